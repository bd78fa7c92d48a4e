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
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_measure import kill_and_resume, orchestrate_run


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
