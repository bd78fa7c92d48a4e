"""orchestrate's benchmark suite: each figure next to a raw baseline measured in the same run.

    uv run python -m scripts.bench            # the full suite (about 10 minutes on 2 cores)
    uv run python -m scripts.bench --quick    # a smoke run: every row, fewer repeats and hosts

Writes docs/bench/results.json, docs/bench/results.png and docs/bench/results.md (the table the
README shows) unless --out says otherwise. The SSH rows (P1, and the supervisor's RSS in P7) need
root for the namespaced test bed; without it they are reported as skipped, with the reason.

| id | measurement | baseline |
|----|-------------|----------|
| P1 | launch fan-out to every agent running, 1/4/16 SSH hosts | threads + paramiko, 1 exec/host |
| P2 | `launch` to the first training step, 2 local workers | workers started by hand |
| P2c | the same with the trainers in a podman image | the image started by hand |
| P3 | steady training throughput (middle epochs) | the same hand-started workers |
| P3c | CPU of our processes beside the trainers, standbys ready | the trainers' own CPU |
| P4 | trainer SIGKILLed -> supervisor begins stopping | TensorFlow's own: the survivor exits |
| P5 | trainer SIGKILLed -> training resumed | a hand-started cold start, same round |
| P6 | `orchestrate status`, 20 jobs x 16 tasks in the store | - |
| P7 | peak RSS: one agent; the supervisor of 16 SSH hosts | the trainer's own peak RSS |
| P8 | `launch --dry-run` of a 1,000-host cluster.toml | - |
| P9 | plain `fit` script: steady throughput via the bootstrap | the same, `instrument = false` |
| P9b | the same cost in one process: fit calls alternating | fit without our callbacks |
| P10 | a host's link down -> group stopping, 3 SSH hosts | TensorFlow's own: a survivor exits |
| P11 | a host's link down -> training resumed on a spare | the same TensorFlow failure time |
| P12 | Slurm: trainer SIGKILLed -> resumed warm, a new step of the allocation | cold sbatch |
| P13 | Slurm: `launch` to every task's first epoch done | sbatch + srun by hand |
| P14 | trainer SIGKILLed -> training resumed, in the warm standby | a hand-started cold start |
| P14b | RSS of a warm standby when ready | a trainer's RSS, same round |
| P14c | the P14 restart, trainers and standbys in a podman image | the image started by hand |
| P15 | relaunch (stop, launch again) -> first step, kept standbys | a hand-started cold start |

Every ratio is the median of per-round ratios, each round measuring its baseline and its value
back to back; every target is fixed in the code before the run (scripts/benchmarks/suite.py,
and each row's own script).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchmarks.rows import REPO, compile_checkout, run_meta, write_results
from scripts.benchmarks.suite import run_suite


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="one repeat, fewer hosts and epochs")
    parser.add_argument("--out", type=Path, help="default: docs/bench (--quick: a temp dir)")
    args = parser.parse_args()
    compile_checkout()
    if args.out is None:
        committed = REPO / "docs" / "bench"
        args.out = Path(tempfile.mkdtemp(prefix="orch-bench-quick-")) if args.quick else committed
    # SIGTERM unwinds like Ctrl-C: every test bed and trainer is torn down on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.time()
    rows = run_suite(args.quick)
    command = "scripts/bench.py" + (" --quick" if args.quick else "")
    meta = run_meta(command, started, args.quick)
    # A full run replaces every row and the README's table; a quick one writes where it is told.
    if not args.quick and args.out == REPO / "docs" / "bench":
        (args.out / "results.json").unlink(missing_ok=True)
    readme = REPO / "README.md" if args.out == REPO / "docs" / "bench" else None
    table = write_results(args.out, rows, meta, readme)
    print(table)
    print(f"\nwrote {args.out}/results.json, results.md, results.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
