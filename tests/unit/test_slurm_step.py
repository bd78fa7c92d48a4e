"""srun's word on a step's tasks: a task srun says ended is dead at once, though the step lives
on until srun has ended the others (orchestrator.backends.slurm_step)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.backends.slurm_allocation import Allocation
from orchestrator.backends.slurm_step import Step, task_ranks


class _Running:
    """A stand-in for srun, alive until told."""

    def __init__(self) -> None:
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code


@pytest.mark.parametrize(
    ("text", "ranks"),
    [
        ("1", {1}),
        ("0-3,5", {0, 1, 2, 3, 5}),
        ("3-1", set()),
        ("x,2,-4,5-", {2}),
        ("0-99999999", set()),
    ],
)
def test_slurm_task_lists(text: str, ranks: set[int]) -> None:
    assert task_ranks(text) == frozenset(ranks)


def test_a_task_srun_says_ended_is_dead_while_the_step_lives(tmp_path: Path) -> None:
    log = tmp_path / "srun.log"
    log.write_bytes(b"srun: error: n0: task 0: Killed\n")  # an earlier step of the attempt
    start = log.stat().st_size
    srun = _Running()
    step = Step(Allocation("7"), srun, "7.1", (log, start))  # type: ignore[arg-type]
    assert step.living(range(4)) == {0, 1, 2, 3}
    with open(log, "ab") as out:
        out.write(b"srun: error: n1: task 2: Killed\nsrun: error: n1: tasks 1,3: Exi")
    assert step.living(range(4)) == {0, 1, 3}  # a line srun has not finished is not read
    with open(log, "ab") as out:
        out.write(b"ted with exit code 1\nsrun: launch/slurm: _step_signal: Terminating\n")
        out.write(b"task 0: Killed\n\xff\xfe garbage: srun: error: x: task 0: Killed\n")
    assert step.living(range(4)) == {0}
    srun.code = 0
    assert step.living(range(4)) == set()  # the step ended: every task with it


def test_a_step_whose_log_is_gone_lives_as_the_step_does(tmp_path: Path) -> None:
    step = Step(Allocation("7"), _Running(), "7.1", (tmp_path / "none.log", 0))  # type: ignore[arg-type]
    assert step.living([0, 1]) == {0, 1}
