"""What a stop leaves (pure): one rule for the supervisor's stop and for a stop without one."""

from __future__ import annotations

from orchestrator.state.states import TaskState
from orchestrator.state.store import TaskRecord
from orchestrator.supervision.stop_outcome import running, tasks_after_stop, unconfirmed_cause

PREEMPTED = 143


def task(idx: int, state: TaskState, exit_code: int | None = None) -> TaskRecord:
    return TaskRecord("j", idx, "worker", idx, f"h{idx}", "a:1", state, exit_code=exit_code)


def test_every_task_running_when_the_stop_began_ends_stopped_or_unreachable() -> None:
    before = [task(i, TaskState.RUNNING) for i in range(3)]
    after = [
        task(0, TaskState.LOST),  # gone while the stop ran: we stopped it
        task(1, TaskState.FAILED, PREEMPTED),  # checkpointed on our SIGTERM
        task(2, TaskState.RUNNING),  # its host did not answer
    ]
    ends = tasks_after_stop(running(before), after, {2}, PREEMPTED)
    assert ends == {0: TaskState.STOPPED, 1: TaskState.STOPPED, 2: TaskState.UNREACHABLE}


def test_a_task_that_ended_on_its_own_keeps_its_end() -> None:
    before = [task(0, TaskState.RUNNING), task(1, TaskState.RUNNING), task(2, TaskState.FAILED, 1)]
    after = [task(0, TaskState.SUCCEEDED), task(1, TaskState.FAILED, 3), before[2]]
    # 0 succeeded, 1 failed with its own exit code before the stop reached it, and 2 had
    # ended before the stop began: none is rewritten.
    assert tasks_after_stop(running(before), after, set(), PREEMPTED) == {}


def test_pending_tasks_are_stopped_too() -> None:
    before = [task(0, TaskState.PENDING), task(1, TaskState.STOPPED)]
    assert running(before) == {0}
    assert tasks_after_stop(running(before), before, set(), PREEMPTED) == {0: TaskState.STOPPED}


def test_an_unconfirmed_stop_is_worded_once_and_says_what_to_run() -> None:
    cause = unconfirmed_cause("job-1", "h2 unreachable (timed out)")
    assert cause == (
        "stop not confirmed: h2 unreachable (timed out); run `orchestrate stop job-1` again "
        "once it is back"
    )
