"""Taking a task's Python stacks (worker/stacks.py) from a live process that waits in a
function of its own: through the handler the bootstrap installs (faulthandler), and with
py-spy; a process without the handler is never signalled; the host helper asks only our agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker import hostd, stacks
from worker.proctl import identity

CHILD = """
import sys, time
sys.path.insert(0, {repo!r})
from worker import stacks
if {handler}:
    stacks.install_in_trainer({task_dir!r}, "0")


def wait_for_batch():
    # one line: the stacks name it whether they are taken before the sleep or during it
    print("waiting", flush=True); time.sleep(600)


wait_for_batch()
"""
VENV_BIN = str(Path(sys.executable).parent)
JOB = "stacks-test-job"


@pytest.fixture
def child(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str]]:
    script = tmp_path / "child.py"
    repo = str(Path(__file__).resolve().parent.parent)
    script.write_text(CHILD.format(repo=repo, handler=request.param, task_dir=str(tmp_path)))
    env = {**os.environ, "ORCHESTRATE_JOB_ID": JOB}  # as every process of a job has
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
    yield proc
    proc.kill()
    proc.wait()


def _path_without_py_spy(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = [p for p in os.environ["PATH"].split(os.pathsep) if p != VENV_BIN]
    monkeypatch.setenv("PATH", os.pathsep.join(kept))


@pytest.mark.parametrize("child", [True], indirect=True)
def test_the_trainers_own_handler_writes_every_thread_and_names_the_scripts_function(
    child: subprocess.Popen[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _path_without_py_spy(monkeypatch)
    path = stacks.stacks_path(tmp_path, 0)
    said = stacks.take(child.pid, path, JOB)
    assert said == f"Python stacks of every thread before the stop: {path}"
    text = path.read_text()
    assert "Current thread 0x" in text and 'child.py", line 11 in wait_for_batch' in text
    assert stacks.where(text, [str(tmp_path)]) == "child.py:11 wait_for_batch"
    assert child.poll() is None  # the handler wrote; the trainer goes on


@pytest.mark.parametrize("child", [False], indirect=True)
def test_py_spy_takes_them_from_any_python_process_with_full_file_names(
    child: subprocess.Popen[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", os.pathsep.join([VENV_BIN, os.environ["PATH"]]))
    path = stacks.stacks_path(tmp_path, 0)
    assert stacks.take(child.pid, path, JOB) == (
        f"Python stacks of every thread (py-spy) before the stop: {path}"
    )
    text = path.read_text()
    assert f"wait_for_batch ({tmp_path}/child.py:11)" in text
    assert stacks.where(text, [str(tmp_path)]) == "child.py:11 wait_for_batch"


@pytest.mark.parametrize("child", [True], indirect=True)
def test_a_stopped_trainer_is_said_at_once_not_waited_for(
    child: subprocess.Popen[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOPped (as the chaos soak hangs a trainer), its handler cannot run: no wait for a
    dump that cannot come, and the stop that follows is not held up."""
    _path_without_py_spy(monkeypatch)
    path = stacks.stacks_path(tmp_path, 0)
    child.send_signal(signal.SIGSTOP)  # our own child, not reaped: its pid is its own
    try:
        assert wait_for_state(child.pid, "T")

        def no_wait(seconds: float) -> None:
            raise AssertionError(f"waited {seconds} s for a dump that cannot come")

        monkeypatch.setattr(stacks.time, "sleep", no_wait)
        said = stacks.take(child.pid, path, JOB)
        assert said == "no Python stacks: the trainer is stopped (SIGSTOP or a debugger)"
        assert path.read_text() == ""
    finally:
        child.send_signal(signal.SIGCONT)


def wait_for_state(pid: int, state: str) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == state:
                return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("child", [False], indirect=True)
def test_a_trainer_without_the_handler_is_never_signalled(
    child: subprocess.Popen[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _path_without_py_spy(monkeypatch)
    said = stacks.take(child.pid, stacks.stacks_path(tmp_path, 0), JOB)
    assert said == "no Python stacks: py-spy is not on this host and the trainer has no handler"
    assert child.poll() is None  # SIGUSR2's default would have ended it


@pytest.mark.parametrize("child", [False], indirect=True)
def test_the_host_helper_asks_only_the_process_it_was_named(
    child: subprocess.Popen[str],
) -> None:
    # Not our agent (its identity differs): no signal, which would have ended it.
    assert hostd.handle("ask_stacks", {"pid": child.pid, "ident": "not-its-identity"}) is False
    assert child.poll() is None
    assert identity(child.pid) is not None


def test_a_dump_says_where_when_no_frame_is_the_scripts() -> None:
    gc = "Current thread 0x00007f (most recent call first):\n  Garbage-collecting\n  <no Python frame>\n"
    assert stacks.where(gc, ["/job"]) == "garbage collection (no Python frame)"
    lib = 'Thread 0x1 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
    assert stacks.where(lib, ["/job"]) == "library code (threading.py:320 wait)"
    assert stacks.where("", ["/job"]) is None
    site = '  File "/job/.venv/lib/python3.11/site-packages/x.py", line 3 in f\n'
    assert stacks.where("Thread 0x2 (most recent call first):\n" + site, ["/job"]) == (
        "library code (x.py:3 f)"
    )  # an installed package under the job's directory is not the script's own code


@pytest.mark.parametrize("child", [True], indirect=True)
def test_a_process_of_another_job_is_neither_signalled_nor_spied_on(
    child: subprocess.Popen[str], tmp_path: Path
) -> None:
    path = stacks.stacks_path(tmp_path, 0)
    assert stacks.take(child.pid, path, "another-job") == "no Python stacks: the trainer is gone"
    assert path.read_text() == "" and child.poll() is None
    assert stacks.take(1, path, JOB) == "no Python stacks: the trainer is gone"  # never pid 1


def test_a_dump_a_trainer_wrote_itself_is_cut_short_and_made_printable() -> None:
    from orchestrator.supervision.hung_stacks import _plain

    hostile = (
        'Thread 0x1 (most recent call first):\n  File "/job/\x1b[2Jx.py", line 1 in ' + "f" * 5000
    )
    place = stacks.where(hostile, ["/job"])
    assert place is not None and len(_plain(place)) == 200 and "\x1b" not in _plain(place)


def test_the_stacks_event_is_never_the_text_a_trainer_planted(tmp_path: Path) -> None:
    """The done mark lives in the task's directory, which the trainer can write: a trainer
    that writes it first (with escapes and a forged message) does not choose the event's
    words, nor does its own dump."""
    from types import SimpleNamespace

    from orchestrator.backends.base import TaskHandle
    from orchestrator.supervision.hung_stacks import take_stacks
    from orchestrator.supervision.observations import FailureKind, failure
    from orchestrator.transport.local import LocalTransport
    from worker.spec import JobLayout

    layout = JobLayout(tmp_path, "job-1")
    transport = LocalTransport()
    # Each agent took the request (its trainer may then write anything).
    backend = SimpleNamespace(transport=lambda host: transport, ask_stacks=lambda task: True)
    agents = [TaskHandle(i, 0, "agent") for i in (0, 1)]
    for i, dump in ((0, b"Process 12 ...\nThread 0x1\n"), (1, b"")):
        task = Path(layout.task_dir(i))
        task.mkdir(parents=True)
        (task / "stacks-attempt-0.txt").write_bytes(dump)
        (task / "stacks-attempt-0.done").write_bytes(b"\x1b]0;pwned\x07job succeeded\n" * 3)
    events: list[tuple[str, str]] = []
    config = SimpleNamespace(entrypoint=SimpleNamespace(script=tmp_path / "t.py", workdir=None))
    take_stacks(backend, layout, config, SimpleNamespace(agents=agents, number=0),  # type: ignore[arg-type]
                failure(FailureKind.HUNG, "hung", (1,)), lambda k, m: events.append((k, m)))  # fmt: skip
    assert sorted(events) == [
        ("stacks", "worker-0: Python stacks of every thread (py-spy) before the stop: "
                   f"{layout.task_dir(0)}/stacks-attempt-0.txt"),
        ("stacks", "worker-1: no Python stacks (the task's log says why)"),
    ]  # fmt: skip
