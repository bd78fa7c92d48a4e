"""`launch --detach`: the job's supervisor as a background process of its own
(`orchestrate supervise JOB`), and the wait until the job runs."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import REFUSED_EVENT, OrchestrateError, PreflightError
from orchestrator.state.job_state import fail_job
from orchestrator.state.paths import supervisor_log
from orchestrator.state.states import JobState
from orchestrator.state.store import JobRecord, Store
from orchestrator.transport.local import LocalTransport
from worker.proctl import is_same

# How long `launch --detach` waits for the background supervisor to bring the job up.
DETACHED_START_TIMEOUT = 600.0


def start_detached_supervisor(
    store: Store, job: JobRecord, on_update: Callable[[JobRecord], None] = lambda job: None
) -> tuple[JobRecord, int]:
    """Start `orchestrate supervise JOB` in the background and wait until the job runs (or
    waits in the queue, or ended), telling `on_update` of the job meanwhile. Returns the job
    and the supervisor's pid; raises when the job failed or stopped."""

    log = supervisor_log(job.id)
    supervisor = LocalTransport().start_detached(
        [sys.executable, "-m", "orchestrator", "supervise", job.id], log_path=str(log)
    )
    store.update_job(
        job.id,
        supervisor_pid=supervisor.pid,
        supervisor_ident=supervisor.ident,
        supervisor_host=socket.gethostname(),
    )
    deadline = time.monotonic() + DETACHED_START_TIMEOUT
    current = store.get_job(job.id)
    while time.monotonic() < deadline:
        current = store.get_job(job.id)
        on_update(current)
        if current.state in (JobState.RUNNING, JobState.QUEUED) or current.state.is_terminal():
            break
        if not is_same(supervisor.pid, supervisor.ident):  # it died before the job ran
            current = store.get_job(job.id)  # it may have ended the job just before exiting
            if current.state == JobState.STOPPING:  # a `stop` ended it: the stop says how
                time.sleep(0.1)
                continue
            if not current.state.is_terminal():
                tail = _last_line(log) or "no output"
                fail_job(store, job.id, f"the supervisor exited during launch: {tail}")
                current = store.get_job(job.id)
            break
        time.sleep(0.1)
    if current.state in (JobState.FAILED, JobState.STOPPED):
        message = f"job {job.id} {current.state.value}: {current.last_cause}"
        if any(e.kind == REFUSED_EVENT for e in store.events(job.id)):
            raise PreflightError(message)
        raise OrchestrateError(message)
    return current, supervisor.pid


def _last_line(path: Path) -> str:
    try:
        lines = path.read_bytes().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""
