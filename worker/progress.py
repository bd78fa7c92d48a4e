"""The trainer's side of progress reporting: one writer per process for the small JSON file the
agent relays (ORCHESTRATE_PROGRESS_FILE). The bootstrap's hooks, the Keras callback and
worker.runtime all update the same `Progress`, so they never overwrite each other's fields.

Standard library only: the bootstrap imports this before the user's script runs.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from worker.spec import ENV_PROGRESS_FILE, Phase, Progress, write_json_atomic

RATE_WINDOW = 1.0  # seconds: steps/s is measured over at least this long


class ProgressWriter:
    """Holds this task's latest Progress and writes it atomically: at once when forced (a phase
    change, an epoch boundary), otherwise at most every `min_interval` seconds."""

    def __init__(self, path: Path | None, min_interval: float = 0.5) -> None:
        self.path = path
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._progress = Progress()
        self._last_write = float("-inf")
        # Read at each write: the wait clock's totals (worker.wait_clock), once it is there.
        self.counters: Callable[[], dict[str, float]] | None = None
        # Run once, before TRAINING is first written (worker.warm.imports_ahead' record: the agent
        # prepares the next standby when it reads TRAINING).
        self.before_training: Callable[[], None] | None = None
        self._hook_lock = threading.Lock()
        self._training_began = False

    @property
    def current(self) -> Progress:
        return self._progress

    def update(self, force: bool = False, **changes: Any) -> None:
        if not self._training_began and changes.get("phase") == Phase.TRAINING:
            self.training_begins()
        with self._lock:
            self._progress = replace(self._progress, **changes)
            now = time.monotonic()
            if self.path is None or (not force and now - self._last_write < self.min_interval):
                return
            if self.counters is not None:
                try:
                    counted: dict[str, Any] = dict(self.counters())
                    self._progress = replace(self._progress, **counted)
                except Exception:  # ours, never the script's: go on without the wait clock
                    self.counters = None
            try:
                write_json_atomic(self.path, self._progress.to_dict())
            except OSError:
                return  # a full or vanished disk must not end training; the next write retries
            self._last_write = now

    def training_begins(self) -> None:
        """Run before_training, once: at the first TRAINING, or as Keras fit starts (a script
        that imports its own copy of worker.runtime reports through that copy's writer)."""
        with self._hook_lock:  # a second thread waits: TRAINING is written after the hook
            hook, self.before_training = self.before_training, None
            if hook is not None:
                with contextlib.suppress(Exception):  # ours: training goes on without it
                    hook()
            self._training_began = True

    def due(self) -> bool:
        """Whether an unforced update would be written now."""
        return time.monotonic() - self._last_write >= self.min_interval

    def phase(self, phase: Phase) -> None:
        self.update(force=True, phase=phase)


def fit_step_counter(model: Any) -> Any:
    """The variable fit counts its steps in: tf-keras's train counter (reset by each fit),
    else the optimizer's iterations (Keras 3). None: nothing to read."""
    counter = getattr(model, "_train_counter", None)
    if counter is None:
        counter = getattr(getattr(model, "optimizer", None), "iterations", None)
    return counter


def read_counter(variable: Any) -> int | None:
    """A step counter's value here (fit's train counter, an optimizer's iterations; a mirrored
    one's own copy: no collective); None while it cannot be read (not built yet, torn down)."""
    if variable is None:
        return None
    try:
        return int(variable.numpy())
    except Exception:
        return None


class StepRate:
    """Steps per second, over windows of at least RATE_WINDOW seconds (monotonic clock)."""

    def __init__(self) -> None:
        self.restart()
        self.rate: float | None = None

    def restart(self) -> None:
        """A new window: after the first step, whose time includes tracing, not the pace."""
        self._start, self._steps = time.monotonic(), 0

    def add(self, steps: int) -> None:
        self._steps += steps

    def current(self) -> float | None:
        now = time.monotonic()
        if now - self._start >= RATE_WINDOW and self._steps:
            self.rate = self._steps / (now - self._start)
            self._start, self._steps = now, 0
        return self.rate


_shared: ProgressWriter | None = None
_shared_lock = threading.Lock()


def shared() -> ProgressWriter:
    """The process's one writer (to ORCHESTRATE_PROGRESS_FILE; writes nothing outside
    orchestrate)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            path = os.environ.get(ENV_PROGRESS_FILE)
            _shared = ProgressWriter(Path(path) if path else None)
        return _shared
