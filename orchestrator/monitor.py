"""Pure supervision logic: from what each task reports to one decision for the group, and from
a failure to a restart plan.

No I/O here, so every rule is unit-tested with plain values. The supervisor (I/O) gathers
observations, calls `decide` and `plan_restart`, and acts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.config import RestartSection
from orchestrator.states import TaskState
from worker.spec import AgentState, Phase, TaskStatus


class Verdict(StrEnum):
    CONTINUE = "continue"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class FailureKind(StrEnum):
    EXITED = "exited"  # a trainer exited non-zero
    LOST = "lost"  # an agent vanished without a final status
    STOPPED = "stopped"  # a task was stopped by someone else
    SILENT = "silent"  # heartbeats stopped (agent hung, host unreachable)
    HUNG = "hung"  # heartbeats go on, training steps do not (watchdog)
    STARTUP = "startup"  # the group missed its startup deadline
    LAUNCH = "launch"  # a relaunch could not start (host still down, ...)


@dataclass(frozen=True)
class TaskObservation:
    index: int
    state: TaskState
    exit_code: int | None = None
    heartbeat_age: float | None = None  # seconds since the heartbeat last advanced
    progress_age: float | None = None  # seconds since the training step last advanced
    phase: Phase = Phase.NONE
    reached_first_step: bool = False
    is_chief: bool = False


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    cause: str = ""
    tasks: tuple[int, ...] = ()
    kind: FailureKind | None = None
    exit_code: int | None = None


CONTINUE = Decision(Verdict.CONTINUE)


def failure(
    kind: FailureKind, cause: str, tasks: tuple[int, ...] = (), code: int | None = None
) -> Decision:
    return Decision(Verdict.FAILED, cause, tasks, kind, code)


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


def _names(indices: Sequence[int]) -> str:
    return ", ".join(f"worker-{i}" for i in indices)


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
        cause = f"no heartbeat for {heartbeat_timeout:g}s from {_names(silent)}"
        return failure(FailureKind.SILENT, cause, tuple(silent))
    if progress_timeout > 0:
        hung = [
            t.index
            for t in tasks
            if t.phase == Phase.TRAINING
            and t.reached_first_step
            and t.progress_age is not None
            and t.progress_age > progress_timeout
        ]
        if hung:
            cause = f"no training progress for {progress_timeout:g}s from {_names(hung)}"
            return failure(FailureKind.HUNG, cause, tuple(hung))
    if elapsed > startup_deadline:
        late = [t for t in tasks if not t.reached_first_step and not t.state.is_terminal()]
        if late:
            never = [t.index for t in late if t.phase == Phase.NONE]
            starting = [t.index for t in late if t.phase == Phase.STARTING]
            joining = [t.index for t in late if t.phase == Phase.JOINING]
            named = {*never, *starting, *joining}
            other = [t.index for t in late if t.index not in named]
            parts = [
                f"{label}: {_names(group)}"
                for label, group in (
                    ("never reported", never),
                    ("starting", starting),
                    ("waiting for peers", joining),
                    ("no first step", other),
                )
                if group
            ]
            cause = f"startup deadline of {startup_deadline:g}s passed; " + "; ".join(parts)
            culprits = tuple(never or starting or joining or other)
            return failure(FailureKind.STARTUP, cause, culprits)
    return CONTINUE


@dataclass(frozen=True)
class RestartPlan:
    restart: bool
    counts: bool  # whether it counts against max_restarts (a preemption does not)
    delay: float
    reason: str


def plan_restart(
    decision: Decision,
    policy: RestartSection,
    counted_restarts: int,
    startup_timeout_restarts: bool,
) -> RestartPlan:
    """Whether a failed group is started again, after how long, and why (or why not)."""
    preempted = (
        decision.kind == FailureKind.EXITED and decision.exit_code == policy.preemption_exit_code
    )
    if preempted:
        return RestartPlan(True, False, 0.0, "preempted: restart not counted")
    if decision.kind == FailureKind.STARTUP and not startup_timeout_restarts:
        return RestartPlan(False, False, 0.0, "on_startup_timeout = fail")
    if (
        decision.kind == FailureKind.EXITED
        and policy.retryable_exit_codes is not None
        and decision.exit_code not in policy.retryable_exit_codes
    ):
        return RestartPlan(False, False, 0.0, f"exit code {decision.exit_code} is not retryable")
    if counted_restarts >= policy.max_restarts:
        return RestartPlan(False, True, 0.0, f"max_restarts ({policy.max_restarts}) reached")
    delay = min(policy.backoff * (2**counted_restarts), policy.backoff_max)
    return RestartPlan(
        True, True, delay, f"restart {counted_restarts + 1} of {policy.max_restarts}"
    )
