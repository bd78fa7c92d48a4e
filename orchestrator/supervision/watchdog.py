"""The watchdog: a task past its first step whose step signal stopped advancing is hung."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.supervision.observations import (
    Decision,
    FailureKind,
    TaskObservation,
    failure,
    task_names,
)
from worker.spec import Phase, StepSignal


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
        f"{task_names(group)} ({signal.describe()})" for signal, group in by_signal.items()
    )
    cause = f"no training progress for {progress_timeout:g}s from {named}"
    return failure(FailureKind.HUNG, cause, tuple(t.index for t in hung))
