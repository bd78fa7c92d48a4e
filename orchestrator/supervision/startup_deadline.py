"""The startup deadline: when it passes, every task must have taken its first step (or, where
steps are not observed, be past the rendezvous); the late ones are named by how far they got."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.state.states import TaskState
from orchestrator.supervision.observations import (
    CONTINUE,
    Decision,
    FailureKind,
    TaskObservation,
    failure,
    task_names,
)
from worker.spec import Phase, StepSignal


def startup_met_without_steps(task: TaskObservation) -> bool:
    """Supervision judges only what it can see: a task whose steps are not observed meets the
    startup deadline at the rendezvous; an uninstrumented trainer that reports nothing at all
    meets it by running."""
    if task.step_signal == StepSignal.NONE and task.phase.past_rendezvous():
        return True
    return not task.instrumented and task.phase == Phase.NONE and task.state == TaskState.RUNNING


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
    parts = [f"{label}: {task_names(group)}" for label, group in groups if group]
    cause = f"startup deadline of {startup_deadline:g}s passed; " + "; ".join(parts)
    culprits = next(group for _, group in groups if group)
    return failure(FailureKind.STARTUP, cause, tuple(culprits))
