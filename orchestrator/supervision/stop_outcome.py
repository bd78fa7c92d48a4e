"""What a stop leaves behind, decided in one place for the supervisor's stop and for a stop
without one: each task's end state, and the one wording of a stop that was not confirmed. Pure."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from orchestrator.state.states import TaskState
from orchestrator.state.store import TaskRecord


def tasks_after_stop(
    running_before: Collection[int],
    tasks: Sequence[TaskRecord],
    unconfirmed: Collection[int],
    preemption_exit_code: int,
) -> dict[int, TaskState]:
    """The end state of each task that was running when the stop began (`running_before`,
    by index), read again after it (`tasks`): we stopped it, so it is STOPPED whatever it
    reported while going down (lost, or the preemption exit code of a trainer that
    checkpointed on our SIGTERM); UNREACHABLE where its stop was not confirmed. A task that
    succeeded keeps it, and one whose agent reported FAILED with its own exit code ended on its
    own before the stop reached it (an agent asked to stop reports STOPPED): it stays failed."""

    def ended_on_its_own(t: TaskRecord) -> bool:
        return t.state == TaskState.FAILED and t.exit_code not in (None, preemption_exit_code)

    return {
        t.idx: TaskState.UNREACHABLE if t.idx in unconfirmed else TaskState.STOPPED
        for t in tasks
        if t.idx in running_before and t.state != TaskState.SUCCEEDED and not ended_on_its_own(t)
    }


def running(tasks: Sequence[TaskRecord]) -> set[int]:
    """The tasks a stop is for: those not in an end state."""
    return {t.idx for t in tasks if not t.state.is_terminal()}


def unconfirmed_cause(job_id: str, what: str) -> str:
    """The job's cause (and the CLI's error) when a stop could not be confirmed."""
    return f"stop not confirmed: {what}; run `orchestrate stop {job_id}` again once it is back"
