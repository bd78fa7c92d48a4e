"""How our processes start and wait for their children: the trainer (from the agent) and the
standby (from its keeper) start through the bootstrap, and die with the process that started
them. Standard library only."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
from collections.abc import Callable
from typing import Protocol

BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when its parent dies, so that
    nothing of ours lives on without the process that owns it."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Waitable(Protocol):
    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def exit_waiter(proc: Waitable) -> Callable[[float], bool]:
    """wait(timeout) -> whether proc has exited. Sleeps in the kernel on a pidfd; Popen.wait
    with a timeout would instead wake up every 50 ms, next to a trainer that wants the CPU."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):

        def poll(timeout: float) -> bool:
            try:
                proc.wait(timeout=timeout)
                return True
            except subprocess.TimeoutExpired:
                return False

        return poll

    def wait(timeout: float) -> bool:
        try:
            ready, _, _ = select.select([pidfd], [], [], timeout)
        except InterruptedError:  # a signal (SIGTERM to forward): go round again
            return proc.poll() is not None
        return bool(ready)

    return wait
