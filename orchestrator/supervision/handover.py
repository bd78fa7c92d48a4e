"""A dropped terminal never stops training: on SIGHUP a foreground supervisor hands its job to
a detached one, the takeover `attach` does, with no gap in supervision.

The order keeps one supervisor at every moment:
1. the foreground supervisor starts its successor (`orchestrate supervise JOB --after PID`, in
   a session of its own, its output in the job's supervisor.log) and watches on;
2. the successor loads what it needs (the job's configuration, the supervision code), then says
   it is ready (a `handover` event in the store);
3. the foreground supervisor leaves the job as it is (no stop, no release of what the backend
   holds) and exits;
4. the successor waits for that exit and adopts the job, as `attach` does.
Should the successor fail to get ready, the foreground supervisor goes on without a terminal."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from orchestrator.errors import OrchestrateError
from orchestrator.state.paths import supervisor_log
from orchestrator.state.store import Store
from orchestrator.transport.local import LocalTransport
from worker.proctl import is_same

HANDOVER_EVENT = "handover"
READY_TIMEOUT = 120.0  # seconds for a successor to load (a busy machine imports slowly)
# Seconds for the handing supervisor to be gone once its successor is ready: it hands over on
# its next watch, which a restart (stop, backoff, relaunch) may delay.
EXIT_TIMEOUT = 900.0


def start_successor(job_id: str, pid: int) -> tuple[int, str]:
    """Start the detached supervisor that takes the job over from supervisor `pid`; its pid
    and identity."""
    argv = [sys.executable, "-m", "orchestrator", "supervise", job_id, "--after", str(pid)]
    started = LocalTransport().start_detached(argv, log_path=str(supervisor_log(job_id)))
    return started.pid, started.ident


def ready_message(pid: int) -> str:
    return f"supervisor {pid} is ready to take the job over"


def say_ready(store: Store, job_id: str, pid: int) -> None:
    store.add_event(job_id, HANDOVER_EVENT, ready_message(pid))


def successor_ready(
    store: Store, job_id: str, successor: tuple[int, str], since: float
) -> bool | None:
    """Whether the successor (its pid and identity; started at monotonic `since`) said it is
    ready: True; False: it died first, or READY_TIMEOUT passed; None: not yet."""
    if not is_same(*successor):
        return False
    wanted = ready_message(successor[0])
    if any(e.kind == HANDOVER_EVENT and e.message == wanted for e in store.events(job_id)):
        return True
    return False if time.monotonic() - since > READY_TIMEOUT else None


def wait_gone(pid: int, ident: str) -> bool:
    """Whether supervisor `pid` (that `ident`) exited within EXIT_TIMEOUT."""
    deadline = time.monotonic() + EXIT_TIMEOUT
    while is_same(pid, ident):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def silence_terminal() -> None:
    """The terminal is gone: what this process writes to its output goes nowhere from now on
    (a write to a hung-up terminal fails)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


class Handover:
    """The handing side, polled on each watch tick once the terminal closed: the successor is
    started on the first poll and is ready a few polls later; the watch goes on meanwhile."""

    def __init__(self) -> None:
        # Its pid and identity, and since when (monotonic).
        self._successor: tuple[tuple[int, str], float] | None = None
        self._failed = False

    def poll(self, store: Store, job_id: str, say: Callable[[str], None]) -> int | None:
        """The successor's pid once it is ready to take the job over; None: not (yet), or it
        failed (then this supervisor goes on without a terminal, and the job's events say
        so)."""
        if self._failed:
            return None
        me = os.getpid()

        def record(text: str) -> None:
            store.add_event(job_id, HANDOVER_EVENT, text)
            say(text)

        if self._successor is None:
            say("the terminal closed (SIGHUP): handing the job to a detached supervisor")
            try:
                self._successor = (start_successor(job_id, me), time.monotonic())
            except OrchestrateError as exc:
                self._failed = True
                record(f"the terminal closed; no detached supervisor ({exc}): supervisor {me} "
                       "goes on without a terminal")  # fmt: skip
            return None
        successor, since = self._successor
        ready = successor_ready(store, job_id, successor, since)
        if ready is None:
            return None
        if not ready:
            self._failed = True
            record(f"the terminal closed; the detached supervisor {successor[0]} did not take "
                   f"over (see {supervisor_log(job_id)}): supervisor {me} goes on without a "
                   "terminal")  # fmt: skip
            return None
        record(f"the terminal closed: supervisor {me} handed the job to supervisor {successor[0]}")
        return successor[0]
