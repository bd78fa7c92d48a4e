"""The job state machine: which state may follow which, and the one place a supervisor writes a
job's state to the store (with whatever else changes in the same step)."""

from __future__ import annotations

from typing import Any

from orchestrator.errors import OrchestrateError, UsageError
from orchestrator.states import JobState
from orchestrator.store import Store

_ENDINGS = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})

# A supervisor that adopts a job (`attach`) takes it over in whatever live state its dead
# supervisor left, so RUNNING may follow any state that is not terminal.
LEGAL: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.LAUNCHING, JobState.RUNNING, JobState.STOPPING})
    | _ENDINGS,
    JobState.LAUNCHING: frozenset({JobState.RUNNING, JobState.STOPPING}) | _ENDINGS,
    JobState.RUNNING: frozenset({JobState.RUNNING, JobState.STOPPING}) | _ENDINGS,
    JobState.STOPPING: frozenset({JobState.RESTARTING, JobState.RUNNING}) | _ENDINGS,
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

    def reopen(self, **fields: Any) -> None:
        """`resume`: the one way out of an ending, for a failed or stopped job only: PENDING
        again, for a supervisor to launch its next attempt."""
        if self.state not in RESUMABLE:
            raise IllegalTransition(f"job state {self.state.value} cannot be resumed")
        self.store.update_job(self.job_id, state=JobState.PENDING, ended=None, **fields)
        self.state = JobState.PENDING
