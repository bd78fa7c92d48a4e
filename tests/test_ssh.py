"""The SSH backend against real OpenSSH sshd hosts, each in its own network namespace
(tests/beds/ssh.py). Needs root, iproute2 and openssh-server: skipped with the reason where
they are missing, failed under CI=true."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.agents import agent_pid, start_agents
from orchestrator.backends.preflight import preflight
from orchestrator.backends.ssh import SshHosts
from orchestrator.config import SshBackend, load_config
from orchestrator.errors import LaunchError, TransportError
from orchestrator.planning.plan import plan_on_hosts
from orchestrator.planning.task_specs import make_specs
from orchestrator.transport.base import ProcessRef
from orchestrator.transport.ssh import SshTransport
from tests import test_transport_contract as contract
from tests.beds import ssh as tb
from tests.conftest import (
    REPO,
    CliResult,
    Terminal,
    job_view,
    launch_detached,
    python_with_env,
    python_without_orchestrate,
    signal_job_process,
    ssh_testbed,
    status_json,
    wait_for,
    wait_for_end,
)
from worker.spec import HOST_PROTOCOL

pytestmark = pytest.mark.ssh
FAKE = Path(__file__).parent / "fixtures" / "fake_trainer.py"
# A user's own MWMS `fit` script with its own BackupAndRestore: imports nothing of ours.
PLAIN_FIT = Path(__file__).parent / "fixtures" / "plain_fit.py"
AGENT = "/worker agent "  # in an agent's command line: python COPY/worker agent SPEC


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tb.Testbed]:
    with ssh_testbed(tmp_path_factory, 3, epochs=4) as bed:
        yield bed


def backend_config(bed: tb.Testbed, **overrides: object) -> SshBackend:
    cfg = load_config(bed.cluster_toml)
    assert isinstance(cfg.backend, SshBackend)
    return cfg.backend.model_copy(update=overrides)


def fake_toml(bed: tb.Testbed, tmp_path: Path, args: list[str], hosts: str | None = None) -> Path:
    """The test bed's cluster.toml with the stand-in trainer and its own shared dir."""
    text = Path(bed.cluster_toml).read_text()
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    text = text.replace(f'shared_dir = "{bed.root}/shared"', f'shared_dir = "{shared}"')
    text = text.replace('module = "worker.examples.digits"', f'script = "{FAKE}"')
    text = text.replace('args = ["--epochs", "4"]', f"args = {json.dumps(args)}")
    text = text.replace(
        "[backend]",
        "[supervision]\nheartbeat_interval = 0.2\nstop_grace = 2.0\n"
        "poll_interval = 0.1\n\n[backend]",
    )
    if hosts is not None:
        text = text[: text.index("[[backend.hosts]]")] + hosts
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def processes_in(namespace: str, needle: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    found = []
    for pid in out.stdout.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if needle.encode() in cmdline:
            found.append(int(pid))
    return found


def drop_ssh_sessions(host: tb.TestHost) -> int:
    """Cut every SSH connection to the host by killing sshd's per-connection processes (the
    children of the listening sshd we started); the listener stays, so reconnects work."""
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        if ppid == host.sshd_pid:
            os.kill(int(entry.name), signal.SIGKILL)
            killed += 1
    return killed


# --- the transport contract, over SSH ------------------------------------------------------


@pytest.fixture(scope="module")
def ssh(bed: tb.Testbed) -> Iterator[SshTransport]:
    backend = backend_config(bed)
    transport = SshTransport(backend.hosts[1], backend)
    yield transport
    transport.close()


def test_ssh_argv_and_env_arrive_byte_for_byte(ssh: SshTransport, bed: tb.Testbed) -> None:
    contract.check_argv_and_env_arrive_byte_for_byte(ssh, bed.python)


def test_ssh_stdin_exit_code(ssh: SshTransport, bed: tb.Testbed) -> None:
    contract.check_stdin_exit_code_and_stderr(ssh, bed.python)


def test_ssh_timeout(ssh: SshTransport, bed: tb.Testbed) -> None:
    contract.check_timeout_raises(ssh, bed.python)


def test_ssh_files(ssh: SshTransport, tmp_path: Path) -> None:
    contract.check_files(ssh, str(tmp_path / "remote"), tmp_path / "local")


def test_ssh_observe_liveness(ssh: SshTransport, bed: tb.Testbed, tmp_path: Path) -> None:
    contract.check_observe_liveness(ssh, bed.python, str(tmp_path))


def test_ssh_watch_holds_a_quiet_host_and_answers_a_death_at_once(
    ssh: SshTransport, bed: tb.Testbed, tmp_path: Path
) -> None:
    contract.check_watch_holds_a_quiet_host_and_answers_a_death_at_once(
        ssh, bed.python, str(tmp_path)
    )


def test_ssh_detached_and_stop(ssh: SshTransport, bed: tb.Testbed, tmp_path: Path) -> None:
    contract.check_detached_start_and_group_stop(ssh, bed.python, str(tmp_path))


def test_commands_run_on_the_host_itself(ssh: SshTransport) -> None:
    assert ssh.run(["hostname"]).stdout.strip() == b"h1"


def test_connection_survives_a_drop(ssh: SshTransport, bed: tb.Testbed, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    ssh.put_file(path, b"0123456789")
    assert ssh.read_file(path, 4) == b"456789"
    assert drop_ssh_sessions(bed.hosts[1]) >= 1
    time.sleep(0.2)
    assert ssh.read_file(path, 8) == b"89"  # reconnected transparently, same offset semantics


# --- host keys -----------------------------------------------------------------------------


def test_unknown_host_key_is_refused_with_how_to_trust_it(bed: tb.Testbed, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    backend = backend_config(bed, known_hosts=empty)
    transport = SshTransport(backend.hosts[0], backend)
    with pytest.raises(TransportError) as err:
        transport.run(["true"])
    message = str(err.value)
    assert message.startswith("h0: unknown host key ssh-ed25519 SHA256:")
    assert f"ssh-keyscan {bed.hosts[0].address} >> {empty}" in message
    assert "trust_unknown_hosts" in message
    assert empty.read_text() == ""


def test_trust_on_first_use_records_the_key_then_checks_it(bed: tb.Testbed, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    backend = backend_config(bed, known_hosts=known, trust_unknown_hosts=True)
    transport = SshTransport(backend.hosts[2], backend)
    assert transport.run(["true"]).ok
    transport.close()
    recorded = known.read_text().split()
    expected = next(
        line.split()
        for line in Path(bed.known_hosts).read_text().splitlines()
        if line.startswith(bed.hosts[2].address + " ")
    )
    assert recorded == expected
    strict = SshTransport(backend.hosts[2], backend_config(bed, known_hosts=known))
    assert strict.run(["true"]).ok
    strict.close()


@pytest.mark.parametrize("trust_unknown", [False, True])
def test_changed_host_key_is_always_refused(
    bed: tb.Testbed, tmp_path: Path, trust_unknown: bool
) -> None:
    import paramiko

    impostor = paramiko.Ed25519Key.from_private_key_file(bed.identity_file)  # any other key
    known = tmp_path / "known_hosts"
    known.write_text(f"{bed.hosts[0].address} ssh-ed25519 {impostor.get_base64()}\n")
    backend = backend_config(bed, known_hosts=known, trust_unknown_hosts=trust_unknown)
    transport = SshTransport(backend.hosts[0], backend)
    with pytest.raises(TransportError, match=r"h0: host key for .* has CHANGED.*refusing"):
        transport.run(["true"])
    assert known.read_text().count("\n") == 1  # nothing was recorded


# --- preflight and launch ------------------------------------------------------------------


def test_unreachable_host_and_wrong_key_fail_preflight_naming_each_host(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    wrong_key = tmp_path / "wrong_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True
    )
    ghost = bed.gateway.rsplit(".", 1)[0] + ".250"  # in the test subnet, no namespace behind it
    hosts = (
        f'[[backend.hosts]]\naddress = "{bed.hosts[0].address}"\nname = "h0"\n\n'
        f'[[backend.hosts]]\naddress = "{ghost}"\nname = "ghost"\n\n'
        f'[[backend.hosts]]\naddress = "{bed.hosts[1].address}"\nname = "badkey"\n'
        f'identity_file = "{wrong_key}"\n'
    )
    path = fake_toml(bed, tmp_path, ["--mode", "sleep"], hosts=hosts)
    path.write_text(path.read_text().replace("connect_timeout = 5.0", "connect_timeout = 2.0"))
    result = cli("launch", str(path), timeout=120)
    assert result.code == 3, result
    assert result.err.count("\n") == 1 and "Traceback" not in result.err
    assert "preflight failed on 2 host(s)" in result.err
    assert "ghost: cannot connect to root@" in result.err
    assert "badkey: authentication failed for root@" in result.err
    assert "h0:" not in result.err.split("host(s):", 1)[1]
    [job] = status_json(cli)["jobs"]
    assert job["state"] == "failed" and "preflight failed" in job["last_cause"]
    assert list((tmp_path / "shared").iterdir()) == []  # no job files, token dir removed
    assert all(agent_pid(t["agent"]) is None for t in job["tasks"])
    for host in bed.hosts:
        assert processes_in(host.namespace, AGENT) == []


def test_a_host_with_another_orchestrate_installed_runs_the_coordinators_worker(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    # h1's interpreter sees another worker package first (an older host protocol), one that
    # leaves a mark when imported: the job runs from the copy the coordinator shipped.
    old = tmp_path / "old-orchestrate"
    shutil.copytree(REPO / "worker", old / "worker")
    spec = old / "worker" / "spec.py"
    spec.write_text(re.sub(r"HOST_PROTOCOL = \d+", "HOST_PROTOCOL = 1", spec.read_text()))
    marker = tmp_path / "old-imported"
    init = old / "worker" / "__init__.py"
    init.write_text(f"open({str(marker)!r}, 'a').close()\n" + init.read_text())
    wrapper = python_with_env(tmp_path / "old-python", bed.python, {"PYTHONPATH": str(old)})
    hosts = (
        f'[[backend.hosts]]\naddress = "{bed.hosts[0].address}"\nname = "h0"\n\n'
        f'[[backend.hosts]]\naddress = "{bed.hosts[1].address}"\nname = "h1"\n'
        f'python = "{wrapper}"\n'
    )
    result = cli("launch", str(fake_toml(bed, tmp_path, ["--mode", "ok"], hosts=hosts)))
    assert result.code == 0, result
    assert not marker.exists()
    assert HOST_PROTOCOL > 1
    for host in bed.hosts:
        assert processes_in(host.namespace, AGENT) == []


@pytest.mark.slow
def test_hosts_with_python_and_tensorflow_alone_train_from_the_shipped_worker(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """Each host's interpreter has TensorFlow and tf-keras but not orchestrate, and a cache of
    its own: each is sent the worker package once, and a plain `fit` script trains."""
    bare = python_without_orchestrate(tmp_path)
    caches = [tmp_path / f"cache-{h.name}" for h in bed.hosts]
    hosts = "".join(
        f'[[backend.hosts]]\naddress = "{h.address}"\nname = "{h.name}"\npython = "'
        + str(python_with_env(tmp_path / f"python-{h.name}", bare, {"XDG_CACHE_HOME": str(c)}))
        + '"\n\n'
        for h, c in zip(bed.hosts, caches, strict=True)
    )
    path = plain_training_toml(bed, tmp_path, 2, "")
    text = path.read_text().replace(f'workdir = "{REPO}"', f'workdir = "{tmp_path}"')
    path.write_text(text[: text.index("[[backend.hosts]]")] + hosts)
    result = cli("launch", "--plain", str(path), timeout=300)
    assert result.code == 0, result.err[-2000:]
    assert "[worker-2 h2] Epoch 2/2" in result.out
    copies = [list((c / "orchestrate").iterdir()) for c in caches]
    assert all(len(found) == 1 for found in copies), copies
    assert len({found[0].name for found in copies}) == 1  # the same digest everywhere
    for [copy] in copies:
        assert (copy / "worker" / "agent.py").is_file()
        assert stat.S_IMODE(copy.stat().st_mode) == 0o700
    job_id = status_json(cli)["jobs"][0]["id"]
    agent_log = (tmp_path / "shared" / job_id / "tasks" / "1" / "agent.log").read_text()
    assert "Traceback" not in agent_log
    # A second launch finds each copy where it left it: nothing is sent again.
    inodes = [found[0].stat().st_ino for found in copies]
    again = cli("launch", str(fake_toml(bed, tmp_path, ["--mode", "ok"], hosts=hosts)))
    assert again.code == 0, again
    assert [
        c.stat().st_ino for [c] in (list((c / "orchestrate").iterdir()) for c in caches)
    ] == inodes


def test_a_host_failing_to_start_rolls_back_the_others(bed: tb.Testbed, tmp_path: Path) -> None:
    cfg = load_config(fake_toml(bed, tmp_path, ["--mode", "sleep"]))
    backend = SshHosts(cfg.backend)  # type: ignore[arg-type]
    started: dict[int, ProcessRef] = {}
    real = [backend.transport(i) for i in range(3)]

    class Starts:  # records what the real transport started
        def __init__(self, inner: SshTransport, index: int) -> None:
            self.inner, self.index = inner, index

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def start_detached(self, argv: list[str], **kw: object) -> ProcessRef:
            if self.index == 2:
                raise TransportError("h2: injected start failure")
            proc = self.inner.start_detached(argv, **kw)  # type: ignore[arg-type]
            started[self.index] = proc
            return proc

    recorded = [Starts(t, i) for i, t in enumerate(real)]

    class Recorded:  # the real SSH backend, each transport wrapped
        kind = backend.kind
        capabilities = backend.capabilities

        def host_count(self) -> int:
            return backend.host_count()

        def transport(self, i: int) -> Any:
            return recorded[i]

        def python(self, i: int) -> str:
            return backend.python(i)

        def close(self) -> None:
            backend.close()

    hosts = Recorded()
    try:
        reports = preflight(cfg, hosts, "rollback-job")
        plan = plan_on_hosts(cfg, {h: r.ports for h, r in reports.items()}, {})
        specs = make_specs(cfg, plan, "rollback-job", 0, hosts)
        with pytest.raises(LaunchError) as err:
            start_agents(hosts, plan, specs, stop_grace=1.0)
        message = str(err.value)
        assert "worker-2@h2: h2: injected start failure" in message
        assert "worker-0@h0: started, then stopped" in message
        assert sorted(started) == [0, 1]
        for i, proc in started.items():
            assert real[i].alive_pids([proc]) == set()  # checked on the host itself
            assert processes_in(bed.hosts[i].namespace, AGENT) == []
            assert processes_in(bed.hosts[i].namespace, "fake_trainer") == []
    finally:
        backend.close()


def test_args_and_env_with_metacharacters_reach_remote_trainers(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    nasty = ["; echo pwned", "$(id)", "it's", 'a "b"', "c\\d", "e f", "`x`"]
    path = fake_toml(bed, tmp_path, ["--mode", "ok", *nasty])
    path.write_text(
        path.read_text().replace(
            'env = { TF_CPP_MIN_LOG_LEVEL = "2" }',
            'env = { NASTY = "; $(x) \' \\" \\\\ `y` and spaces" }',
        )
    )
    result = cli("launch", str(path), timeout=120)
    assert result.code == 0, result
    for i in range(3):
        assert f"[worker-{i} h{i}] task {i} mode ok argv={['--mode', 'ok', *nasty]!r}" in result.out
    assert "env=" + json.dumps("; $(x) ' \" \\ `y` and spaces") in result.out
    spec = next((tmp_path / "shared").glob("*/tasks/0/spec.json"))
    assert oct(spec.stat().st_mode & 0o777) == "0o600"
    assert oct(spec.parent.parent.parent.stat().st_mode & 0o777) == "0o700"  # the job dir


def test_dropped_connections_lose_and_double_no_log_line(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult], home: Path
) -> None:
    count = 1500
    path = fake_toml(bed, tmp_path, ["--mode", f"count:{count}"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "launch", str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: list((tmp_path / "shared").glob("*/logs/worker-2.log")), 30)
        drops = 0
        for _ in range(3):
            time.sleep(1.0)
            drops += drop_ssh_sessions(bed.hosts[1]) + drop_ssh_sessions(bed.hosts[2])
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert drops >= 3
    assert proc.returncode == 0, out[-2000:] + err
    [job] = status_json(cli)["jobs"]
    for i in range(3):
        shared_log = (tmp_path / "shared" / job["id"] / "logs" / f"worker-{i}.log").read_bytes()
        copy = (home / "jobs" / job["id"] / "logs" / f"worker-{i}.log").read_bytes()
        assert copy == shared_log
        numbered = [ln for ln in copy.splitlines() if ln.startswith(b"line ")]
        assert [int(ln.split()[1]) for ln in numbered] == list(range(count))
        assert out.count(f"[worker-{i} h{i}] line ") == count


def test_a_dropped_terminal_hands_an_ssh_job_to_a_detached_supervisor(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult], home: Path
) -> None:
    """A foreground launch on three SSH hosts, in a pseudo-terminal that closes (the kernel's
    SIGHUP): the job goes on under a detached supervisor, nothing lost or twice in its logs."""
    path = fake_toml(bed, tmp_path, ["--mode", "count:2400", "--task-0", "ok-after:16"])
    terminal = Terminal([sys.executable, "-m", "orchestrator", "launch", "--plain", str(path)])
    try:
        running = wait_for(
            lambda: next((j for j in status_json(cli)["jobs"] if j["state"] == "running"), None),
            60,
        )
        assert running["supervisor"]["pid"] == terminal.proc.pid
        terminal.hang_up()
        assert terminal.proc.wait(timeout=120) == 0
    finally:
        terminal.close()
    job = wait_for_end(cli, running["id"], timeout=120)
    assert job["state"] == "succeeded", job["last_cause"]
    assert job["supervisor"]["pid"] not in (None, terminal.proc.pid)
    said = [e["message"] for e in job["events"] if e["kind"] == "handover"]
    assert said[-1].endswith(f"handed the job to supervisor {job['supervisor']['pid']}")
    for i in range(3):
        shared_log = (tmp_path / "shared" / job["id"] / "logs" / f"worker-{i}.log").read_bytes()
        copy = (home / "jobs" / job["id"] / "logs" / f"worker-{i}.log").read_bytes()
        assert copy == shared_log
        if i:  # every numbered line, once
            numbered = [ln for ln in copy.splitlines() if ln.startswith(b"line ")]
            assert [int(ln.split()[1]) for ln in numbered] == list(range(2400))
    assert wait_for(lambda: no_job_process_left(bed), 30)


# --- the real example on three hosts --------------------------------------------------------


@pytest.mark.slow
def test_example_trains_across_three_ssh_hosts_through_a_dropped_connection(
    bed: tb.Testbed, cli: Callable[..., CliResult], home: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "launch", bed.cluster_toml],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def training() -> dict | None:
            jobs = status_json(cli)["jobs"]
            ok = (
                jobs
                and jobs[0]["state"] == "running"
                and all(t["step"] > 0 and t["resources"] for t in jobs[0]["tasks"])
            )
            return jobs[0] if ok else None

        running = wait_for(training, 150)
        assert drop_ssh_sessions(bed.hosts[1]) >= 1  # mid-training
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:] + err
    for i in range(3):
        assert f"[worker-{i} h{i}] final held-out accuracy:" in out
    assert [t["host"] for t in running["tasks"]] == ["h0", "h1", "h2"]
    # Each remote agent's resource sample reached `status` through its host's long poll.
    assert all(t["resources"]["rss_bytes"] > 200 << 20 for t in running["tasks"])
    assert [t["address"].rsplit(":", 1)[0] for t in running["tasks"]] == [
        h.address for h in bed.hosts
    ]
    job = status_json(cli, running["id"])["jobs"][0]
    assert job["state"] == "succeeded"
    job_dir = Path(job["job_dir"])
    assert [p.relative_to(job_dir) for p in job_dir.rglob("saved_model.pb")] == [
        Path("model/saved_model.pb")
    ]
    for i in range(3):
        copy = (home / "jobs" / job["id"] / "logs" / f"worker-{i}.log").read_bytes()
        assert copy == (job_dir / "logs" / f"worker-{i}.log").read_bytes()
    assert (home / "jobs" / job["id"] / "collected" / "model" / "saved_model.pb").is_file()


def test_ssh_config_alias_is_honoured(bed: tb.Testbed, tmp_path: Path) -> None:
    """A host given by its ~/.ssh/config alias: HostName, User and IdentityFile come from there."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host gpu-box\n  HostName {bed.hosts[2].address}\n  User root\n"
        f"  IdentityFile {bed.identity_file}\n"
    )
    code = (
        "import sys; from pathlib import Path; from orchestrator.config import SshBackend;"
        "from orchestrator.transport.ssh import SshTransport;"
        "b = SshBackend.model_validate({'type': 'ssh', 'known_hosts': sys.argv[1],"
        " 'hosts': [{'address': 'gpu-box'}]});"
        "print(SshTransport(b.hosts[0], b).run(['hostname']).stdout.decode().strip())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, bed.known_hosts],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(home)},
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "h2"


# --- faults on SSH hosts ---------------------------------------------------------------------


def training_toml(bed: tb.Testbed, tmp_path: Path, epochs: int, sections: str) -> Path:
    text = Path(bed.cluster_toml).read_text()
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    text = text.replace(f'shared_dir = "{bed.root}/shared"', f'shared_dir = "{shared}"')
    text = text.replace('args = ["--epochs", "4"]', f'args = ["--epochs", "{epochs}"]')
    text = text.replace("[backend]", sections + "\n[backend]")
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def plain_training_toml(bed: tb.Testbed, tmp_path: Path, epochs: int, sections: str) -> Path:
    """The test bed's job with a plain `fit` script instead of the example (nothing of ours
    imported): orchestrate sees its epochs only through the bootstrap. A small delay per
    step keeps an epoch near a second, as the example's."""
    path = training_toml(bed, tmp_path, epochs, sections)
    backup = tmp_path / "shared" / "backup"
    text = path.read_text().replace('module = "worker.examples.digits"', f'script = "{PLAIN_FIT}"')
    text = text.replace(
        f'args = ["--epochs", "{epochs}"]',
        f'args = ["--epochs", "{epochs}", "--backup-dir", "{backup}", "--step-delay", "0.03"]',
    )
    path.write_text(text)
    return path


def launch_and_wait_for_epoch(
    cli: Callable[..., CliResult], path: Path, epoch: int
) -> tuple[subprocess.Popen[str], dict]:
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", str(path)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

    def reached() -> dict | None:
        jobs = status_json(cli)["jobs"]
        ok = (
            jobs
            and jobs[0]["state"] == "running"
            and all(t["epoch"] >= epoch for t in jobs[0]["tasks"])
        )
        return jobs[0] if ok else None

    try:
        return proc, wait_for(reached, 150)  # type: ignore[return-value]
    except BaseException:
        proc.kill()
        raise


def events_text(cli: Callable[..., CliResult], job_id: str) -> str:
    return "\n".join(e["message"] for e in status_json(cli, job_id)["jobs"][0]["events"])


def no_job_process_left(bed: tb.Testbed) -> bool:
    return not any(
        processes_in(h.namespace, needle)
        for h in bed.hosts
        for needle in (AGENT, "worker.examples", "plain_fit.py")
    )


def link(host: tb.TestHost, state: str) -> None:
    subprocess.run(["ip", "link", "set", host.veth, state], check=True)


def event_times(job: dict, kind: str) -> list[float]:
    return [e["ts"] for e in job["events"] if e["kind"] == kind]


@pytest.mark.slow
def test_a_killed_remote_trainer_then_a_host_cut_off_for_less_than_host_wait_each_restart(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """One job, two faults. (a) A trainer in h1 SIGKILLed: the group restarts and resumes.
    (b) Then h2's link down longer than host_timeout, shorter than host_wait, then back: the
    group stops within seconds, the relaunch waits for the host without spending restarts, and
    the job resumes from its last epoch and succeeds."""
    sections = "[supervision]\nstop_grace = 2.0\n\n[restart]\nmax_restarts = 5\nbackoff = 0.2\n"
    path = plain_training_toml(bed, tmp_path, 12, sections)
    path.write_text(path.read_text().replace("connect_timeout = 5.0", "connect_timeout = 2.0"))
    victim = bed.hosts[2]
    proc, running = launch_and_wait_for_epoch(cli, path, 3)
    try:
        killed_at = time.time()
        signal_job_process(running["tasks"][1]["pid"], running["id"], signal.SIGKILL)  # in h1

        def training_again() -> dict | None:
            job = status_json(cli, running["id"])["jobs"][0]
            on = (
                job["state"] == "running"
                and job["attempt"] >= 1
                and all(
                    t["attempt"] == job["attempt"]
                    and t["epoch"] > t["initial_epoch"] > 0
                    and t["first_step_at"] is not None
                    for t in job["tasks"]
                )
            )
            return job if on else None

        again: Any = wait_for(training_again, 150)
        restart = next(e for e in again["events"] if e["kind"] == "restart")
        assert "worker-1 exited with code 137" in restart["message"]
        failure = next(e["ts"] for e in again["events"] if e["kind"] == "failure")
        launched = [e["ts"] for e in again["events"] if e["kind"] == "launched"][-1]
        resumed = min(t["first_step_at"] for t in again["tasks"])
        print(
            f"\n[timing] ssh trainer SIGKILL: detected+stopping {failure - killed_at:.2f}s, "
            f"relaunched {launched - killed_at:.2f}s, training resumed {resumed - killed_at:.2f}s"
        )

        link(victim, "down")
        cut_at = time.time()
        try:
            wait_for(lambda: "waiting for h2" in events_text(cli, running["id"]), 60)
            waiting = status_json(cli, running["id"])["jobs"][0]
            assert "waiting for h2: unreachable for" in " ".join(waiting["host_notes"])
            time.sleep(max(0.0, cut_at + 15 - time.time()))  # away for 15 s in all
        finally:
            link(victim, "up")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:] + err
    job = status_json(cli, running["id"])["jobs"][0]
    assert job["state"] == "succeeded"
    # The waiting spent no restart: no relaunch failed while h2 was away (a busy machine may
    # still add a restart of its own).
    assert job["restarts"] >= 2
    events = events_text(cli, job["id"])
    assert "h2 unreachable for" in events and "relaunch failed" not in events
    assert all(t["initial_epoch"] > 0 and t["attempt"] == job["attempt"] for t in job["tasks"])
    stopping = next(t for t in event_times(job, "failure") if t >= cut_at)
    print(f"\n[timing] link down to group stopping: {stopping - cut_at:.2f}s")
    assert wait_for(lambda: no_job_process_left(bed), 30)


def run_with_a_host_cut_off(
    bed: tb.Testbed, cli: Callable[..., CliResult], path: Path, victim: tb.TestHost
) -> tuple[dict, float]:
    """Launch, cut the victim's link at epoch 3 and leave it down until the job ends; the job
    (which must succeed) and when the link went down. The link is back up afterwards."""
    path.write_text(path.read_text().replace("connect_timeout = 5.0", "connect_timeout = 2.0"))
    proc, running = launch_and_wait_for_epoch(cli, path, 3)
    try:
        link(victim, "down")
        cut_at = time.time()
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:] + err
        # Cut off, the victim's agent stopped its trainer by itself: none trains on alone.
        assert wait_for(lambda: processes_in(victim.namespace, "plain_fit.py") == [], 30)
    finally:
        if proc.poll() is None:
            proc.kill()
        link(victim, "up")
    assert wait_for(lambda: no_job_process_left(bed), 30)
    return status_json(cli, running["id"])["jobs"][0], cut_at


@pytest.mark.slow
def test_a_host_cut_off_for_good_is_replaced_by_a_spare_and_the_job_finishes_there(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """(b) Two hosts train, h2 is a spare; h0's (the chief's) link goes down for good. Both
    tasks move: task 0 to h1 (where task 1's keeper is), task 1 to the spare. The hosts share
    /tmp, as containers can: a task that moves to another host must not start in the standby
    its keeper on the lost host holds (it would train in the lost host's network namespace,
    and the group would never form). (P11 of the benchmark loses h1: only task 1 moves.)"""
    victim = "h0"
    path = plain_training_toml(bed, tmp_path, 10, "[restart]\nbackoff = 0.5\nstandby_delay = 0\n")
    path.write_text(path.read_text().replace('name = "h2"', 'name = "h2"\nspare = true'))
    lost = next(h for h in bed.hosts if h.name == victim)

    job, cut_at = run_with_a_host_cut_off(bed, cli, path, lost)

    assert job["state"] == "succeeded" and job["restarts"] >= 1, events_text(cli, job["id"])
    assert {t["host"] for t in job["tasks"]} == {"h0", "h1", "h2"} - {victim}
    assert all(t["initial_epoch"] > 0 for t in job["tasks"])
    assert f"h2 replaces {victim}" in events_text(cli, job["id"])
    assert {h["name"]: h["role"] for h in job["hosts"]}[victim] == "quarantined"
    resumed = min(t["first_step_at"] for t in job["tasks"])
    print(f"\n[timing] link down to training resumed on a spare: {resumed - cut_at:.2f}s")
    # The spare kept a standby for the task it took over, and a task that moved to the other
    # host took the standby of the one that left it: every task restarted warm.
    assert "h2 keeps 1 standby(s) warm as a spare" in events_text(cli, job["id"])
    for task in job["tasks"]:
        starts = cli("logs", job["id"], "--task", str(task["index"]), "--grep", "(warm|cold) start")
        assert "warm start" in starts.out.splitlines()[-1], starts.out


@pytest.mark.slow
def test_a_dropped_host_that_comes_back_rejoins_at_an_epoch_boundary_with_regrow(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """(c) No spare, min_workers = 2 of 3: past host_wait the job goes on with two workers,
    from the checkpoint the three left; with regrow on, h2 rejoins once it is back."""
    sections = (
        "[supervision]\nhost_wait = 3.0\n\n"
        "[restart]\nbackoff = 0.5\nmin_workers = 2\nregrow = true\n"
    )
    path = plain_training_toml(bed, tmp_path, 40, sections)
    path.write_text(path.read_text().replace("connect_timeout = 5.0", "connect_timeout = 2.0"))
    victim = bed.hosts[2]
    proc, running = launch_and_wait_for_epoch(cli, path, 2)
    try:
        link(victim, "down")
        try:
            wait_for(lambda: "going on with 2 of 3" in events_text(cli, running["id"]), 90)
            shrunk = wait_for(
                lambda: (
                    len((j := job_view(cli, running["id"]))["tasks"]) == 2
                    and all(t["step"] > 0 for t in j["tasks"])
                    and j
                ),
                90,
            )
            assert isinstance(shrunk, dict)
            assert [t["host"] for t in shrunk["tasks"]] == ["h0", "h1"] and shrunk["width"] == 2
            assert all(t["initial_epoch"] > 0 for t in shrunk["tasks"])  # the three's checkpoint
            assert {h["name"]: h["role"] for h in shrunk["hosts"]}["h2"] == "out"
        finally:
            link(victim, "up")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        link(victim, "up")
    assert proc.returncode == 0, out[-3000:] + err
    job = status_json(cli, running["id"])["jobs"][0]
    assert job["state"] == "succeeded" and job["width"] == 3
    assert job["restarts"] >= 2 and job["preemptions"] == 1  # the regrow is not counted
    events = events_text(cli, job["id"])
    assert "going on with 2 of 3 worker(s), without h2" in events
    assert "h2 reachable again" in events and "back to 3 worker(s)" in events
    report = json.loads(cli("report", job["id"], "--json").out)
    assert [w["workers"] for w in report["width"]] == [3, 2, 3]
    assert wait_for(lambda: no_job_process_left(bed), 30)


def test_stop_with_a_host_cut_off_confirms_only_what_it_reached_and_a_later_stop_finishes(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    path = fake_toml(bed, tmp_path, ["--mode", "sleep"])
    path.write_text(path.read_text().replace("connect_timeout = 5.0", "connect_timeout = 2.0"))
    job_id = launch_detached(cli, path, reap_pids)
    wait_for(lambda: all(t["state"] == "running" for t in job_view(cli, job_id)["tasks"]), 60)
    victim = bed.hosts[2]
    assert processes_in(victim.namespace, AGENT) != []
    subprocess.run(["ip", "link", "set", victim.veth, "down"], check=True)
    try:
        first = cli("stop", job_id)

        assert first.code == 1, first
        assert len(first.err.strip().splitlines()) == 1 and "h2 unreachable" in first.err
        job = job_view(cli, job_id)
        assert job["state"] == "stopping" and "h2" in job["last_cause"]
        states = {t["host"]: t["state"] for t in job["tasks"]}
        assert states == {"h0": "stopped", "h1": "stopped", "h2": "unreachable"}
        for host in bed.hosts[:2]:  # what could be reached was really stopped
            assert processes_in(host.namespace, AGENT) == []
        assert processes_in(victim.namespace, AGENT) != []  # and this one was not
        # Cut off from the coordinator and every peer, it stops by itself (orphan timeout).
        assert wait_for(lambda: processes_in(victim.namespace, AGENT) == [], 40)
    finally:
        subprocess.run(["ip", "link", "set", victim.veth, "up"], check=True)

    second = cli("stop", job_id)

    assert second.code == 0, second
    job = job_view(cli, job_id)
    assert job["state"] == "stopped"
    assert {t["state"] for t in job["tasks"]} == {"stopped"}
    assert wait_for(lambda: no_job_process_left(bed), 15)


WARM = re.compile(r"warm start: the standby \(pid (\d+)\) runs the entrypoint")


def kept_per_host(cli: Callable[..., CliResult], path: Path) -> dict[str, list[dict]]:
    result = cli("standbys", str(path), "--json")
    assert result.code == 0, result
    hosts = json.loads(result.out)["hosts"]
    assert all(h["error"] is None for h in hosts), hosts
    return {h["host"]: h["keepers"] for h in hosts}


@pytest.mark.slow
def test_a_relaunch_starts_each_task_in_the_standby_its_own_host_kept(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """The edit-run loop over SSH, with a script that imports nothing of ours: a job stopped once
    its standbys are ready leaves one kept on each host (`orchestrate standbys` asks each host
    through its helper); the next launch starts each task in the standby of its own host, inside
    that host's network, and trains."""
    path = plain_training_toml(bed, tmp_path, 500, "[restart]\nstandby_delay = 0\n")
    first = launch_detached(cli, path, reap_pids)

    def all_ready() -> bool:
        keepers = kept_per_host(cli, path)
        return len(keepers) == 3 and all(
            any(k["standby_ready"] for k in found) for found in keepers.values()
        )

    wait_for(all_ready, 240, interval=1.0)
    assert cli("stop", first).code == 0
    assert wait_for_end(cli, first, 60)["state"] == "stopped"
    kept = {
        host: [k for k in found if k["state"] == "kept"]
        for host, found in kept_per_host(cli, path).items()
    }
    for host in bed.hosts:
        (keeper,) = kept[host.name]
        reap_pids.extend([keeper["pid"], keeper["standby"]])
        assert keeper["standby"] in processes_in(host.namespace, "--standby"), host.name

    path = plain_training_toml(bed, tmp_path, 2, "")
    second = launch_detached(cli, path, reap_pids)
    job = wait_for_end(cli, second, 240)
    assert job["state"] == "succeeded", job["last_cause"]
    for task in job["tasks"]:
        log = (tmp_path / "shared" / second / "logs" / f"worker-{task['index']}.log").read_text()
        warm = WARM.search(log)
        assert warm, log
        assert int(warm[1]) == kept[task["host"]][0]["standby"], (task["host"], kept)
    assert wait_for(lambda: no_job_process_left(bed), 15)
