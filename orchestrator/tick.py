"""One supervisor tick: every host read at once, in one request each (liveness when due, then
each task's new log bytes and status file), turned into one observation per task, with its
bookkeeping (heartbeats and steps on the coordinator's clock, the store, the streamed logs).

The supervisor calls `Tick.observe` every poll interval and hands the observations to
monitor.decide."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field

from orchestrator.backends import Backend
from orchestrator.fanout import Fanout
from orchestrator.launcher import AgentRef
from orchestrator.logstream import LineSink, LogTailer
from orchestrator.monitor import task_state_of
from orchestrator.observations import TaskObservation
from orchestrator.plan import LaunchPlan, TaskPlan
from orchestrator.states import TaskState
from orchestrator.store import Sample, Store
from worker.spec import JobLayout, Phase, StepSignal, TaskStatus

# A read is never given less than this, even when its host's host_timeout is nearly spent.
MIN_READ_TIMEOUT = 0.5


@dataclass
class Watch:
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
    host_ok: dict[int, float] = field(default_factory=dict)  # host -> last read that worked
    host_error: dict[int, str] = field(default_factory=dict)  # host -> why its last read failed


@dataclass
class HostRead:
    """What one tick read from one reachable host."""

    alive: set[int] | None  # agent pids found alive; None when liveness was not checked
    lines: dict[int, list[bytes]] = field(default_factory=dict)  # task -> new whole log lines
    status: dict[int, bytes | None] = field(default_factory=dict)  # task -> status file


def agents_by_host(agents: list[AgentRef]) -> dict[int, list[AgentRef]]:
    by_host: dict[int, list[AgentRef]] = {}
    for agent in agents:
        by_host.setdefault(agent.host_index, []).append(agent)
    return by_host


@dataclass(frozen=True)
class Group:
    """One attempt's running group: what was planned and which agents run it."""

    attempt: int
    plan: LaunchPlan
    agents: list[AgentRef]


class Tick:
    """The reads and bookkeeping of a job's ticks; it keeps each task's log offset, the last
    liveness answer, and the thread pool that reads every host at once."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        backend: Backend,
        layout: JobLayout,
        sink: LineSink,
        instrumented: bool,
        host_timeout: float = 5.0,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.backend = backend
        self.layout = layout
        self.sink = sink
        self.instrumented = instrumented
        self.host_timeout = host_timeout
        self.tailers: dict[int, LogTailer] = {}
        self.alive_cache: set[int] = set()
        self._alive_checked_at = float("-inf")
        self._alive_checked_pids: frozenset[int] = frozenset()
        self.fanout = Fanout()  # every host read at once each tick

    def close(self) -> None:
        self.fanout.close()

    def recheck_liveness(self) -> None:
        """The next tick asks every host which agents live, whatever the interval."""
        self._alive_checked_at = float("-inf")

    def observe(
        self, group: Group, watch: Watch, skip: Collection[int] = ()
    ) -> list[TaskObservation]:
        """One round of reads of every host but those in `skip` (lost: not waited on)."""
        # The tick's time is taken before the reads: a slow host must not age the heartbeats
        # of the hosts read at once beside it.
        now_mono, now = time.monotonic(), time.time()
        by_host = {h: a for h, a in agents_by_host(group.agents).items() if h not in skip}
        check_alive = self.alive_check_due(group.agents, now_mono)
        # Each read may take what is left of the host's host_timeout (from its last good
        # read): a host that stops answering is then lost host_timeout after it last answered.
        limits = {
            h: max(
                MIN_READ_TIMEOUT, self.host_timeout - (now_mono - watch.host_ok.get(h, now_mono))
            )
            for h in by_host
        }
        reads = self.fanout.each(
            by_host, lambda h: self.read_host(h, by_host[h], check_alive, limits[h])
        )
        for h in reads.succeeded:
            watch.host_ok[h] = now_mono
            watch.host_error.pop(h, None)
        for h in reads.failed:
            watch.host_error[h] = reads.reason(
                h, group.plan.tasks[by_host[h][0].task_index].host_label
            )
        if check_alive:  # an unreachable host is not proof of death: its agents count as alive
            self.alive_cache = set().union(
                *(reads.succeeded[h].alive or set() for h in reads.succeeded),
                *({a.pid for a in by_host[h]} for h in reads.failed),
            )
        alive = self.alive_cache
        observations: list[TaskObservation] = []
        updates: dict[int, dict[str, object]] = {}
        samples: list[Sample] = []
        for agent in group.agents:
            i = agent.task_index
            task = group.plan.tasks[i]
            read = reads.succeeded.get(agent.host_index)
            if agent.host_index in skip:
                continue
            if read is None:
                # Unreachable this tick (the transport reconnects next time); its heartbeat
                # age keeps growing, so a host that stays away is caught by the timeout.
                observations.append(self.unreachable(i, task, watch, now_mono))
                continue
            self.sink.task_lines(i, task.host_label, read.lines.get(i, []))
            status = parse_status(read.status[i])
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
                    instrumented=self.instrumented,
                )
            )
        self.store.update_tasks(self.job_id, updates)
        self.store.add_samples(self.job_id, samples)
        return observations

    @staticmethod
    def unreachable(i: int, task: TaskPlan, watch: Watch, now: float) -> TaskObservation:
        last_state = watch.last.get(i, {}).get("state", TaskState.STARTING)
        return TaskObservation(
            index=i,
            state=last_state if isinstance(last_state, TaskState) else TaskState.STARTING,
            heartbeat_age=now - watch.seq_changed.get(i, watch.started),
            reached_first_step=i in watch.first_step,
            is_chief=task.is_chief,
        )

    def read_host(
        self,
        host_index: int,
        agents: list[AgentRef],
        check_alive: bool,
        timeout: float | None = None,
    ) -> HostRead:
        """One host's part of a tick (on a thread of its own), in one round trip: liveness when
        due, then each task's new log bytes and status file. Raises when the host is
        unreachable."""
        procs = [a.process for a in agents]
        files: list[tuple[str, int]] = []
        for agent in agents:
            i = agent.task_index
            files += [(str(self.layout.log_path(i)), self.tailers[i].offset),
                      (str(self.layout.status_path(i)), 0)]  # fmt: skip
        seen = self.backend.transport(host_index).observe(
            procs if check_alive else None,
            files,
            timeout=timeout or self.host_timeout,
            contact=[a.pid for a in agents],
        )
        read = HostRead(alive=seen.alive)
        for k, agent in enumerate(agents):
            i = agent.task_index
            read.lines[i] = self.tailers[i].feed(seen.files[2 * k])
            read.status[i] = seen.files[2 * k + 1]
        return read

    def lost_hosts(self, group: Group, watch: Watch) -> list[int]:
        """Hosts whose reads have failed for host_timeout (counted from the attempt's start for
        a host never read yet): lost, whatever their tasks last said."""
        now = time.monotonic()
        return sorted(
            h
            for h in agents_by_host(group.agents)
            if h in watch.host_error
            and now - watch.host_ok.get(h, watch.started) >= self.host_timeout
        )

    def alive_check_due(self, agents: list[AgentRef], now: float) -> bool:
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

    def alive_agents(self, agents: list[AgentRef]) -> set[int]:
        by_host = agents_by_host(agents)

        def check(host_index: int) -> set[int]:
            procs = [a.process for a in by_host[host_index]]
            return self.backend.transport(host_index).alive_pids(procs)

        results = self.fanout.each(by_host, check)
        return set().union(  # unreachable for now is not proof of death
            *results.values(), *({a.pid for a in by_host[h]} for h in results.failed)
        )


def parse_status(raw: bytes | None) -> TaskStatus | None:
    if not raw:
        return None
    try:
        return TaskStatus.from_json(raw)
    except ValueError:
        return None
