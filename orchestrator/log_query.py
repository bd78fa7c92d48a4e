"""`orchestrate logs`: read the coordinator's durable copies with the time each line arrived,
and choose lines by task, age and pattern. The copies are the tasks' logs byte for byte; the
arrival times live beside them (`worker-N.times`: one `UNIX_TIME END_OFFSET` line per batch
the supervisor wrote)."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.logstream import attempts_path, times_path
from orchestrator.paths import log_copies_dir
from orchestrator.store import JobRecord, Store
from orchestrator.terminal_text import safe

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float) -> float:
    """`--since`: an age (`90s`, `5m`, `2h`, `1d`, or kubectl's `1h30m`) or a local time
    (`2026-12-03T11:40`, `11:40`), as a UNIX time."""
    if re.fullmatch(r"(\d+(?:\.\d+)?[smhd])+", text.strip()):
        parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", text)
        return now - sum(float(n) * _UNITS[unit] for n, unit in parts)
    try:
        if re.fullmatch(r"\d{1,2}:\d\d(:\d\d)?", text.strip()):
            today = datetime.fromtimestamp(now).date().isoformat()
            return datetime.fromisoformat(f"{today}T{text.strip()}").timestamp()
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise UsageError(
            f"--since {text!r}: give an age like 90s, 5m, 1h30m, 1d or a time like 11:40 "
            "or 2026-12-03T11:40"
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
# when it runs past the budget.
_GREP_CHILD = """
import json, re, sys
pattern = re.compile(sys.argv[1])
texts = json.load(sys.stdin)
sys.stdout.write(json.dumps([i for i, t in enumerate(texts) if pattern.search(t)]))
"""


class Grep:
    """A user's --grep pattern, matched within GREP_BUDGET seconds a batch."""

    def __init__(self, pattern: str) -> None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"--grep {pattern!r}: not a regular expression: {exc}") from None
        self.pattern = pattern

    def matching(self, texts: list[str]) -> set[int]:
        """Indexes of the texts the pattern matches."""
        if not texts:
            return set()
        import json
        import subprocess
        import sys

        try:
            out = subprocess.run(
                [sys.executable, "-c", _GREP_CHILD, self.pattern],
                input=json.dumps(texts),
                capture_output=True,
                text=True,
                timeout=GREP_BUDGET,
                check=True,
            )
        except subprocess.TimeoutExpired:
            raise UsageError(
                f"--grep {self.pattern!r}: matching took over {GREP_BUDGET:g}s for "
                f"{len(texts)} line(s) and was stopped; the pattern backtracks (nested "
                "repetition like (a+)+): simplify it"
            ) from None
        return set(json.loads(out.stdout))


def parse_grep(pattern: str | None) -> Grep | None:
    return None if pattern is None else Grep(pattern)


def stamp(ts: float | None) -> str:
    """RFC 3339 in UTC with milliseconds, as `kubectl logs --timestamps` prints."""
    if ts is None:
        return "-" * 24
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
    return f"{whole}.{int(ts % 1 * 1000):03d}Z"


@dataclass(frozen=True)
class LogLine:
    ts: float | None  # when the coordinator received it; None: a copy from before timestamps
    text: str


class TimedLog:
    """Follows one durable copy and its times by offset."""

    def __init__(self, log: Path, span: tuple[int, int | None] = (0, None)) -> None:
        self.log = log
        self.times = times_path(log)
        self.offset, self.end = span  # the bytes [offset, end) only (one attempt's)
        self._skip_rest = self.offset > 0  # the span may start inside a cut line: not ours
        self._times_read = 0
        self._marks: list[tuple[int, float]] = []  # (end offset, time), ascending

    def _load_marks(self) -> bool:
        """Read new time marks; False when there is no times file (an old copy)."""
        try:
            with open(self.times, "rb") as fh:
                fh.seek(self._times_read)
                data = fh.read()
        except FileNotFoundError:
            return False
        whole = data[: data.rfind(b"\n") + 1]
        self._times_read += len(whole)
        for record in whole.splitlines():
            ts, end = record.split()
            self._marks.append((int(end), float(ts)))
        return True

    def read(self, final: bool = False) -> list[LogLine]:
        """New whole lines (at the end, with `final`, a last partial line too). Following, only
        lines whose arrival time is written are returned, so each has its time."""
        timed = self._load_marks()
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        if self.end is not None:
            data = data[: max(self.end - self.offset, 0)]
            final = final or len(data) == self.end - self.offset  # the span is all there
        if self._skip_rest and data:
            if not self._begins_a_line():
                cut = data.find(b"\n")
                if cut < 0:
                    return []
                self.offset, data = self.offset + cut + 1, data[cut + 1 :]
            self._skip_rest = False
        if timed and not final:
            limit = (self._marks[-1][0] if self._marks else self.offset) - self.offset
            data = data[: max(limit, 0)]
        if not final:
            data = data[: data.rfind(b"\n") + 1]
        if not data:
            return []
        pieces = data.split(b"\n")
        if pieces[-1] == b"":
            pieces.pop()
        lines, start = [], self.offset
        for piece in pieces:
            lines.append(LogLine(self._time_at(start), piece.decode(errors="replace")))
            start += len(piece) + 1
        self.offset += len(data)
        return lines

    def _begins_a_line(self) -> bool:
        with open(self.log, "rb") as fh:
            fh.seek(self.offset - 1)
            return fh.read(1) == b"\n"

    def _time_at(self, start: int) -> float | None:
        while self._marks and self._marks[0][0] <= start:
            self._marks.pop(0)
        return self._marks[0][1] if self._marks else None


def select(lines: list[LogLine], since: float | None, pattern: Grep | None) -> list[LogLine]:
    """Lines at or after `since` (a line of unknown time is left out when one is given) that
    match `pattern`."""
    recent = [ln for ln in lines if since is None or (ln.ts is not None and ln.ts >= since)]
    if pattern is None:
        return recent
    hits = pattern.matching([ln.text for ln in recent])
    return [ln for i, ln in enumerate(recent) if i in hits]


def attempt_span(log: Path, number: int) -> tuple[int, int | None]:
    """The bytes of a task's copy that attempt `number` wrote: from its mark to the next
    attempt's (the supervisor marks each attempt's start in `worker-N.attempts`)."""
    try:
        marks = [tuple(map(int, ln.split())) for ln in attempts_path(log).read_text().split("\n")
                 if ln.strip()]  # fmt: skip
    except FileNotFoundError:
        marks = []
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


def log_batches(store: Store, job: JobRecord, query: LogQuery) -> Iterator[list[LogRecord]]:
    """The chosen tasks' lines in the order they arrived, a batch at a time: one batch, or with
    `follow` one every 0.3 s until the job ends."""
    if query.tail is not None and query.tail < 0:
        raise UsageError(f"--tail {query.tail}: give a number of lines, 0 or more")
    tasks = store.tasks(job.id)
    chosen_ids = parse_tasks(query.task, len(tasks)) if query.task is not None else None
    pattern = parse_grep(query.grep)
    after = parse_since(query.since, time.time()) if query.since is not None else None
    chosen = [t for t in tasks if chosen_ids is None or t.idx in chosen_ids]
    log_dir = log_copies_dir(job.id)
    readers = {}
    for t in chosen:
        log = log_dir / f"worker-{t.idx}.log"
        span = attempt_span(log, query.attempt) if query.attempt is not None else (0, None)
        readers[t.idx] = TimedLog(log, span)
    first = True
    while True:
        last = not query.follow or store.get_job(job.id).state.is_terminal()
        batch = [
            LogRecord(line.ts, t.idx, t.host, line.text)
            for t in chosen
            for line in select(readers[t.idx].read(final=last), after, pattern)
        ]
        batch.sort(key=lambda r: (r.time or 0.0, r.task))  # by arrival; each task's order kept
        if first and query.tail is not None:
            batch = batch[len(batch) - query.tail :] if query.tail else []
        first = False
        yield batch
        if last:
            return
        time.sleep(0.3)


def follow_logs(store: Store, job: JobRecord, query: LogQuery) -> None:
    """`orchestrate logs`: the chosen tasks' durable copies, prefixed by task, in the order the
    lines arrived; with `follow`, on until the job ends."""
    shown = safe if sys.stdout.isatty() else str  # a terminal: escape what drives it
    alone = query.task is not None and len(parse_tasks(query.task, len(store.tasks(job.id)))) == 1
    for batch in log_batches(store, job, query):
        if query.as_json:
            out = "".join(record.as_json() + "\n" for record in batch)
        else:
            out = "".join(
                (stamp(r.time) + " " if query.timestamps else "")
                + ("" if alone else f"[worker-{r.task} {r.host}] ")
                + shown(r.text)
                + "\n"
                for r in batch
            )
        sys.stdout.write(out)
        sys.stdout.flush()
