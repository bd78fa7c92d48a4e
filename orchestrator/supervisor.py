"""The supervisor: launch a job, watch it to the end, record everything in the store.

It runs in the foreground (`orchestrate launch`) or as a detached background process
(`orchestrate launch --detach`, i.e. `python -m orchestrator supervise JOB`). The rules live in
monitor.py; this module does the I/O: status files, log streaming, store updates, stopping.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from orchestrator.backends import Backend, open_backend
from orchestrator.config import ClusterConfig
from orchestrator.errors import OrchestrateError
from orchestrator.launcher import (
    AgentRef,
    job_layout,
    make_specs,
    plan_launch,
    preflight,
    run_setup,
    start_agents,
    stop_agents,
)
from orchestrator.logstream import LineSink, LogTailer
from orchestrator.monitor import Decision, TaskObservation, Verdict, decide, task_state_of
from orchestrator.plan import LaunchPlan, task_slots
from orchestrator.states import JobState, TaskState
from orchestrator.store import JobRecord, Store, TaskRecord, orchestrate_home
from worker.spec import TaskStatus


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def job_home(job_id: str) -> Path:
    """The coordinator's own directory for a job: streamed log copies, collected results."""
    return orchestrate_home() / "jobs" / job_id


def register_job(store: Store, config: ClusterConfig, config_path: str) -> JobRecord:
    """Record a validated job (state PENDING) with its planned tasks; starts nothing."""
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


@dataclass
class _Watch:
    """Per-attempt bookkeeping of what the supervisor has seen (coordinator clock)."""

    started: float
    seq: dict[int, int] = field(default_factory=dict)
    seq_changed: dict[int, float] = field(default_factory=dict)
    first_step: set[int] = field(default_factory=set)
    last: dict[int, dict[str, object]] = field(default_factory=dict)


class Supervisor:
    def __init__(
        self,
        store: Store,
        job: JobRecord,
        config: ClusterConfig,
        sink: LineSink,
        backend: Backend | None = None,
    ) -> None:
        self.store = store
        self.job = job
        self.config = config
        self.sink = sink
        self.backend = backend or open_backend(config)
        self.stop_requested = threading.Event()
        self.layout = job_layout(config, job.id)
        self.attempt = 0
        self._alive_cache: set[int] = set()
        self._alive_checked_at = float("-inf")

    def install_signal_handlers(self) -> None:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop_requested.set()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, on_signal)

    def run(self) -> JobState:
        """Launch and supervise to a terminal state; always leaves no agent running."""
        job_id = self.job.id
        self.store.update_job(
            job_id,
            state=JobState.LAUNCHING,
            supervisor_pid=os.getpid(),
            supervisor_host=socket.gethostname(),
        )
        try:
            return self._run_attempt(attempt=0)
        except OrchestrateError as exc:
            self._finish(JobState.FAILED, str(exc))
            raise
        finally:
            self.sink.close()
            self.backend.close()

    def _run_attempt(self, attempt: int) -> JobState:
        job_id, config = self.job.id, self.config
        self.attempt = attempt
        self.sink.info(f"preflight on {self.backend.host_count()} host(s)")
        reports = preflight(config, self.backend, job_id)
        if attempt == 0:
            run_setup(config, self.backend)
        plan = plan_launch(config, reports)
        specs = make_specs(config, plan, job_id, attempt, self.backend)
        self.store.replace_tasks(job_id, self._task_records(plan, attempt))
        if self.stop_requested.is_set():
            self._finish(JobState.STOPPED, "stopped before launch")
            return JobState.STOPPED
        pids = start_agents(self.backend, plan, specs, config.supervision.stop_grace)
        agents = [AgentRef(i, plan.tasks[i].host_index, pid) for i, pid in pids.items()]
        self.store.update_tasks(
            job_id, {i: {"agent_pid": pid, "state": TaskState.STARTING} for i, pid in pids.items()}
        )
        self.store.update_job(job_id, state=JobState.RUNNING, attempt=attempt)
        self.store.add_event(job_id, "launched", f"attempt {attempt}: {len(pids)} task(s) started")
        self.sink.info(
            f"job {job_id}: {len(pids)} task(s) running; "
            + ", ".join(f"worker-{t.index}={t.endpoint}" for t in plan.tasks)
        )

        watch = _Watch(started=time.monotonic())
        decision = self._watch(plan, agents, watch)
        if decision is None:
            self.store.update_job(job_id, state=JobState.STOPPING)
            self.sink.info("stop requested: stopping every task")
            self._stop_all(plan, agents, watch)
            self._finish(JobState.STOPPED, "stopped on request")
            return JobState.STOPPED
        if decision.verdict == Verdict.SUCCEEDED:
            self._let_stragglers_finish(plan, agents, watch)
            self._stop_all(plan, agents, watch)
            self._collect()
            self._finish(JobState.SUCCEEDED, decision.cause)
            return JobState.SUCCEEDED
        self.store.update_job(job_id, state=JobState.STOPPING, last_cause=decision.cause)
        self.sink.info(f"{decision.cause}: stopping every task")
        self._stop_all(plan, agents, watch)
        self._collect()
        self._finish(JobState.FAILED, decision.cause)
        return JobState.FAILED

    def _task_records(self, plan: LaunchPlan, attempt: int) -> list[TaskRecord]:
        return [
            TaskRecord(
                job_id=self.job.id,
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

    # --- watching ---------------------------------------------------------------------
    def _watch(self, plan: LaunchPlan, agents: list[AgentRef], watch: _Watch) -> Decision | None:
        """Poll until the group needs a decision; None when a stop was requested."""
        sup = self.config.supervision
        self._tailers = {
            t.index: LogTailer(
                self.backend.transport(t.host_index), str(self.layout.log_path(t.index))
            )
            for t in plan.tasks
        }
        while not self.stop_requested.is_set():
            observations = self._observe(plan, agents, watch)
            decision = decide(
                observations,
                elapsed=time.monotonic() - watch.started,
                startup_deadline=sup.startup_deadline,
                heartbeat_timeout=sup.heartbeat_timeout,
            )
            if decision.verdict != Verdict.CONTINUE:
                return decision
            self.stop_requested.wait(sup.poll_interval)
        return None

    def _observe(
        self, plan: LaunchPlan, agents: list[AgentRef], watch: _Watch
    ) -> list[TaskObservation]:
        now_mono, now = time.monotonic(), time.time()
        alive = self._alive_agents_cached(agents, now_mono)
        observations: list[TaskObservation] = []
        updates: dict[int, dict[str, object]] = {}
        for agent in agents:
            i = agent.task_index
            task = plan.tasks[i]
            transport = self.backend.transport(task.host_index)
            try:
                self.sink.task_lines(i, task.host_label, self._tailers[i].poll())
                status = _parse_status(transport.read_file(str(self.layout.status_path(i))))
            except OrchestrateError:
                # Unreachable this tick (the transport reconnects next time); its heartbeat
                # age keeps growing, so a host that stays away is caught by the timeout.
                last_state = watch.last.get(i, {}).get("state", TaskState.STARTING)
                observations.append(
                    TaskObservation(
                        index=i,
                        state=last_state
                        if isinstance(last_state, TaskState)
                        else TaskState.STARTING,
                        heartbeat_age=now_mono - watch.seq_changed.get(i, watch.started),
                        reached_first_step=i in watch.first_step,
                        is_chief=task.is_chief,
                    )
                )
                continue
            if status is not None and status.attempt != self.attempt:
                status = None  # left over from an earlier attempt
            state = task_state_of(status, agent.pid in alive)
            if status is not None and status.seq != watch.seq.get(i):
                watch.seq[i] = status.seq
                watch.seq_changed[i] = now_mono
            progress = status.progress if status is not None else None
            if progress is not None and progress.step > 0 and i not in watch.first_step:
                watch.first_step.add(i)
                updates.setdefault(i, {})["first_step_at"] = now
            row: dict[str, object] = {"state": state}
            if status is not None:
                row.update(
                    trainer_pid=status.trainer_pid,
                    exit_code=status.exit_code,
                    epoch=progress.epoch if progress else 0,
                    step=progress.step if progress else 0,
                    loss=progress.loss if progress else None,
                    steps_per_sec=progress.steps_per_sec if progress else None,
                    seq=status.seq,
                )
            if row != watch.last.get(i):
                watch.last[i] = row
                values = {k: v for k, v in row.items() if k != "seq"}
                values["heartbeat_at"] = now - (now_mono - watch.seq_changed.get(i, now_mono))
                updates.setdefault(i, {}).update(values)
            age_since = watch.seq_changed.get(i, watch.started)
            observations.append(
                TaskObservation(
                    index=i,
                    state=state,
                    exit_code=status.exit_code if status is not None else None,
                    heartbeat_age=now_mono - age_since,
                    reached_first_step=i in watch.first_step,
                    is_chief=task.is_chief,
                )
            )
        self.store.update_tasks(self.job.id, updates)
        return observations

    def _alive_agents_cached(self, agents: list[AgentRef], now: float) -> set[int]:
        """Liveness at most every backend.alive_check_interval (a remote command each)."""
        interval = self.backend.alive_check_interval
        if interval <= 0 or now - self._alive_checked_at >= interval:
            self._alive_cache = self._alive_agents(agents)
            self._alive_checked_at = now
        return self._alive_cache

    def _alive_agents(self, agents: list[AgentRef]) -> set[int]:
        by_host: dict[int, list[int]] = {}
        for agent in agents:
            by_host.setdefault(agent.host_index, []).append(agent.pid)
        alive: set[int] = set()
        for host_index, pids in by_host.items():
            try:
                alive |= self.backend.transport(host_index).alive_pids(pids)
            except OrchestrateError:
                # Unreachable for now: not proof of death. The heartbeat timeout decides.
                alive |= set(pids)
        return alive

    # --- ending -----------------------------------------------------------------------
    def _let_stragglers_finish(
        self, plan: LaunchPlan, agents: list[AgentRef], watch: _Watch
    ) -> None:
        """After the chief succeeds, the others are normally exiting too: give them a moment."""
        deadline = time.monotonic() + self.config.supervision.stop_grace
        while time.monotonic() < deadline and not self.stop_requested.is_set():
            if not self._alive_agents(agents):
                break
            time.sleep(self.config.supervision.poll_interval)
        self._observe(plan, agents, watch)

    def _stop_all(self, plan: LaunchPlan, agents: list[AgentRef], watch: _Watch) -> None:
        running_before = {t.idx for t in self.store.tasks(self.job.id) if not t.state.is_terminal()}
        results = stop_agents(self.backend, agents, self.config.supervision.stop_grace)
        self._observe(plan, agents, watch)  # final statuses (exit codes) after the stop
        for agent in agents:
            i = agent.task_index
            task = plan.tasks[i]
            self.sink.task_lines(i, task.host_label, self._tailers[i].flush())
        stuck = [i for i, ok in results.items() if not ok]
        if stuck:
            self.store.add_event(self.job.id, "stop_failed", f"could not stop tasks {stuck}")
        # We stopped them: a task without a final status of its own is stopped, not lost.
        self.store.update_tasks(
            self.job.id,
            {
                t.idx: {"state": TaskState.STOPPED}
                for t in self.store.tasks(self.job.id)
                if t.idx in running_before
                and (not t.state.is_terminal() or t.state == TaskState.LOST)
            },
        )

    def _collect(self) -> None:
        try:
            collect_job(self.backend, self.layout.root, job_home(self.job.id) / "collected")
        except (OSError, OrchestrateError) as exc:
            self.store.add_event(self.job.id, "collect_failed", str(exc))

    def _finish(self, state: JobState, cause: str) -> None:
        self.store.update_job(self.job.id, state=state, last_cause=cause)
        self.store.add_event(self.job.id, state.value, cause)
        self.sink.info(f"job {self.job.id} {state.value}: {cause}")


def collect_job(backend: Backend, job_root: object, dest: Path) -> int:
    """Pull per-task logs, the final model and metrics from the shared directory."""
    transport = backend.transport(0)
    root = str(job_root)
    count = transport.get_tree(f"{root}/logs", dest / "logs")
    count += transport.get_tree(f"{root}/model", dest / "model")
    metrics = transport.read_file(f"{root}/metrics.json")
    if metrics is not None:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "metrics.json").write_bytes(metrics)
        count += 1
    return count


def _parse_status(raw: bytes | None) -> TaskStatus | None:
    if not raw:
        return None
    try:
        return TaskStatus.model_validate_json(raw)
    except ValueError:
        return None
