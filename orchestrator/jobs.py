"""Job operations outside the supervision loop: register a job, collect its results, tell
whether its supervisor lives, stop it without a supervisor, and find its live processes.

`status` imports this module: the heavy ones (pydantic models, backends) are imported inside the
functions that need them, so that it stays fast."""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.states import JobState, TaskState
from orchestrator.store import JobRecord, Store, TaskRecord

if TYPE_CHECKING:
    from orchestrator.backends import Backend
    from orchestrator.config import ClusterConfig


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def register_job(store: Store, config: ClusterConfig, config_path: str) -> JobRecord:
    """Record a validated job (state PENDING) with its planned tasks; starts nothing."""
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
    return job


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
    labels = host_labels(cfg)
    backend = open_backend(cfg)
    try:
        results = each(range(len(labels)), lambda h: backend.transport(h).stop_job(job.id, grace))
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


def needs_stop(store: Store, job: JobRecord) -> bool:
    """A job is not over until every task is: a terminal job may still hold tasks whose stop
    was never confirmed."""
    return not job.state.is_terminal() or any(
        not t.state.is_terminal() for t in store.tasks(job.id)
    )
