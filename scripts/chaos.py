"""A chaos soak: real jobs (the plain `fit` script, real TensorFlow), faults injected from a
schedule drawn from a seed, some overlapping, invariants checked after every fault and at the
end of each job.

    python -m scripts.chaos --backend local --faults 10 --seed 7 --json chaos.json
    sudo python -m scripts.chaos --backend ssh --faults 100     # the namespaced SSH hosts
    sudo python -m scripts.chaos --backend slurm --faults 50    # a real slurmctld/slurmd
    python -m scripts.chaos --quick            # 8 faults, the seed drawn from the date

Each job runs until it has met `--per-job` faults, then is stopped; a new job starts until
`--faults` faults were injected. One line per fault; the last line is
`chaos: N faults, M recovered, K violations (seed S)`, and the exit status is 0 only when K is 0.
A violation is recorded with the seed and the schedule so far, to be replayed with the same
`--backend --faults --per-job --seed`.

Fault kinds (scripts/soak/beds.py): on every backend a trainer or an agent SIGKILLed, a trainer
SIGSTOPped past progress_timeout (a hang), a trainer SIGTERMed (a preemption), the supervisor
SIGKILLed then `attach`ed, the supervisor SIGSTOPped for 1-4 s (a stall), `stop` then `resume`,
`attach` while the supervisor lives; a quarter of the kills have a second trainer kill 0.2-2 s
later. SSH bed: a host's link down for 2 s, about host_timeout, and past host_wait (the spare
takes over, or the job fails naming the host and is resumed); a host's sshd killed and
restarted; a host rebooted (every process in it killed, sshd back after 2 s). Slurm bed: a
preemption by a job in the urgent partition. With `--webhook` (on in `--quick`) every job's
`[notify]` webhook misbehaves on each event's first try (scripts/soak/webhook.py), and every
event must still arrive.
Invariants (scripts/soak/checks.py): see docs/faults.md, "Chaos soak".

Before the faults, the run measures what its recoveries are compared with: a cold start, two
workers of the benchmark's trainer started by hand with TF_CONFIG to their first step, on this
machine (`cold_start_s` in --json, the median of three; one in --quick).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from scripts.benchmarks.measure import raw_cold_start
from scripts.soak.beds import open_bed
from scripts.soak.checks import Cli, Fault
from scripts.soak.jobs import run_job
from scripts.soak.webhook import MisbehavingWebhook


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.chaos", description=__doc__)
    parser.add_argument("--backend", default="local", choices=["local", "ssh", "slurm"])
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--per-job", type=int, default=5)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--kinds", help="only these fault kinds, comma-separated (a replay)")
    parser.add_argument("--webhook", action="store_true",
                        help="a [notify] webhook that misbehaves (on in --quick)")  # fmt: skip
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(datetime.date.today().strftime("%Y%m%d"))
    if args.quick:
        args.backend, args.faults, args.per_job, args.webhook = "local", 8, 4, True
    rng = random.Random(seed)
    print(f"chaos: seed {seed}, {args.faults} faults on the {args.backend} backend", flush=True)
    faults: list[Fault] = []
    problems: list[str] = []
    started = time.time()
    cold: float | None = None
    bed = open_bed(args.backend)
    webhook = MisbehavingWebhook() if args.webhook else None
    try:
        # Not under a private tmp: the hosts' and nodes' processes write the truth files.
        with tempfile.TemporaryDirectory(prefix="chaos-", dir="/tmp") as tmp:
            root = Path(tmp)
            os.chmod(root, 0o755)
            cli = Cli(root / "home", bed.env())
            cold = statistics.median(raw_cold_start(root) for _ in range(1 if args.quick else 3))
            print(f"chaos: a cold start by hand takes {cold:.2f} s here", flush=True)
            bed.prepare(root / "shared")
            if args.kinds:
                bed.kinds = tuple(k for k in bed.kinds if k in args.kinds.split(","))
            try:
                empty = 0  # jobs in a row that met no fault
                while len(faults) < args.faults and empty < 3:
                    n = min(args.per_job, args.faults - len(faults))
                    before = len(faults)
                    problems += run_job(bed, cli, root, rng, n, faults, webhook)
                    empty = empty + 1 if len(faults) == before else 0
            finally:
                bed.unprepare(root / "shared")
    finally:
        bed.close()
        if webhook is not None:
            webhook.close()
    violations = problems + [
        f"fault {i + 1}: {v}" for i, f in enumerate(faults) for v in f.violations
    ]
    recovered = sum(1 for f in faults if not f.violations)
    for line in problems:
        print(f"violation: {line}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "seed": seed, "backend": args.backend, "per_job": args.per_job,
            "seconds": round(time.time() - started), "cold_start_s": cold and round(cold, 3),
            "faults": [asdict(f) for f in faults],
            "violations": violations,
        }, indent=2))  # fmt: skip
    print(f"chaos: {len(faults)} faults, {recovered} recovered, {len(violations)} violations "
          f"(seed {seed})")  # fmt: skip
    sys.exit(0 if not violations else 1)


if __name__ == "__main__":
    main()
