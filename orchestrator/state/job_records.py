"""A job's records outside the supervision loop: registering it, its configuration as stored
and as a supervisor reads it again, its tasks' rows, whether its supervisor lives, whether it
still needs a stop.

`status` imports this module: the heavy ones (pydantic models) are imported inside the
functions that need them, so that it stays fast."""

from __future__ import annotations

import secrets
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.state.paths import job_home, overrides_path
from orchestrator.state.states import JobState, TaskState
from orchestrator.state.store import JobRecord, Store, TaskRecord

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig
    from orchestrator.config.overrides import Overrides
    from orchestrator.planning.plan import LaunchPlan


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def register_job(
    store: Store,
    config: ClusterConfig,
    config_path: str,
    force: bool = False,
    overrides: Overrides | None = None,
    metadata: str = "",
) -> JobRecord:
    """Record a validated job (state PENDING) with its planned tasks; starts nothing.
    `force` (`launch --force`) is kept with the job, for its restarts and resumes too; so are
    the command line's `overrides` (in a private file of the job's: env values are secrets)."""
    from orchestrator.planning.plan import dry_run_plan
    from orchestrator.planning.task_specs import job_layout

    job_id = new_job_id(config.job.name)
    now = time.time()
    job = JobRecord(
        id=job_id,
        name=config.job.name,
        state=JobState.PENDING,
        backend=config.backend.type,
        config_path=str(Path(config_path).absolute()),
        config_json=stored_config_json(config),
        job_dir=str(job_layout(config, job_id).root),
        created=now,
        updated=now,
        forced=force,
        metadata=metadata,
    )
    if overrides:
        from worker.atomic import makedirs_private, write_bytes_atomic

        makedirs_private(job_home(job_id))
        write_bytes_atomic(overrides_path(job_id), overrides.to_json().encode(), mode=0o600)
    store.create_job(job, task_records(job_id, dry_run_plan(config), 0))
    store.add_event(job_id, "created", f"job {job_id} created from {config_path}")
    if overrides:
        store.add_event(job_id, "overrides", overrides.described())
    if force:
        store.add_event(job_id, "forced", "launch --force: GPUs busy with other programs are used")
    return job


def task_records(job_id: str, plan: LaunchPlan, attempt: int) -> list[TaskRecord]:
    """A plan's tasks as the store keeps them, each pending."""
    return [
        TaskRecord(
            job_id=job_id,
            idx=t.index,
            type=t.type,
            host_index=t.host_index,
            host=t.host_label,
            address=t.endpoint,
            state=TaskState.PENDING,
            attempt=attempt,
        )
        for t in plan.tasks
    ]


REDACTED = "<redacted>"


def stored_config_json(config: ClusterConfig) -> str:
    """The configuration as the store keeps it: each `env` value replaced by a mark (the keys
    stay), so that the store never holds secrets in clear."""
    env = {name: REDACTED for name in config.entrypoint.env}
    entry = config.entrypoint.model_copy(update={"env": env})
    return config.model_copy(update={"entrypoint": entry}).model_dump_json()


def stored_config(job: JobRecord) -> ClusterConfig:
    """The job's configuration from the store: everything but its env values (enough to stop
    or collect it)."""
    from orchestrator.config import parse_stored_config

    return parse_stored_config(job.config_json)


def launch_config(job: JobRecord) -> ClusterConfig:
    """The configuration a supervisor runs the job with (detached, or attaching), env values
    included: read again from the job's cluster.toml with its launch's overrides, and refused
    if it changed since."""
    from orchestrator.config import load_config
    from orchestrator.config.overrides import Overrides
    from orchestrator.errors import ConfigError, UsageError

    path = overrides_path(job.id)
    overrides = Overrides.from_json(path.read_text()) if path.exists() else None
    try:
        config = load_config(Path(job.config_path), overrides)
    except ConfigError as exc:
        raise UsageError(f"job {job.id}: cannot read its configuration again: {exc}") from None
    if stored_config_json(config) != job.config_json:
        raise UsageError(
            f"job {job.id}: {job.config_path} changed since the job was launched: restore it "
            "(or stop the job and launch it again)"
        )
    return config


def supervisor_alive(job: JobRecord) -> bool | None:
    """Whether the job's supervisor lives: the recorded pid, still held by the same process
    (its identity checked, so a reused pid is not taken for it). None: on another machine."""
    if job.supervisor_pid is None:
        return False
    if job.supervisor_host != socket.gethostname():
        return None  # on another machine: we cannot tell from here
    from worker.proctl import is_same

    return is_same(job.supervisor_pid, job.supervisor_ident)


def needs_stop(store: Store, job: JobRecord) -> bool:
    """A job is not over until every task is: a terminal job may still hold tasks whose stop
    was never confirmed."""
    return not job.state.is_terminal() or any(
        not t.state.is_terminal() for t in store.tasks(job.id)
    )
