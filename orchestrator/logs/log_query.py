"""`orchestrate logs`: read the coordinator's durable copies with the time each line arrived
(`orchestrator.logs.log_files`), and choose lines by task, age and pattern. Nothing holds a whole
copy: lines are merged, chosen and written in bounded batches, and `--tail` reads from the
end."""

from __future__ import annotations

import codecs
import heapq
import itertools
import json
import os
import re
import select as select_fd  # `select` is the function below
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.errors import OrchestrateError, UsageError
from orchestrator.logs.launch_output import silence_stdout
from orchestrator.logs.log_files import LogLine, TimedLog
from orchestrator.logs.logstream import attempts_path
from orchestrator.logs.terminal_text import safe
from orchestrator.state.paths import log_copies_dir
from orchestrator.state.store import JobRecord, Store, TaskRecord

__all__ = ["Grep", "LogLine", "LogQuery", "LogRecord", "TimedLog", "follow_logs", "log_batches"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str) -> float | None:
    """An age (`90s`, `5m`, `2h`, `30d`, or kubectl's `1h30m`) in seconds; None: not one."""
    if not re.fullmatch(r"(\d+(?:\.\d+)?[smhd])+", text.strip()):
        return None
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", text)
    return sum(float(n) * _UNITS[unit] for n, unit in parts)


def parse_since(text: str, now: float) -> float:
    """`--since`: an age (`90s`, `5m`, `2h`, `1d`, or kubectl's `1h30m`) or a time in UTC, as
    `--timestamps` prints them (`2026-12-03T11:40`, `11:40` today; an explicit offset such as
    `+01:00` is honoured), as a UNIX time."""
    age = parse_age(text)
    if age is not None:
        return now - age
    try:
        if re.fullmatch(r"\d{1,2}:\d\d(:\d\d)?", text.strip()):
            today = datetime.fromtimestamp(now, UTC).date().isoformat()
            text = f"{today}T{text.strip()}"
        when = datetime.fromisoformat(text.strip())
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    except ValueError:
        raise UsageError(
            f"--since {text!r}: give an age like 90s, 5m, 1h30m, 1d or a time in UTC like "
            "11:40 or 2026-12-03T11:40"
        ) from None


def parse_tasks(text: str, count: int) -> list[int]:
    """`--task 0,2` or `--task 1-3` (or both mixed), checked against the job's tasks."""
    chosen: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise UsageError(f"--task {text!r}: give task indexes like 0,2 or 1-3")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        if first > last:
            raise UsageError(f"--task {text!r}: {first}-{last} is empty (give the low end first)")
        if last >= count:  # checked before anything is built from it: 0-99999999999 is refused
            raise UsageError(
                f"--task {text!r}: no task {max(first, count)} (tasks: 0..{count - 1})"
                if count
                else f"--task {text!r}: the job has no tasks"
            )
        chosen.update(range(first, last + 1))
    return sorted(chosen)


GREP_BUDGET = 10.0  # seconds a --grep pattern may spend on one batch of lines

# Python's re backtracks: a pattern like (a+)+$ takes exponential time on some lines, and a
# running match cannot be interrupted. So lines are matched in a child process that is killed
# when a batch runs past the budget; one child serves every batch (a JSON list a line).
_GREP_CHILD = """
import json, re, sys
pattern = re.compile(sys.argv[1])
for batch in sys.stdin:
    texts = json.loads(batch)
    sys.stdout.write(json.dumps([i for i, t in enumerate(texts) if pattern.search(t)]) + "\\n")
    sys.stdout.flush()
"""


class Grep:
    """A user's --grep pattern, matched within GREP_BUDGET seconds a batch."""

    def __init__(self, pattern: str) -> None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"--grep {pattern!r}: not a regular expression: {exc}") from None
        self.pattern = pattern
        self._child: subprocess.Popen[bytes] | None = None

    def matching(self, texts: list[str]) -> set[int]:
        """Indexes of the texts the pattern matches."""
        if not texts:
            return set()
        if self._child is None:
            self._child = subprocess.Popen(
                [sys.executable, "-c", _GREP_CHILD, self.pattern],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        child, deadline = self._child, time.monotonic() + GREP_BUDGET
        assert child.stdin is not None and child.stdout is not None
        answer = b""
        try:
            child.stdin.write(json.dumps(texts).encode() + b"\n")
            child.stdin.flush()
            while not answer.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select_fd.select([child.stdout], [], [], left)[0]:
                    self.close()
                    raise UsageError(
                        f"--grep {self.pattern!r}: matching took over {GREP_BUDGET:g}s for "
                        f"{len(texts)} line(s) and was stopped; the pattern backtracks (nested "
                        "repetition like (a+)+): simplify it"
                    )
                data = os.read(child.stdout.fileno(), 1 << 16)
                if not data:
                    raise BrokenPipeError
                answer += data
        except BrokenPipeError:
            self.close()
            raise UsageError(f"--grep {self.pattern!r}: the matching process ended") from None
        return set(json.loads(answer))

    def close(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            for pipe in (self._child.stdin, self._child.stdout):
                if pipe is not None:
                    pipe.close()
            self._child = None


def parse_grep(pattern: str | None) -> Grep | None:
    return None if pattern is None else Grep(pattern)


def stamp(ts: float | None) -> str:
    """RFC 3339 in UTC with milliseconds, as `kubectl logs --timestamps` prints."""
    if ts is None:
        return "-" * 24
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
    return f"{whole}.{int(ts % 1 * 1000):03d}Z"


def _kept(lines: list[LogLine], since: float | None, pattern: Grep | None) -> list[int]:
    recent = [
        i for i, ln in enumerate(lines) if since is None or (ln.ts is not None and ln.ts >= since)
    ]
    if pattern is None:
        return recent
    # A longer line is matched on what is held of it: its first 64 KiB.
    hits = pattern.matching([lines[i].raw.decode(errors="replace") for i in recent])
    return [i for n, i in enumerate(recent) if n in hits]


def select(lines: list[LogLine], since: float | None, pattern: Grep | None) -> list[LogLine]:
    """Lines at or after `since` (a line of unknown time is left out when one is given) that
    match `pattern`."""
    return [lines[i] for i in _kept(lines, since, pattern)]


def attempt_span(log: Path, number: int) -> tuple[int, int | None]:
    """The bytes of a task's copy that attempt `number` wrote: from its mark to the next
    attempt's (the supervisor marks each attempt's start in `worker-N.attempts`)."""
    path = attempts_path(log)
    try:
        text = path.read_bytes().decode(errors="replace")
    except FileNotFoundError:
        text = ""
    marks: list[tuple[int, int]] = []
    for row, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        if len(words) != 2 or not all(w.isdigit() and len(w) < 20 for w in words):
            raise OrchestrateError(
                f"{path}: line {row} is not `ATTEMPT OFFSET` ({line[:60]!r}): the file is "
                "damaged; `logs` without --attempt still reads every line"
            )
        marks.append((int(words[0]), int(words[1])))
    starts = [offset for n, offset in marks if n == number]
    if not starts:
        known = sorted({n for n, _ in marks})
        have = f"its attempts: {', '.join(map(str, known))}" if known else "no attempt is marked"
        raise UsageError(f"--attempt {number}: {log.stem} has no such attempt ({have})")
    later = [offset for n, offset in marks if n > number]
    return starts[0], (min(later) if later else None)


@dataclass(frozen=True)
class LogQuery:
    """What `orchestrate logs` was asked for."""

    task: str | None = None  # "0,2" or "1-3"
    follow: bool = False
    timestamps: bool = False
    since: str | None = None
    grep: str | None = None
    tail: int | None = None  # the last N lines (of all chosen tasks), then follow on
    attempt: int | None = None
    as_json: bool = False  # one JSON object per line: time, task, host, text


@dataclass(frozen=True)
class LogRecord:
    """One line of a task's log, as `logs --json` prints it and `Job.logs()` returns it."""

    time: float | None  # when the coordinator received it (None: a copy without times)
    task: int
    host: str
    text: str

    def as_json(self) -> str:
        when = stamp(self.time) if self.time is not None else None
        return json.dumps({"time": when, "task": self.task, "host": self.host, "text": self.text})


BATCH_LINES = 5000  # lines chosen (and written) at once, and at most BATCH_BYTES of them
BATCH_BYTES = 1 << 20
Item = tuple[TaskRecord, LogLine]
Sources = list[tuple[TaskRecord, Iterator[LogLine]]]  # each task's lines, in reading order
Batches = Generator[list[Item], None, None]


def _merged(sources: Sources, backward: bool) -> Iterator[Item]:
    """The tasks' lines in the order they arrived (each task's in its own order), or that
    order reversed from sources read backward."""
    sign = -1 if backward else 1
    streams = [zip(itertools.repeat(task), lines) for task, lines in sources]
    return heapq.merge(*streams, key=lambda item: (sign * item[1].key, sign * item[0].idx))


def _chosen(items: Iterator[Item], since: float | None, pattern: Grep | None) -> Batches:
    """The items `select` keeps, a bounded batch at a time."""
    batch: list[Item] = []
    held = 0
    for item in itertools.chain(items, [None]):
        if item is not None:
            batch.append(item)
            held += len(item[1].raw)
        if batch and (item is None or len(batch) >= BATCH_LINES or held >= BATCH_BYTES):
            kept = [batch[i] for i in _kept([ln for _, ln in batch], since, pattern)]
            batch, held = [], 0
            if kept:
                yield kept


def _last(sources: Sources, count: int, since: float | None, pattern: Grep | None) -> Batches:
    """The last `count` chosen lines, found reading the copies backward."""
    picked: list[Item] = []
    chosen = _chosen(_merged(sources, backward=True), since, pattern)
    for batch in chosen if count else ():
        picked.extend(batch[: count - len(picked)])
        if len(picked) == count:
            break
    chosen.close()  # done reading: the copies are let go now
    picked.reverse()
    for first in range(0, len(picked), BATCH_LINES):
        yield picked[first : first + BATCH_LINES]


def line_batches(store: Store, job: JobRecord, query: LogQuery) -> Batches:
    """The chosen tasks' lines in the order they arrived, in bounded batches: once through, or
    with `follow` again every 0.3 s until the job ends. Only `--tail`'s lines are held whole."""
    if query.tail is not None and query.tail < 0:
        raise UsageError(f"--tail {query.tail}: give a number of lines, 0 or more")
    tasks = store.tasks(job.id)
    chosen_ids = parse_tasks(query.task, len(tasks)) if query.task is not None else None
    pattern = parse_grep(query.grep)
    after = parse_since(query.since, time.time()) if query.since is not None else None
    chosen = [t for t in tasks if chosen_ids is None or t.idx in chosen_ids]
    log_dir = log_copies_dir(job.id)
    readers = []
    for t in chosen:
        log = log_dir / f"worker-{t.idx}.log"
        span = attempt_span(log, query.attempt) if query.attempt is not None else (0, None)
        readers.append((t, TimedLog(log, span)))
    try:
        first = True
        while True:
            last = not query.follow or store.get_job(job.id).state.is_terminal()
            if first and query.tail is not None:  # from the end; following goes on from there
                ends = [(t, reader.from_end(final=last)) for t, reader in readers]
                yield from _last(ends, query.tail, after, pattern)
            else:
                news = [(t, reader.lines(final=last)) for t, reader in readers]
                yield from _chosen(_merged(news, backward=False), after, pattern)
            first = False
            if last:
                return
            time.sleep(0.3)
    finally:
        if pattern is not None:
            pattern.close()


def log_batches(store: Store, job: JobRecord, query: LogQuery) -> Iterator[list[LogRecord]]:
    """`line_batches` as records (a longer line cut at 64 KiB, marked)."""
    for batch in line_batches(store, job, query):
        yield [LogRecord(line.ts, t.idx, t.host, line.text) for t, line in batch]


def _json_line(write: Callable[[bytes], object], task: TaskRecord, line: LogLine) -> None:
    """One `--json` object; a longer line's text whole, decoded and escaped as it streams."""
    text = "" if line.rest else line.raw.decode(errors="replace")
    record = LogRecord(line.ts, task.idx, task.host, text).as_json()
    if line.rest is None:
        write(record.encode())
        return
    write(record[:-2].encode())  # up to the text's opening quote: `text` is the last key
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in itertools.chain([line.raw], line.rest_chunks()):
        write(json.dumps(decoder.decode(chunk))[1:-1].encode())
    write(json.dumps(decoder.decode(b"", final=True))[1:-1].encode() + b'"}')


def follow_logs(
    store: Store, job: JobRecord, query: LogQuery, frame: tuple[bytes, bytes] | None = None
) -> None:
    """`orchestrate logs`: the chosen tasks' durable copies, prefixed by task, in the order the
    lines arrived; with `follow`, on until the job ends. On a terminal each line is decoded
    and what would drive the terminal escaped; piped, a line is the task's bytes exactly.
    `frame`: under --json, one document: its start and end around the line objects (written
    as they are read, so a long log is never held), which commas then separate."""
    alone = query.task is not None and len(parse_tasks(query.task, len(store.tasks(job.id)))) == 1
    batches = line_batches(store, job, query)
    try:
        _write(batches, query, alone, frame)
    except BrokenPipeError:  # the reader stopped (`logs | head`): not a failure
        silence_stdout()
    finally:
        batches.close()  # a --grep matcher ends now


def _write(
    batches: Iterator[list[Item]], query: LogQuery, alone: bool, frame: tuple[bytes, bytes] | None
) -> None:
    tty = sys.stdout.isatty()
    raw = None if tty else getattr(sys.stdout, "buffer", None)

    def write(data: bytes) -> None:
        if raw is not None:
            raw.write(data)
        else:  # a terminal (or a stream without bytes): text
            sys.stdout.write(data.decode(errors="replace"))

    if frame is not None:
        write(frame[0])
    separator = b""
    for batch in batches:
        for task, line in batch:
            if query.as_json:
                write(separator)
                _json_line(write, task, line)
                write(b"\n")
                separator = b"," if frame is not None else b""
                continue
            prefix = (stamp(line.ts) + " " if query.timestamps else "") + (
                "" if alone else f"[worker-{task.idx} {task.host}] "
            )
            if tty:
                sys.stdout.write(prefix + safe(line.text) + "\n")
                continue
            write(prefix.encode() + line.raw)
            for chunk in line.rest_chunks():
                write(chunk)
            write(b"\n")
        (raw or sys.stdout).flush()
    if frame is not None:
        write(frame[1])
