"""The host side of supervision's long poll (the host helper's `watch`).

The coordinator asks a host what is new and says what it already knows: which agents lived,
how far it has read each log, and the `status_key` of each task's status file. The helper
checks that every `step` seconds on the host itself (a stat of each status file, a look at each
agent in /proc) and answers

- at once, when something the coordinator acts on changed: an agent ended, a status's key
  changed (a new state, phase or exit code, the first step), or a log has more backlog than one
  answer carries;
- otherwise after `wait` seconds (the keep-alive), with whatever accumulated meanwhile: log
  lines, heartbeats, progress.

A quiet host then costs the coordinator one round trip per keep-alive, and a death is still seen
within one step. Standard library only."""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from worker import proctl

READ_LIMIT = 1 << 20  # bytes of one log per answer: a burst is read over a few answers
STEP = 0.05  # seconds between two looks on the host

AliveCheck = Callable[[list[int], list[str] | None], set[int]]


def status_key(raw: bytes | None) -> str:
    """What of a task's status file makes the coordinator act at once: its state, attempt,
    processes, exit code, message, phase and step signal, and whether it has stepped yet. Not
    the heartbeat count, nor the step, loss or rate, which change all the time and ride on the
    next keep-alive. "" when there is no status file."""
    if raw is None:
        return ""
    try:
        data = json.loads(raw)
        progress = data.get("progress") or {}
        fields = [
            data.get("state"),
            data.get("attempt"),
            data.get("agent_pid"),
            data.get("trainer_pid"),
            data.get("exit_code"),
            data.get("message"),
            progress.get("phase"),
            progress.get("step_signal"),
            bool(progress.get("step")),
        ]
        return json.dumps(fields, separators=(",", ":"))
    except (ValueError, AttributeError):  # not a status (yet): any change of it is news
        return f"raw:{zlib.crc32(raw):08x}:{len(raw)}"


@dataclass
class WatchAnswer:
    alive: set[int] | None  # pids found alive; None when not asked
    logs: list[bytes | None]  # each log from its offset (None: no such file)
    statuses: list[bytes | None]  # each status file whole (None: none)
    keys: list[str]  # status_key of each status
    urgent: bool  # answered on a change rather than on the keep-alive


def _read(path: str, offset: int, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(limit)
    except FileNotFoundError:
        return None


def file_stamp(path: str) -> tuple[int, int, int] | None:
    """A file's (inode, size, mtime): any change of it changes this; None when it is absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def watch(
    pids: list[int] | None,
    idents: list[str] | None,
    known_alive: Sequence[int] | None,
    logs: Sequence[tuple[str, int]],
    statuses: Sequence[tuple[str, str | None]],
    wait: float = 0.0,
    step: float = STEP,
    limit: int = READ_LIMIT,
    alive_check: AliveCheck = proctl.alive,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> WatchAnswer:
    """One long poll: look every `step` seconds until something urgent changed or `wait` has
    passed, then read. `known_alive` None, or a status key None, is news at once (the
    coordinator knows nothing yet). Liveness is looked at before the reads: an agent found gone
    has already written its final status, which the read then sees."""
    deadline = clock() + wait
    seen_stat: list[tuple[int, int, int] | bool | None] = [False] * len(statuses)
    seen_key: list[str] = [""] * len(statuses)
    urgent = known_alive is None or any(key is None for _, key in statuses)
    alive: set[int] | None = None
    while True:
        alive = alive_check(pids, idents) if pids is not None else None
        if alive is not None and known_alive is not None and alive != set(known_alive):
            urgent = True
        for k, (path, key) in enumerate(statuses):
            stat = file_stamp(path)
            if stat != seen_stat[k]:  # read and judge a status only when its file changed
                seen_stat[k] = stat
                seen_key[k] = "" if stat is None else status_key(_read(path, 0, limit))
            if key is not None and seen_key[k] != key:
                urgent = True
        for path, offset in logs:  # more than one answer carries: go on reading at once
            stat = file_stamp(path)
            if stat is not None and stat[1] - offset > limit:
                urgent = True
        if urgent or clock() >= deadline:
            break
        sleep(min(step, max(0.0, deadline - clock())))
    data = [_read(path, offset, limit) for path, offset in logs]
    raw = [_read(path, 0, limit) for path, _ in statuses]
    return WatchAnswer(alive, data, raw, [status_key(r) for r in raw], urgent)
