"""Shared fixtures: an isolated ORCHESTRATE_HOME, cluster.toml writers, CLI runners."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.beds import checked_signal

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fixtures" / "fake_trainer.py"  # a trainer without TensorFlow
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private state directory for this test (the store and the coordinator's job files)."""
    path = tmp_path / "home"
    monkeypatch.setenv("ORCHESTRATE_HOME", str(path))
    return path


@pytest.fixture
def cli(home: Path) -> Callable[..., CliResult]:
    """Run the real `orchestrate` entry point in a subprocess, as a user would."""

    def run(*args: str, timeout: float = 240, env: dict[str, str] | None = None) -> CliResult:
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            cwd=REPO,
            check=False,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[str], Path]:
    def write(text: str, name: str = "cluster.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


def status_json(run: Callable[..., CliResult], job: str | None = None) -> dict:
    result = run("status", *([job] if job else []), "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.2) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def fake_job(tmp_path: Path, args: list[str], workers: int = 2, extra: str = "") -> str:
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    return f"""
[job]
name = "fake"
shared_dir = "{shared}"

[entrypoint]
script = "{FAKE}"
args = {json.dumps(args)}
env = {{ NASTY = "; $(x) ' \\" \\\\ and spaces" }}

[backend]
type = "local"
workers = {workers}

[supervision]
heartbeat_interval = 0.2
stop_grace = 2.0
poll_interval = 0.1
{extra}
"""


def two_worker_config(
    tmp_path: Path, name: str, entrypoint: str, *, supervision: str = "", restart: str = ""
) -> Path:
    """A 2-worker local job with fast supervision; `entrypoint` is the body of [entrypoint]."""
    path = tmp_path / "cluster.toml"
    path.write_text(
        f"""
[job]
name = "{name}"
shared_dir = "{tmp_path / "shared"}"

[entrypoint]
{entrypoint}

[backend]
type = "local"
workers = 2

[supervision]
heartbeat_interval = 0.5
stop_grace = 5.0
{supervision}

[restart]
backoff = 0.2
{restart}
"""
    )
    return path


def job_view(cli: Callable[..., CliResult], job_id: str) -> dict:
    return status_json(cli, job_id)["jobs"][0]


def launch_detached(
    cli: Callable[..., CliResult], path: Path, reap: list[int], env: dict[str, str] | None = None
) -> str:
    result = cli("launch", "--detach", str(path), env=env)
    assert result.code == 0, result
    job = status_json(cli)["jobs"][0]
    reap.append(job["supervisor"]["pid"])
    return job["id"]


def wait_for_end(cli: Callable[..., CliResult], job_id: str, timeout: float = 240) -> dict:
    def ended() -> dict | None:
        job = job_view(cli, job_id)
        return job if job["state"] in ("succeeded", "failed", "stopped") else None

    return wait_for(ended, timeout, interval=0.5)  # type: ignore[return-value]


def job_processes(job_id: str) -> list[int]:
    """Every live process of a job, found from /proc: agents by their spec path, standby
    keepers serving it (their own record, worker.warm.registry; a keeper that keeps its standby for
    the next job serves none), trainers by the ORCHESTRATE_JOB_ID in their environment, warm
    trainers by their keeper's record. Whatever attempt started them."""
    from worker.proctl import is_alive
    from worker.warm.registry import entries

    serving = {e.pid for e in entries(every_host=True) if e.job == job_id}
    serving |= {e.trainer for e in entries(every_host=True) if e.job == job_id and e.trainer}
    found = []
    needle = f"ORCHESTRATE_JOB_ID={job_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        argv = cmdline.split(b"\0")
        if len(argv) > 1 and argv[1].endswith(
            b"/worker/warm/keeper.py"
        ):  # named for the job that made it
            ours = int(entry.name) in serving
        else:
            ours = f"/{job_id}/tasks/".encode() in cmdline or needle in environ.split(b"\0")
            ours = ours or int(entry.name) in serving
        if ours and is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def ssh_testbed(
    factory: pytest.TempPathFactory, hosts: int, epochs: int, name: str = "testbed"
) -> Iterator[Any]:
    """tests/beds/ssh.py's hosts (network namespaces running sshd), torn down afterwards;
    skipped with the reason outside CI when this machine cannot make them, failed under CI."""
    from tests.beds import ssh as tb

    reason = tb.missing_requirements()
    if reason:
        if IN_CI:
            pytest.fail(f"SSH test bed unavailable under CI: {reason}")
        pytest.skip(f"SSH test bed unavailable: {reason}")
    root = factory.mktemp(name)
    bed = tb.up(hosts, root, epochs=epochs)
    try:
        yield bed
    finally:
        tb.down(root)


@pytest.fixture(autouse=True)
def no_standby_kept_past_the_test() -> Iterator[None]:
    """Every test starts as on a fresh machine: no standby is kept for a next job ([restart]
    keep_standbys; a cache), and those a test's jobs kept end with it, on every host of its
    test beds too."""
    from worker.warm.registry import clear

    clear(every_host=True, kept_only=False)
    yield
    clear(every_host=True, kept_only=False)


class Reaped(list[int]):
    """Pids a test started (directly or through orchestrate), each with its identity when it
    was added: at teardown only a process still holding that identity is killed (a pid that
    ended and was reused meanwhile is someone else's)."""

    def __init__(self) -> None:
        super().__init__()
        self.identities: dict[int, str] = {}

    def append(self, pid: int) -> None:
        from worker.proctl import identity

        super().append(pid)
        if isinstance(pid, int) and pid > 1 and pid not in self.identities:
            self.identities[pid] = identity(pid) or ""

    def extend(self, pids: Iterable[int]) -> None:
        for pid in pids:
            self.append(pid)

    def kill_the_same(self) -> None:
        """SIGKILL each that is still the process added (and its group, when it leads one),
        through a pidfd opened before the check."""
        from worker.proctl import identity

        for pid, ident in self.identities.items():
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if not ident or identity(pid) != ident:
                    continue
                if os.getpgid(pid) == pid:  # it leads its group: the group is its own
                    with contextlib.suppress(OSError):
                        os.killpg(pid, 9)
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, 9)
            except OSError:
                continue
            finally:
                os.close(fd)


@pytest.fixture
def reap_pids() -> Iterator[Reaped]:
    """Pids a test started: SIGKILLed at teardown if still the same processes."""
    pids = Reaped()
    yield pids
    pids.kill_the_same()


def signal_job_process(pid: int, job_id: str, sig: int, gone_ok: bool = False) -> None:
    """Signal a process of this test's job, checked right before through a pidfd (> 1, alive,
    the job's id in its environment, its warm trainer, or the standby of a keeper serving the
    job): a pid reused by anyone else is never signalled (tests/beds/checked_signal.py)."""
    checked_signal.signal_job_process(pid, job_id, sig, gone_ok)


def signal_supervisor(pid: int, job_id: str, sig: int) -> None:
    """Signal the job's background supervisor (its command line names the job), checked."""
    checked_signal.signal_supervisor(pid, job_id, sig)


def python_without_orchestrate(where: Path) -> Path:
    """An interpreter with this environment's TensorFlow, tf-keras (and the rest of its
    site-packages) but not orchestrate, as a host that never installed it: a venv whose one
    .pth names our site-packages (Python reads no .pth, such as the editable install's, from
    a directory that a .pth names)."""
    venv = where / "python-without-orchestrate"
    subprocess.run(
        [getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip",
         str(venv)], check=True, timeout=120,
    )  # fmt: skip
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / version / "site-packages"
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = venv / "bin" / "python"
    for module in ("worker", "orchestrator"):
        probe = subprocess.run([python, "-c", f"import {module}"], cwd="/", capture_output=True)
        assert probe.returncode != 0, f"{python} can import {module}"
    return python


def python_with_env(path: Path, python: Path | str, env: dict[str, str]) -> Path:
    """A wrapper at path that runs python with env set (as a host's own profile would)."""
    sets = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    path.write_text(f'#!/bin/sh\nexport {sets}\nexec {python} "$@"\n')
    path.chmod(0o755)
    return path


# --- a second user on the host ------------------------------------------------------------


def as_nobody(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """`argv` as a second user (nobody): skipped where this is not root with setpriv, failed
    under CI."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        if IN_CI:
            pytest.fail("needs root and setpriv to act as a second user")
        pytest.skip("needs root and setpriv to act as a second user")
    return subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip


@pytest.fixture
def shared_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A /tmp of the test's own (mode 1777 like /tmp), for this process and its children."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        if IN_CI:
            pytest.fail("needs root and setpriv to act as a second user")
        pytest.skip("needs root and setpriv to act as a second user")
    path = Path(tempfile.mkdtemp(prefix="orch-shared-tmp-", dir="/tmp"))
    path.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def tf_image() -> Iterator[str]:
    """The test image (tests/images/tf_image.py: Debian's Python, TensorFlow, tf-keras,
    scikit-learn), built once if missing, and podman's settings for this host in the
    environment of everything the test starts; skipped with the reason outside CI."""
    why = None
    if shutil.which("podman") is None:
        why = "podman is not installed (apt-get install podman)"
    elif shutil.which("debootstrap") is None:
        why = "debootstrap is not installed (apt-get install debootstrap): the image is built"
    elif os.geteuid() != 0:
        why = "the image is built as root (debootstrap)"
    if why is not None:
        if IN_CI:
            pytest.fail(f"container tests under CI: {why}")
        pytest.skip(why)
    from tests.images.tf_image import ensure_image, podman_env

    name, seconds = ensure_image()
    if seconds is not None:
        print(f"built {name} in {seconds:.0f} s")
    with pytest.MonkeyPatch.context() as patch:  # the CLI, supervisors and agents inherit it
        for key, value in podman_env(name).items():
            patch.setenv(key, value)
        yield name


@pytest.fixture(scope="module")
def docker_image(tf_image: str) -> Iterator[str]:
    """The test image in a Docker daemon of the suite's own (tests/images/docker_daemon.py),
    DOCKER_HOST set for everything the test starts; skipped with the reason outside CI."""
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        why = "Docker is not installed (apt-get install docker.io)"
        if IN_CI:
            pytest.fail(f"Docker tests under CI: {why}")
        pytest.skip(why)
    from tests.images.docker_daemon import docker_daemon, load_image

    with docker_daemon() as env, pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        load_image(tf_image, env)
        yield tf_image


def containers_of(job_id: str) -> list[str]:
    out = subprocess.run(
        ["podman", "ps", "--all", "--quiet", "--filter", f"label=orchestrate.job={job_id}"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return out.stdout.split()


class Terminal:
    """A command run in a pseudo-terminal of its own, as from a laptop's SSH session: the
    leader of its own session, with the terminal as its controlling one. What it prints is
    read as it comes (and kept); `hang_up` closes the terminal, as a dropped connection
    does, and the kernel sends the command SIGHUP."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        import fcntl
        import pty
        import termios

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO,
            env={**os.environ, "TERM": "xterm", **(env or {})},
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )  # fmt: skip
        os.close(slave)
        self.output = bytearray()
        self._open = threading.Event()
        self._open.set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        import select

        while self._open.is_set():
            if select.select([self.master], [], [], 0.1)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                self.output += chunk

    def hang_up(self) -> None:
        if self._open.is_set():
            self._open.clear()
            self._reader.join()
            os.close(self.master)

    def close(self) -> None:
        """Hang up, and end the command if it is still ours and running."""
        self.hang_up()
        if self.proc.poll() is None and self.proc.pid > 1:
            self.proc.kill()
            self.proc.wait(timeout=30)
