"""What the supervisor sees of a running group: each host's answers (long polls by
orchestrator.host_poller while the group is watched, or one round of immediate reads), turned
into one observation per task by orchestrator.ingest.

While it watches a group the supervisor calls `Tick.next` every poll interval: it returns as
soon as a host reports something urgent (an agent gone, a new state or exit code), otherwise
after the interval with whatever the hosts answered meanwhile. Only the hosts that answered
cost work; the others' observations are kept, their ages updated. `Tick.observe` is one round
of reads of every host at once (after a stop, and in tests)."""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Collection

from orchestrator.backends import Backend
from orchestrator.fanout import Fanout
from orchestrator.host_poller import (
    MIN_READ_TIMEOUT,
    HostPoller,
    PollResult,
    PollTarget,
    read_timeout,
)
from orchestrator.ingest import Group, Ingest, Watch, agents_by_host
from orchestrator.launcher import AgentRef
from orchestrator.logstream import LineSink, LogTailer
from orchestrator.observations import TaskObservation
from orchestrator.store import Store
from worker import host_watch
from worker.spec import JobLayout

# Group, Watch and agents_by_host are the ingest's values; the supervisor's side imports them
# from here, with the rounds that use them.
__all__ = ["Group", "Tick", "Watch", "agents_by_host"]


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
        self.backend = backend
        self.layout = layout
        self.host_timeout = host_timeout
        self.keepalive = keepalive
        self.retry_delay = retry_delay
        self._ingest = Ingest(store, job_id, sink, instrumented)
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
        return self._ingest.ingest(group, watch, results)

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
        return self._ingest.ingest(group, watch, results, skip, now)

    # --- turning answers into observations (orchestrator.ingest) -----------------------------
    @property
    def tailers(self) -> dict[int, LogTailer]:
        return self._ingest.tailers

    @tailers.setter
    def tailers(self, tailers: dict[int, LogTailer]) -> None:
        self._ingest.tailers = tailers

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
