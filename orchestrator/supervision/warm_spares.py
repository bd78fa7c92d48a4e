"""Warm spares: while a host waits as a spare, it keeps a standby for each task of the job's
busiest host (worker/warm/spare.py), so that the tasks it takes over from a lost host start
warm, as a member's restart does, not after a TensorFlow import.

A thread of its own visits every spare host at once after each launch, then every third of
the keepers' linger: a keeper that no visit reaches for its linger ends with its standby, so
nothing outlives a supervisor that died. Best effort: a spare that does not answer is visited
again next round. What the thread has to say waits for the supervisor's thread (`said`)."""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Sequence

from orchestrator.backends import Backend
from orchestrator.transport.fanout import each
from worker.spec import WorkerSpec

MIN_PERIOD = 1.0


class WarmSpares:
    def __init__(
        self, backend: Backend, spares: Callable[[], tuple[int, ...]], labels: Sequence[str]
    ) -> None:
        self._backend = backend
        self._spares = spares  # the hosts that are spares now (read at each visit)
        self._labels = list(labels)
        self._specs: list[WorkerSpec] = []
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._said: set[tuple[int, bool]] = set()
        self._messages: queue.SimpleQueue[str] = queue.SimpleQueue()

    def launched(self, specs: Sequence[WorkerSpec]) -> None:
        """An attempt started with these specs: visit the spares now, with the tasks of its
        busiest host (a spare may take any host's place)."""
        by_host: dict[str, list[WorkerSpec]] = {}
        for spec in specs:
            by_host.setdefault(spec.host_label, []).append(spec)
        if not by_host or self._closed.is_set():
            return
        self._specs = max(by_host.values(), key=len)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="warm-spares", daemon=True)
            self._thread.start()
        self._wake.set()

    def said(self) -> list[str]:
        """What the visits found worth an event since the last call (once per host and
        outcome)."""
        out = []
        while not self._messages.empty():
            out.append(self._messages.get_nowait())
        return out

    def _run(self) -> None:
        while not self._closed.is_set():
            specs = self._specs
            period = max(MIN_PERIOD, specs[0].standby_linger / 3) if specs else MIN_PERIOD
            self._wake.wait(period)
            self._wake.clear()
            hosts = self._spares()
            if self._closed.is_set() or not specs or not hosts:
                continue
            results = each(hosts, functools.partial(self._visit, specs=specs))
            for h in results:
                ok = h in results.succeeded
                if (h, ok) in self._said:
                    continue
                self._said.add((h, ok))
                label = self._labels[h]
                self._messages.put(
                    f"{label} keeps {len(specs)} standby(s) warm as a spare"
                    if ok
                    else f"{label}: no standby kept as a spare: {results.reason(h, label)}"
                )

    def _visit(self, host: int, specs: list[WorkerSpec]) -> None:
        self._backend.keep_spare_warm(host, specs)

    def close(self, wait: float = 10.0) -> None:
        """No more visits (before the job's standbys are released: none is started after)."""
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(wait)
