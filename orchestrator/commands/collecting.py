"""`orchestrate collect` and `Job.collect()`: a job's logs, model, metrics and its newest
verified checkpoint, copied from its first host to this machine."""

from __future__ import annotations

from pathlib import Path

from orchestrator.state.job_records import stored_config
from orchestrator.state.store import JobRecord
from orchestrator.supervision.checkpoints import Checkpoint


def collect_here(
    job: JobRecord, dest: Path | None
) -> tuple[Path, int, Checkpoint | None, list[Checkpoint]]:
    """Where they went (default ./JOB_ID), how many files, the checkpoint copied, and those
    not copied for not being whole."""
    from orchestrator.backends import open_backend
    from orchestrator.supervision.checkpoints import find_checkpoints, newest_verified
    from orchestrator.supervision.collect import check_destination, collect_checkpoint, collect_job

    target = dest or Path(job.id)
    check_destination(target)
    backend = open_backend(stored_config(job))
    try:
        count = collect_job(backend, job.job_dir, target)
        found = find_checkpoints(job, backend=backend)
        newest = newest_verified(found)
        if newest is not None:
            count += collect_checkpoint(backend, newest.prefix, target)
    finally:
        backend.close()
    return target, count, newest, [c for c in found if c.ok is False]
