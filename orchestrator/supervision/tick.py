"""What the supervisor sees of a running group: each host's answers (long polls by
host_poller.py while the group is watched, or one round of immediate reads), turned into one
observation per task by ingest.py.

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
from typing import TYPE_CHECKING

from orchestrator.backends.base import Backend, TaskHandle
from orchestrator.supervision.attempt import Attempt, agents_by_host
from orchestrator.supervision.host_poller import HostPoller, PollResult, PollTarget
from orchestrator.supervision.ingest import Ingest
from orchestrator.supervision.observations import TaskObservation
from orchestrator.transport.fanout import Fanout
from worker import host_watch

if TYPE_CHECKING:
    from orchestrator.supervision.context import SupervisionContext


class Tick:
    """The reads and bookkeeping of a job's rounds; it keeps the host pollers of the attempt
    being watched, and a thread pool for one-off rounds."""

    def __init__(self, ctx: SupervisionContext) -> None:
        self.backend: Backend = ctx.backend
        self.layout = ctx.layout
        self.timing = ctx.timing
        instrumented = ctx.config.entrypoint.instrument
        self._ingest = Ingest(ctx.store, ctx.job_id, ctx.sink, instrumented)
        self.fanout = Fanout()  # one-off rounds: every host read at once
        self._pollers: list[HostPoller] = []
        self._answers: queue.SimpleQueue[PollResult] = queue.SimpleQueue()

    def close(self) -> None:
        self.end()
        self.fanout.close()

    # --- watching a group: long polls ---------------------------------------------------
    def begin(self, attempt: Attempt, skip: Collection[int] = ()) -> None:
        """Start one poller per host of the attempt (but those in `skip`)."""
        self.end()
        self._answers = queue.SimpleQueue()  # answers of earlier pollers are not this group's
        for h, agents in agents_by_host(attempt.agents).items():
            if h in skip:
                continue
            target = self._target(h, agents)
            poller = HostPoller(
                target,
                self.backend,
                [attempt.tailers[a.task_index].offset for a in agents],
                self._answers,
                timing=self.timing,
                step=host_watch.STEP,
            )
            poller.start()
            self._pollers.append(poller)

    def end(self) -> None:
        for poller in self._pollers:
            poller.stop()
        self._pollers = []

    def next(self, attempt: Attempt, interval: float) -> list[TaskObservation]:
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
        return self._ingest.ingest(attempt, results)

    def settle(self, attempt: Attempt) -> None:
        """Before the group is stopped: wait (at most host_timeout) until every host has
        answered within a keep-alive or its read has failed, so that the stop is not sent to
        a host that has just stopped answering (it is skipped and its tasks left unconfirmed,
        as a host lost before the stop)."""
        watch = attempt.watch
        deadline = time.monotonic() + self.timing.host_timeout
        hosts = agents_by_host(attempt.agents)
        while time.monotonic() < deadline and self._pollers:
            now = time.monotonic()
            if not self.timing.overdue_hosts(hosts, watch, now):
                return
            self.next(attempt, 0.1)

    # --- one round of immediate reads -----------------------------------------------------
    def observe(self, attempt: Attempt, skip: Collection[int] = ()) -> list[TaskObservation]:
        """One round of reads of every host but those in `skip` (lost: not waited on), all at
        once, each answered at once."""
        now, watch = time.monotonic(), attempt.watch
        by_host = {h: a for h, a in agents_by_host(attempt.agents).items() if h not in skip}

        def read(h: int) -> PollResult:
            target = self._target(h, by_host[h])
            offsets = tuple(attempt.tailers[a.task_index].offset for a in by_host[h])
            timeout = self.timing.read_timeout(0.0, watch.answered_ago(h, now))
            files = [*zip(target.logs, offsets, strict=True),
                     *((path, 0) for path in target.statuses)]  # fmt: skip
            seen = self.backend.observe(h, target.tasks, files, timeout=timeout)
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
        return self._ingest.ingest(attempt, results, skip, now)

    def _target(self, host: int, agents: list[TaskHandle]) -> PollTarget:
        return PollTarget(
            host,
            tuple(agents),
            tuple(str(self.layout.log_path(a.task_index)) for a in agents),
            tuple(str(self.layout.status_path(a.task_index)) for a in agents),
        )

    def alive_tasks(self, tasks: list[TaskHandle]) -> set[int]:
        """The indices of these tasks that still run (or whose host did not answer)."""
        by_host = agents_by_host(tasks)

        def check(host_index: int) -> set[int]:
            return self.backend.alive_tasks(host_index, by_host[host_index])

        results = self.fanout.each(by_host, check)
        return set().union(  # unreachable for now is not proof of death
            *results.values(), *({t.task_index for t in by_host[h]} for h in results.failed)
        )
