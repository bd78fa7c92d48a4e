"""The job state machine: which state may follow which, and the one place anything writes a job's
state or cause to the store (with whatever else changes in the same step): a supervisor, a
stop without one, a resume, a supervisor that could not be made."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from orchestrator.errors import OrchestrateError, UsageError
from orchestrator.state.job_records import needs_stop
from orchestrator.state.states import JobState
from orchestrator.state.store import JobRecord, Store

_ENDINGS = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})

# A supervisor that adopts a job (`attach`) takes it over in whatever live state its dead
# supervisor left, so RUNNING may follow any state that is not terminal.
LEGAL: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset(
        {JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING, JobState.STOPPING}
    )
    | _ENDINGS,
    # A queued job launches once what it asks for is free; a preflight that finds GPUs busy or
    # a host unreachable puts it back in the queue.
    JobState.QUEUED: frozenset(
        {JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING, JobState.STOPPING}
    )
    | _ENDINGS,
    JobState.LAUNCHING: frozenset({JobState.QUEUED, JobState.RUNNING, JobState.STOPPING})
    | _ENDINGS,
    JobState.RUNNING: frozenset({JobState.RUNNING, JobState.STOPPING}) | _ENDINGS,
    # STOPPING again: a stop without a supervisor that still could not confirm every task.
    JobState.STOPPING: frozenset({JobState.RESTARTING, JobState.RUNNING, JobState.STOPPING})
    | _ENDINGS,
    JobState.RESTARTING: frozenset({JobState.RUNNING, JobState.STOPPING}) | _ENDINGS,
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.STOPPED: frozenset(),
}


class IllegalTransition(OrchestrateError):
    """A bug: a state change the job state machine does not allow."""


class SupervisionTaken(UsageError):
    """Another process claimed the job's supervision first (`attach` racing a launch)."""


def check_transition(current: JobState, new: JobState) -> None:
    if new not in LEGAL[current]:
        raise IllegalTransition(f"job state {current.value} cannot become {new.value}")


RESUMABLE = frozenset({JobState.FAILED, JobState.STOPPED})


class JobStateMachine:
    """A job's state as its supervisor moves it; every change is checked, then stored."""

    def __init__(self, store: Store, job_id: str) -> None:
        self.store = store
        self.job_id = job_id
        self.state = store.get_job(job_id).state

    def to(self, new: JobState, **fields: Any) -> None:
        check_transition(self.state, new)
        self.store.update_job(self.job_id, state=new, **fields)
        self.state = new

    def note_cause(self, cause: str) -> None:
        """Why the job is where it is, while its state stays (waiting for a host or a queue)."""
        self.store.update_job(self.job_id, last_cause=cause)

    def cause(self) -> str:
        return self.store.get_job(self.job_id).last_cause

    def claim(
        self, new: JobState, supervisor: tuple[int, str, str], replacing: tuple[int | None, str]
    ) -> None:
        """Become the job's supervisor and move it to `new`, atomically (store.claim_job): two
        supervisors never run one job. SupervisionTaken when another process got there first."""
        check_transition(self.state, new)
        if not self.store.claim_job(self.job_id, self.state, new, supervisor, replacing):
            job = self.store.get_job(self.job_id)
            raise SupervisionTaken(
                f"job {self.job_id} is {job.state.value} and supervised by pid "
                f"{job.supervisor_pid} on {job.supervisor_host or 'this host'}: not taking it over"
            )
        self.state = new

    def move_unless(self, new: JobState, blocked: Callable[[list[JobRecord]], str]) -> str:
        """Move to `new` unless `blocked`, shown every job not ended under one write lock,
        gives a reason: that becomes the cause instead (store.move_job_unless). Returns it."""
        check_transition(self.state, new)
        reason = self.store.move_job_unless(self.job_id, self.state, new, blocked)
        self.state = self.store.get_job(self.job_id).state
        return reason

    def stop_if_pending(self, cause: str) -> bool:
        """PENDING becomes STOPPING in one statement, unless a supervisor claimed the job
        first (then it stops the job itself)."""
        if not self.store.move_job(self.job_id, JobState.PENDING, JobState.STOPPING, cause):
            return False
        self.state = JobState.STOPPING
        return True

    def reopen(self, **fields: Any) -> None:
        """`resume`: the one way out of an ending, for a failed or stopped job only: PENDING
        again, for a supervisor to launch its next attempt."""
        if self.state not in RESUMABLE:
            raise IllegalTransition(f"job state {self.state.value} cannot be resumed")
        self.store.update_job(self.job_id, state=JobState.PENDING, ended=None, **fields)
        self.state = JobState.PENDING


def fail_job(store: Store, job_id: str, cause: str) -> None:
    """End a job FAILED that no supervisor will end: its supervisor could not be made, or died
    before it ran the job."""
    machine = JobStateMachine(store, job_id)
    if not machine.state.is_terminal():
        machine.to(JobState.FAILED, last_cause=cause)
        store.add_event(job_id, "failed", cause)


@contextmanager
def failing_job_on_error(store: Store, job_id: str) -> Iterator[None]:
    """Whatever goes wrong while a supervisor is being made (a bad host entry that fabric
    refuses, an unwritable ORCHESTRATE_HOME) ends the job FAILED with its cause, not PENDING
    forever; nothing has been started yet."""
    try:
        yield
    except OrchestrateError as exc:
        fail_job(store, job_id, str(exc))
        raise
    except Exception as exc:
        fail_job(store, job_id, f"{type(exc).__name__}: {exc}")
        raise


def reopen_for_resume(store: Store, job: JobRecord) -> JobRecord:
    """Make a failed or stopped job PENDING again for its next attempt (same id, same shared
    directory, so its checkpoints), with a fresh restart budget. Refused, in one line, for a
    job still running, one that succeeded, or one whose stop was never confirmed."""
    refuse_resume(store, job)
    JobStateMachine(store, job.id).reopen(
        attempt=job.attempt + 1,
        budget_base=job.restarts - job.preemptions,
        last_cause="",
        supervisor_pid=None,
        supervisor_ident="",
        hosts_json="",  # every host of cluster.toml again, spares as spares
    )
    store.add_event(
        job.id, "resumed", f"resumed after {job.state.value}: attempt {job.attempt + 1}"
    )
    return store.get_job(job.id)


def refuse_resume(store: Store, job: JobRecord) -> None:
    """UsageError (one line) unless the job may be resumed now."""
    if not job.state.is_terminal():
        raise UsageError(f"job {job.id} is {job.state.value}: only a failed or stopped job resumes")
    if job.state not in RESUMABLE:
        raise UsageError(f"job {job.id} already {job.state.value}: nothing to resume")
    if needs_stop(store, job):
        raise UsageError(
            f"job {job.id}: its stop was never confirmed: run `orchestrate stop {job.id}` first"
        )
