"""`orchestrate attach`: whether a job may be taken over by a new supervisor, and what to do
instead when not. A job is taken over only when its supervisor is known dead (on this machine),
it has claimed the job, and the job has not ended."""

from __future__ import annotations

from enum import Enum

from orchestrator.errors import UsageError
from orchestrator.state.job_records import needs_stop, supervisor_alive
from orchestrator.state.states import JobState, TaskState
from orchestrator.state.store import JobRecord, Store


class AttachPlan(Enum):
    ADOPT = "adopt"  # supervise it from here on
    FINISH_STOP = "finish_stop"  # a stop that could not reach every host: finish it


def attach_plan(store: Store, job: JobRecord) -> AttachPlan:
    """What `attach` does with this job; UsageError (one line) when there is nothing to do."""
    if needs_stop(store, job) and (
        job.state.is_terminal()
        or any(t.state == TaskState.UNREACHABLE for t in store.tasks(job.id))
    ):
        return AttachPlan.FINISH_STOP
    if job.state.is_terminal():
        raise UsageError(f"job {job.id} already {job.state.value}: nothing to attach to")
    if job.state == JobState.PENDING:  # its launch has not claimed it yet: it is not lost
        raise UsageError(
            f"job {job.id} is pending: its launch is starting it; nothing to attach to"
        )
    alive = supervisor_alive(job)
    if alive:
        raise UsageError(f"job {job.id} is supervised by pid {job.supervisor_pid}; it is not lost")
    if alive is None:
        raise UsageError(
            f"job {job.id} is supervised from host {job.supervisor_host}: attach there"
        )
    return AttachPlan.ADOPT
