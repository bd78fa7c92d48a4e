#!/usr/bin/env python3
"""Warm restarts (issue 15), measured in one run on 2 local workers (the digits MLP):

P2   `launch` to the first training step (a cold start), orchestrated;
P5c  trainer SIGKILLed -> training resumed, warm_restart = false (a new interpreter and a
     TensorFlow import per task);
P5w  the same with the warm standby (waited for before the kill), and where its time goes:
     the failure seen, the broken group stopped, the next attempt's agents started (preflight
     included), then the trainer's own start (activation, the script's imports, the
     rendezvous, the restore, the first step);
RSS  the standby's resident size when it is ready, beside a trainer's.

  uv run python scripts/bench_warm.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_measure import (
    PY,
    REPO,
    local_config,
    orch_env,
    orchestrate_run,
    status_json,
    wait,
)

READY = re.compile(r"warm standby ready for a restart: pid (\d+), RSS (\d+) MB")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def kill_and_resume(root: Path, home: Path, warm: bool) -> dict[str, float]:
    config = local_config(root, 30, extra=f"warm_restart = {'true' if warm else 'false'}")
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
    os.kill(job["tasks"][1]["pid"], signal.SIGKILL)  # type: ignore[index]

    def resumed() -> dict | None:
        job = status_json(home, job_id)["jobs"][0]
        ok = all(t["attempt"] == 1 and t["first_step_at"] for t in job["tasks"])
        return job if ok else None

    job = wait(resumed, 240)
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-warm-") as tmp:
        root = Path(tmp)
        (root / "shared").mkdir()
        home = root / "home"
        p2, cold, warm = [], [], []
        for n in range(args.rounds):  # alternating, so drift hits every variant alike
            print(f"round {n + 1}/{args.rounds} ...", flush=True)
            p2.append(orchestrate_run(root, home, 5)["first_step"])
            cold.append(kill_and_resume(root, home, warm=False))
            warm.append(kill_and_resume(root, home, warm=True))
    med = statistics.median

    def listed(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    p2m = med(p2)
    cold_runs = [r["resumed"] for r in cold]
    warm_runs = [r["resumed"] for r in warm]
    cold_m, warm_m = med(cold_runs), med(warm_runs)
    met = "yes" if warm_m <= 0.5 * p2m else "**no**"
    standby_rss = med(r["standby_rss"] for r in warm)
    trainer_rss = med(r["trainer_rss"] for r in warm)
    print()
    print("| row | what | median (all rounds) | vs P2 cold start | target |")
    print("|---|---|---|---|---|")
    print(f"| P2 | launch -> first step (cold) | {p2m:.2f} s ({listed(p2)}) | 1.00x | |")
    print(f"| P5c | SIGKILL -> resumed, warm_restart = false | {cold_m:.2f} s "
          f"({listed(cold_runs)}) | {cold_m / p2m:.2f}x | |")  # fmt: skip
    print(f"| P5w | SIGKILL -> resumed, warm standby | {warm_m:.2f} s ({listed(warm_runs)}) "
          f"| {warm_m / p2m:.2f}x | <= 0.5x: {met} |")  # fmt: skip
    print(f"| RSS | standby when ready / a trainer | {standby_rss:.0f} MB / "
          f"{trainer_rss:.0f} MB | | |")  # fmt: skip
    print()
    for name, runs in (("cold", cold), ("warm", warm)):
        parts = ", ".join(
            f"{key} {med(r[key] for r in runs):.2f} s"
            for key in ("seen", "stopped", "started", "trainer")
        )
        print(f"where a {name} restart's time goes (medians): {parts}")
    print(f"warm start used in {sum(r['warm_used'] for r in warm):.0f} of {len(warm)} warm runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
