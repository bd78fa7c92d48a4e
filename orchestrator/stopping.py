"""Stopping a job from outside its supervisor: ask the supervisor, wait for it, then sweep every
host for what is left (found by the job id, so processes whose pids never reached the store
too). What cannot be confirmed is said, never taken for done."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.errors import OrchestrateError
from orchestrator.jobs import stored_config, supervisor_alive
from orchestrator.states import JobState, TaskState
from orchestrator.store import JobRecord, Store

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig

# Beyond the stop grace: how long the supervisor may take to stop its tasks and record it.
SUPERVISOR_STOP_MARGIN = 60.0


@dataclass(frozen=True)
class StopReport:
    """What a stop without a supervisor confirmed: hosts it could not reach (label -> why) and
    processes still alive after it (label -> pids)."""

    unreachable: dict[str, str]
    left: dict[str, list[int]]

    @property
    def confirmed(self) -> bool:
        return not self.unreachable and not self.left

    def describe(self) -> str:
        parts = [f"{h} unreachable ({why})" for h, why in self.unreachable.items()]
        parts += [f"{h} still runs pids {pids}" for h, pids in self.left.items()]
        return "; ".join(parts)


def stop_without_supervisor(store: Store, job: JobRecord, cfg: ClusterConfig) -> StopReport:
    """The supervisor is gone (or did not answer): stop the job's processes on every host
    ourselves, found by the job id in their environment, so that agents whose pids never
    reached the store are stopped too. Only what was confirmed is marked stopped: tasks on a
    host that could not be reached become UNREACHABLE and the job stays STOPPING (a later
    stop finishes the work)."""
    from orchestrator.backends import open_backend
    from orchestrator.fanout import each
    from orchestrator.launcher import AGENT_STOP_MARGIN, host_labels

    grace = cfg.supervision.stop_grace + AGENT_STOP_MARGIN
    from orchestrator.config import SlurmBackend

    if isinstance(cfg.backend, SlurmBackend):
        report = _cancel_allocation(job, grace)  # one allocation: all confirmed, or none
        unconfirmed = set() if report.confirmed else {t.host_index for t in store.tasks(job.id)}
    else:
        labels = host_labels(cfg)
        backend = open_backend(cfg)
        try:
            results = each(
                range(len(labels)), lambda h: backend.transport(h).stop_job(job.id, grace)
            )
        finally:
            backend.close()
        report = StopReport(
            unreachable={labels[h]: results.reason(h, labels[h]) for h in results.failed},
            left={labels[h]: pids for h, pids in results.succeeded.items() if pids},
        )
        unconfirmed = set(results.failed) | {h for h, pids in results.succeeded.items() if pids}
    updates: dict[int, dict[str, object]] = {}
    for t in store.tasks(job.id):
        if not t.state.is_terminal():
            unreached = t.host_index in unconfirmed
            updates[t.idx] = {"state": TaskState.UNREACHABLE if unreached else TaskState.STOPPED}
    store.update_tasks(job.id, updates)
    current = store.get_job(job.id).state
    if report.confirmed:
        if not current.is_terminal():
            store.update_job(job.id, state=JobState.STOPPED, last_cause="stopped on request")
        if updates or not current.is_terminal():  # a sweep after the supervisor's stop: silent
            store.add_event(job.id, "stopped", "stopped on request (no supervisor)")
    else:
        cause = f"stop not confirmed: {report.describe()}; run `orchestrate stop` again"
        if not current.is_terminal():
            store.update_job(job.id, state=JobState.STOPPING, last_cause=cause)
        store.add_event(job.id, "stop_unconfirmed", cause)
    return report


def _cancel_allocation(job: JobRecord, grace: float) -> StopReport:
    """Slurm: scancel the job's allocation (every step, every node) and wait until Slurm says
    it ended."""
    from orchestrator.backends.slurm_allocation import Allocation

    if not job.scheduler_job:  # never submitted: nothing runs
        return StopReport({}, {})
    name = f"Slurm job {job.scheduler_job}"
    try:
        ended = Allocation(job.scheduler_job).cancel(wait=grace)
    except OrchestrateError as exc:
        return StopReport({name: str(exc)}, {})
    if ended:
        return StopReport({}, {})
    return StopReport({name: f"still running {grace:g}s after scancel"}, {})


def needs_stop(store: Store, job: JobRecord) -> bool:
    """A job is not over until every task is: a terminal job may still hold tasks whose stop
    was never confirmed."""
    return not job.state.is_terminal() or any(
        not t.state.is_terminal() for t in store.tasks(job.id)
    )


def stop_job(store: Store, job: JobRecord) -> JobState:
    """Stop a job: its supervisor first (SIGTERM, then wait while it stops the tasks), then a
    sweep of every host. Returns the job's state; raises when the stop is not confirmed."""
    if not job.state.is_terminal() and supervisor_alive(job) and job.supervisor_pid is not None:
        os.kill(job.supervisor_pid, signal.SIGTERM)  # identity checked just above
        grace = stored_config(job).supervision.stop_grace
        deadline = time.monotonic() + grace + SUPERVISOR_STOP_MARGIN
        while (
            time.monotonic() < deadline
            and not store.get_job(job.id).state.is_terminal()
            and supervisor_alive(job)  # it may end with the stop unconfirmed: not terminal
        ):
            time.sleep(0.1)
    return finish_stop(store, store.get_job(job.id))


def finish_stop(store: Store, job: JobRecord) -> JobState:
    """Sweep every host for the job's processes and stop them; raise, naming what could not be
    confirmed, so that the caller says to run the stop again."""
    report = stop_without_supervisor(store, job, stored_config(job))
    if not report.confirmed:
        raise OrchestrateError(
            f"job {job.id}: stop not confirmed: {report.describe()}; "
            f"run `orchestrate stop {job.id}` again once the host is back"
        )
    return store.get_job(job.id).state
