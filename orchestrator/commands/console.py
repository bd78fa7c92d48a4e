"""The live console of `orchestrate launch` on a terminal: a panel (rich) of every task's phase,
progress and startup timeline, refreshed from the store, with the tasks' lines streamed above
it and identical lines from several tasks folded into one (`[worker-0..3] Epoch 1/15`).

Only a terminal gets it: without one, or with `--plain`, LineSink prints today's prefixed lines
unchanged. The pure parts (labels, the phase clock, folding) are kept apart from rich."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, cast

from orchestrator.commands.views import RESOURCE_HEADERS, resource_cells, straggler_cell
from orchestrator.logs.launch_output import GuardedOutput
from orchestrator.logs.logstream import LineSink
from orchestrator.logs.terminal_text import safe
from orchestrator.state.states import TaskState
from orchestrator.state.store import JobRecord, Store, TaskRecord
from worker.spec import Phase

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

REFRESH = 0.25  # seconds between panel refreshes
OUTPUT_LOST_EVENT = "output_lost"  # the launch's standard output went away
FOLD_WINDOW = 0.6  # seconds a line waits for the same line from the other tasks

_PHASE_LABELS = {
    Phase.STARTING: "importing TensorFlow",
    Phase.IMPORTED: "setting up",
    Phase.JOINING: "waiting for peers",
    Phase.JOINED: "first step",
    Phase.TRAINING: "training",
    Phase.FINISHED: "saving",
}
# The startup timeline: (label, from phase, to phase). NONE stands for "the attempt began".
_TIMELINE = (
    ("start", Phase.NONE, Phase.STARTING),
    ("import", Phase.STARTING, Phase.IMPORTED),
    ("peers", Phase.IMPORTED, Phase.JOINED),
    ("1st step", Phase.JOINED, Phase.TRAINING),
)
_ORDER = list(Phase)


def activity(task: TaskRecord) -> str:
    """What a task is doing, in words: its phase while it runs, its state once it ended."""
    if task.state.is_terminal() or task.state == TaskState.UNREACHABLE:
        return task.state.value + (f" ({task.exit_code})" if task.exit_code else "")
    if task.state == TaskState.PENDING:
        return "connecting"
    if task.phase == Phase.NONE:
        return "starting" if task.state == TaskState.STARTING else "running"
    return _PHASE_LABELS[task.phase]


@dataclass
class PhaseClock:
    """When each task's phases were first seen, per attempt: the startup timeline."""

    seen: dict[tuple[int, int], dict[Phase, float]] = field(default_factory=dict)

    def observe(self, tasks: Sequence[TaskRecord], now: float) -> None:
        for task in tasks:
            marks = self.seen.setdefault((task.idx, task.attempt), {Phase.NONE: now})
            if task.phase not in marks:
                # Phases passed between two looks get the time of the later one.
                for phase in _ORDER[1 : _ORDER.index(task.phase) + 1]:
                    marks.setdefault(phase, now)

    def timeline(self, task: TaskRecord) -> str:
        marks = self.seen.get((task.idx, task.attempt), {})
        parts = [
            f"{label} {marks[end] - marks[begin]:.1f}s"
            for label, begin, end in _TIMELINE
            if begin in marks and end in marks
        ]
        return " · ".join(parts) or "-"


def fold_label(indexes: Sequence[int], host: str) -> str:
    """`[worker-2 n1]` for one task; `[worker-0..3]` or `[worker-0,2]` for several."""
    if len(indexes) == 1:
        return f"[worker-{indexes[0]} {host}]"
    ordered = sorted(indexes)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"[worker-{ordered[0]}..{ordered[-1]}]"
    return "[worker-" + ",".join(map(str, ordered)) + "]"


@dataclass
class _Pending:
    text: str
    host: str
    since: float
    indexes: list[int]


class LineFolder:
    """Holds each line up to FOLD_WINDOW for the same line from other tasks; releases lines in
    the order they first arrived, so each task's own order is kept."""

    def __init__(self, window: float = FOLD_WINDOW) -> None:
        self.window = window
        self.width = 0  # how many tasks the job has: a line all of them printed goes at once
        self._queue: list[_Pending] = []

    def add(self, index: int, host: str, text: str, now: float) -> None:
        for pending in self._queue:
            if pending.text == text and index not in pending.indexes:
                pending.indexes.append(index)
                return
        self._queue.append(_Pending(text, host, now, [index]))

    def due(self, now: float, everything: bool = False) -> list[tuple[list[int], str, str]]:
        out = []
        while self._queue:
            first = self._queue[0]
            complete = self.width > 1 and len(first.indexes) >= self.width
            if not (everything or complete or now - first.since >= self.window):
                break
            self._queue.pop(0)
            out.append((first.indexes, first.host, first.text))
        return out


def _job_line(job: JobRecord, now: float) -> str:
    wall = (job.ended or now) - job.created
    parts = [f"job {job.id}", job.state.value, f"attempt {job.attempt}", f"{wall:.0f}s"]
    if job.restarts:
        parts.append(f"restarts {job.restarts}")
    if job.preemptions:
        parts.append(f"preemptions {job.preemptions}")
    return "  ".join(parts)


def panel(
    job: JobRecord,
    tasks: Sequence[TaskRecord],
    clock: PhaseClock,
    hosts: Sequence[str],
    notes: Sequence[str],
    now: float,
    max_rows: int = 24,
) -> RenderableType:
    """The panel: the job's line, each host that answered preflight, a row per task (the
    first max_rows; a count of the rest by activity) and the latest notes."""
    from rich.console import Group as RichGroup
    from rich.table import Table
    from rich.text import Text

    headers = ("TASK", "HOST", "PHASE", "EPOCH", "STEP", "LOSS", "STEPS/S", "HEARTBEAT",
               *RESOURCE_HEADERS, "STRAGGLER", "STARTUP")  # fmt: skip
    rows = [
        (
            f"{t.type}-{t.idx}",
            t.host,
            activity(t),
            f"{t.epoch}/{t.total_epochs}" if t.total_epochs else str(t.epoch or "-"),
            str(t.step) if t.step else "-",
            "-" if t.loss is None else f"{t.loss:.4f}",
            "-" if t.steps_per_sec is None else f"{t.steps_per_sec:.1f}",
            "-" if t.heartbeat_at is None else f"{max(now - t.heartbeat_at, 0.0):.1f}s",
            *resource_cells(None if t.state.is_terminal() else t.resources),
            straggler_cell(t.straggler),
            clock.timeline(t),
        )
        for t in tasks[:max_rows]
    ]
    grid = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for i, name in enumerate(headers):
        # On a narrow terminal only the startup timeline is cut short, never the figures.
        fixed = max([len(name), *(len(r[i]) for r in rows)]) if name != "STARTUP" else None
        grid.add_column(name, no_wrap=True, min_width=fixed, overflow="ellipsis")
    for row in rows:
        grid.add_row(*row)
    parts: list[RenderableType] = [Text(_job_line(job, now), style="bold")]
    parts += [Text(f"preflight: {h}", style="dim") for h in hosts[-max_rows:]]
    parts.append(grid)
    if len(tasks) > max_rows:
        rest: dict[str, int] = {}
        for t in tasks[max_rows:]:
            rest[activity(t)] = rest.get(activity(t), 0) + 1
        counts = ", ".join(f"{n} {a}" for a, n in sorted(rest.items()))
        parts.append(Text(f"… {len(tasks) - max_rows} more: {counts}"))
    parts += [Text(n, style="dim") for n in notes]
    from rich.panel import Panel

    return Panel(RichGroup(*parts), title="orchestrate", title_align="left", expand=False)


class LiveConsole(LineSink):
    """A LineSink that keeps the durable copies as LineSink does, and on the terminal shows the
    live panel with the tasks' (folded) lines above it."""

    def __init__(self, copy_dir: Path, stream: TextIO, store_path: Path, job_id: str,
                 verbose: bool = False) -> None:  # fmt: skip
        from rich.console import Console
        from rich.live import Live

        super().__init__(copy_dir, None, verbose)
        self.rich: Console = Console(file=stream, highlight=False, markup=False)
        self.store_path = store_path
        self.job_id = job_id
        self.clock = PhaseClock()
        self.folder = LineFolder()
        self.hosts: dict[str, str] = {}  # the latest preflight's answer per host
        self._closed = threading.Event()
        self.live: Live = Live(console=self.rich, auto_refresh=False, transient=False,
                               redirect_stdout=False, redirect_stderr=False)  # fmt: skip
        self.live.start()
        self._thread = threading.Thread(target=self._refresh_loop, daemon=True)
        self._thread.start()

    # --- lines above the panel ---------------------------------------------------------
    def show(self, index: int, host: str, lines: list[bytes]) -> None:
        now = time.time()
        for line in lines:
            self.folder.add(index, host, safe(line.decode(errors="replace")), now)
        self._release(now)

    def _release(self, now: float, everything: bool = False) -> None:
        from rich.text import Text

        for indexes, host, text in self.folder.due(now, everything):
            color = f"color({1 + indexes[0] % 6})" if len(indexes) == 1 else "bold"
            label = Text(fold_label(indexes, host) + " ", style=color)
            self.rich.print(label + Text(text), soft_wrap=True)

    def info(self, message: str) -> None:
        with self._lock:
            self._release(time.time(), everything=True)
            self.rich.print(f"orchestrate: {message}", soft_wrap=True)

    def host_answered(self, label: str, seconds: float, detail: str) -> None:
        with self._lock:
            self.hosts[label] = f"{label} ok in {seconds:.1f}s ({detail})"

    # --- the panel ---------------------------------------------------------------------
    def _refresh_loop(self) -> None:
        store = Store(self.store_path)  # this thread's own connection
        try:
            while not self._closed.wait(REFRESH):
                self._refresh(store)
            self._refresh(store)
        finally:
            store.close()

    def _refresh(self, store: Store) -> None:
        now = time.time()
        job = store.get_job(self.job_id)
        tasks = store.tasks(self.job_id)
        notes = [f"{e.kind}: {e.message}" for e in store.events(self.job_id)[-3:]]
        with self._lock:
            self.clock.observe(tasks, now)
            self.folder.width = len(tasks)
            self._release(now)
            rows = max(self.rich.size.height - 12 - len(notes), 4)
            self.live.update(
                panel(job, tasks, self.clock, list(self.hosts.values()), notes, now, rows),
                refresh=True,
            )

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._thread.join(timeout=5)
            with self._lock:
                self._release(time.time(), everything=True)
            self.live.stop()
        super().close()


def watch(render: Callable[[], tuple[RenderableType, bool]], stream: TextIO,
          interval: float = 1.0) -> None:  # fmt: skip
    """Redraw `render()` in place every interval until it says it is done (or Ctrl-C)."""
    from rich.console import Console
    from rich.live import Live

    console: Console = Console(file=stream, highlight=False, markup=False)
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            renderable, done = render()
            live.update(renderable, refresh=True)
            if done:
                return
            time.sleep(interval)


def watch_text(snapshot: Callable[[], tuple[str, bool]], stream: TextIO, interval: float) -> None:
    """`status --watch`: on a terminal, the text redrawn in place (with the time); elsewhere,
    one snapshot after another; until `snapshot()` says it is done (or Ctrl-C)."""
    if stream.isatty():
        from rich.text import Text

        def render() -> tuple[Text, bool]:
            text, done = snapshot()
            return Text(time.strftime("%H:%M:%S ") + text.rstrip("\n")), done

        watch(render, stream, interval)
        return
    while True:
        text, done = snapshot()
        stream.write(text + "\n")
        stream.flush()
        if done:
            return
        time.sleep(interval)


class JobPanel:
    """`launch --detach` on a terminal: the job's panel while it waits for the job to run."""

    def __init__(self, store: Store, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self.store = store
        self.clock = PhaseClock()
        self.live: Live = Live(console=Console(file=stream, highlight=False, markup=False),
                               auto_refresh=False, transient=False)  # fmt: skip
        self._shown = 0.0

    def __enter__(self) -> JobPanel:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def update(self, job: JobRecord) -> None:
        now = time.time()
        if now - self._shown < REFRESH:
            return
        self._shown = now
        tasks = self.store.tasks(job.id)
        self.clock.observe(tasks, now)
        notes = [f"{e.kind}: {e.message}" for e in self.store.events(job.id)[-3:]]
        self.live.update(panel(job, tasks, self.clock, [], notes, now), refresh=True)


def live_wanted(plain: bool) -> bool:
    """The panel only on a terminal, and not when asked for plain lines."""
    return not plain and sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def console_sink(copy_dir: Path, store_path: Path, job_id: str, verbose: bool,
                 plain: bool, to_stderr: bool = False) -> LineSink:  # fmt: skip
    """Where a supervising `launch`/`attach`/`resume` sends the tasks' lines: its standard
    output (`to_stderr`: its standard error, plain, where stdout holds one JSON document), for
    as long as something reads it (orchestrator.logs.launch_output)."""

    def lost(why: str) -> None:
        store = Store(store_path)
        try:
            store.add_event(job_id, OUTPUT_LOST_EVENT, f"the launch's output can no longer be "
                            f"written ({why}): supervision goes on; see `orchestrate logs "
                            f"{job_id}`")  # fmt: skip
        finally:
            store.close()

    out = cast(TextIO, GuardedOutput(sys.stderr if to_stderr else sys.stdout, lost))
    if live_wanted(plain or to_stderr):
        return LiveConsole(copy_dir, out, store_path, job_id, verbose)
    return LineSink(copy_dir, out, verbose)


def detach_progress(store: Store, plain: bool) -> AbstractContextManager[JobPanel | None]:
    """On a terminal, `launch --detach` shows the job's panel while it waits for it to run."""
    return JobPanel(store, sys.stdout) if live_wanted(plain) else contextlib.nullcontext()
