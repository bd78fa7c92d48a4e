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
from worker.spec import AgentState, Phase, StepSignal, TaskStatus


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
    step_signal: StepSignal = StepSignal.NONE
    # The trainer runs under the bootstrap, so its phases are reported whatever the script.
    instrumented: bool = True


def startup_met_without_steps(task: TaskObservation) -> bool:
    """Supervision judges only what it can see: a task whose steps are not observed meets the
    startup deadline at the rendezvous; an uninstrumented trainer that reports nothing at all
    meets it by running."""
    if task.step_signal == StepSignal.NONE and task.phase.past_rendezvous():
        return True
    return not task.instrumented and task.phase == Phase.NONE and task.state == TaskState.RUNNING


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
        hung = watchdog(tasks, progress_timeout)
        if hung is not None:
            return hung
    if elapsed > startup_deadline:
        return startup_deadline_missed(tasks, startup_deadline)
    return CONTINUE


def watchdog(tasks: Sequence[TaskObservation], progress_timeout: float) -> Decision | None:
    """Tasks past their first step whose step signal stopped advancing: hung (a collective
    blocked on a peer, a stuck input pipeline). The cause names the signal that went still."""
    hung = [
        t
        for t in tasks
        if t.phase == Phase.TRAINING
        and t.reached_first_step
        and t.progress_age is not None
        and t.progress_age > progress_timeout
    ]
    if not hung:
        return None
    by_signal: dict[StepSignal, list[int]] = {}
    for t in hung:
        by_signal.setdefault(t.step_signal, []).append(t.index)
    named = "; ".join(
        f"{_names(group)} ({signal.describe()})" for signal, group in by_signal.items()
    )
    cause = f"no training progress for {progress_timeout:g}s from {named}"
    return failure(FailureKind.HUNG, cause, tuple(t.index for t in hung))


_STARTUP_GROUPS = (
    ("never reported", (Phase.NONE,)),
    ("starting", (Phase.STARTING,)),
    ("before the rendezvous", (Phase.IMPORTED,)),
    ("waiting for peers", (Phase.JOINING,)),
)


def startup_deadline_missed(tasks: Sequence[TaskObservation], startup_deadline: float) -> Decision:
    """The deadline has passed: every task must have taken its first step (or, where steps are
    not observed, be past the rendezvous). The late ones are named by how far they got, the
    least advanced first: they are the likely culprits."""
    late = [
        t
        for t in tasks
        if not t.reached_first_step
        and not t.state.is_terminal()
        and not startup_met_without_steps(t)
    ]
    if not late:
        return CONTINUE
    groups: list[tuple[str, list[int]]] = []
    for label, phases in _STARTUP_GROUPS:
        groups.append((label, [t.index for t in late if t.phase in phases]))
    grouped = {i for _, group in groups for i in group}
    groups.append(("no first step", [t.index for t in late if t.index not in grouped]))
    parts = [f"{label}: {_names(group)}" for label, group in groups if group]
    cause = f"startup deadline of {startup_deadline:g}s passed; " + "; ".join(parts)
    culprits = next(group for _, group in groups if group)
    return failure(FailureKind.STARTUP, cause, tuple(culprits))


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
