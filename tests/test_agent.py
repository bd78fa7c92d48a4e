"""The real agent process with a stand-in trainer: status, exit codes, signals, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_for
from worker.proctl import HURRY, is_alive
from worker.spec import AgentState, TaskStatus, WorkerSpec

FAKE = Path(__file__).parent / "fixtures" / "fake_trainer.py"


def _start(
    tmp_path: Path, mode: str, grace: float = 5.0
) -> tuple[subprocess.Popen[bytes], WorkerSpec]:
    spec = WorkerSpec(
        job_id="job-1",
        task_index=0,
        host_label="local",
        tf_config={"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}},
        argv=[sys.executable, str(FAKE), "--mode", mode],
        env={"NASTY": "a'b"},
        workdir=str(tmp_path),
        shared_dir=str(tmp_path / "shared"),
        heartbeat_interval=0.1,
        stop_grace=grace,
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.to_json())
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.agent", str(spec_path)], start_new_session=True
    )
    return proc, spec


def _status(spec: WorkerSpec) -> TaskStatus | None:
    path = Path(spec.layout.status_path(0))
    return TaskStatus.from_json(path.read_bytes()) if path.exists() else None


def _trainer_pid(spec: WorkerSpec) -> int:
    path = Path(spec.layout.task_dir(0)) / "trainer.pid"
    wait_for(path.exists, 20)
    return int(path.read_text())


def test_success_writes_final_status_log_and_progress(tmp_path: Path) -> None:
    proc, spec = _start(tmp_path, "ok")
    assert proc.wait(timeout=30) == 0
    status = _status(spec)
    assert status is not None
    assert status.state == AgentState.SUCCEEDED and status.exit_code == 0
    assert status.progress.step == 5 and status.progress.loss == 0.25
    assert status.seq >= 2
    log = Path(spec.layout.log_path(0)).read_text()
    assert 'env="a\'b"' in log and "partial line without newline... completed" in log
    assert "trainer exited with code 0" in log


def test_an_attempt_after_one_that_ended_mid_line_starts_on_a_line_of_its_own(
    tmp_path: Path,
) -> None:
    log = tmp_path / "shared" / "job-1" / "logs" / "worker-0.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"attempt 0's last line, cut sho")
    proc, spec = _start(tmp_path, "ok")
    assert Path(spec.layout.log_path(0)) == log
    assert proc.wait(timeout=30) == 0
    first, second = log.read_text().splitlines()[:2]
    assert first == "attempt 0's last line, cut sho"
    assert second.startswith("[orchestrate] attempt 0: worker-0 on local starting")


def test_failure_exit_code_is_propagated(tmp_path: Path) -> None:
    proc, spec = _start(tmp_path, "fail:7")
    assert proc.wait(timeout=30) == 7
    status = _status(spec)
    assert status is not None and status.state == AgentState.FAILED and status.exit_code == 7


@pytest.mark.parametrize(
    ("mode", "grace", "signals"),
    [
        ("ignore-term", 1.0, [signal.SIGTERM]),  # the grace runs out
        ("checkpoint-on-term:30:42", 30.0, [signal.SIGTERM, HURRY]),  # the grace ends early
    ],
)
def test_a_trainer_still_running_past_the_grace_is_killed(
    tmp_path: Path, mode: str, grace: float, signals: list[int]
) -> None:
    proc, spec = _start(tmp_path, mode, grace=grace)
    try:
        trainer = _trainer_pid(spec)
        wait_for(lambda: (s := _status(spec)) and s.state == AgentState.RUNNING, 10)
        for signum in signals:
            proc.send_signal(signum)
            time.sleep(0.2)
        assert proc.wait(timeout=15) == 128 + signal.SIGKILL
        assert not is_alive(trainer)
        status = _status(spec)
        assert status is not None and status.state == AgentState.STOPPED
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_trainer_dies_with_a_sigkilled_agent(tmp_path: Path) -> None:
    proc, spec = _start(tmp_path, "sleep")
    trainer = _trainer_pid(spec)
    try:
        assert is_alive(trainer)
        proc.kill()
        proc.wait(timeout=10)
        wait_for(lambda: not is_alive(trainer), 10)
    finally:
        if is_alive(trainer):
            os.kill(trainer, signal.SIGKILL)


def test_a_second_sigterm_within_the_grace_leaves_the_trainer_its_checkpoint(
    tmp_path: Path,
) -> None:
    """Slurm signals every process of a step, and may do so twice (its --signal warning, then
    an scancel or a preemption): the trainer still ends its epoch and exits to be restarted."""
    proc, spec = _start(tmp_path, "checkpoint-on-term:1.5:42", grace=10.0)
    try:
        _trainer_pid(spec)
        wait_for(lambda: (s := _status(spec)) and s.state == AgentState.RUNNING, 10)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 42
        status = _status(spec)
        assert status is not None and status.exit_code == 42
        assert status.state == AgentState.FAILED  # the coordinator's cue for a preemption
        log = Path(spec.layout.log_path(0)).read_text()
        assert "checkpointed after 1 SIGTERM(s)" in log  # forwarded once
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("bad_argv", [["/no/such/python"]])
def test_unstartable_trainer_fails_cleanly(tmp_path: Path, bad_argv: list[str]) -> None:
    spec = WorkerSpec(
        job_id="job-2",
        task_index=0,
        host_label="local",
        tf_config={},
        argv=bad_argv,
        workdir=str(tmp_path),
        shared_dir=str(tmp_path / "shared"),
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.to_json())
    code = subprocess.call([sys.executable, "-m", "worker.agent", str(spec_path)], timeout=30)
    assert code == 127
    assert (s := _status(spec)) is not None and s.state == AgentState.FAILED
    assert "cannot start trainer" in Path(spec.layout.log_path(0)).read_text()


NESTED_SIGNALS = """
import os, signal, sys, threading
from worker.proctl import not_nested
stop = threading.Event()
calls = []
def handler(signum, frame):
    calls.append(signum)
    stop.set()  # takes the Event's lock, as the agent's and the supervisor's handlers do
    if len(calls) == 1:  # a second SIGTERM arrives while the first handler runs
        with stop._cond:  # the lock held, as inside Event.set
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(200000))  # bytecodes: where Python runs a pending handler
signal.signal(signal.SIGTERM, not_nested(handler) if sys.argv[1] == "wrapped" else handler)
threading.Timer(5, lambda: os._exit(3)).start()  # the main thread deadlocked
os.kill(os.getpid(), signal.SIGTERM)
stop.wait(5)
os._exit(0)
"""


@pytest.mark.parametrize(("mode", "code"), [("bare", 3), ("wrapped", 0)])
def test_a_second_signal_inside_a_handler_does_not_deadlock_it(mode: str, code: int) -> None:
    """The hang behind Slurm's time-limit test: two SIGTERMs at once (Slurm's and the agent's
    forward), the second run inside the first handler while it held threading.Event's lock."""
    proc = subprocess.run([sys.executable, "-c", NESTED_SIGNALS, mode], cwd=REPO, timeout=30,
                          check=False)  # fmt: skip
    assert proc.returncode == code
