"""Telling of stragglers while a group trains: the verdicts of stragglers.py (pure) as events,
`[notify]` hooks, console lines and the `status` column; never a failure."""

from __future__ import annotations

import time

from orchestrator.logs.logstream import LineSink
from orchestrator.state.store import Store
from orchestrator.supervision.attempt import Attempt
from orchestrator.supervision.notify import Notifier
from orchestrator.supervision.stragglers import StragglerWatch
from worker.spec import AgentState, Phase


def tell_stragglers(
    stragglers: StragglerWatch,
    attempt: Attempt,
    store: Store,
    job_id: str,
    notifier: Notifier,
    sink: LineSink,
) -> None:
    """A warning when a task holds the group back, and when it no longer does."""
    # Evidence only while every task trains: in the first seconds, and in the last ones
    # (the chief saving, or gone), the shares of waiting say nothing about a straggler.
    statuses = attempt.watch.statuses()
    training = list(statuses.values())
    if len(training) < len(attempt.plan.tasks) or not all(
        s is not None and s.state == AgentState.RUNNING and s.progress.phase == Phase.TRAINING
        for s in training
    ):
        return
    resources = {i: s.resources if s else None for i, s in statuses.items()}
    hosts = {t.index: t.host_index for t in attempt.plan.tasks}
    changes = stragglers.judge(time.monotonic(), resources, hosts)
    for change in changes:
        message = change.message()
        store.add_event(job_id, "straggler", message, task=change.task)
        if change.straggler is not None:
            notifier.event("straggler", message)
        sink.info(message)
    if changes:
        store.update_tasks(
            job_id,
            {c.task: {"straggler": c.straggler.reason if c.straggler else ""} for c in changes},
        )
