"""A job as a document: what `status --json`, the API and `[notify]` hooks say of it (its
record, its tasks, its hosts' roles; for a job whose supervisor is gone, what can still be told
of each task)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from orchestrator.state.host_pool import HostPool, describe_hosts
from orchestrator.state.job_records import supervisor_alive
from orchestrator.state.store import JobRecord, Store, TaskRecord
from worker.container import container_name, job_runtime
from worker.spec import StepSignal, remaining_steps
from worker.warm.cold import cold_reason

if TYPE_CHECKING:
    from orchestrator.backends import BackendPlugin


def unsupervised_check(job: JobRecord, task: TaskRecord) -> str | None:
    """What status can tell of a task the store says runs, its job's supervisor being gone:
    'alive' or 'gone' where its backend can tell from this machine (an agent of this machine,
    by its handle), else 'unconfirmed'. None: the task ended."""
    if task.state.is_terminal():
        return None
    plugin = _plugin(job.backend) if task.agent else None
    if plugin is not None and plugin.task_alive_here is not None:
        return "alive" if plugin.task_alive_here(task.agent) else "gone"
    return "unconfirmed"


def _plugin(backend_type: str) -> BackendPlugin | None:
    from orchestrator.backends import plugin_for
    from orchestrator.errors import OrchestrateError

    try:
        return plugin_for(backend_type)
    except OrchestrateError:  # a plug-in no longer installed here: say what is known
        return None


def _named_containers(job: JobRecord) -> bool:
    """Whether the job's trainers run in named containers (podman, Docker)."""
    return job_runtime(job.config_json) in ("podman", "docker")


def _allocation(job: JobRecord) -> str | None:
    """The backend's name for what it holds for the job (a Slurm job id); None: nothing."""
    if not job.backend_state:  # most jobs: no backend imported for status
        return None
    plugin = _plugin(job.backend)
    return plugin.allocation(job.backend_state) if plugin else None


def _cold_restarts(job: JobRecord) -> str | None:
    """Why the job's restarts are cold; None: they may be warm (or its plug-in is gone). Read
    from the stored configuration's JSON as it is: `status` builds no configuration."""
    plugin = _plugin(job.backend)
    try:
        stored = json.loads(job.config_json)
    except ValueError:
        return None
    if plugin is None or not isinstance(stored, dict):
        return None
    restart, entry = stored.get("restart") or {}, stored.get("entrypoint") or {}
    container = stored.get("container") or {}
    return cold_reason(
        bool(restart.get("warm_restart", True)),
        bool(entry.get("instrument", True)),
        container.get("runtime") if container else None,
        plugin.capabilities.warm_restarts,
        plugin.capabilities.warm_in_image,
    )


def job_view(job: JobRecord, tasks: list[TaskRecord], now: float) -> dict[str, Any]:
    alive = None if job.state.is_terminal() else supervisor_alive(job)
    pool = HostPool.from_json(job.hosts_json)
    named = _named_containers(job)
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "backend": job.backend,
        "allocation": _allocation(job),
        "attempt": job.attempt,
        "restarts": job.restarts,
        "preemptions": job.preemptions,
        "last_cause": job.last_cause,
        "metadata": json.loads(job.metadata) if job.metadata else {},
        "created": job.created,
        "ended": job.ended,
        "wall_seconds": round((job.ended or now) - job.created, 1),
        "job_dir": job.job_dir,
        "supervisor": {"pid": job.supervisor_pid, "host": job.supervisor_host, "alive": alive},
        "width": len(tasks),
        "hosts": []
        if pool is None
        else [
            {"name": h.label, "role": h.role.value, "since": h.since or None, "until": h.until}
            for h in pool.hosts
        ],
        "host_notes": [] if pool is None else describe_hosts(pool, now),
        "tasks": [
            {
                "index": t.idx,
                "type": t.type,
                "host": t.host,
                "address": t.address,
                # host:port the trainer's own cluster (its own resolver) gave it; null: TF_CONFIG's
                "listening": t.listening or None,
                "state": t.state.value,
                "agent": t.agent or None,
                # its trainer's container (podman, Docker); null: none, or not named
                "container": container_name(job.id, t.idx, t.attempt) if named else None,
                "pid": t.trainer_pid,
                "exit_code": t.exit_code,
                "attempt": t.attempt,
                "epoch": t.epoch,
                # false: the trainer reports no epochs (a custom loop): `epoch` is 0 then
                "epochs_observed": bool(t.epoch or t.total_epochs),
                "initial_epoch": t.initial_epoch,
                "step": t.step,
                "loss": t.loss,
                "steps_per_sec": t.steps_per_sec,
                "phase": t.phase.value,
                "step_signal": t.step_signal.value,
                "steps_observed": t.step_signal != StepSignal.NONE,
                "total_epochs": t.total_epochs,
                "steps_per_epoch": t.steps_per_epoch,
                "epoch_step": t.epoch_step,
                "eta_seconds": _eta(t),
                "first_step_at": t.first_step_at,
                "heartbeat_age": None
                if t.heartbeat_at is None
                else round(max(now - t.heartbeat_at, 0.0), 2),
                # The latest sample while it runs (worker.resources); None: none yet or ended.
                "resources": None
                if t.resources is None or t.state.is_terminal()
                else t.resources.to_dict(),
                "straggler": t.straggler or None,
                # With no supervisor, `state` is the last one recorded: what is known now.
                "unsupervised": unsupervised_check(job, t) if alive is False else None,
            }
            for t in tasks
        ],
    }


def _eta(task: TaskRecord) -> float | None:
    """Seconds to the end of model.fit at the current pace; None where fit gave no totals."""
    if task.state.is_terminal() or not task.steps_per_sec:
        return None
    left = remaining_steps(task.epoch, task.total_epochs, task.steps_per_epoch, task.epoch_step)
    return None if left is None else round(left / task.steps_per_sec, 1)


def status_documents(
    store: Store, jobs: list[JobRecord], with_events: bool = False
) -> list[dict[str, Any]]:
    """Each job as `status --json` shows it (with_events: the events of the first, too)."""
    tasks = store.tasks_for([j.id for j in jobs])
    now = time.time()
    views = [job_view(j, tasks[j.id], now) for j in jobs]
    if with_events:
        # One job asked for: why its restarts are cold (null: they may be warm). Not for a
        # list of jobs: it reads the job's backend plug-in, an import `status` else avoids.
        views[0]["cold_restarts"] = _cold_restarts(jobs[0])
        views[0]["events"] = [
            {"ts": e.ts, "kind": e.kind, "task": e.task, "message": e.message}
            for e in store.events(jobs[0].id)
        ]
    return views
