"""Signals that the tests, the benchmarks and the chaos soak send to a job's processes, each
checked right before it is sent: a pid that `orchestrate status` named is a claim, not a fact
(it may have ended and been reused). A pidfd is opened first, the process is then checked, and
the signal goes through the pidfd: what was checked is what is signalled."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path


def signal_checked(
    pid: object, sig: int, is_it: Callable[[int], bool], what: str, gone_ok: bool = False
) -> None:
    """Send `sig` to pid only if it is > 1 and `is_it(pid)` holds; AssertionError otherwise.
    `gone_ok`: a process that has ended already (or is a zombie) is no error: nothing is sent."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        raise AssertionError(f"not a pid to signal: {pid!r} (for {what})")
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        if gone_ok:
            return
        raise AssertionError(f"pid {pid} is gone (was {what})") from None
    try:
        if gone_ok and _ending(pid):
            return
        if not is_it(pid):
            raise AssertionError(f"pid {pid} is not {what}: not signalled")
        signal.pidfd_send_signal(fd, sig)
    finally:
        os.close(fd)


def _ending(pid: int) -> bool:
    """Ended, or ending: a process on its way out loses its environment before it is a
    zombie, so it is given a second to get there."""
    from worker.proctl import is_alive

    deadline = time.monotonic() + 1.0
    while is_alive(pid):
        if time.monotonic() > deadline:
            return False
        try:
            if Path(f"/proc/{pid}/environ").read_bytes():
                return False  # whole, and alive: not ending
        except OSError:
            pass
        time.sleep(0.02)
    return True


def is_job_or_standby(pid: int, job_id: str) -> bool:
    """A live process of the job (its id in the environment, or its warm trainer), or a
    keeper serving the job, or the standby such a keeper holds (by the keeper's own record)."""
    from worker.proctl import is_alive, is_job_process
    from worker.warm.registry import entries

    if is_job_process(pid, job_id):
        return True
    serving = [e for e in entries(every_host=True) if e.job == job_id]
    return pid in {p for e in serving for p in (e.pid, e.standby)} and is_alive(pid)


def signal_job_process(pid: object, job_id: str, sig: int, gone_ok: bool = False) -> None:
    signal_checked(pid, sig, lambda p: is_job_or_standby(p, job_id), f"a process of job {job_id}",
                   gone_ok)  # fmt: skip


def is_supervisor_of(pid: int, job_id: str) -> bool:
    """An orchestrate process whose command line names the job (`supervise JOB`, `attach
    JOB`, `resume JOB`: how a job is supervised in the background)."""
    from worker.proctl import is_alive

    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return is_alive(pid) and job_id.encode() in argv and any(b"orchestrator" in a for a in argv)


def signal_supervisor(pid: object, job_id: str, sig: int) -> None:
    signal_checked(pid, sig, lambda p: is_supervisor_of(p, job_id), f"job {job_id}'s supervisor")
