"""Job operations outside the supervision loop: register a job, collect its results, tell
whether its supervisor lives, stop it without a supervisor, and find its live processes.

`status` imports this module: the heavy ones (pydantic models, backends) are imported inside the
functions that need them, so that it stays fast."""

from __future__ import annotations

import secrets
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.states import JobState, TaskState
from orchestrator.store import JobRecord, Store, TaskRecord

if TYPE_CHECKING:
    from orchestrator.backends import Backend
    from orchestrator.config import ClusterConfig
    from orchestrator.fanout import HostResults


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
        config_path=config_path,
        config_json=config.model_dump_json(),
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
    if job.supervisor_pid is None:
        return False
    if job.supervisor_host != socket.gethostname():
        return None  # on another machine: we cannot tell from here
    from worker.proctl import is_alive

    return is_alive(job.supervisor_pid)


def stop_without_supervisor(store: Store, job: JobRecord, cfg: Any) -> None:
    """The supervisor is gone (or did not answer): stop the agents ourselves."""
    from orchestrator.backends import open_backend
    from orchestrator.launcher import AGENT_STOP_MARGIN, AgentRef, stop_agents

    tasks = store.tasks(job.id)
    agents = [AgentRef(t.idx, t.host_index, t.agent_pid) for t in tasks if t.agent_pid]
    backend = open_backend(cfg)
    try:
        stop_agents(backend, agents, cfg.supervision.stop_grace + AGENT_STOP_MARGIN)
    finally:
        backend.close()
    store.update_tasks(
        job.id, {t.idx: {"state": TaskState.STOPPED} for t in tasks if not t.state.is_terminal()}
    )
    store.update_job(job.id, state=JobState.STOPPED, last_cause="stopped on request")
    store.add_event(job.id, "stopped", "stopped on request (no supervisor)")


def alive_job_processes(store: Store, job_id: str, cfg: Any) -> HostResults[int, set[int]]:
    """Per host index, which of the job's recorded agent and trainer pids still live there."""
    from orchestrator.backends import open_backend
    from orchestrator.fanout import each

    by_host: dict[int, list[int]] = {}
    for t in store.tasks(job_id):
        pids = [p for p in (t.agent_pid, t.trainer_pid) if p]
        by_host.setdefault(t.host_index, []).extend(pids)
    backend = open_backend(cfg)
    try:
        return each(by_host, lambda h: backend.transport(h).alive_pids(by_host[h]))
    finally:
        backend.close()
