"""A durable copy read without holding it: forward a block at a time from an offset (all of it,
or what `logs --follow` has not shown yet), or backward from its end (`logs --tail`). A line is
held at most MAX_LINE bytes; where a longer one must be written whole, the rest is copied from
the file. Each line gets the time its batch arrived, from `worker-N.times` (one
`UNIX_TIME END_OFFSET` record per batch the supervisor wrote), read the same bounded way."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from orchestrator.logs.logstream import CUT_MARK, MAX_LINE, times_path

BLOCK = 1 << 20  # bytes read at once
_CUT_TEXT = CUT_MARK.decode()


@dataclass(frozen=True)
class LogLine:
    ts: float | None  # when the coordinator received it; None: not marked (an older copy)
    raw: bytes  # the line without its newline: all of it, or its first MAX_LINE bytes
    key: float = 0.0  # its place in arrival order: never decreases along one task's copy
    rest: tuple[Path, int, int] | None = None  # a longer line: (copy, start, end) of the rest

    @property
    def text(self) -> str:
        """As shown in memory: decoded, a longer line cut and marked."""
        return self.raw.decode(errors="replace") + (_CUT_TEXT if self.rest else "")

    def rest_chunks(self) -> Iterator[bytes]:
        """The bytes of a longer line past `raw`, a block at a time."""
        if self.rest is None:
            return
        yield from _blocks(*self.rest)


def _mark(record: bytes) -> tuple[int, float] | None:
    parts = record.split()
    try:
        return (int(parts[1]), float(parts[0])) if len(parts) == 2 else None
    except ValueError:
        return None


def _marks_back(path: Path) -> Iterator[tuple[int, float]]:
    """A times file's (end offset, time) records, last first (a partial last one left out)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed below; a missing file means no marks)
    except FileNotFoundError:
        return
    with fh:
        pos, carry = fh.seek(0, 2), None  # None: the last newline is not found yet
        while pos > 0:
            size = min(BLOCK, pos)
            pos -= size
            fh.seek(pos)
            parts = (fh.read(size) + (carry or b"")).split(b"\n")
            if carry is None:  # what follows the last newline is not written whole yet
                if len(parts) == 1 and pos > 0:
                    continue
                parts.pop()
            carry = parts.pop(0) if pos > 0 else b""  # it may begin in the block before
            for record in reversed(parts):
                if (mark := _mark(record)) is not None:
                    yield mark


def last_mark(path: Path) -> tuple[int, float] | None:
    return next(_marks_back(path), None)


class _Marks:
    """A times file read forward as needed; `time_at(start)` is the time of the first batch
    that ends past `start`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last: float | None = None  # the time of the latest mark passed
        self._read = 0
        self._pending: deque[tuple[int, float]] = deque()

    def _more(self) -> bool:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._read)
                data = fh.read(BLOCK)
                while b"\n" not in data and (more := fh.read(BLOCK)):  # a record across blocks
                    data += more
        except FileNotFoundError:
            return False
        whole = data[: data.rfind(b"\n") + 1]
        self._read += len(whole)
        self._pending.extend(m for m in map(_mark, whole.split(b"\n")) if m is not None)
        return bool(whole)

    def time_at(self, start: int) -> float | None:
        while True:
            while self._pending and self._pending[0][0] <= start:
                self.last = self._pending.popleft()[1]
            if self._pending:
                return self._pending[0][1]
            if not self._more():
                return None


class _MarksBack:
    """The same lookup for starts that only go down (reading a copy backward)."""

    def __init__(self, path: Path) -> None:
        self._marks = _marks_back(path)
        self._next = next(self._marks, None)
        self._current: tuple[int, float] | None = None  # the earliest mark ending past a start

    def time_at(self, start: int) -> float | None:
        while self._next is not None and self._next[0] > start:
            self._current, self._next = self._next, next(self._marks, None)
        return self._current[1] if self._current is not None else None


class _Window:
    """A file read backward through one block: newlines found and line heads read without
    holding more than BLOCK bytes, however long a line is."""

    def __init__(self, fh: BinaryIO, lo: int) -> None:
        self.fh, self.lo = fh, lo
        self.at, self.data = lo, b""  # the bytes [at, at + len(data)) of the file

    def rfind(self, pos: int) -> int:
        """The last newline in [lo, pos), or -1."""
        while pos > self.lo:
            if not self.at < pos <= self.at + len(self.data):
                start = max(self.lo, pos - BLOCK)
                self.fh.seek(start)
                self.data, self.at = self.fh.read(pos - start), start
                if len(self.data) < pos - start:  # the copy shrank: nothing to trust
                    return -1
            found = self.data.rfind(b"\n", 0, pos - self.at)
            if found >= 0:
                return self.at + found
            pos = self.at
        return -1

    def head(self, start: int, end: int) -> bytes:
        stop = min(end, start + MAX_LINE)
        if self.at <= start and stop <= self.at + len(self.data):
            return self.data[start - self.at : stop - self.at]
        self.fh.seek(start)
        return self.fh.read(stop - start)


def _blocks(path: Path, at: int, end: int) -> Iterator[bytes]:
    """The file's bytes in [at, end), a block at a time (fewer where it ends sooner)."""
    with open(path, "rb") as fh:
        fh.seek(at)
        while at < end:
            data = fh.read(min(BLOCK, end - at))
            if not data:
                return
            at += len(data)
            yield data


def _find_newline(path: Path, lo: int, hi: int) -> int:
    """The first newline in [lo, hi) of the file, or -1."""
    for data in _blocks(path, lo, hi):
        if (found := data.find(b"\n")) >= 0:
            return lo + found
        lo += len(data)
    return -1


class TimedLog:
    """Follows one durable copy and its times by offset."""

    def __init__(self, log: Path, span: tuple[int, int | None] = (0, None)) -> None:
        self.log = log
        self.times = times_path(log)
        self.offset, self.end = span  # the bytes [offset, end) only (one attempt's)
        self._skip_rest = self.offset > 0  # the span may start inside a cut line: not ours
        self._marks = _Marks(self.times)
        self._key = float("-inf")  # the latest line's key: a clock that stepped back is held

    def _bounds(self, final: bool) -> tuple[int, bool] | None:
        """Where this read stops, and whether a last line without its newline is taken then;
        None: nothing to read yet. Following, only lines whose arrival time is written count,
        so each has its time."""
        try:
            size = self.log.stat().st_size
        except FileNotFoundError:
            return None
        stop = size if self.end is None else min(size, self.end)
        final = final or (self.end is not None and size >= self.end)  # the span is all there
        if self._skip_rest and self.offset < stop:
            if not self._begins_a_line():
                cut = _find_newline(self.log, self.offset, stop)
                if cut < 0:
                    return None
                self.offset = cut + 1
            self._skip_rest = False
        if not final and self.times.exists():
            mark = last_mark(self.times)
            stop = min(stop, max(mark[0] if mark else self.offset, self.offset))
        return stop, final

    def _begins_a_line(self) -> bool:
        with open(self.log, "rb") as fh:
            fh.seek(self.offset - 1)
            return fh.read(1) == b"\n"

    def read(self, final: bool = False) -> list[LogLine]:
        return list(self.lines(final))

    def lines(self, final: bool = False) -> Iterator[LogLine]:
        """New whole lines, a block read at a time (at the end, with `final`, a last partial
        line too); the offset moves past each line as it is taken."""
        bounds = self._bounds(final)
        if bounds is None:
            return
        stop, final = bounds
        with open(self.log, "rb") as fh:
            fh.seek(self.offset)
            pos = start = self.offset
            head = b""
            while pos < stop:
                block = fh.read(min(BLOCK, stop - pos))
                if not block:
                    break
                at = 0
                while (found := block.find(b"\n", at)) >= 0:
                    if len(head) < MAX_LINE:
                        head += block[at : min(found, at + MAX_LINE - len(head))]
                    self.offset = pos + found + 1
                    yield self._line(start, pos + found, head)
                    head, start, at = b"", pos + found + 1, found + 1
                if len(head) < MAX_LINE:
                    head += block[at : at + MAX_LINE - len(head)]
                pos += len(block)
            if final and start < pos:
                self.offset = pos
                yield self._line(start, pos, head)

    def _line(self, start: int, end: int, head: bytes) -> LogLine:
        ts = self._marks.time_at(start)
        key = ts if ts is not None else (self._marks.last or 0.0)  # after its last marked line
        self._key = max(self._key, key)
        return LogLine(ts, head, self._key, self._rest(start, end))

    def _rest(self, start: int, end: int) -> tuple[Path, int, int] | None:
        return (self.log, start + MAX_LINE, end) if end - start > MAX_LINE else None

    def from_end(self, final: bool = False) -> Iterator[LogLine]:
        """The lines `lines(final)` would give, last first, read backward from the end; the
        offset moves to where they end at once (following goes on from there)."""
        bounds = self._bounds(final)
        if bounds is None:
            return iter(())
        stop, final = bounds
        lo = hi = self.offset
        if stop > lo:
            with open(self.log, "rb") as fh:
                newline = _Window(fh, lo).rfind(stop)
            hi = stop if final else newline + 1 if newline >= 0 else lo
        self.offset = hi
        return self._backward(lo, hi)

    def _backward(self, lo: int, hi: int) -> Iterator[LogLine]:
        if hi <= lo:
            return
        last = last_mark(self.times)
        unmarked = last[1] if last is not None else 0.0  # the key of a line past every mark
        marks, key = _MarksBack(self.times), float("inf")
        with open(self.log, "rb") as fh:
            window = _Window(fh, lo)
            end = hi - 1 if window.rfind(hi) == hi - 1 else hi  # else a last partial line
            while True:
                newline = window.rfind(end)
                start = newline + 1 if newline >= 0 else lo
                ts = marks.time_at(start)
                key = min(key, ts if ts is not None else unmarked)
                yield LogLine(ts, window.head(start, end), key, self._rest(start, end))
                if newline < 0:
                    return
                end = newline
