"""The worker package shipped, with real processes: a copy in use is never pruned, the SSH
helper's loader asks for the package once and serves from its copy, and a program runs from a
copy with nothing installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.transport import worker_package
from tests.conftest import (
    CliResult,
    as_nobody,
    python_without_orchestrate,
    two_worker_config,
)
from worker import ship


def _copy(root: Path, n: int, age: float) -> str:
    name = f"worker-{n:020x}"
    (root / name / "worker").mkdir(parents=True)
    then = time.time() - age
    os.utime(root / name, (then, then))
    return name


def test_pruning_keeps_the_newest_the_recent_and_those_in_use(tmp_path: Path) -> None:
    day = ship.IDLE_BEFORE_PRUNE
    old = [_copy(tmp_path, n, age=2 * day + n) for n in range(6)]  # old[0] the newest
    recent = _copy(tmp_path, 99, age=60)
    (tmp_path / ".tmp-stale").mkdir()
    os.utime(tmp_path / ".tmp-stale", (time.time() - 7200,) * 2)
    (tmp_path / ".tmp-fresh").mkdir()
    # A process of ours whose command line names the oldest copy (as an agent's does).
    user = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path / old[5] / "worker")]
    )
    try:
        ship.prune(str(tmp_path), keep=_copy(tmp_path, 100, age=0))
    finally:
        user.kill()
        user.wait()
    left = {p.name for p in tmp_path.iterdir()}
    # Kept: the one installed, the KEEP newest others (the recent one and old[0..1]), the one
    # in use, and a fresh unpacking.
    assert left == {f"worker-{100:020x}", recent, old[0], old[1], old[5], ".tmp-fresh"}


def _helper(cache: Path) -> subprocess.Popen[bytes]:
    argv = worker_package.helper_argv(sys.executable)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        cwd="/",
    )  # fmt: skip


def test_the_helper_stub_asks_for_the_package_once_then_serves_from_its_copy(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "orchestrate" / f"worker-{worker_package.digest()}"
    for asks in (True, False):
        helper = _helper(tmp_path)
        assert helper.stdin is not None and helper.stdout is not None
        if asks:
            assert json.loads(helper.stdout.readline()) == {"need": 1}
            payload = worker_package.payload()
            helper.stdin.write(b"%d\n" % len(payload) + payload)
            helper.stdin.flush()
        ready = json.loads(helper.stdout.readline())
        assert ready == {"ready": 1, "root": str(copy)}
        request = {"id": 7, "op": "alive", "args": {"pids": [helper.pid], "idents": [""]}}
        helper.stdin.write(json.dumps(request).encode() + b"\n")
        helper.stdin.flush()
        assert json.loads(helper.stdout.readline()) == {"id": 7, "ok": True, "result": [helper.pid]}
        helper.stdin.close()
        assert helper.wait(30) == 0
    assert (copy / "worker" / "hostd.py").read_bytes() == (
        Path(ship.__file__).with_name("hostd.py").read_bytes()
    )


def test_the_helper_stub_given_a_broken_package_says_so_and_installs_nothing(
    tmp_path: Path,
) -> None:
    helper = _helper(tmp_path)
    out, err = helper.communicate(b"5\nabcde", timeout=30)
    assert helper.returncode == 1
    assert out == b'{"need": 1}\n'
    assert err.decode().startswith("cannot install the worker package: ")
    assert [p.name for p in (tmp_path / "orchestrate").iterdir()] == []


def test_a_program_runs_from_a_copy_with_nothing_installed(tmp_path: Path) -> None:
    copy = ship.install(str(tmp_path), worker_package.digest(), worker_package.payload())
    argv = worker_package.program_argv(sys.executable, copy, "proctl")
    # -I: no site-packages, no PYTHONPATH, no current directory: only the copy has `worker`.
    run = subprocess.run([argv[0], "-I", *argv[1:]], capture_output=True, text=True, cwd="/")
    assert run.returncode == 2 and "usage: python -m worker.proctl" in run.stderr


def test_caches_another_user_prepared_are_never_used_and_ours_are_closed_to_them(
    shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second user makes the places our copy would go first (a cache directory open to
    writes, and our /tmp directory): nothing is installed there, the refusal names both; the
    copy we do install cannot be read or written by them."""
    planted = shared_tmp / "their-cache"
    env = {"PATH": os.environ["PATH"]}
    for place in (planted, shared_tmp / f"orchestrate-{os.getuid()}"):
        made = as_nobody(["sh", "-c", f"mkdir -m 777 {place}"], env)
        assert made.wait(10) == 0, made.stdout.read() if made.stdout else ""
    monkeypatch.setenv("XDG_CACHE_HOME", str(planted))
    with pytest.raises(OSError) as refused:
        ship.install_somewhere(worker_package.digest(), worker_package.payload())
    assert (
        str(refused.value).count("belongs to uid 65534")
        + str(refused.value).count("not ours alone")
        == 2
    ), refused.value
    assert list(planted.iterdir()) == []
    assert list((shared_tmp / f"orchestrate-{os.getuid()}").iterdir()) == []
    # Our own cache: the second user can neither list it nor put a file in it.
    mine = shared_tmp / "mine"  # open to look into, as a home often is
    mine.mkdir(mode=0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(mine))
    copy = ship.install_somewhere(worker_package.digest(), worker_package.payload())
    for attempt in (["ls", copy], ["touch", f"{copy}/worker/evil.py"]):
        tried = as_nobody(attempt, env)
        assert tried.wait(10) != 0, attempt
    assert not Path(copy, "worker", "evil.py").exists()


@pytest.mark.slow
def test_an_uninstrumented_module_of_ours_runs_on_a_python_without_orchestrate(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """No bootstrap puts the shipped copy on the trainer's path with `instrument = false`:
    the agent appends it to PYTHONPATH, so `-m worker....` is found as where it is installed."""
    bare = python_without_orchestrate(tmp_path)
    path = two_worker_config(
        tmp_path, "bare", 'module = "worker.proctl"\nargs = ["alive", "1"]\ninstrument = false'
    )
    path.write_text(path.read_text().replace("workers = 2", f'workers = 2\npython = "{bare}"'))
    result = cli("launch", "--plain", str(path), timeout=120)
    assert result.code == 0, result.out[-2000:] + result.err[-1000:]
    assert "[worker-1 local] 1" in result.out  # proctl's answer: pid 1 is alive


def test_a_host_clock_days_ahead_prunes_nothing_used_recently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ages count from the copy just used (the same clock stamped every copy), not from this
    host's clock: one three days ahead sees recently used copies as recent."""
    recent = [_copy(tmp_path, n, age=60 + n) for n in range(6)]
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3 * 86400)
    ship.prune(str(tmp_path), keep=_copy(tmp_path, 100, age=0))
    assert set(recent) <= {p.name for p in tmp_path.iterdir()}


def test_the_helper_refuses_to_start_from_a_copy_edited_since_and_the_next_installs_it(
    tmp_path: Path,
) -> None:
    """A helper lives as long as its connection: a copy edited meanwhile (worker/spec.py, which
    every agent and trainer imports) is found at the next start, not run."""
    copy = tmp_path / "orchestrate" / f"worker-{worker_package.digest()}"
    ship.install(str(copy.parent), worker_package.digest(), worker_package.payload())
    helper = _helper(tmp_path)
    assert helper.stdin is not None and helper.stdout is not None
    assert json.loads(helper.stdout.readline()) == {"ready": 1, "root": str(copy)}
    spec = copy / "worker" / "spec.py"
    spec.write_bytes(spec.read_bytes() + b"\nraise SyntaxError('edited')\n")
    request = {
        "id": 1,
        "op": "start",
        "args": {"argv": ["true"], "log_path": str(tmp_path / "agent.log"), "env": {}},
    }
    helper.stdin.write(json.dumps(request).encode() + b"\n")
    helper.stdin.flush()
    reply = json.loads(helper.stdout.readline())
    assert reply["ok"] is False and "changed after it was installed" in reply["error"], reply
    assert helper.wait(30) == 1  # the channel closes: the coordinator starts a new helper
    assert not copy.exists() and not (tmp_path / "agent.log").exists()
    again = _helper(tmp_path)
    out, _ = again.communicate(b"", timeout=30)
    assert out == b'{"need": 1}\n'


def test_a_shared_dir_another_user_may_write_is_refused_for_slurm_copies(
    shared_tmp: Path,
) -> None:
    """In a shared_dir others may write, another user swaps `.orchestrate` after our check
    (shown here), and every task of the step would run their code as us: copy_under refuses
    such a shared_dir, and one that belongs to another user; in ours alone they cannot."""
    env = {"PATH": os.environ["PATH"]}
    shared = shared_tmp / "project"
    shared.mkdir()
    shared.chmod(0o777)
    root = shared / ".orchestrate"
    ship.install(
        str(root), worker_package.digest(), worker_package.payload()
    )  # as a check would find it
    swap = f"mv {root} {shared}/.mine && mkdir -p {root}/worker-{worker_package.digest()}/worker"
    swapped = as_nobody(["sh", "-c", swap], env)
    assert swapped.wait(10) == 0, swapped.stdout.read() if swapped.stdout else ""
    assert root.stat().st_uid == 65534  # theirs, where the step's argv points
    with pytest.raises(ship.UnsafeCache, match=f"chmod g-w,o-w {shared}"):
        worker_package.copy_under(str(root))
    # A shared_dir of another user's (its owner may swap what is in it) is refused too.
    theirs = shared_tmp / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ship.UnsafeCache, match="uid 65534"):
        worker_package.copy_under(str(theirs / ".orchestrate"))
    assert list(theirs.iterdir()) == []
    # Ours alone: the copy goes there and the other user cannot move it away.
    mine = shared_tmp / "mine"
    mine.mkdir(mode=0o755)
    copy = worker_package.copy_under(str(mine / ".orchestrate"))
    moved = as_nobody(["mv", str(mine / ".orchestrate"), str(mine / ".gone")], env)
    assert moved.wait(10) != 0
    assert ship.intact(copy, worker_package.digest())
