#!/usr/bin/env python3
"""Restarts on 2 local workers (the digits MLP), each round beside a cold start by hand:

P5   trainer SIGKILLed -> training resumed, warm_restart = false (a new interpreter and a
     TensorFlow import per task);
P14  the same with the warm standby (waited for before the kill); a round that restarted cold
     is a failed round;
P14b the standby's resident size when it is ready, beside a trainer's in the same round;
P15  the edit-run loop: a job stopped once its standbys are ready, the same cluster.toml
     launched again, to its first step (in the standbys the first job kept); a round that
     started cold is a failed round;
and where a restart's time goes: the failure seen, the broken group stopped, the next attempt's
agents started (preflight included), then the trainer's own start (activation, the script's
imports, the rendezvous, the restore, the first step).

Writes its rows into docs/bench/results.json (and the tables made from it).

  uv run python -m scripts.benchmarks.warm [--rounds 3]
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.benchmarks.measure import (
    PY,
    bench_lines,
    kill_job_process,
    launch,
    local_config,
    no_kept_standbys,
    orch_env,
    raw_cold_start,
    status_json,
    wait,
)
from scripts.benchmarks.rows import Row, measure_alone

REPO = Path(__file__).resolve().parents[2]

# --- the measurements: a restart, a relaunch ------------------------------------------------


READY = re.compile(r"warm standby ready for a restart: pid (\d+), RSS (\d+) MB")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def kill_and_resume(root: Path, home: Path, warm: bool, extra: str = "") -> dict[str, float]:
    """`extra`: more of cluster.toml after the [restart] section (P14c's [container])."""
    no_kept_standbys()
    # Epochs past the standby_delay and the measurement (which stops the job).
    restart = f"warm_restart = {'true' if warm else 'false'}\n{extra}"
    config = local_config(root, 1000, extra=restart)
    env = orch_env(home)
    out = subprocess.run([PY, "-m", "orchestrator", "launch", "--detach", str(config)],
                         capture_output=True, text=True, env=env, cwd=REPO, check=True)  # fmt: skip
    job_id = out.stdout.split()[1]
    logs = [Path(root / "shared" / job_id / "logs" / f"worker-{i}.log") for i in (0, 1)]

    def ready() -> dict | None:
        job = status_json(home, job_id)["jobs"][0]
        if not all(t["epoch"] >= 3 for t in job["tasks"]):
            return None
        if warm and not all(READY.search(p.read_text()) for p in logs):
            return None
        return job

    job = wait(ready, 240)
    result: dict[str, float] = {}
    if warm:
        standbys = [int(READY.search(p.read_text()).group(1)) for p in logs]  # type: ignore[union-attr]
        result["standby_rss"] = statistics.mean(_rss_mb(p) for p in standbys)
        result["trainer_rss"] = statistics.mean(_rss_mb(t["pid"]) for t in job["tasks"])  # type: ignore[index]
    killed = time.time()
    kill_job_process(job["tasks"][1]["pid"], job_id)  # type: ignore[index]

    def resumed() -> dict | None:
        job = status_json(home, job_id)["jobs"][0]
        ok = all(t["attempt"] == 1 and t["first_step_at"] for t in job["tasks"])
        return job if ok else None

    # Waited out on the logs (each attempt's trainer prints its first step), not by polling
    # `orchestrate status`: a Python start every 0.1 s would take CPU from the restart it times.
    wait(lambda: all(p.read_text().count("BENCH first_step ") >= 2 for p in logs), 240, 0.05)
    job = wait(resumed, 60, 0.5)
    events = {e["kind"]: e["ts"] for e in job["events"]}  # type: ignore[index]
    first = max(
        float(line.split()[2])
        for p in logs
        for line in p.read_text().splitlines()[-400:]
        if line.startswith("BENCH first_step ")
    )
    text = logs[0].read_text()
    result["warm_used"] = float("warm start: the standby" in text)
    subprocess.run([PY, "-m", "orchestrator", "stop", job_id], env=env, cwd=REPO,
                   capture_output=True, check=True)  # fmt: skip
    result.update(
        resumed=first - killed,
        seen=events["failure"] - killed,
        stopped=events["restart"] - events["failure"],
        started=events["launched"] - events["restart"],
        trainer=first - events["launched"],
    )
    return result


def relaunch(root: Path, home: Path) -> dict[str, float]:
    """P15, the edit-run loop: a job trains until its warm standbys are ready and is stopped
    (the user saw what to fix), then the same cluster.toml is launched again: that launch to
    its first training step. `warm_used` 0: it started cold (a failed round)."""
    no_kept_standbys()
    env = orch_env(home)
    config = local_config(root, 1000)  # stopped once its standbys are ready
    out = subprocess.run([PY, "-m", "orchestrator", "launch", "--detach", str(config)],
                         capture_output=True, text=True, env=env, cwd=REPO, check=True)  # fmt: skip
    job_id = out.stdout.split()[1]
    logs = [Path(root / "shared" / job_id / "logs" / f"worker-{i}.log") for i in (0, 1)]
    wait(lambda: all(p.exists() and READY.search(p.read_text()) for p in logs), 240)
    subprocess.run([PY, "-m", "orchestrator", "stop", job_id], env=env, cwd=REPO,
                   capture_output=True, check=True)  # fmt: skip
    t0 = time.time()
    out = launch(local_config(root, 3), home, fresh=False)
    first, _ = bench_lines(out)
    assert first is not None
    return {"first_step": first - t0, "warm_used": float(out.count("warm start: the standby") == 2)}


def relaunch_row() -> Row:
    return Row(
        "P15",
        "relaunch (stop, launch again) -> first step, in the kept standbys",
        "s",
        kind="ratio",
        target_ratio=0.6,
        baseline_label="a cold start: workers started by hand, to their first step",
        target="<= 0.6x a cold start",
    )


def relaunch_rows(root: Path, home: Path, rounds: int, p15: Row) -> None:
    """Rounds of (cold start by hand, relaunch)."""
    for n in range(rounds):
        print(f"relaunches: round {n + 1}/{rounds} ...", flush=True)
        baseline = raw_cold_start(root)
        again = relaunch(root, home)
        if not again["warm_used"]:
            p15.failed_rounds += 1  # it started cold: not a warm relaunch's figure
            continue
        p15.baseline.append(baseline)
        p15.values.append(again["first_step"])


def rows() -> tuple[Row, Row, Row]:
    p5 = Row(
        "P5",
        "trainer SIGKILL -> training resumed",
        "s",
        kind="ratio",
        target_ratio=1.5,
        baseline_label="a cold start: workers started by hand, to their first step",
        target="<= 1.5x a cold start",
    )
    p14 = Row(
        "P14",
        "trainer SIGKILL -> training resumed, warm standby",
        "s",
        kind="ratio",
        target_ratio=0.4,
        baseline_label="a cold start: workers started by hand, to their first step",
        target="<= 0.4x a cold start",
    )
    p14b = Row(
        "P14b",
        "RSS of a warm standby, ready",
        "MB",
        kind="ratio",
        target_ratio=1.0,
        baseline_label="a trainer's RSS, same round",
        target="<= 1.0x a trainer's",
    )
    return p5, p14, p14b


def restart_rows(
    root: Path, home: Path, rounds: int, p5: Row, p14: Row, p14b: Row
) -> list[dict[str, float]]:
    """Rounds of (cold start by hand, cold restart, cold start by hand, warm restart), so each
    restart has a baseline measured just before it. Returns the cold restarts' figures."""
    cold_runs, warm_runs = [], []
    for n in range(rounds):
        print(f"restarts: round {n + 1}/{rounds} ...", flush=True)
        p5.baseline.append(raw_cold_start(root))
        cold = kill_and_resume(root, home, warm=False)
        p5.values.append(cold["resumed"])
        cold_runs.append(cold)
        baseline = raw_cold_start(root)
        warm = kill_and_resume(root, home, warm=True)
        p14b.values.append(warm["standby_rss"])
        p14b.baseline.append(warm["trainer_rss"])
        if not warm["warm_used"]:
            p14.failed_rounds += 1  # it restarted cold: not a warm restart's figure
            continue
        p14.baseline.append(baseline)
        p14.values.append(warm["resumed"])
        warm_runs.append(warm)
    parts = []
    for name, runs in (("cold", cold_runs), ("warm", warm_runs)):
        if runs:
            parts.append(
                f"a {name} restart's time (medians): "
                + ", ".join(
                    f"{key} {statistics.median(r[key] for r in runs):.2f} s"
                    for key in ("seen", "stopped", "started", "trainer")
                )
            )
    p14.note = "; ".join(parts)
    return cold_runs


def main() -> int:
    p5, p14, p14b = rows()
    p15 = relaunch_row()

    def measure(root: Path, rounds: int) -> None:
        (root / "shared").mkdir()
        restart_rows(root, root / "home", rounds, p5, p14, p14b)
        relaunch_rows(root, root / "home", rounds, p15)

    return measure_alone(
        __doc__ or "", "scripts/benchmarks/warm.py", [p5, p14, p14b, p15], measure,
        flag="--rounds", default=3,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
