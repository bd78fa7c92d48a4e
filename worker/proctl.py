"""Process control on a worker host, shared by every transport: which pids are alive (zombies
are not), and stopping a whole process group (SIGTERM, grace, SIGKILL).

A pid alone does not name a process for long: once it exits the kernel hands the number to the
next process. So every process we start is recorded with its identity (this boot's id and its
start time in clock ticks, both from /proc), and nothing is signalled or called alive unless the
process holding the pid now has that identity. A process group is safe to signal while its
leader lives with the recorded identity, or after the leader exited while members remain: Linux
does not reuse a pid that still names a process group.

The job's processes can also be found with no pid at all: every agent and trainer carries
ORCHESTRATE_JOB_ID=<job> in its environment (`find_job`, `stop_job`).

The local transport calls these functions directly; on a remote host the host helper
(worker.hostd, one per SSH connection) calls them for its `alive`, `observe` and `stop`
requests.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from types import FrameType

SignalHandler = Callable[[int, FrameType | None], None]


def not_nested(handler: SignalHandler) -> SignalHandler:
    """A signal handler that a second signal, arriving while it runs, does not enter again.
    Python runs a handler between any two bytecodes, even inside another handler; a handler
    that takes a lock (threading.Event.set does) would then wait forever on the lock its
    outer call holds, and the main thread with it. Two SIGTERMs at once are common: Slurm
    signals a step's process group, and the agent forwards its own. The outer call does what
    the dropped one would have (handlers here are idempotent)."""
    running = False

    def once(signum: int, frame: FrameType | None) -> None:
        nonlocal running
        if running:
            return
        running = True
        try:
            handler(signum, frame)
        finally:
            running = False

    return once


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def is_stopped(pid: int) -> bool:
    """Stopped by a signal (SIGSTOP, a terminal's) or held by a tracer: no code of its own runs,
    a signal handler's neither, until it is continued."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")


_boot_id: str | None = None


def boot_id() -> str:
    global _boot_id
    if _boot_id is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as fh:
                _boot_id = fh.read().strip()
        except OSError:
            _boot_id = "unknown-boot"
    return _boot_id


def identity(pid: int) -> str | None:
    """`<boot id>:<start time>` of the process holding pid now; None when there is none."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return f"{boot_id()}:{fields[19]}"  # field 22 of stat, starttime


def is_same(pid: int, ident: str) -> bool:
    """The process holding pid now is the one recorded with `ident` ("" trusts the pid)."""
    fields = _stat_fields(pid)  # one read of /proc/PID/stat: this runs every tick per agent
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return not ident or (len(fields) >= 20 and f"{boot_id()}:{fields[19]}" == ident)


def is_alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def alive(pids: Iterable[int], idents: Sequence[str] | None = None) -> set[int]:
    """Which pids live (with the recorded identity, where `idents` gives one per pid)."""
    pids = list(pids)
    marks = list(idents) if idents is not None else [""] * len(pids)
    return {pid for pid, ident in zip(pids, marks, strict=True) if is_same(pid, ident)}


def group_members(pgid: int) -> set[int]:
    """Live processes whose process group is pgid."""
    members = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        # After the state come ppid, then pgrp.
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.add(int(name))
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_is_ours(pgid: int, ident: str) -> bool:
    """The group pgid is still the one whose leader we recorded as `ident`: the leader lives
    with that identity, or it is gone (members of its group keep its pid from being reused)."""
    if not ident:
        return True
    now = identity(pgid)
    return now is None or now == ident


# Seconds the leader of a group (an agent) has, once its trainer is killed, to write how it
# ended before it is killed too.
LEADER_LAST_WORDS = 1.0
# "The grace is over": the agent kills its trainer now and writes how it ended. Not a second
# SIGTERM: a scheduler may send SIGTERM more than once within the grace (Slurm's --signal
# warning, then a preemption or an scancel), and each must leave the trainer its checkpoint.
# A real-time signal, which nothing else sends to these processes.
HURRY = signal.SIGRTMIN + 3


def stop_group(pgid: int, grace: float, ident: str = "", poll: float = 0.05) -> bool:
    """SIGTERM every process of the group, wait up to grace, SIGKILL the rest (the leader
    last, after LEADER_LAST_WORDS). True when none is left. pgid must be a session/group
    leader we started (the agent), recorded as `ident`; a pid that now names someone else's
    process is never signalled (ours is gone: True)."""
    if pgid <= 1:
        raise ValueError(f"refusing to signal process group {pgid}")

    def gone() -> bool:
        return not group_is_ours(pgid, ident) or not group_members(pgid)

    def wait_until_gone(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if gone():
                return True
            time.sleep(poll)
        return gone()

    if gone():
        return True
    _signal_group(pgid, signal.SIGTERM)
    if wait_until_gone(grace):
        return True
    # Past the grace: the leader's followers (a trainer) are killed, and the leader (the
    # agent) is told to hurry, so that it ends its own way: its note of how the trainer ended
    # and its final status reach the log. Then the whole group goes.
    for pid in group_members(pgid) - {pgid}:
        _signal_checked(pid, signal.SIGKILL, functools.partial(_in_group, pid, pgid, ident))
    _signal_checked(pgid, HURRY, functools.partial(_in_group, pgid, pgid, ident))
    if wait_until_gone(LEADER_LAST_WORDS):
        return True
    _signal_group(pgid, signal.SIGKILL)
    return wait_until_gone(5.0)


def _signal_checked(pid: int, sig: int, check: Callable[[], bool]) -> None:
    """Signal pid only if `check` holds of it, through a pidfd opened before the check: the
    process checked is the process signalled, even if the number is reused meanwhile."""
    if pid <= 1:
        return
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone
        return
    try:
        if check():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(fd, sig)
    finally:
        os.close(fd)


def _in_group(pid: int, pgid: int, ident: str) -> bool:
    """pid is alive in the process group whose leader we recorded as `ident`."""
    fields = _stat_fields(pid)
    return (
        fields is not None
        and fields[0] not in ("Z", "X")
        and int(fields[2]) == pgid
        and group_is_ours(pgid, ident)
    )


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return marker in b"\0" + fh.read()
    except OSError:  # gone, or another user's
        return False


def _warm_trainers(job_id: str) -> set[int]:
    """The job's trainers that were standbys started before it (worker.warm.registry)."""
    from worker.warm.registry import trainers_of

    return set(trainers_of(job_id))


def _runs_as_me(pid: int) -> bool:
    """The process's real and effective uid are ours: another user may put any job's id in
    its own environment (root can read every environment), and is never ours to signal."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    real, effective = line.split()[1:3]
                    return int(real) == int(effective) == os.getuid()
    except (OSError, ValueError, IndexError):
        pass
    return False


def is_job_process(pid: int, job_id: str) -> bool:
    """A live process of ours (> 1, not a zombie, our uid) started with this job's id in its
    environment, or a warm trainer its keeper says serves the job."""
    fields = _stat_fields(pid) if pid > 1 else None
    if fields is None or fields[0] in ("Z", "X") or not _runs_as_me(pid):
        return False
    marker = f"\0ORCHESTRATE_JOB_ID={job_id}\0".encode()
    return _environ_has(pid, marker) or pid in _warm_trainers(job_id)


def _net_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def find_job(job_id: str) -> list[tuple[int, int, str]]:
    """Every live process of ours that carries ORCHESTRATE_JOB_ID=job_id in its environment
    (or is the job's warm trainer, worker.warm.registry), in this host's network namespace: (pid,
    process group, identity). (Agents and trainers live in the namespace of the helper that
    started them; machines that share one kernel, as network namespaces do, must not stop
    each other's tasks.)"""
    marker = f"\0ORCHESTRATE_JOB_ID={job_id}\0".encode()
    warm = _warm_trainers(job_id)
    found = []
    me = os.getpid()
    here = _net_namespace("self")
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        if _net_namespace(pid) != here:
            continue
        fields = _stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X"):
            continue
        if pid not in warm and not _environ_has(pid, marker):
            continue
        if not _runs_as_me(pid):
            continue
        ident = identity(pid)
        if ident is not None:
            found.append((pid, int(fields[2]), ident))
    return found


def stop_job(job_id: str, grace: float, poll: float = 0.1) -> list[int]:
    """Stop every process of the job on this host, found by its environment (whether or not a
    pid was ever recorded): SIGTERM, grace, SIGKILL. Each is signalled through its process
    group when the group is the job's own (its leader is one of them, or gone), else alone,
    and only after checking it is still the process found. Returns the pids left alive."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        found = find_job(job_id)
        if not found:
            return []
        ours = {pid for pid, _, _ in found}
        for pid, pgid, ident in found:
            if identity(pid) != ident:
                continue
            if pgid in ours or (pgid > 1 and identity(pgid) is None and group_members(pgid)):
                _signal_group(pgid, sig)
            else:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and find_job(job_id):
            time.sleep(poll)
    return [pid for pid, _, _ in find_job(job_id)]


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "alive":
        print(" ".join(str(p) for p in sorted(alive(int(a) for a in argv[1:]))))
        return 0
    if len(argv) in (3, 4) and argv[0] == "stop":
        ident = argv[3] if len(argv) == 4 else ""
        return 0 if stop_group(int(argv[1]), float(argv[2]), ident) else 1
    print("usage: python -m worker.proctl alive PID... | stop PGID GRACE [IDENT]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
