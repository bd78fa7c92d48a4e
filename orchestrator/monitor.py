"""Pure supervision logic: from what each task reports to one decision for the group.

No I/O here, so every rule is unit-tested with plain values. The supervisor (I/O) gathers
observations, calls `decide`, and acts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.states import TaskState
from worker.spec import AgentState, TaskStatus


class Verdict(StrEnum):
    CONTINUE = "continue"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class TaskObservation:
    index: int
    state: TaskState
    exit_code: int | None = None
    heartbeat_age: float | None = None  # seconds since the heartbeat last advanced
    reached_first_step: bool = False
    is_chief: bool = False


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    cause: str = ""
    tasks: tuple[int, ...] = ()


CONTINUE = Decision(Verdict.CONTINUE)


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
) -> Decision:
    """Success is the chief exiting 0; any other task ending badly, going silent, or the group
    missing its startup deadline fails the group (MWMS cannot go on without a peer)."""
    for task in tasks:
        if task.is_chief and task.state == TaskState.SUCCEEDED:
            return Decision(Verdict.SUCCEEDED, "chief exited 0", (task.index,))
    for task in tasks:
        name = f"worker-{task.index}"
        if task.state == TaskState.FAILED:
            return Decision(
                Verdict.FAILED, f"{name} exited with code {task.exit_code}", (task.index,)
            )
        if task.state == TaskState.LOST:
            return Decision(Verdict.FAILED, f"{name}'s agent is gone", (task.index,))
        if task.state == TaskState.STOPPED:
            return Decision(Verdict.FAILED, f"{name} was stopped", (task.index,))
    silent = [
        t.index
        for t in tasks
        if t.state.is_running()
        and t.heartbeat_age is not None
        and t.heartbeat_age > heartbeat_timeout
    ]
    if silent:
        names = ", ".join(f"worker-{i}" for i in silent)
        return Decision(
            Verdict.FAILED, f"no heartbeat for {heartbeat_timeout:g}s from {names}", tuple(silent)
        )
    if elapsed > startup_deadline:
        late = [t.index for t in tasks if not t.reached_first_step and not t.state.is_terminal()]
        if late:
            names = ", ".join(f"worker-{i}" for i in late)
            return Decision(
                Verdict.FAILED,
                f"startup deadline of {startup_deadline:g}s passed; "
                f"never reached the first training step: {names}",
                tuple(late),
            )
    return CONTINUE
