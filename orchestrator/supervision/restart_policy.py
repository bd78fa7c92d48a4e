"""The restart policy: whether a failed group is started again, after how long, and why."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import RestartSection
from orchestrator.supervision.observations import Decision, FailureKind


@dataclass(frozen=True)
class RestartPlan:
    restart: bool
    counts: bool  # whether it counts against max_restarts (a preemption does not)
    delay: float
    reason: str
    preempted: bool = False  # the group restarts because a task was preempted


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
        return RestartPlan(True, False, 0.0, "preempted: restart not counted", preempted=True)
    if decision.kind == FailureKind.REGROW:
        return RestartPlan(True, False, 0.0, "growing back to full width: restart not counted")
    if decision.kind == FailureKind.HOST_WAIT:
        return RestartPlan(False, False, 0.0, "supervision.host_wait passed")
    if decision.kind == FailureKind.ALLOCATION_ENDED:
        return RestartPlan(False, False, 0.0, "the Slurm allocation is over")
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
