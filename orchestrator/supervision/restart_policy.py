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
    in_a_row: int = 0  # counted restarts since the last healthy stretch, this one included


def backoff_streak(policy: RestartSection, in_a_row: int, ran_for: float) -> int:
    """The backoff's exponent: the counted restarts in a row, which an attempt that ran
    `backoff_reset` seconds ends (as Kubernetes forgets a crash loop after ten minutes)."""
    return 0 if policy.backoff_reset and ran_for >= policy.backoff_reset else in_a_row


def plan_restart(
    decision: Decision,
    policy: RestartSection,
    counted_restarts: int,
    startup_timeout_restarts: bool,
    streak: tuple[int, float] = (0, 0.0),
) -> RestartPlan:
    """Whether a failed group is started again, after how long, and why (or why not).
    `streak`: the counted restarts in a row before this one, and how long the failed attempt
    ran (the backoff doubles with each restart in a row; a healthy stretch starts it over)."""
    in_a_row = backoff_streak(policy, *streak)
    preempted = (
        decision.kind == FailureKind.EXITED and decision.exit_code == policy.preemption_exit_code
    )
    if preempted:
        return RestartPlan(True, False, 0.0, "preempted: restart not counted", True, in_a_row)
    if decision.kind == FailureKind.REGROW:
        reason = "growing back to full width: restart not counted"
        return RestartPlan(True, False, 0.0, reason, in_a_row=in_a_row)
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
    delay = min(policy.backoff * (2**in_a_row), policy.backoff_max)
    reason = f"restart {counted_restarts + 1} of {policy.max_restarts}"
    return RestartPlan(True, True, delay, reason, in_a_row=in_a_row + 1)
