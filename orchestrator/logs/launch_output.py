"""The standard output of a supervising `launch`, `attach` or `resume`: a reader that goes
away (`launch | head -1`, a closed pseudo-terminal) never ends supervision. The first write
that fails is told once (the supervisor records it in the job's events); every later write is
dropped. The tasks' durable copies and the store are written as before."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO


class GuardedOutput:
    """A text stream whose write and flush never raise OSError (EPIPE, EIO, ENOSPC ...)."""

    def __init__(self, stream: TextIO, on_lost: Callable[[str], None]) -> None:
        self._stream = stream
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self.lost = ""  # why the output was given up ("": it was not)

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._stream.write(text)
            except (OSError, ValueError) as exc:  # ValueError: the stream was closed
                self._give_up(exc)
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except (OSError, ValueError) as exc:
                self._give_up(exc)

    def isatty(self) -> bool:
        if self.lost:
            return False
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:  # fileno, encoding ... (rich asks for them)
        return getattr(self._stream, name)

    def _give_up(self, exc: BaseException) -> None:
        with self._lock:
            if self.lost:
                return
            self.lost = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if self._stream in (sys.stdout, sys.__stdout__):
            silence_stdout()
        with contextlib.suppress(Exception):  # telling must not end supervision either
            self._on_lost(self.lost)


def silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null: the interpreter's own flush at exit then has
    nowhere to fail (no 'Exception ignored ... BrokenPipeError' and no exit status 120)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
