"""The job state machine on its own, and what a supervisor does with an error it did not
foresee: it stops what it started and ends the job FAILED with the cause, never `running`."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.logs.logstream import LineSink
from orchestrator.state.job_records import register_job
from orchestrator.state.job_state import LEGAL, IllegalTransition, JobStateMachine, check_transition
from orchestrator.state.states import JobState
from orchestrator.state.store import Store
from orchestrator.supervision.supervisor import Supervisor
from tests.conftest import job_processes, wait_for

FAKE = Path(__file__).parent / "fixtures" / "fake_trainer.py"


def test_the_legal_transitions() -> None:
    # A launch that succeeds, a failure and a restart, an adoption, a stop.
    for path in (
        [JobState.PENDING, JobState.LAUNCHING, JobState.RUNNING, JobState.SUCCEEDED],
        [JobState.RUNNING, JobState.STOPPING, JobState.RESTARTING, JobState.RUNNING],
        [JobState.RESTARTING, JobState.STOPPING, JobState.FAILED],
        [JobState.STOPPING, JobState.RUNNING],  # attach to a job whose supervisor died there
        [JobState.RUNNING, JobState.STOPPING, JobState.STOPPED],
        [JobState.LAUNCHING, JobState.FAILED],
    ):
        for current, new in pairwise(path):
            check_transition(current, new)
    for terminal in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED):
        assert not LEGAL[terminal]
        for new in JobState:
            with pytest.raises(IllegalTransition):
                check_transition(terminal, new)
    for state in JobState:
        with pytest.raises(IllegalTransition):
            check_transition(state, JobState.PENDING)
    with pytest.raises(IllegalTransition, match="pending cannot become restarting"):
        check_transition(JobState.PENDING, JobState.RESTARTING)


def test_the_machine_writes_through_to_the_store(tmp_path: Path, home: Path) -> None:
    config = load_config(_config(tmp_path))
    store = Store()
    job = register_job(store, config, "c.toml")
    machine = JobStateMachine(store, job.id)
    machine.to(JobState.LAUNCHING, supervisor_pid=123)
    assert (store.get_job(job.id).state, store.get_job(job.id).supervisor_pid) == (
        JobState.LAUNCHING,
        123,
    )
    with pytest.raises(IllegalTransition):
        machine.to(JobState.RESTARTING)
    assert store.get_job(job.id).state == JobState.LAUNCHING  # nothing written


def test_an_unforeseen_error_stops_what_started_and_fails_the_job(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(_config(tmp_path))
    store = Store()
    job = register_job(store, config, "c.toml")
    supervisor = Supervisor(store, job, config, LineSink(tmp_path / "copies", console=None))

    def broken_watch(group: object) -> None:
        wait_for(lambda: len(job_processes(job.id)) >= 4, 20)  # agents and trainers running
        raise RuntimeError("a bug in the tick")

    monkeypatch.setattr(supervisor, "_watch", broken_watch)
    with pytest.raises(RuntimeError, match="a bug in the tick"):
        supervisor.run()
    ended = store.get_job(job.id)
    assert ended.state == JobState.FAILED
    assert ended.last_cause == "internal error: RuntimeError: a bug in the tick"
    wait_for(lambda: not job_processes(job.id), 10)


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(
        f"""
[job]
name = "machine"
shared_dir = "{tmp_path / "shared"}"

[entrypoint]
script = "{FAKE}"
args = ["--mode", "sleep"]

[backend]
type = "local"
workers = 2

[supervision]
stop_grace = 2.0
"""
    )
    return path
