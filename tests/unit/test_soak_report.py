"""The chaos soak's record of each recovery's starts (scripts/soak/checks.warm_starts): read from
the agents' own lines in the durable logs, attempt by attempt, and counted in the report; the
report's table beside an earlier run's."""

from __future__ import annotations

from pathlib import Path

from scripts.soak.checks import agent_pid, warm_starts
from scripts.soak.report import beside, markdown, rows

ATTEMPT_0 = "[orchestrate] attempt 0: worker-{i} on local starting\nstep 1\n"
WARM = "[orchestrate] attempt 1: worker-{i} on local starting\n[orchestrate] warm start: the " \
       "standby (pid 12) runs the entrypoint (after 2.1s waiting for its TensorFlow import)\n"  # fmt: skip
READY = "[orchestrate] attempt 1: worker-{i} on local starting\n[orchestrate] warm start: the " \
        "standby (pid 13) runs the entrypoint\n"  # fmt: skip
COLD = "[orchestrate] attempt 1: worker-{i} on local starting\n[orchestrate] cold start: no " \
       "standby was prepared on this host\n"  # fmt: skip


def _view(tmp_path: Path, texts: list[str], attempt: int = 1) -> dict:
    (tmp_path / "logs").mkdir(exist_ok=True)
    for i, text in enumerate(texts):
        (tmp_path / "logs" / f"worker-{i}.log").write_text(text.format(i=i))
    tasks = [{"type": "worker", "index": i} for i in range(len(texts))]
    return {"job_dir": str(tmp_path), "attempt": attempt, "tasks": tasks}


def test_each_tasks_start_is_read_from_its_own_attempt(tmp_path: Path) -> None:
    # Each task: the seconds its warm start waited for the standby's import, None: cold.
    assert warm_starts(_view(tmp_path, [ATTEMPT_0 + WARM, ATTEMPT_0 + READY])) == [2.1, 0.0]
    assert warm_starts(_view(tmp_path, [ATTEMPT_0 + WARM, ATTEMPT_0 + COLD])) == [2.1, None]
    # Attempt 2 not logged yet (or a garbage log): not seen, never guessed.
    assert warm_starts(_view(tmp_path, [ATTEMPT_0 + WARM] * 2, attempt=2), timeout=0.1) is None
    garbage = _view(tmp_path, ["\x00\xff [orchestrate] attempt x: " * 50] * 2)
    assert warm_starts(garbage, timeout=0.1) is None


def test_the_report_counts_recoveries_whose_every_task_started_warm() -> None:
    fault = {"kind": "trainer_kill", "overlap": "", "detected_s": 0.1, "recovered_s": 2.0,
             "backoff_s": 0.5, "budget_spent": 1, "violations": [], "tasks": 2}  # fmt: skip
    run = {"backend": "local", "seed": 1, "per_job": 5, "seconds": 60, "cold_start_s": 4.0,
           "violations": [], "faults": [{**fault, "warm": 2, "import_wait_s": 2.0},
                                        {**fault, "warm": 1, "import_wait_s": 0.0},
                                        {**fault, "warm": None}]}  # fmt: skip
    table = rows([run])
    assert table[0]["warm"] == [True, False]
    assert "| 1 of 2 | 1.00 / 2.00 |" in markdown([run], table)


def test_earlier_runs_recoveries_stand_beside_the_new_ones() -> None:
    fault = {"kind": "trainer_kill", "overlap": "", "detected_s": 0.1, "budget_spent": 1,
             "violations": []}  # fmt: skip
    then = {"backend": "local", "faults": [{**fault, "recovered_s": r} for r in (6.0, 8.0)]}
    now = {"backend": "local", "faults": [{**fault, "recovered_s": 2.0}]}
    text = beside([then], rows([now]), "2026-12-04/results.md")
    assert "| local | `trainer_kill` | 7.00 / 8.00 | 2.00 / 2.00 | 2 / 1 |" in text, text


def test_the_soak_reads_an_agents_pid_from_either_kind_of_handle() -> None:
    """An agent host's handle is `pid/ident` (the ident `boot id:start time`); a Slurm step's
    task is named `node:pid`."""
    assert agent_pid("4242/0f6c2a51-8e1d-4b0e-9f4e-3c1d2b7a9e10:1234567") == 4242
    assert agent_pid("node-1:4242") == 4242
    assert [agent_pid(ref) for ref in (None, "", "node-1:", "node-1:x", "1/0")] == [None] * 5
