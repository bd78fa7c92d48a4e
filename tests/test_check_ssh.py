"""`orchestrate check` on the namespaced SSH test bed (tests/beds/ssh.py): every host reaches
every task port, then one port is blocked between two hosts only and exactly that pair fails,
by name; nothing is registered and nothing is left on the hosts. Needs root, iproute2 and
openssh-server: skipped with the reason where they are missing, failed under CI=true."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.beds import ssh as tb
from tests.conftest import CliResult, ssh_testbed, status_json, wait_for

pytestmark = pytest.mark.ssh
BASE = 24500  # ports.base: worker-i listens on BASE on host hi (one slot each)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tb.Testbed]:
    with ssh_testbed(tmp_path_factory, 3, epochs=1, name="checkbed") as bed:
        yield bed


@pytest.fixture
def config(bed: tb.Testbed, tmp_path: Path) -> Path:
    """The test bed's cluster.toml with fixed ports and a shared directory of its own."""
    shared = tmp_path / "shared"
    shared.mkdir()
    text = Path(bed.cluster_toml).read_text()
    text = text.replace(f'shared_dir = "{bed.root}/shared"', f'shared_dir = "{shared}"')
    text = text.replace("[backend]", f"[ports]\nbase = {BASE}\n\n[backend]")
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


@contextlib.contextmanager
def dropped(host: tb.TestHost, peer: tb.TestHost, port: int) -> Iterator[None]:
    """`host` drops what its `port` sends to `peer` (a policy-routing blackhole, iproute2 only):
    peer's SYNs arrive but get no answer, so its connections time out, as through a firewall
    that drops; every other pair, this port from other hosts included, still works."""
    rule = ["to", peer.address, "ipproto", "tcp", "sport", str(port), "blackhole"]
    subprocess.run(["ip", "-n", host.namespace, "rule", "add", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "-n", host.namespace, "rule", "del", *rule], check=False)


def port_free_in(host: tb.TestHost, port: int) -> bool:
    """Whether `port` can be bound (without SO_REUSEADDR) on every address of the host."""
    code = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_INET6)\n"
        "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
        f"s.bind(('::', {port}))\n"
    )
    argv = ["ip", "netns", "exec", host.namespace, sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def helpers_in(host: tb.TestHost) -> list[str]:
    """Command lines of the host's processes other than sshd's listener (the bed's own)."""
    pids = subprocess.run(
        ["ip", "netns", "pids", host.namespace], capture_output=True, text=True, check=False
    ).stdout.split()
    found = []
    for pid in pids:
        if int(pid) == host.sshd_pid:
            continue
        with contextlib.suppress(OSError):
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return found


def assert_nothing_left(bed: tb.Testbed, config: Path, cli: Callable[..., CliResult]) -> None:
    assert status_json(cli)["jobs"] == []
    assert list((config.parent / "shared").iterdir()) == []  # the preflight's tokens are gone
    for host in bed.hosts:
        assert port_free_in(host, BASE), f"a listener is left on {host.name}"
    # Each host's helper ends with its SSH connection, once the command has exited.
    wait_for(lambda: not any(helpers_in(host) for host in bed.hosts), 10)


def test_check_passes_when_every_host_reaches_every_port(
    bed: tb.Testbed, config: Path, cli: Callable[..., CliResult]
) -> None:
    result = cli("check", str(config))
    assert result.code == 0, result.err
    assert result.err == ""
    lines = result.out.splitlines()
    assert lines[:6] == [
        "port check: 3 host(s), 3 task port(s), each from every host",
        "",
        "from \\ to  h0    h1    h2",
        "h0         ok    ok    ok",
        "h1         ok    ok    ok",
        "h2         ok    ok    ok",
    ]
    assert lines[6:] == ["", "interfaces:"] + [
        f"  {h.name}: {h.address} via eth0" for h in bed.hosts
    ]
    assert_nothing_left(bed, config, cli)


def test_check_fails_exactly_the_blocked_pair_and_names_it(
    bed: tb.Testbed, config: Path, cli: Callable[..., CliResult]
) -> None:
    h0, _, h2 = bed.hosts
    with dropped(h2, h0, BASE):  # h0 cannot reach h2's task port; h1 can, and h2 itself
        result = cli("check", str(config))
    assert result.code == 3, result
    assert result.out.splitlines()[2:6] == [
        "from \\ to  h0    h1    h2",
        "h0         ok    ok    FAIL",
        "h1         ok    ok    ok",
        "h2         ok    ok    ok",
    ]
    assert f"failing pairs:\n  h0 -> h2:{BASE} (worker-2): timed out\n" in result.out
    assert result.err == (
        f"error: port check failed for 1 of 9 pair(s): h0 -> h2:{BASE} (worker-2): timed out\n"
    )
    assert "Traceback" not in result.out + result.err
    assert_nothing_left(bed, config, cli)
