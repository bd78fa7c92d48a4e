"""A custom loop's whole step at each checkpoint (worker.checkpoint_steps): what a resumed
attempt adds to its optimizers' count, the record kept across attempts, and garbage in it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from worker.checkpoint_steps import FILE_NAME, KEEP, CheckpointSteps, Mark, steps_to_add


def test_a_checkpoint_without_the_optimizer_adds_its_whole_step() -> None:
    # The optimizer's count began again at 0 (read right after the restore): the whole step
    # at the checkpoint comes before it.
    assert steps_to_add(Mark(step=700, iterations=700), 0) == 700
    # A second resume: the mark was written in a resumed attempt (700 before, 100 its own).
    assert steps_to_add(Mark(step=800, iterations=100), 0) == 800


def test_a_checkpoint_with_the_optimizer_adds_only_what_came_before_its_count() -> None:
    assert steps_to_add(Mark(step=700, iterations=700), 700) == 0
    assert steps_to_add(Mark(step=900, iterations=200), 205) == 700  # read a few steps on


def test_marks_are_kept_across_attempts_by_the_checkpoints_name(tmp_path: Path) -> None:
    first = CheckpointSteps(str(tmp_path))
    first.wrote(str(tmp_path / "ckpt" / "ckpt-7"), 700, 700)
    # The next attempt's trainer; a worker restores the chief's checkpoint of the same name.
    again = CheckpointSteps(str(tmp_path))
    assert again.at("/elsewhere/chief/ckpt-7") == Mark(700, 700)
    assert again.at("ckpt-8") is None
    assert (tmp_path / FILE_NAME).stat().st_mode & 0o777 == 0o600


def test_only_the_newest_marks_are_kept(tmp_path: Path) -> None:
    steps = CheckpointSteps(str(tmp_path))
    for n in range(KEEP + 10):
        steps.wrote(f"ckpt-{n}", n * 10, n * 10)
    kept = json.loads((tmp_path / FILE_NAME).read_text())
    assert len(kept) == KEEP and "ckpt-9" not in kept and f"ckpt-{KEEP + 9}" in kept


def test_garbage_in_the_record_is_no_mark(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    for garbage in (b"\x00\xff not json", b"[1, 2]", b'{"a": "b", "c": [1], "d": [true, 1]}',
                    b'{"e": [-1, 2], "f": [1.5, 2]}', b"{" * 100_000):  # fmt: skip
        path.write_bytes(garbage)
        steps = CheckpointSteps(str(tmp_path))
        assert [steps.at(n) for n in "abcdef"] == [None] * 6
    path.write_bytes(b'{"ok": [3, 2], "bad": "x"}')
    assert CheckpointSteps(str(tmp_path)).at("ok") == Mark(3, 2)


def test_no_task_directory_keeps_nothing(tmp_path: Path) -> None:
    steps = CheckpointSteps(None)
    steps.wrote("ckpt-1", 10, 10)
    assert steps.at("ckpt-1") is None and not os.listdir(tmp_path)


def test_a_task_that_never_marked_a_checkpoint_reads_another_tasks_mark(tmp_path: Path) -> None:
    # worker-1 was killed after the chief's save of ckpt-9, before its own mark of it.
    chief, worker = tmp_path / "tasks" / "0", tmp_path / "tasks" / "1"
    chief.mkdir(parents=True)
    worker.mkdir()
    CheckpointSteps(str(chief)).wrote("/shared/ckpt/ckpt-9", 900, 200)
    CheckpointSteps(str(worker)).wrote("/shared/ckpt/tmp-1/ckpt-8", 800, 100)
    again = CheckpointSteps(str(worker))
    assert again.at("/shared/ckpt/ckpt-9") == Mark(900, 200)
    assert again.at("/shared/ckpt/tmp-1/ckpt-8") == Mark(800, 100)  # its own first
    assert again.at("ckpt-10") is None
    (chief / FILE_NAME).write_bytes(b"\x00garbage")  # another task's file: garbage is no mark
    assert again.at("/shared/ckpt/ckpt-9") is None
