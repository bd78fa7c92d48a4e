"""`orchestrate delete` and `orchestrate prune`: a job's records go (its store rows, the
coordinator's copies of its logs and its report) and, with `--files`, its directory on the
shared filesystem (checkpoints, model, logs). Never a job that still runs or whose stop was not
confirmed: that is one line, exit 2, and nothing is removed."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.state.job_records import needs_stop, stored_config
from orchestrator.state.paths import job_home
from orchestrator.state.store import JobRecord, Store

REMOVE_TIMEOUT = 300.0  # seconds for a job directory's removal on the shared filesystem


@dataclass(frozen=True)
class Removed:
    job_id: str
    files: str | None  # the shared job directory removed, if asked for


def check_removable(store: Store, job: JobRecord) -> None:
    if needs_stop(store, job):
        state = job.state.value if not job.state.is_terminal() else "not confirmed stopped"
        raise UsageError(f"job {job.id} is {state}: stop it first (orchestrate stop {job.id})")


def delete_job(store: Store, job: JobRecord, files: bool) -> Removed:
    """Remove one ended job (UsageError, nothing removed, if it still runs)."""
    check_removable(store, job)
    removed = _remove_shared_dir(job) if files else None
    if not store.delete_job(job.id):  # it was launched again meanwhile (resume): keep it
        raise UsageError(f"job {job.id} is running again: nothing removed")
    shutil.rmtree(job_home(job.id), ignore_errors=True)
    return Removed(job.id, removed)


def prune(store: Store, older_than: float, files: bool, dry_run: bool) -> list[Removed]:
    """Remove every ended job that ended more than `older_than` seconds ago."""
    cutoff = time.time() - older_than
    old = [j for j in store.list_jobs(limit=1 << 30) if j.ended is not None and j.ended < cutoff]
    old = [j for j in old if not needs_stop(store, j)]
    if dry_run:
        return [Removed(j.id, j.job_dir if files else None) for j in old]
    return [delete_job(store, j, files) for j in old]


def _remove_shared_dir(job: JobRecord) -> str:
    """The job's own directory under its shared_dir, removed from its first host (where the
    shared filesystem is mounted); only a directory named for the job is ever removed."""
    from orchestrator.backends import open_backend

    path = Path(job.job_dir)
    config = stored_config(job)
    if path.name != job.id or path.parent != Path(config.job.shared_dir):
        raise UsageError(f"job {job.id}: its directory {path} is not its own: not removed")
    backend = open_backend(config)
    try:
        ran = backend.transport(0).run(["rm", "-rf", "--", str(path)], timeout=REMOVE_TIMEOUT)
    finally:
        backend.close()
    if not ran.ok:
        raise UsageError(f"job {job.id}: could not remove {path}: {ran.tail()}")
    return str(path)
