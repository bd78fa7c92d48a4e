"""One host's long poll for one attempt, on a thread of its own.

The poller asks its host what is new and tells it what it already knows: which agents lived,
how far each log was read, and each status's key (worker.host_watch). The host answers at once
when something the supervisor acts on changed, otherwise after the keep-alive. Each answer,
or the failure to get one, goes onto the tick's queue, and the poller asks again at once. A
quiet host thus costs one round trip per keep-alive, however often the supervisor decides.

Only the supervisor's thread touches the log tailers: a poller hands raw bytes with the offsets
it read them at, and keeps its own copy of the offsets to ask from next."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.config.timing import Timing
from orchestrator.errors import OrchestrateError
from orchestrator.transport.base import Observation, Watching

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend, TaskHandle


@dataclass(frozen=True)
class PollResult:
    """One host's answer (or why there was none), as the supervisor's thread takes it."""

    host: int
    at: float  # monotonic time it arrived
    offsets: tuple[int, ...]  # each log's offset the answer was read at
    seen: Observation | None = None
    error: OrchestrateError | None = None
    crash: BaseException | None = None  # a bug of ours, raised again on the supervisor's thread

    @property
    def urgent(self) -> bool:
        return self.seen is None or self.seen.urgent


@dataclass(frozen=True)
class PollTarget:
    """What one host's poller reads: its tasks, and each of their log and status files."""

    host: int
    tasks: tuple[TaskHandle, ...]
    logs: tuple[str, ...]
    statuses: tuple[str, ...]


class HostPoller:
    def __init__(
        self,
        target: PollTarget,
        backend: Backend,
        offsets: Sequence[int],
        out: queue.SimpleQueue[PollResult],
        *,
        timing: Timing,
        step: float,
    ) -> None:
        self.target = target
        self.backend = backend
        self.out = out
        self.timing = timing
        self.step = step
        self._offsets = list(offsets)
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"poll-host-{target.host}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Asks nothing more; an answer still in flight is dropped when it comes."""
        self._stopped.set()

    def _run(self) -> None:
        t = self.target
        known_alive: frozenset[int] | None = None
        keys: list[str | None] = [None] * len(t.statuses)
        last_ok = time.monotonic()
        while not self._stopped.is_set():
            offsets = tuple(self._offsets)
            wait = self.timing.keepalive
            watching = Watching(known_alive, tuple(zip(t.statuses, keys, strict=True)),
                                wait, self.step)  # fmt: skip
            timeout = self.timing.read_timeout(wait, time.monotonic() - last_ok)
            try:
                seen = self.backend.observe(
                    t.host,
                    t.tasks,
                    list(zip(t.logs, offsets, strict=True)),
                    timeout=timeout,
                    watching=watching,
                )
            except OrchestrateError as exc:
                if not self._stopped.is_set():
                    self.out.put(PollResult(t.host, time.monotonic(), offsets, error=exc))
                self._stopped.wait(
                    self.timing.poll_interval
                )  # a host refusing at once is not spun on
                continue
            except BaseException as exc:  # a bug: the supervisor's thread raises it
                self.out.put(PollResult(t.host, time.monotonic(), offsets, crash=exc))
                return
            if self._stopped.is_set():
                return
            last_ok = time.monotonic()
            self.out.put(PollResult(t.host, last_ok, offsets, seen=seen))
            self._offsets = [o + len(d or b"") for o, d in zip(offsets, seen.files, strict=True)]
            known_alive = None if seen.alive is None else frozenset(seen.alive)
            keys = list(seen.keys) if len(seen.keys) == len(keys) else [None] * len(keys)
