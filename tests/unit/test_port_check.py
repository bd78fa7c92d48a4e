"""`orchestrate check`: the pure pairs/grid/summary logic (orchestrator.planning.port_check), the host
side's listen/connect/route on loopback (worker.netcheck), and the command on the local backend.
The SSH test bed case (a port blocked between two hosts) is tests/test_check_ssh.py."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.planning import port_check as pc
from orchestrator.planning.plan import LaunchPlan, TaskPlan
from tests.conftest import CliResult, fake_job, status_json
from worker import hostd, netcheck


def plan(*hosts: tuple[str, str, int], base: int | None = 20000) -> LaunchPlan:
    """A plan with `slots` tasks on each (label, address, slots) host, ports base, base+1..."""
    tasks = []
    for h, (label, address, slots) in enumerate(hosts):
        for s in range(slots):
            port = None if base is None else base + s
            tasks.append(TaskPlan(len(tasks), h, label, address, port))
    return LaunchPlan("j", tuple(tasks))


THREE = plan(("n0", "10.0.0.1", 1), ("n1", "10.0.0.2", 2), ("n2", "10.0.0.3", 1))


def check_of(
    the_plan: LaunchPlan,
    listened: dict[int, list[str] | str] | None = None,
    fail: dict[tuple[int, str], str] | None = None,
    connected: dict[int, list[str] | str] | None = None,
) -> pc.PortCheck:
    """A check of the plan where every port listens and every pair connects, except as told:
    fail[(source host, task)] = error."""
    found = pc.targets(the_plan)
    labels = pc.hosts_of(found)
    listened = listened or {h: [""] * len(pc.ports_on(found, h)) for h in labels}
    missing = pc.not_listening(found, listened)
    tried = pc.tried(found, missing)
    answers: dict[int, list[str] | str] = {
        h: [(fail or {}).get((h, t.task), "") for t in tried] for h in labels
    }
    answers.update(connected or {})
    return pc.PortCheck(tuple(labels), labels, pc.pairs(found, missing, answers))


# --- pure: pairs, grid, summary -------------------------------------------------------------


def test_targets_are_every_task_port_and_need_resolved_ports() -> None:
    found = pc.targets(THREE)
    assert [(t.task, t.host_label, t.address, t.port) for t in found] == [
        ("worker-0", "n0", "10.0.0.1", 20000),
        ("worker-1", "n1", "10.0.0.2", 20000),
        ("worker-2", "n1", "10.0.0.2", 20001),
        ("worker-3", "n2", "10.0.0.3", 20000),
    ]
    assert pc.hosts_of(found) == {0: "n0", 1: "n1", 2: "n2"}
    assert pc.ports_on(found, 1) == [20000, 20001]
    with pytest.raises(ValueError, match="worker-0 has no port"):
        pc.targets(plan(("n0", "10.0.0.1", 1), base=None))


def test_every_host_tries_every_task_port() -> None:
    check = check_of(THREE)
    assert check.ok
    assert len(check.pairs) == 3 * 4
    assert {(p.source, p.target.task) for p in check.pairs} == {
        (h, f"worker-{t}") for h in range(3) for t in range(4)
    }


def test_route_peers_are_the_other_hosts_or_a_lone_hosts_own_address() -> None:
    assert pc.route_peers(pc.targets(THREE)) == {
        0: [("n1", "10.0.0.2"), ("n2", "10.0.0.3")],
        1: [("n0", "10.0.0.1"), ("n2", "10.0.0.3")],
        2: [("n0", "10.0.0.1"), ("n1", "10.0.0.2")],
    }
    local = plan(("local", "127.0.0.1", 2))
    assert pc.route_peers(pc.targets(local)) == {0: [("local", "127.0.0.1")]}


def test_grid_fails_exactly_the_failing_pair_and_names_it() -> None:
    check = check_of(THREE, fail={(0, "worker-2"): "timed out"})
    assert not check.ok
    assert pc.grid(check) == [
        "from \\ to  n0    n1    n2",
        "n0         ok    FAIL  ok",
        "n1         ok    ok    ok",
        "n2         ok    ok    ok",
    ]
    assert [f"{p.describe()}: {p.error}" for p in check.failures] == [
        "n0 -> n1:20001 (worker-2): timed out"
    ]
    text = pc.render(check)
    assert "failing pairs:\n  n0 -> n1:20001 (worker-2): timed out" in text
    assert text.startswith("port check: 3 host(s), 4 task port(s), each from every host\n")
    assert pc.summary(check) == (
        "port check failed for 1 of 12 pair(s): n0 -> n1:20001 (worker-2): timed out"
    )


def test_summary_names_the_first_few_and_counts_the_rest() -> None:
    fail = {(h, f"worker-{t}"): "connection refused" for h in range(3) for t in (1, 2, 3)}
    summary = pc.summary(check_of(THREE, fail=fail))
    assert summary.startswith("port check failed for 9 of 12 pair(s): n0 -> n1:20000 (worker-1)")
    assert summary.count("connection refused") == pc.NAMED_IN_SUMMARY
    assert summary.endswith("; and 4 more")
    assert "\n" not in summary


def test_a_port_that_cannot_listen_fails_every_pair_to_it_without_a_try() -> None:
    listened: dict[int, list[str] | str] = {
        0: [""],
        1: ["", "address already in use"],
        2: "listen failed: no helper",
    }
    found = pc.targets(THREE)
    missing = pc.not_listening(found, listened)
    assert missing == {
        2: "cannot listen there: address already in use",
        3: "cannot listen on n2: listen failed: no helper",
    }
    assert [t.task for t in pc.tried(found, missing)] == ["worker-0", "worker-1"]
    check = check_of(THREE, listened=listened)
    assert pc.grid(check)[1:] == [
        "n0         ok    FAIL  FAIL",
        "n1         ok    FAIL  FAIL",
        "n2         ok    FAIL  FAIL",
    ]
    assert len(check.failures) == 6


def test_a_host_that_cannot_try_fails_its_row() -> None:
    check = check_of(THREE, connected={1: "connect failed: helper gone"})
    assert pc.grid(check)[1:] == [
        "n0         ok    ok    ok",
        "n1         FAIL  FAIL  FAIL",
        "n2         ok    ok    ok",
    ]
    assert {p.error for p in check.failures} == {"n1 could not try: connect failed: helper gone"}


def test_short_answers_fail_rather_than_pass() -> None:
    check = check_of(THREE, listened={0: [], 1: ["", ""], 2: [""]}, connected={2: [""]})
    assert pc.cell(check, 1, 0) == "FAIL"  # no listen answer for n0's port
    assert pc.cell(check, 2, 1) == "FAIL"  # n2 answered for one target of three
    assert pc.cell(check, 1, 1) == "ok"


def test_interface_lines() -> None:
    same = (pc.Route("n1", "10.0.0.1", "eth0"), pc.Route("n2", "10.0.0.1", "eth0"))
    assert pc.interface_line("n0", same) == "n0: 10.0.0.1 via eth0"
    mixed = (
        pc.Route("n1", "10.0.0.1", "eth0"),
        pc.Route("n2", "192.168.0.1", ""),
        pc.Route("n3", error="network is unreachable"),
    )
    assert pc.interface_line("n0", mixed) == (
        "n0: 10.0.0.1 via eth0 (to n1); 192.168.0.1 via ? (to n2); "
        "no route: network is unreachable (to n3)"
    )
    assert pc.interface_line("n0", "route failed: gone") == "n0: unknown (route failed: gone)"
    peers = [("n1", "10.0.0.2"), ("n2", "10.0.0.3")]
    routes = pc.parse_routes(peers, [{"source": "10.0.0.1", "interface": "eth0"}, {"error": "x"}])
    assert routes == (pc.Route("n1", "10.0.0.1", "eth0"), pc.Route("n2", error="x"))
    check = pc.PortCheck((0,), {0: "n0"}, check_of(THREE).pairs[:1], {0: same})
    assert pc.render(check).endswith("\n\ninterfaces:\n  n0: 10.0.0.1 via eth0")


# --- the host side, on loopback -------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@pytest.fixture
def key() -> Iterator[str]:
    yield "check-test"
    netcheck.unlisten("check-test")


def test_listen_connect_unlisten_leave_nothing_behind(key: str) -> None:
    port, closed = free_port(), free_port()
    assert hostd.handle("listen", {"key": key, "ports": [port], "token": "t0k", "hold": 30}) == [""]
    assert not is_free(port)
    targets = [["127.0.0.1", port], ["127.0.0.1", closed]]
    answer = hostd.handle("connect", {"targets": targets, "token": "t0k", "timeout": 2})
    assert answer == ["", "connection refused"]
    assert hostd.handle("unlisten", {"key": key}) is True
    assert is_free(port)
    assert hostd.handle("unlisten", {"key": key}) is False
    assert hostd.handle("connect", {"targets": targets[:1], "token": "t0k", "timeout": 2}) == [
        "connection refused"
    ]


def test_listeners_close_themselves_after_hold(key: str) -> None:
    port = free_port()
    assert netcheck.listen(key, [port], "t", hold=0.3) == [""]
    listener = netcheck._listeners[key]
    listener.thread.join(timeout=5)
    assert not listener.thread.is_alive()
    assert is_free(port)
    assert key not in netcheck._listeners


def test_a_port_in_use_is_reported_and_another_program_is_told_apart(key: str) -> None:
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        stop = threading.Event()

        def serve() -> None:  # someone else's server: says nothing, closes
            other.settimeout(0.1)
            while not stop.is_set():
                try:
                    conn, _ = other.accept()
                    conn.close()
                except OSError:
                    continue

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            assert netcheck.listen(key, [port], "t", hold=30) == ["address already in use"]
            assert netcheck.connect([("127.0.0.1", port)], "t", 2.0) == [
                "another program answers on this port"
            ]
        finally:
            stop.set()
            thread.join()


def test_route_to_loopback_and_a_bad_name() -> None:
    ok, bad = netcheck.route(["127.0.0.1", "no-such-host.invalid"])
    assert ok == {"source": "127.0.0.1", "interface": "lo"}
    assert bad["error"].startswith("cannot resolve the address")


# --- the command, on the local backend ------------------------------------------------------


def test_check_on_the_local_backend_prints_the_grid_and_registers_nothing(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, [], workers=2))
    result = cli("check", str(path))
    assert result.code == 0, result.err
    assert result.err == ""
    assert result.out.splitlines() == [
        "port check: 1 host(s), 2 task port(s), each from every host",
        "",
        "from \\ to  local",
        "local      ok",
        "",
        "interfaces:",
        "  local: 127.0.0.1 via lo",
    ]
    assert status_json(cli)["jobs"] == []
    assert not any((tmp_path / "shared").iterdir())  # the preflight's tokens are gone


def test_check_names_a_port_in_use_on_one_line(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        while not is_free(other.getsockname()[1] - 1):
            other.close()
            other = socket.socket()
            other.bind(("127.0.0.1", 0))
        other.listen()
        base = other.getsockname()[1] - 1  # worker-1's port is taken
        path = tmp_path / "c.toml"
        path.write_text(fake_job(tmp_path, [], workers=2, extra=f"[ports]\nbase = {base}\n"))
        result = cli("check", str(path))
    assert result.code == 3
    assert "local      FAIL" in result.out
    assert f"local -> local:{base + 1} (worker-1): cannot listen there: address already in use" in (
        result.out
    )
    assert result.err == (
        f"error: port check failed for 1 of 2 pair(s): local -> local:{base + 1} (worker-1): "
        "cannot listen there: address already in use\n"
    )
    assert is_free(base)
    assert status_json(cli)["jobs"] == []


def test_check_refuses_slurm_in_one_line(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        f'[job]\nname = "sl"\nshared_dir = "{tmp_path}"\n\n[entrypoint]\n'
        'module = "worker.examples.digits"\n\n[backend]\ntype = "slurm"\nnodes = 2\n'
    )
    result = cli("check", str(path))
    assert result.code == 2
    assert result.err.startswith("error: check needs the hosts before the job: a Slurm job's")
    assert result.err.count("\n") == 1
    assert "Traceback" not in result.err
