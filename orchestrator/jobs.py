"""Job operations outside the supervision loop: register a job, start its supervisor in the
background, tell whether that supervisor lives, end a job no supervisor will end, and collect
its results.

`status` imports this module: the heavy ones (pydantic models, backends) are imported inside the
functions that need them, so that it stays fast."""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.states import JobState, TaskState
from orchestrator.store import JobRecord, Store, TaskRecord

if TYPE_CHECKING:
    from orchestrator.backends import Backend
    from orchestrator.config import ClusterConfig
    from orchestrator.console import JobPanel

# How long `launch --detach` waits for the background supervisor to bring the job up.
DETACHED_START_TIMEOUT = 600.0


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


FORCED = "forced"  # the event kind that records `launch --force`


def register_job(
    store: Store, config: ClusterConfig, config_path: str, force: bool = False
) -> JobRecord:
    """Record a validated job (state PENDING) with its planned tasks; starts nothing.
    `force` (`launch --force`) is recorded as the job's "forced" event, which every supervisor
    of the job reads (launched_with_force)."""
    from orchestrator.launcher import job_layout
    from orchestrator.plan import task_slots

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
    )
    tasks = [
        TaskRecord(
            job_id=job_id,
            idx=i,
            type="worker",
            host_index=slot.host_index,
            host=slot.host_label,
            address=slot.address,
            state=TaskState.PENDING,
        )
        for i, slot in enumerate(task_slots(config))
    ]
    store.create_job(job, tasks)
    store.add_event(job_id, "created", f"job {job_id} created from {config_path}")
    if force:
        store.add_event(job_id, FORCED, "launch --force: GPUs busy with other programs are used")
    return job


def launched_with_force(store: Store, job_id: str) -> bool:
    """Whether the job was launched with --force (for it, its restarts and its resumes)."""
    return any(e.kind == FORCED for e in store.events(job_id))


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
    from orchestrator.config import ClusterConfig

    return ClusterConfig.model_validate_json(job.config_json)


def launch_config(job: JobRecord) -> ClusterConfig:
    """The configuration a supervisor runs the job with (detached, or attaching), env values
    included: read again from the job's cluster.toml, and refused if it changed since."""
    from orchestrator.config import load_config
    from orchestrator.errors import ConfigError, UsageError

    try:
        config = load_config(Path(job.config_path))
    except ConfigError as exc:
        raise UsageError(f"job {job.id}: cannot read its configuration again: {exc}") from None
    if stored_config_json(config) != job.config_json:
        raise UsageError(
            f"job {job.id}: {job.config_path} changed since the job was launched: restore it "
            "(or stop the job and launch it again)"
        )
    return config


def collect_job(backend: Backend, job_root: object, dest: Path) -> int:
    """Pull per-task logs, the final model and metrics from the shared directory."""
    transport = backend.transport(0)
    root = str(job_root)
    count = transport.get_tree(f"{root}/logs", dest / "logs")
    count += transport.get_tree(f"{root}/model", dest / "model")
    count += transport.get_tree(f"{root}/tensorboard", dest / "tensorboard")
    metrics = transport.read_file(f"{root}/metrics.json")
    if metrics is not None:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "metrics.json").write_bytes(metrics)
        count += 1
    return count


def supervisor_alive(job: JobRecord) -> bool | None:
    """Whether the job's supervisor lives: the recorded pid, still held by the same process
    (its identity checked, so a reused pid is not taken for it). None: on another machine."""
    if job.supervisor_pid is None:
        return False
    if job.supervisor_host != socket.gethostname():
        return None  # on another machine: we cannot tell from here
    from worker.proctl import is_same

    return is_same(job.supervisor_pid, job.supervisor_ident)


def fail_job(store: Store, job_id: str, cause: str) -> None:
    """End a job FAILED that no supervisor will end: its supervisor could not be made, or died
    before it ran the job."""
    from orchestrator.job_state import JobStateMachine

    machine = JobStateMachine(store, job_id)
    if not machine.state.is_terminal():
        machine.to(JobState.FAILED, last_cause=cause)
        store.add_event(job_id, "failed", cause)


@contextmanager
def failing_job_on_error(store: Store, job_id: str) -> Iterator[None]:
    """Whatever goes wrong while a supervisor is being made (a bad host entry that fabric
    refuses, an unwritable ORCHESTRATE_HOME) ends the job FAILED with its cause, not PENDING
    forever; nothing has been started yet."""
    from orchestrator.errors import OrchestrateError

    try:
        yield
    except OrchestrateError as exc:
        fail_job(store, job_id, str(exc))
        raise
    except Exception as exc:
        fail_job(store, job_id, f"{type(exc).__name__}: {exc}")
        raise


def start_detached_supervisor(
    store: Store, job: JobRecord, progress: JobPanel | None = None
) -> tuple[JobRecord, int]:
    """Start `orchestrate supervise JOB` in the background and wait until the job runs (or
    ended), showing it on `progress` meanwhile. Returns the job and the supervisor's pid;
    raises when the job failed or stopped."""
    from orchestrator.errors import OrchestrateError
    from orchestrator.paths import supervisor_log
    from orchestrator.transport.local import LocalTransport
    from worker.proctl import is_same

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
        if progress is not None:
            progress.update(current)
        if current.state == JobState.RUNNING or current.state.is_terminal():
            break
        if not is_same(supervisor.pid, supervisor.ident):  # it died before the job ran
            current = store.get_job(job.id)  # it may have ended the job just before exiting
            if not current.state.is_terminal():
                tail = _last_line(log) or "no output"
                fail_job(store, job.id, f"the supervisor exited during launch: {tail}")
                current = store.get_job(job.id)
            break
        time.sleep(0.1)
    if current.state in (JobState.FAILED, JobState.STOPPED):
        raise OrchestrateError(f"job {job.id} {current.state.value}: {current.last_cause}")
    return current, supervisor.pid


def _last_line(path: Path) -> str:
    try:
        lines = path.read_bytes().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


def check_destination(target: Path) -> None:
    """collect writes into target: say so in one line when it cannot, before any copy."""
    from orchestrator.errors import UsageError

    if target.exists() and not target.is_dir():
        raise UsageError(f"--dest {target} is not a directory")
    existing = target if target.exists() else next(p for p in target.parents if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--dest {target}: {existing} is not writable")
    probe = existing / f".orchestrate-write-test-{os.getpid()}"
    try:  # root passes os.access on a read-only file system: try a write
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--dest {target}: cannot write in {existing}: {exc.strerror}") from None


def reopen_for_resume(store: Store, job: JobRecord) -> JobRecord:
    """Make a failed or stopped job PENDING again for its next attempt (same id, same shared
    directory, so its checkpoints), with a fresh restart budget. Refused, in one line, for a
    job still running, one that succeeded, or one whose stop was never confirmed."""
    from orchestrator.errors import UsageError
    from orchestrator.job_state import RESUMABLE, JobStateMachine
    from orchestrator.stopping import needs_stop  # it imports this module

    if not job.state.is_terminal():
        raise UsageError(f"job {job.id} is {job.state.value}: only a failed or stopped job resumes")
    if job.state not in RESUMABLE:
        raise UsageError(f"job {job.id} already {job.state.value}: nothing to resume")
    if needs_stop(store, job):
        raise UsageError(
            f"job {job.id}: its stop was never confirmed: run `orchestrate stop {job.id}` first"
        )
    JobStateMachine(store, job.id).reopen(
        attempt=job.attempt + 1,
        budget_base=job.restarts - job.preemptions,
        last_cause="",
        supervisor_pid=None,
        supervisor_ident="",
        hosts_json="",  # every host of cluster.toml again, spares as spares
    )
    store.add_event(
        job.id, "resumed", f"resumed after {job.state.value}: attempt {job.attempt + 1}"
    )
    return store.get_job(job.id)
