#!/usr/bin/env python3
"""What sampling resources and timing waits (issue: at most 1 % of steady throughput) costs,
each figure next to a baseline measured in the same run:

    uv run python -m scripts.benchmarks.sampling [--rounds 8] [--pairs 3] [--out FILE.json]

- S1, the trainer's side: two MWMS workers (two processes, TF_CONFIG on loopback) alternate
  fit calls traced without and with the wait clock (timestamps around every collective and
  every batch's input, worker/wait_clock.py). Same processes, same warm state; this machine
  flips between a fast and a slow mode from one fit call to the next, so each variant's best
  round is compared (as P9b of scripts/bench.py).
- S2, the agent's side: one sample (worker/resources.py: /proc of the trainer and each of its
  threads, the host, TensorBoard's record) of a live worker of S1, timed in CPU; its share of
  one core at a 1 s heartbeat, against the trainer's own CPU.
- S3, the whole: the plain fit script of P9 under `orchestrate launch`, 2 local workers,
  `supervision.sample_resources` true and false, alternating; steady steps/s (middle epochs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

from scripts.benchmarks.measure import BENCH_AB, PY, REPO, free_ports, plain_run
from worker.resources import ResourceSampler, tensorboard_scalars
from worker.spec import Progress
from worker.tb_events import EventWriter

OFF = "[supervision]\nsample_resources = false"


def wait_clock_ab(root: Path, rounds: int) -> tuple[list[tuple[float, float]], dict, dict]:
    """S1 and S2: the workers' (without, with) steps/s per round, worker 0's wait clock at the
    end, and S2's figures (sampled while they ran)."""
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for index in range(2):
        env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
               "TF_CONFIG": json.dumps({"cluster": cluster,
                                        "task": {"type": "worker", "index": index}})}  # fmt: skip
        procs.append(subprocess.Popen(
            [PY, str(BENCH_AB), "--backup-dir", str(root), "--waits", str(rounds)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO,
        ))  # fmt: skip
    agent_cost: dict = {}
    sampler_thread = threading.Thread(target=_sample_costs, args=(procs[0].pid, root, agent_cost))
    sampler_thread.start()
    try:
        outputs = [p.communicate(timeout=1200)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
        agent_cost["stop"] = True
        sampler_thread.join()
    pairs, clock = [], {}
    for line in outputs[0].splitlines():
        if line.startswith("BENCH ab "):
            without, with_clock = map(float, line.split()[2:4])
            pairs.append((without, with_clock))
        elif line.startswith("BENCH clock "):
            clock = json.loads(line.removeprefix("BENCH clock "))
    return pairs, clock, agent_cost


def _sample_costs(pid: int, root: Path, out: dict) -> None:
    """Samples `pid` once a second as its agent does, timing each sample's CPU here."""
    sampler, writer = ResourceSampler(), EventWriter(root / "tensorboard" / "resources")
    costs, trainer_cpu, threads = [], [], []
    time.sleep(15)  # past TensorFlow's import: its thread pools are up
    while not out.get("stop"):
        started = time.thread_time()
        sample = sampler.sample(pid, Progress())
        writer.scalars(len(costs), tensorboard_scalars(sample))
        costs.append(time.thread_time() - started)
        if sample.cpu_percent is not None:
            trainer_cpu.append(sample.cpu_percent)
        try:
            threads.append(len(os.listdir(f"/proc/{pid}/task")))
        except OSError:
            break
        time.sleep(1.0)
    out.update(
        samples=len(costs),
        ms_per_sample=round(statistics.median(costs) * 1000, 3) if costs else None,
        trainer_threads=max(threads) if threads else None,
        trainer_cpu_percent=round(statistics.median(trainer_cpu), 1) if trainer_cpu else None,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="S1 rounds (pairs of fit calls)")
    parser.add_argument("--pairs", type=int, default=3, help="S3 pairs of whole jobs")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "sampling.json")
    args = parser.parse_args()
    import tempfile

    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="orch-sampling-") as tmp:
        root = Path(tmp)
        (root / "shared").mkdir()
        print(f"S1/S2: two workers, {args.rounds} rounds of fit calls without / with the wait "
              "clock ...", flush=True)  # fmt: skip
        pairs, clock, agent = wait_clock_ab(root, args.rounds)
        best_without, best_with = max(a for a, _ in pairs), max(b for _, b in pairs)
        results["S1"] = {
            "rounds": pairs,
            "best_without": best_without,
            "best_with": best_with,
            "ratio": round(best_with / best_without, 4),
            "wait_clock_at_end": clock,
        }
        per_second = agent["ms_per_sample"] / 1000 if agent.get("ms_per_sample") else None
        results["S2"] = {
            **{k: v for k, v in agent.items() if k != "stop"},
            "core_percent_at_1s_heartbeat": None if per_second is None else per_second * 100,
            "of_trainer_cpu": None
            if per_second is None or not agent.get("trainer_cpu_percent")
            else per_second * 100 / agent["trainer_cpu_percent"],
        }
        print(f"S3: {args.pairs} pairs of whole jobs, sample_resources true / false ...",
              flush=True)  # fmt: skip
        home = root / "home"
        jobs = []
        for _ in range(args.pairs):
            off = plain_run(root, home, args.epochs, True, OFF)
            on = plain_run(root, home, args.epochs, True)
            jobs.append((off, on))
        results["S3"] = {
            "pairs": jobs,
            "median_pair_ratio": round(statistics.median(b / a for a, b in jobs), 4),
        }
    s1, s2, s3 = results["S1"], results["S2"], results["S3"]
    print()
    print(
        f"S1 wait clock, in the trainer: best {s1['best_with']:.0f} steps/s against "
        f"{s1['best_without']:.0f} without: {s1['ratio']:.3f}x "
        f"(collectives timed: {s1['wait_clock_at_end'].get('collective_seconds', 0):.1f} s)"
    )
    print(
        f"S2 one sample of a {s2['trainer_threads']}-thread trainer: {s2['ms_per_sample']} ms "
        f"of CPU, {s2['core_percent_at_1s_heartbeat']:.3f} % of a core at 1 s; "
        f"{s2['of_trainer_cpu']:.4f}x the trainer's own CPU ({s2['trainer_cpu_percent']} %)"
    )
    print(
        f"S3 whole job, sampling on / off: {s3['median_pair_ratio']:.3f}x (median of pair "
        "ratios; pairs " + ", ".join(f"{b:.0f}/{a:.0f}" for a, b in s3["pairs"]) + ")"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
