"""What the supervisor sees of a running group: each host's answers (long polls by
orchestrator.host_poller while the group is watched, or one round of immediate reads) turned
into one observation per task, with its bookkeeping (heartbeats and steps on the coordinator's
clock, the store, the streamed logs).

While it watches a group the supervisor calls `Tick.next` every poll interval: it returns as
soon as a host reports something urgent (an agent gone, a new state or exit code), otherwise
after the interval with whatever the hosts answered meanwhile. Only the hosts that answered
cost work; the others' observations are kept, their ages updated. `Tick.observe` is one round
of reads of every host at once (after a stop, and in tests)."""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from orchestrator.backends import Backend
from orchestrator.fanout import Fanout
from orchestrator.host_poller import (
    MIN_READ_TIMEOUT,
    HostPoller,
    PollResult,
    PollTarget,
    read_timeout,
)
from orchestrator.launcher import AgentRef
from orchestrator.logstream import LineSink, LogTailer
from orchestrator.monitor import task_state_of
from orchestrator.observations import TaskObservation
from orchestrator.plan import LaunchPlan, TaskPlan
from orchestrator.states import TaskState
from orchestrator.store import ResourceSample, Sample, Store
from worker import host_watch
from worker.spec import JobLayout, Phase, StepSignal, TaskStatus

RESOURCE_SAMPLE_EVERY = 5.0  # seconds between a task's resource samples kept for the report


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
    # What each task looked like at its host's last answer, ages left out (added each round).
    seen: dict[int, TaskObservation] = field(default_factory=dict)
    raw_status: dict[int, bytes | None] = field(default_factory=dict)
    status: dict[int, TaskStatus | None] = field(default_factory=dict)  # parsed, this attempt's
    resources_kept: dict[int, float] = field(default_factory=dict)  # task -> last kept sample's


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


@dataclass
class _Round:
    """What one round writes to the store, in one transaction."""

    updates: dict[int, dict[str, object]] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    resources: list[ResourceSample] = field(default_factory=list)


class Tick:
    """The reads and bookkeeping of a job's rounds; it keeps each task's log tailer, the host
    pollers of the group being watched, and a thread pool for one-off rounds."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        backend: Backend,
        layout: JobLayout,
        sink: LineSink,
        instrumented: bool,
        host_timeout: float = 5.0,
        keepalive: float = 1.0,
        retry_delay: float = 0.2,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.backend = backend
        self.layout = layout
        self.sink = sink
        self.instrumented = instrumented
        self.host_timeout = host_timeout
        self.keepalive = keepalive
        self.retry_delay = retry_delay
        self.tailers: dict[int, LogTailer] = {}
        self.fanout = Fanout()  # one-off rounds: every host read at once
        self._pollers: list[HostPoller] = []
        self._answers: queue.SimpleQueue[PollResult] = queue.SimpleQueue()

    def close(self) -> None:
        self.end()
        self.fanout.close()

    # --- watching a group: long polls ---------------------------------------------------
    def begin(self, group: Group, watch: Watch, skip: Collection[int] = ()) -> None:
        """Start one poller per host of the group (but those in `skip`)."""
        self.end()
        self._answers = queue.SimpleQueue()  # answers of earlier pollers are not this group's
        for h, agents in agents_by_host(group.agents).items():
            if h in skip:
                continue
            target = self._target(h, agents)
            poller = HostPoller(
                target,
                self.backend.transport(h),
                [self.tailers[a.task_index].offset for a in agents],
                self._answers,
                wait=self.keepalive,
                step=host_watch.STEP,
                host_timeout=self.host_timeout,
                retry_delay=self.retry_delay,
            )
            poller.start()
            self._pollers.append(poller)

    def end(self) -> None:
        for poller in self._pollers:
            poller.stop()
        self._pollers = []

    def next(self, group: Group, watch: Watch, interval: float) -> list[TaskObservation]:
        """The hosts' answers of the next `interval` seconds (sooner on an urgent one), then
        every task's observation."""
        results: list[PollResult] = []
        deadline = time.monotonic() + interval
        # Bounded by the clock and by count: answers may come faster than a round takes them
        # (hundreds of hosts on a loaded machine), and a round must still end and decide.
        limit = 4 * max(1, len(self._pollers))
        while len(results) < limit:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                result = self._answers.get(timeout=remaining)
            except queue.Empty:
                break
            results.append(result)
            if result.urgent:  # take what else is already there, and decide now
                deadline = 0.0
                while len(results) < limit:
                    try:
                        results.append(self._answers.get_nowait())
                    except queue.Empty:
                        break
        return self.ingest(group, watch, results)

    def settle(self, group: Group, watch: Watch) -> None:
        """Before the group is stopped: wait (at most host_timeout) until every host has
        answered within a keep-alive or its read has failed, so that the stop is not sent to
        a host that has just stopped answering (it is skipped and its tasks left unconfirmed,
        as a host lost before the stop)."""
        deadline = time.monotonic() + self.host_timeout
        hosts = agents_by_host(group.agents)
        while time.monotonic() < deadline and self._pollers:
            now = time.monotonic()
            overdue = [
                h
                for h in hosts
                if h not in watch.host_error
                and now - watch.host_ok.get(h, watch.started) > self.keepalive + MIN_READ_TIMEOUT
            ]
            if not overdue:
                return
            self.next(group, watch, 0.1)

    # --- one round of immediate reads -----------------------------------------------------
    def observe(
        self, group: Group, watch: Watch, skip: Collection[int] = ()
    ) -> list[TaskObservation]:
        """One round of reads of every host but those in `skip` (lost: not waited on), all at
        once, each answered at once."""
        now = time.monotonic()
        by_host = {h: a for h, a in agents_by_host(group.agents).items() if h not in skip}

        def read(h: int) -> PollResult:
            target = self._target(h, by_host[h])
            offsets = tuple(self.tailers[a.task_index].offset for a in by_host[h])
            timeout = read_timeout(self.host_timeout, 0.0, now - watch.host_ok.get(h, now))
            files = [*zip(target.logs, offsets, strict=True),
                     *((path, 0) for path in target.statuses)]  # fmt: skip
            seen = self.backend.transport(h).observe(
                target.procs, files, timeout=timeout, contact=[a.pid for a in by_host[h]]
            )
            n = len(offsets)
            keys = tuple(host_watch.status_key(raw) for raw in seen.files[n:])
            seen = dataclasses.replace(seen, files=seen.files[:n], statuses=seen.files[n:],
                                       keys=keys)  # fmt: skip
            return PollResult(h, time.monotonic(), offsets, seen=seen)

        reads = self.fanout.each(by_host, read)
        results = list(reads.succeeded.values())
        results += [PollResult(h, now, (), error=e) for h, e in reads.failed.items()]
        # On the round's clock from before the reads: a slow host must not age the heartbeats
        # of the hosts read beside it.
        return self.ingest(group, watch, results, skip, now)

    # --- turning answers into observations ------------------------------------------------
    def ingest(
        self,
        group: Group,
        watch: Watch,
        results: Iterable[PollResult],
        skip: Collection[int] = (),
        at: float | None = None,
    ) -> list[TaskObservation]:
        """Take these answers (bookkeeping, store, streamed lines), then every task's
        observation, tasks on `skip` hosts left out; `at`: the round's monotonic time."""
        now_mono = time.monotonic() if at is None else at
        now = time.time() - (time.monotonic() - now_mono)
        by_host = agents_by_host(group.agents)
        round_ = _Round()
        for result in results:
            if result.crash is not None:
                raise result.crash
            h = result.host
            if h not in by_host:
                continue
            if result.error is not None or result.seen is None:
                label = group.plan.tasks[by_host[h][0].task_index].host_label
                watch.host_error[h] = str(result.error).removeprefix(f"{label}: ")
                continue
            watch.host_ok[h] = result.at
            watch.host_error.pop(h, None)
            self._take(group, watch, by_host[h], result, now_mono, now, round_)
        self.store.record_round(self.job_id, round_.updates, round_.samples, round_.resources)
        observations = []
        for agent in group.agents:
            i = agent.task_index
            if agent.host_index in skip:
                continue
            base = watch.seen.get(i)
            if agent.host_index in watch.host_error or base is None:
                # Unreachable for now (the poller retries); its heartbeat age keeps growing,
                # so a host that stays away is caught by the timeout.
                base = self.unreachable(i, group.plan.tasks[i], watch)
            observations.append(
                dataclasses.replace(
                    base,
                    heartbeat_age=now_mono - watch.seq_changed.get(i, watch.started),
                    progress_age=now_mono - watch.step_changed.get(i, watch.started),
                    reached_first_step=i in watch.first_step,
                )
            )
        return observations

    def _take(
        self,
        group: Group,
        watch: Watch,
        agents: list[AgentRef],
        result: PollResult,
        now_mono: float,
        now: float,
        round_: _Round,
    ) -> None:
        """One host's answer: its tasks' new lines, statuses and observations."""
        seen = result.seen
        assert seen is not None
        alive = seen.alive if seen.alive is not None else {a.pid for a in agents}
        for k, agent in enumerate(agents):
            i = agent.task_index
            task = group.plan.tasks[i]
            tailer = self.tailers[i]
            if k < len(result.offsets) and tailer.offset == result.offsets[k]:
                self.sink.task_lines(i, task.host_label, tailer.feed(seen.files[k]))
            raw = seen.statuses[k] if k < len(seen.statuses) else None
            changed = i not in watch.status or raw != watch.raw_status.get(i)
            if changed:
                watch.raw_status[i] = raw
                status = parse_status(raw)
                if status is not None and status.attempt != group.attempt:
                    status = None  # left over from an earlier attempt
                watch.status[i] = status
                self._status_seen(group, watch, i, status, now_mono, now, round_)
            status = watch.status[i]
            state = task_state_of(status, agent.pid in alive)
            last = watch.last.get(i, {})
            if last.get("state") != state:
                round_.updates.setdefault(i, {})["state"] = state
                watch.last[i] = {**last, "state": state}
            if changed or i not in watch.seen or watch.seen[i].state != state:
                progress = status.progress if status is not None else None
                watch.seen[i] = TaskObservation(
                    index=i,
                    state=state,
                    exit_code=status.exit_code if status is not None else None,
                    phase=progress.phase if progress is not None else Phase.NONE,
                    is_chief=task.is_chief,
                    step_signal=progress.step_signal if progress else StepSignal.NONE,
                    instrumented=self.instrumented,
                )

    def _status_seen(
        self,
        group: Group,
        watch: Watch,
        i: int,
        status: TaskStatus | None,
        now_mono: float,
        now: float,
        round_: _Round,
    ) -> None:
        """A task's status file changed: its heartbeat and step on our clock, its row."""
        progress = status.progress if status is not None else None
        if status is not None and status.seq != watch.seq.get(i):
            watch.seq[i] = status.seq
            watch.seq_changed[i] = now_mono
        if progress is not None and progress.step != watch.step.get(i):
            watch.step[i] = progress.step
            watch.step_changed[i] = now_mono
        if progress is not None and progress.step > 0 and i not in watch.first_step:
            watch.first_step.add(i)
            round_.updates.setdefault(i, {})["first_step_at"] = now
        row: dict[str, object] = dict(watch.last.get(i, {}))
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
                resources=status.resources,
                seq=status.seq,
            )
            kept = watch.resources_kept.get(i, 0.0)
            if status.resources and status.resources.at - kept >= RESOURCE_SAMPLE_EVERY:
                watch.resources_kept[i] = status.resources.at
                round_.resources.append(ResourceSample.of(i, group.attempt, status.resources))
        if row != watch.last.get(i):
            if progress is not None and progress.step != watch.last.get(i, {}).get("step"):
                round_.samples.append(
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
            values = {k: v for k, v in row.items() if k not in ("seq", "state")}
            values["heartbeat_at"] = now - (now_mono - watch.seq_changed.get(i, now_mono))
            round_.updates.setdefault(i, {}).update(values)

    @staticmethod
    def unreachable(i: int, task: TaskPlan, watch: Watch) -> TaskObservation:
        last_state = watch.last.get(i, {}).get("state", TaskState.STARTING)
        return TaskObservation(
            index=i,
            state=last_state if isinstance(last_state, TaskState) else TaskState.STARTING,
            is_chief=task.is_chief,
        )

    def _target(self, host: int, agents: list[AgentRef]) -> PollTarget:
        return PollTarget(
            host,
            tuple(a.process for a in agents),
            tuple(str(self.layout.log_path(a.task_index)) for a in agents),
            tuple(str(self.layout.status_path(a.task_index)) for a in agents),
        )

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
