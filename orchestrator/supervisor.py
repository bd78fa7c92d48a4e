"""The supervisor: launch a job, watch it to the end, restart the whole group on failure, and
record everything in the store.

It runs in the foreground (`orchestrate launch`), as a detached background process
(`orchestrate launch --detach`, i.e. `python -m orchestrator supervise JOB`), or adopts a
running job whose supervisor died (`orchestrate attach JOB`). The rules live in monitor.py; this
module does the I/O: status files, log streaming, store updates, stopping, relaunching.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from orchestrator.backends import Backend, open_backend
from orchestrator.config import ClusterConfig
from orchestrator.errors import OrchestrateError
from orchestrator.fanout import Fanout
from orchestrator.launcher import (
    AGENT_STOP_MARGIN,
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
from orchestrator.monitor import (
    Decision,
    FailureKind,
    TaskObservation,
    Verdict,
    decide,
    failure,
    plan_restart,
    task_state_of,
)
from orchestrator.plan import LaunchPlan, TaskPlan, task_slots
from orchestrator.states import JobState, TaskState
from orchestrator.store import JobRecord, Sample, Store, TaskRecord, orchestrate_home
from worker.spec import Phase, StepSignal, TaskStatus

# A group that failed is broken (MWMS collectives cannot complete): no checkpoint can be taken,
# and a trainer blocked in a collective ignores SIGTERM anyway. So its tasks get only a moment
# between SIGTERM and SIGKILL, and the restart starts sooner.
BROKEN_GROUP_GRACE = 0.2

UNINSTRUMENTED_NOTICE = (
    "entrypoint.instrument = false: progress, the watchdog and the first-step deadline see only "
    "the phases and steps the script reports through worker.runtime (none for a plain script, "
    "which then meets the startup deadline by running)"
)


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
    step: dict[int, int] = field(default_factory=dict)
    step_changed: dict[int, float] = field(default_factory=dict)
    first_step: set[int] = field(default_factory=set)
    last: dict[int, dict[str, object]] = field(default_factory=dict)
    # The startup deadline is checked once, when it passes: a group that met it then (a task
    # whose steps are not observed meets it at the rendezvous) is not judged by it again.
    startup_passed: bool = False


@dataclass
class _HostRead:
    """What one tick read from one host; a task missing from `status` was unreachable."""

    alive: set[int]  # agent pids found alive (all of them when not checked or unreachable)
    lines: dict[int, list[bytes]] = field(default_factory=dict)  # task -> new whole log lines
    status: dict[int, bytes | None] = field(default_factory=dict)  # task -> status file


def _agents_by_host(agents: list[AgentRef]) -> dict[int, list[AgentRef]]:
    by_host: dict[int, list[AgentRef]] = {}
    for agent in agents:
        by_host.setdefault(agent.host_index, []).append(agent)
    return by_host


@dataclass(frozen=True)
class _Group:
    """One attempt's running group: what was planned and which agents run it."""

    attempt: int
    plan: LaunchPlan
    agents: list[AgentRef]


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
        self.attempt = job.attempt
        self._tailers: dict[int, LogTailer] = {}
        self._alive_cache: set[int] = set()
        self._alive_checked_at = float("-inf")
        self._alive_checked_pids: frozenset[int] = frozenset()
        self._fanout = Fanout()  # every host read at once each tick
        self._leftovers: list[AgentRef] = []  # agents of earlier attempts we could not stop
        self._watch_state = _Watch(started=time.monotonic())

    def install_signal_handlers(self) -> None:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop_requested.set()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, on_signal)

    # --- entry points -------------------------------------------------------------------
    def run(self) -> JobState:
        """Launch a registered job and supervise it to a terminal state."""
        return self._main(adopted=None)

    def adopt(self) -> JobState:
        """Supervise a job whose agents are running but whose supervisor is gone."""
        tasks = self.store.tasks(self.job.id)
        plan = LaunchPlan(self.job.name, tuple(_task_plan(t) for t in tasks))
        agents = [AgentRef(t.idx, t.host_index, t.agent_pid) for t in tasks if t.agent_pid]
        log_copies = self.sink.copy_dir
        self._tailers = {
            t.index: LogTailer(
                self.backend.transport(t.host_index),
                str(self.layout.log_path(t.index)),
                offset=_size(log_copies / f"worker-{t.index}.log"),
            )
            for t in plan.tasks
        }
        self.store.add_event(self.job.id, "attached", f"supervisor {os.getpid()} adopted the job")
        self.sink.info(f"attached to job {self.job.id} (attempt {self.job.attempt})")
        group = _Group(self.job.attempt, plan, agents)
        if len(agents) < len(plan.tasks):  # died mid-launch: the group is incomplete
            return self._main(
                adopted=group, first=failure(FailureKind.LOST, "launch was interrupted")
            )
        return self._main(adopted=group)

    # --- the restart loop ---------------------------------------------------------------
    def _main(self, adopted: _Group | None, first: Decision | None = None) -> JobState:
        job_id = self.job.id
        self.store.update_job(
            job_id,
            state=JobState.RUNNING if adopted else JobState.LAUNCHING,
            supervisor_pid=os.getpid(),
            supervisor_host=socket.gethostname(),
        )
        try:
            return self._loop(adopted, first)
        except OrchestrateError as exc:
            self._finish(JobState.FAILED, str(exc))
            raise
        finally:
            self.sink.close()
            self._fanout.close()
            self.backend.close()

    def _attempt(self, group: _Group | None) -> tuple[_Group | None, Decision | None]:
        """Launch (unless adopted) and watch one attempt; a None decision: stop requested."""
        if group is None:
            try:
                group = self._launch(self.attempt)
            except OrchestrateError as exc:
                if self.attempt == 0:
                    raise  # the first launch fails fast: fix the hosts, then relaunch
                return None, failure(FailureKind.LAUNCH, f"relaunch failed: {exc}")
        return group, self._watch(group)

    def _loop(self, group: _Group | None, pending: Decision | None) -> JobState:
        job = self.store.get_job(self.job.id)
        restarts, preemptions = job.restarts, job.preemptions
        while True:
            if pending is not None:
                decision = pending
            else:
                group, outcome = self._attempt(group)
                if outcome is None:
                    assert group is not None
                    return self._stop_on_request(group)
                if outcome.verdict == Verdict.SUCCEEDED:
                    assert group is not None
                    return self._succeed(group, outcome)
                decision = outcome
            self.store.update_job(self.job.id, state=JobState.STOPPING, last_cause=decision.cause)
            self.store.add_event(self.job.id, "failure", decision.cause, *decision.tasks[:1])
            self.sink.info(f"{decision.cause}: stopping every task")
            if group is not None:
                preempted = decision.exit_code == self.config.restart.preemption_exit_code
                grace = self.config.supervision.stop_grace if preempted else BROKEN_GROUP_GRACE
                self._stop_group(group, grace)
            restart = plan_restart(
                decision,
                self.config.restart,
                restarts - preemptions,
                self.config.supervision.on_startup_timeout == "restart",
            )
            if not restart.restart:
                self._collect()
                cause = decision.cause
                if restarts:
                    cause += f" ({restart.reason})"
                self._finish(JobState.FAILED, cause)
                return JobState.FAILED
            restarts += 1
            preemptions += 0 if restart.counts else 1
            self.store.update_job(
                self.job.id, state=JobState.RESTARTING, restarts=restarts, preemptions=preemptions
            )
            message = f"{restart.reason}, in {restart.delay:g}s, after: {decision.cause}"
            self.store.add_event(self.job.id, "restart", message)
            self.sink.info(message)
            if self.stop_requested.wait(restart.delay):
                self._finish(JobState.STOPPED, "stopped on request")
                return JobState.STOPPED
            self.attempt += 1
            group, pending = None, None

    def _launch(self, attempt: int) -> _Group:
        job_id, config = self.job.id, self.config
        if self._leftovers:  # an earlier attempt's agents on a host that was unreachable
            stopped = stop_agents(self.backend, self._leftovers, BROKEN_GROUP_GRACE)
            self._leftovers = [a for a in self._leftovers if not stopped.get(a.task_index)]
        self.sink.info(f"attempt {attempt}: preflight on {self.backend.host_count()} host(s)")
        reports = preflight(config, self.backend, job_id)
        if attempt == 0:
            run_setup(config, self.backend)
            if not config.entrypoint.instrument:
                self.store.add_event(job_id, "notice", UNINSTRUMENTED_NOTICE)
                self.sink.info(UNINSTRUMENTED_NOTICE)
        plan = plan_launch(config, reports)  # ports probed afresh: TF_CONFIG rebuilt
        specs = make_specs(config, plan, job_id, attempt, self.backend)
        self.store.replace_tasks(job_id, self._task_records(plan, attempt))
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
        if not self._tailers:
            self._tailers = {
                t.index: LogTailer(
                    self.backend.transport(t.host_index), str(self.layout.log_path(t.index))
                )
                for t in plan.tasks
            }
        else:  # same files, same offsets: a restart appends to each task's log
            for t in plan.tasks:
                self._tailers[t.index].transport = self.backend.transport(t.host_index)
        return _Group(attempt, plan, agents)

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
    def _watch(self, group: _Group) -> Decision | None:
        """Poll until the group needs a decision; None when a stop was requested."""
        sup = self.config.supervision
        watch = _Watch(started=time.monotonic())
        for t in self.store.tasks(self.job.id):  # adopted tasks may be past their first step
            if t.first_step_at is not None and t.attempt == group.attempt:
                watch.first_step.add(t.idx)
        self._watch_state = watch
        while not self.stop_requested.is_set():
            observations = self._observe(group, watch)
            elapsed = time.monotonic() - watch.started
            decision = decide(
                observations,
                elapsed=elapsed,
                startup_deadline=float("inf") if watch.startup_passed else sup.startup_deadline,
                heartbeat_timeout=sup.heartbeat_timeout,
                progress_timeout=sup.progress_timeout,
            )
            if decision.verdict != Verdict.CONTINUE:
                return decision
            watch.startup_passed = elapsed > sup.startup_deadline
            self.stop_requested.wait(sup.poll_interval)
        return None

    def _observe(self, group: _Group, watch: _Watch) -> list[TaskObservation]:
        # The tick's time is taken before the reads: a slow host must not age the heartbeats
        # of the hosts read at once beside it.
        now_mono, now = time.monotonic(), time.time()
        by_host = _agents_by_host(group.agents)
        check_alive = self._alive_check_due(group.agents, now_mono)
        reads = dict(
            zip(
                by_host,
                self._fanout.map(lambda h: self._read_host(h, by_host[h], check_alive), [*by_host]),
                strict=True,
            )
        )
        if check_alive:
            self._alive_cache = set().union(*(r.alive for r in reads.values()))
        alive = self._alive_cache
        observations: list[TaskObservation] = []
        updates: dict[int, dict[str, object]] = {}
        samples: list[Sample] = []
        for agent in group.agents:
            i = agent.task_index
            task = group.plan.tasks[i]
            read = reads[agent.host_index]
            self.sink.task_lines(i, task.host_label, read.lines.get(i, []))
            if i not in read.status:
                # Unreachable this tick (the transport reconnects next time); its heartbeat
                # age keeps growing, so a host that stays away is caught by the timeout.
                observations.append(self._unreachable(i, task, watch, now_mono))
                continue
            status = _parse_status(read.status[i])
            if status is not None and status.attempt != group.attempt:
                status = None  # left over from an earlier attempt
            state = task_state_of(status, agent.pid in alive)
            progress = status.progress if status is not None else None
            if status is not None and status.seq != watch.seq.get(i):
                watch.seq[i] = status.seq
                watch.seq_changed[i] = now_mono
            if progress is not None and progress.step != watch.step.get(i):
                watch.step[i] = progress.step
                watch.step_changed[i] = now_mono
            if progress is not None and progress.step > 0 and i not in watch.first_step:
                watch.first_step.add(i)
                updates.setdefault(i, {})["first_step_at"] = now
            row: dict[str, object] = {"state": state}
            if status is not None and progress is not None:
                row.update(
                    trainer_pid=status.trainer_pid,
                    exit_code=status.exit_code,
                    epoch=progress.epoch,
                    initial_epoch=progress.initial_epoch,
                    step=progress.step,
                    loss=progress.loss,
                    steps_per_sec=progress.steps_per_sec,
                    phase=progress.phase.value,
                    step_signal=progress.step_signal.value,
                    total_epochs=progress.epochs,
                    steps_per_epoch=progress.steps_per_epoch,
                    epoch_step=progress.epoch_step,
                    seq=status.seq,
                )
            if row != watch.last.get(i):
                if progress is not None and progress.step != watch.last.get(i, {}).get("step"):
                    samples.append(
                        Sample(
                            i,
                            now,
                            group.attempt,
                            progress.epoch,
                            progress.step,
                            progress.loss,
                            progress.steps_per_sec,
                        )
                    )
                watch.last[i] = row
                values = {k: v for k, v in row.items() if k != "seq"}
                values["heartbeat_at"] = now - (now_mono - watch.seq_changed.get(i, now_mono))
                updates.setdefault(i, {}).update(values)
            observations.append(
                TaskObservation(
                    index=i,
                    state=state,
                    exit_code=status.exit_code if status is not None else None,
                    heartbeat_age=now_mono - watch.seq_changed.get(i, watch.started),
                    progress_age=now_mono - watch.step_changed.get(i, watch.started),
                    phase=progress.phase if progress is not None else Phase.NONE,
                    reached_first_step=i in watch.first_step,
                    is_chief=task.is_chief,
                    step_signal=progress.step_signal if progress else StepSignal.NONE,
                    instrumented=self.config.entrypoint.instrument,
                )
            )
        self.store.update_tasks(self.job.id, updates)
        self.store.add_samples(self.job.id, samples)
        return observations

    @staticmethod
    def _unreachable(i: int, task: TaskPlan, watch: _Watch, now: float) -> TaskObservation:
        last_state = watch.last.get(i, {}).get("state", TaskState.STARTING)
        return TaskObservation(
            index=i,
            state=last_state if isinstance(last_state, TaskState) else TaskState.STARTING,
            heartbeat_age=now - watch.seq_changed.get(i, watch.started),
            reached_first_step=i in watch.first_step,
            is_chief=task.is_chief,
        )

    def _read_host(self, host_index: int, agents: list[AgentRef], check_alive: bool) -> _HostRead:
        """One host's part of a tick (on a thread of its own), in one round trip: liveness when
        due, then each task's new log bytes and status file."""
        pids = [a.pid for a in agents]
        read = _HostRead(alive=set(pids))  # unreachable is not proof of death
        files: list[tuple[str, int]] = []
        for agent in agents:
            i = agent.task_index
            files += [(str(self.layout.log_path(i)), self._tailers[i].offset),
                      (str(self.layout.status_path(i)), 0)]  # fmt: skip
        try:
            seen = self.backend.transport(host_index).observe(pids if check_alive else None, files)
        except OrchestrateError:
            return read  # no task of this host has a status: all observed as unreachable
        if seen.alive is not None:
            read.alive = seen.alive
        for k, agent in enumerate(agents):
            i = agent.task_index
            read.lines[i] = self._tailers[i].feed(seen.files[2 * k])
            read.status[i] = seen.files[2 * k + 1]
        return read

    def _alive_check_due(self, agents: list[AgentRef], now: float) -> bool:
        """Liveness at most every backend.alive_check_interval (a remote call per host), and at
        once for agents not checked before (a relaunch must not be judged by the old pids)."""
        interval = self.backend.alive_check_interval
        pids = frozenset(a.pid for a in agents)
        stale = interval <= 0 or now - self._alive_checked_at >= interval
        if stale or pids != self._alive_checked_pids:
            self._alive_checked_at = now
            self._alive_checked_pids = pids
            return True
        return False

    def _alive_agents(self, agents: list[AgentRef]) -> set[int]:
        by_host = _agents_by_host(agents)

        def check(host_index: int) -> set[int]:
            pids = [a.pid for a in by_host[host_index]]
            try:
                return self.backend.transport(host_index).alive_pids(pids)
            except OrchestrateError:
                return set(pids)  # unreachable for now: not proof of death

        return set().union(*self._fanout.map(check, [*by_host]))

    # --- ending -----------------------------------------------------------------------
    def _succeed(self, group: _Group, outcome: Decision) -> JobState:
        # The chief succeeded: the others are normally exiting too; give them a moment.
        deadline = time.monotonic() + self.config.supervision.stop_grace
        while time.monotonic() < deadline and not self.stop_requested.is_set():
            if not self._alive_agents(group.agents):
                break
            time.sleep(self.config.supervision.poll_interval)
        self._stop_group(group, self.config.supervision.stop_grace + AGENT_STOP_MARGIN)
        self._collect()
        self._finish(JobState.SUCCEEDED, outcome.cause)
        return JobState.SUCCEEDED

    def _stop_on_request(self, group: _Group) -> JobState:
        self.store.update_job(self.job.id, state=JobState.STOPPING)
        self.sink.info("stop requested: stopping every task")
        self._stop_group(group, self.config.supervision.stop_grace + AGENT_STOP_MARGIN)
        self._finish(JobState.STOPPED, "stopped on request")
        return JobState.STOPPED

    def _stop_group(self, group: _Group, grace: float) -> None:
        """Stop every agent's process group; record final states; flush the logs."""
        running_before = {t.idx for t in self.store.tasks(self.job.id) if not t.state.is_terminal()}
        results = stop_agents(self.backend, group.agents, grace)
        self._alive_checked_at = float("-inf")
        self._observe(group, self._watch_state)
        for agent in group.agents:
            task = group.plan.tasks[agent.task_index]
            with contextlib.suppress(OrchestrateError):  # an unreachable host's last lines
                self.sink.task_lines(
                    agent.task_index, task.host_label, self._tailers[agent.task_index].flush()
                )
        stuck = [a for a in group.agents if not results.get(a.task_index)]
        if stuck:
            self._leftovers.extend(stuck)
            names = ", ".join(f"worker-{a.task_index}" for a in stuck)
            self.store.add_event(self.job.id, "stop_failed", f"could not stop {names} (yet)")
        # We stopped them: whatever they reported while going down (lost, or the preemption
        # exit code of a trainer that checkpointed on our SIGTERM), they are stopped.
        self.store.update_tasks(
            self.job.id,
            {
                t.idx: {"state": TaskState.STOPPED}
                for t in self.store.tasks(self.job.id)
                if t.idx in running_before and t.state != TaskState.SUCCEEDED
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
        # The run report draws with matplotlib: in a process of its own, so the supervisor
        # (resident for the whole job) never carries matplotlib's memory.
        report = subprocess.run(
            [sys.executable, "-m", "orchestrator", "report", self.job.id, "--json"],
            capture_output=True,
            timeout=300,
            check=False,
        )
        if report.returncode == 0:
            self.sink.info(f"run report: {job_home(self.job.id) / 'report.png'}")
        else:
            detail = report.stderr.decode(errors="replace").strip()[-300:]
            self.store.add_event(self.job.id, "report_failed", detail)


def _task_plan(task: TaskRecord) -> TaskPlan:
    host, _, port = task.address.rpartition(":")
    return TaskPlan(
        index=task.idx,
        host_index=task.host_index,
        host_label=task.host,
        address=host.strip("[]"),
        port=int(port) if port.isdigit() else None,
        type=task.type,
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


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


def _parse_status(raw: bytes | None) -> TaskStatus | None:
    if not raw:
        return None
    try:
        return TaskStatus.from_json(raw)
    except ValueError:
        return None
