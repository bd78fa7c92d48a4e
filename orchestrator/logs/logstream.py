"""Streaming task logs: read each task's log from an offset, emit whole lines only, prefixed
with task and host, never interleaved mid-line; keep a durable copy on the coordinator."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import BinaryIO, TextIO

from orchestrator.logs.terminal_text import safe
from orchestrator.transport.base import Transport

# TensorFlow's C++/absl notices: kept in the task log, hidden on the console unless --verbose.
_NOISE = re.compile(
    rb"^([IWE]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages before absl|"
    rb"To enable the following instructions|oneDNN custom operations|"
    rb"Could not find cuda drivers|Unable to register cu|"
    rb"This TensorFlow binary is optimized|Attempting to register factory|"
    rb"computation placer already registered|To enable them in other operations|"
    rb"All log messages before absl)"
)


def is_noise(line: bytes) -> bool:
    return bool(_NOISE.match(line))


MAX_LINE = 64 << 10  # bytes of one line held or shown; the copy keeps all of it
CUT_MARK = b" [... line cut at 64 KiB]"


class Cut(bytes):
    """A piece of a line longer than MAX_LINE, without its newline (more of it follows).
    `first`: the line's first piece (the one shown, marked as cut)."""

    first: bool


class CutTail(bytes):
    """The last piece of a cut line, up to its newline: kept in the copy, not shown."""


class LogTailer:
    """Follows one file on one host by offset; a partial last line waits for its newline, up
    to MAX_LINE bytes: a longer one is passed on in pieces, so memory stays bounded whatever a
    trainer prints."""

    def __init__(self, transport: Transport, path: str, offset: int = 0) -> None:
        self.transport = transport
        self.path = path
        self.offset = offset
        self._partial = b""
        self._cutting = False  # inside a line whose first piece went out as a Cut

    @classmethod
    def following(cls, transport: Transport, path: str, copy: Path) -> LogTailer:
        """A tailer that goes on from what the durable copy of this log already holds."""
        tailer = cls(transport, path, _size(copy))
        if tailer.offset:  # the copy ends inside a line: its rest is kept, not shown again
            with copy.open("rb") as held:
                held.seek(-1, 2)
                tailer._cutting = held.read(1) != b"\n"
        return tailer

    def read_through(self, transport: Transport) -> None:
        """Read the same file on from here through this transport (the task's host of a new
        attempt): the offset and a partial line carry over."""
        self.transport = transport

    def poll(self) -> list[bytes]:
        return self.feed(self.transport.read_file(self.path, self.offset))

    def feed(self, data: bytes | None) -> list[bytes]:
        """Take the bytes read at self.offset (by poll, or by the caller's own read)."""
        if not data:
            return []
        self.offset += len(data)
        chunk = self._partial + data
        *whole, self._partial = chunk.split(b"\n")
        lines: list[bytes] = []
        for line in whole:
            lines.append(CutTail(line) if self._cutting else line)
            self._cutting = False
        if len(self._partial) > MAX_LINE:
            piece = Cut(self._partial)
            piece.first = not self._cutting
            lines.append(piece)
            self._partial, self._cutting = b"", True
        return lines

    def flush(self) -> list[bytes]:
        """At an attempt's end: whatever is left, even a line without its newline. That one goes
        out as a Cut (the copy gets no newline the log lacks, so it stays byte for byte the log
        and a tailer started from its size is where this one is); whatever ends it later is
        kept in the copy, not shown."""
        lines = self.poll()
        if self._partial:
            piece = Cut(self._partial)
            piece.first = not self._cutting
            lines.append(piece)
            self._partial, self._cutting = b"", True
        return lines


def shown(lines: list[bytes]) -> list[bytes]:
    """The lines as a person sees them: a cut line once, its first MAX_LINE bytes, marked."""
    out = []
    for line in lines:
        if isinstance(line, CutTail) or (isinstance(line, Cut) and not line.first):
            continue
        out.append(line[:MAX_LINE] + CUT_MARK if len(line) > MAX_LINE else line)
    return out


class LineSink:
    """Where streamed lines go: a durable per-task copy (byte for byte the task's log, with a
    side file of when each batch arrived), and (optionally) the console as prefixed lines."""

    def __init__(self, copy_dir: Path, console: TextIO | None, verbose: bool = False) -> None:
        self.copy_dir = copy_dir
        self.console = console
        self.verbose = verbose
        self._lock = threading.Lock()
        self._files: dict[int, tuple[BinaryIO, BinaryIO]] = {}
        self._tty = bool(console is not None and console.isatty())
        self._color = self._tty
        copy_dir.mkdir(parents=True, exist_ok=True)

    def task_lines(self, index: int, host: str, lines: list[bytes]) -> None:
        if not lines:
            return
        with self._lock:
            files = self._files.get(index)
            if files is None:
                files = (
                    open(self.copy_dir / f"worker-{index}.log", "ab"),  # noqa: SIM115
                    open(times_path(self.copy_dir / f"worker-{index}.log"), "ab"),  # noqa: SIM115
                )
                self._files[index] = files
            log, times = files
            log.write(b"".join(line if isinstance(line, Cut) else line + b"\n" for line in lines))
            log.flush()
            # When the batch arrived and where it ends: `logs --timestamps/--since` read it.
            times.write(f"{time.time():.3f} {log.tell()}\n".encode())
            times.flush()
            self.show(index, host, [ln for ln in shown(lines) if self.verbose or not is_noise(ln)])

    def mark_attempt(self, index: int, number: int) -> None:
        """Attempt `number` of this task starts where its copy ends now (`logs --attempt`)."""
        with self._lock:
            if index in self._files:
                self._files[index][0].flush()
            log = self.copy_dir / f"worker-{index}.log"
            with open(attempts_path(log), "a") as marks:
                marks.write(f"{number} {_size(log)}\n")

    def show(self, index: int, host: str, lines: list[bytes]) -> None:
        """Print a task's lines on the console (called with the lock held)."""
        if self.console is None or not lines:
            return
        prefix = f"[worker-{index} {host}] "
        if self._color:
            prefix = f"\x1b[{31 + index % 6}m{prefix}\x1b[0m"
        # One write per batch: lines from different tasks never mix mid-line.
        texts = [ln.decode(errors="replace") for ln in lines]
        if self._tty:  # a terminal: nothing a trainer prints may drive it
            texts = [safe(text) for text in texts]
        self.console.write("".join(prefix + text + "\n" for text in texts))
        self.console.flush()

    def info(self, message: str) -> None:
        if self.console is None:
            return
        with self._lock:
            self.console.write(f"orchestrate: {message}\n")
            self.console.flush()

    def host_answered(self, label: str, seconds: float, detail: str) -> None:
        """A host passed preflight (the live console shows it; plain output does not)."""

    def close(self) -> None:
        with self._lock:
            for log, times in self._files.values():
                log.close()
                times.close()
            self._files.clear()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def attempts_path(log: Path) -> Path:
    return log.with_suffix(".attempts")


def times_path(log: Path) -> Path:
    return log.with_suffix(".times")
