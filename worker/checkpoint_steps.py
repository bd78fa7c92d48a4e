"""The whole training's step at each checkpoint a custom training loop writes, so that a
resumed attempt's STEP goes on from there even when the script's checkpoint leaves its
optimizer out (TensorFlow's multi-worker custom-loop tutorial checkpoints its own `epoch` and
`step_in_epoch`, and the optimizer's iterations start again at 0).

Each trainer keeps its own marks in its task directory (a file only it writes), keyed by the
checkpoint's file name: saving is collective under MWMS, so every task's n-th checkpoint has
the same name, the chief's and a worker's scratch copy alike. A task killed before it marked a
checkpoint another task wrote reads that task's mark. The files are bounded and read
defensively; garbage in them is no mark, never a failed script.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass

from worker.atomic import write_json_atomic

FILE_NAME = "steps-at-checkpoints.json"
KEEP = 64  # the newest marks; a resume reads one of the last few checkpoints
MAX_BYTES = 64 * 1024
PEERS = 8  # other tasks' marks read when this task has none of a restored checkpoint


@dataclass(frozen=True)
class Mark:
    step: int  # the whole training's step when the checkpoint was written
    iterations: int  # the optimizers' own count then


def steps_to_add(mark: Mark, iterations: int) -> int:
    """What to add to the optimizers' count after `mark`'s checkpoint was restored: the
    steps before the optimizers' count began when the checkpoint held the optimizer (its count
    came back with it), else the whole step at the checkpoint (its count began again)."""
    if iterations >= mark.iterations > 0:
        return mark.step - mark.iterations
    return mark.step


class CheckpointSteps:
    """The marks of one task, kept across its attempts."""

    def __init__(self, task_dir: str | None) -> None:
        self._path = os.path.join(task_dir, FILE_NAME) if task_dir else None
        self._marks = _read_marks(self._path) if self._path else {}

    def wrote(self, checkpoint_path: str, step: int, iterations: int) -> None:
        if self._path is None:
            return
        name = os.path.basename(checkpoint_path)
        self._marks.pop(name, None)
        self._marks[name] = Mark(step, iterations)
        while len(self._marks) > KEEP:
            self._marks.pop(next(iter(self._marks)))
        marks = {k: [m.step, m.iterations] for k, m in self._marks.items()}
        # A full or read-only disk: the next attempt counts from its own start.
        with contextlib.suppress(OSError):
            write_json_atomic(self._path, marks, 0o600)

    def at(self, checkpoint_path: str) -> Mark | None:
        """This task's mark of the checkpoint; else another task's of the same job (one killed
        between another task's save and its own mark: tasks step in lockstep under MWMS, so
        every task's mark of one checkpoint holds the same whole step)."""
        name = os.path.basename(checkpoint_path)
        mark = self._marks.get(name)
        for peer in self._peers() if mark is None else []:
            if (mark := _read_marks(peer).get(name)) is not None:
                break
        return mark

    def _peers(self) -> list[str]:
        """The marks of the job's first other tasks (worker 0, the chief, first)."""
        if self._path is None:
            return []
        tasks = os.path.dirname(os.path.dirname(self._path))
        try:
            names = sorted((n for n in os.listdir(tasks) if n.isdigit()), key=int)
        except OSError:
            return []
        paths = [os.path.join(tasks, n, FILE_NAME) for n in names[: PEERS + 1]]
        return [p for p in paths if p != self._path][:PEERS]


def _read_marks(path: str) -> dict[str, Mark]:
    """A marks file, bounded; garbage in it is no mark."""
    try:
        with open(path, "rb") as fh:
            raw = json.loads(fh.read(MAX_BYTES + 1)[:MAX_BYTES])
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    marks: dict[str, Mark] = {}
    for name, value in list(raw.items())[-KEEP:]:
        if (
            isinstance(value, list)
            and len(value) == 2
            and all(type(v) is int and 0 <= v < 2**62 for v in value)
        ):
            marks[str(name)[:255]] = Mark(value[0], value[1])
    return marks
