"""Stopping a job from outside its supervisor: ask the supervisor, wait for it, then sweep every
host for what is left (found by the job id, so processes whose pids never reached the store
too). What cannot be confirmed is said, never taken for done."""

from __future__ import annotations

import os
import signal
import time

from orchestrator.backends import Sweep
from orchestrator.errors import OrchestrateError
from orchestrator.state.job_records import stored_config, supervisor_alive
from orchestrator.state.job_state import JobStateMachine
from orchestrator.state.states import JobState
from orchestrator.state.store import JobRecord, Store
from orchestrator.supervision.stop_outcome import running, tasks_after_stop, unconfirmed_cause

# Beyond the stop grace: how long the supervisor may take to stop its tasks and record it.
SUPERVISOR_STOP_MARGIN = 60.0


def stop_without_supervisor(store: Store, job: JobRecord) -> Sweep:
    """The supervisor is gone (or did not answer): stop the job's processes on every host
    ourselves, found by the job id in their environment, so that agents whose pids never
    reached the store are stopped too. Only what was confirmed is marked stopped: tasks on a
    host that could not be reached become UNREACHABLE and the job stays STOPPING (a later
    stop finishes the work)."""
    from orchestrator.backends import open_backend
    from orchestrator.backends.agents import AGENT_STOP_MARGIN

    cfg = stored_config(job)
    running_before = running(store.tasks(job.id))
    backend = open_backend(cfg)
    try:
        sweep = backend.sweep(job, cfg.supervision.stop_grace + AGENT_STOP_MARGIN)
    finally:
        backend.close()
    tasks = store.tasks(job.id)
    unconfirmed = {t.idx for t in tasks if t.host_index in sweep.unconfirmed_hosts}
    ends = tasks_after_stop(running_before, tasks, unconfirmed, cfg.restart.preemption_exit_code)
    store.update_tasks(job.id, {i: {"state": s} for i, s in ends.items()})
    machine = JobStateMachine(store, job.id)
    if sweep.confirmed:
        if not machine.state.is_terminal():
            machine.to(JobState.STOPPED, last_cause="stopped on request")
        if ends or not job.state.is_terminal():  # a sweep after the supervisor's stop: silent
            store.add_event(job.id, "stopped", "stopped on request (no supervisor)")
    else:
        cause = unconfirmed_cause(job.id, sweep.describe())
        if not machine.state.is_terminal():
            machine.to(JobState.STOPPING, last_cause=cause)
        store.add_event(job.id, "stop_unconfirmed", cause)
    return sweep


def stop_job(store: Store, job: JobRecord) -> JobState:
    """Stop a job: its supervisor first (SIGTERM, then wait while it stops the tasks), then a
    sweep of every host. Returns the job's state; raises when the stop is not confirmed."""
    # A job no supervisor has claimed yet (`launch --detach` still starting one) is STOPPING
    # from now on: the supervisor cannot claim it, and whoever waits for it sees a stop, not
    # a supervisor that died.
    JobStateMachine(store, job.id).stop_if_pending("stopped on request")
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
    sweep = stop_without_supervisor(store, job)
    if not sweep.confirmed:
        raise OrchestrateError(f"job {job.id}: {unconfirmed_cause(job.id, sweep.describe())}")
    return store.get_job(job.id).state
