"""Pure supervision logic: from what each task reports to one decision for the group.

No I/O here, so every rule is unit-tested with plain values. The supervisor (I/O) gathers
observations, calls `decide` (and, on a failure, restart_policy.plan_restart), and acts. The
rules with names of their own live beside it: watchdog.py, startup_deadline.py,
restart_policy.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.state.states import TaskState
from orchestrator.supervision.observations import (
    CONTINUE,
    Decision,
    FailureKind,
    TaskObservation,
    Verdict,
    failure,
    task_names,
)
from orchestrator.supervision.startup_deadline import startup_deadline_missed
from orchestrator.supervision.watchdog import watchdog
from worker.spec import AgentState, TaskStatus


def task_state_of(status: TaskStatus | None, agent_alive: bool) -> TaskState:
    """Map an agent's report (and whether its process lives) to the coordinator's task state."""
    if status is None:
        return TaskState.STARTING if agent_alive else TaskState.LOST
    if status.state.is_terminal():
        return {
            AgentState.SUCCEEDED: TaskState.SUCCEEDED,
            AgentState.FAILED: TaskState.FAILED,
            AgentState.STOPPED: TaskState.STOPPED,
        }[status.state]
    if not agent_alive:
        return TaskState.LOST  # the agent died without writing a final status
    return TaskState.RUNNING if status.state == AgentState.RUNNING else TaskState.STARTING


def decide(
    tasks: Sequence[TaskObservation],
    *,
    elapsed: float,
    startup_deadline: float,
    heartbeat_timeout: float,
    progress_timeout: float = 0.0,
) -> Decision:
    """Success is the chief exiting 0; any other task ending badly, going silent or hanging, or
    the group missing its startup deadline fails the group (MWMS cannot go on without a peer)."""
    for task in tasks:
        if task.is_chief and task.state == TaskState.SUCCEEDED:
            return Decision(Verdict.SUCCEEDED, "chief exited 0", (task.index,))
    for task in tasks:
        name, one = f"worker-{task.index}", (task.index,)
        if task.state == TaskState.FAILED:
            cause = f"{name} exited with code {task.exit_code}"
            return failure(FailureKind.EXITED, cause, one, task.exit_code)
        if task.state == TaskState.LOST:
            return failure(FailureKind.LOST, f"{name}'s agent is gone", one)
        if task.state == TaskState.STOPPED:
            return failure(FailureKind.STOPPED, f"{name} was stopped", one)
    silent = [
        t.index
        for t in tasks
        if t.state.is_running()
        and t.heartbeat_age is not None
        and t.heartbeat_age > heartbeat_timeout
    ]
    if silent:
        cause = f"no heartbeat for {heartbeat_timeout:g}s from {task_names(silent)}"
        return failure(FailureKind.SILENT, cause, tuple(silent))
    if progress_timeout > 0:
        hung = watchdog(tasks, progress_timeout)
        if hung is not None:
            return hung
    if elapsed > startup_deadline:
        return startup_deadline_missed(tasks, startup_deadline)
    return CONTINUE
