"""Process control on a worker host, shared by every transport: which pids are alive (zombies
are not), and stopping a whole process group (SIGTERM, grace, SIGKILL).

The local transport calls these functions directly; on a remote host the host helper
(worker.hostd, one per SSH connection) calls them for its `alive`, `observe` and `stop`
requests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return raw[raw.rfind(")") + 2 :].split()


def is_alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def alive(pids: Iterable[int]) -> set[int]:
    return {pid for pid in pids if is_alive(pid)}


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


def stop_group(pgid: int, grace: float, poll: float = 0.05) -> bool:
    """SIGTERM every process of the group, wait up to grace, SIGKILL the rest. True when none
    is left. pgid must be a session/group leader we started (the agent)."""
    if pgid <= 1:
        raise ValueError(f"refusing to signal process group {pgid}")
    if not group_members(pgid):
        return True
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(poll)
    _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(poll)
    return False


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "alive":
        print(" ".join(str(p) for p in sorted(alive(int(a) for a in argv[1:]))))
        return 0
    if len(argv) == 3 and argv[0] == "stop":
        return 0 if stop_group(int(argv[1]), float(argv[2])) else 1
    print("usage: python -m worker.proctl alive PID... | stop PGID GRACE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
