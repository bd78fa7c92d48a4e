#!/usr/bin/env python3
"""Where P3's throughput goes: the steady steps/s of P3's training (scripts/benchmarks/trainer.py,
2 local MWMS workers) started by hand, under `orchestrate launch` with every default on, and
with each default that runs beside training turned off in turn, all interleaved in each round.

    uv run python -m scripts.benchmarks.overhead [--rounds 4] [--epochs 12] [--out FILE.json]

Then one run with every default on, its processes' CPU over 8 s of steady training: the
trainers against everything of ours beside them (agents, keepers, standbys, the supervisor).
On a 2-core host every CPU-second of ours is one the trainers could have used.

Variants: `defaults`; `no-sampling` ([supervision] sample_resources = false); `no-standby`
([restart] warm_restart = false); `no-instrument` ([entrypoint] instrument = false: no
bootstrap, so no standby either); `all-off`. Each round runs the hand-started baseline and every
variant back to back in a shuffled order; each variant's ratio is the median of its per-round
ratios to that round's baseline, with their spread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchmarks import measure
from scripts.benchmarks.measure import (
    PY,
    REPO,
    TRAINER,
    epoch_rates,
    launch,
    middle_rate,
    no_kept_standbys,
    orch_env,
    raw_run,
    status_json,
    wait,
)

TICKS = os.sysconf("SC_CLK_TCK")


VARIANTS = {
    "defaults": {},
    "no-sampling": {"supervision": "sample_resources = false"},
    "no-standby": {"restart": "warm_restart = false"},
    "no-instrument": {"entrypoint": "instrument = false"},
    "all-off": {
        "supervision": "sample_resources = false",
        "restart": "warm_restart = false",
        "entrypoint": "instrument = false",
    },
}


def config(root: Path, name: str, epochs: int) -> Path:
    changes = VARIANTS[name]
    path = root / f"overhead-{name}.toml"
    path.write_text(
        f"""
[job]
name = "overhead-{name}"
shared_dir = "{root / "shared"}"

[entrypoint]
script = "{TRAINER}"
args = ["--epochs", "{epochs}"]
env = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}
workdir = "{REPO}"
{changes.get("entrypoint", "")}

[backend]
type = "local"
workers = 2

[supervision]
{changes.get("supervision", "")}

[restart]
backoff = 0.0
{measure.RESTART_EXTRA}
{changes.get("restart", "")}
"""
    )
    return path


def _kind(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    if "--standby" in cmdline:
        return "standby"
    if "standby.py" in text:
        return "keeper"
    if "bootstrap.py" in text:
        return "trainer"
    if "/worker agent" in text:
        return "agent"
    if "supervise" in cmdline:
        return "supervisor"
    return "other"


def _job_cpu(job: str) -> dict[int, tuple[str, float]]:
    """Each process of the job (by its id in the environment or command line, or named by a
    keeper serving it: its standby and warm trainer carry no job id): kind, CPU s."""
    from worker.warm.registry import entries

    named = {p for e in entries() if e.job == job for p in (e.pid, e.standby, e.trainer) if p}
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ours = f"ORCHESTRATE_JOB_ID={job}".encode() in environ or job in cmdline
        if not ours and int(entry.name) not in named:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        found[int(entry.name)] = (_kind(cmdline), (int(fields[11]) + int(fields[12])) / TICKS)
    return found


def _window(job: str, home: Path, seconds: float) -> dict[str, float]:
    """Each kind's CPU (cores) over `seconds` of the attempt that trains at the start, and the
    trainers' steps/s ("steps_per_s", their mean): the trainers are the pids the job's status
    names (a warm trainer's command line is a standby's)."""
    trainers, steps = _running_trainers(job, home)
    before, t0 = _job_cpu(job), time.monotonic()
    time.sleep(seconds)
    after, elapsed = _job_cpu(job), time.monotonic() - t0
    trainers_after, steps_after = _running_trainers(job, home)
    if trainers_after != trainers:
        raise RuntimeError(f"job {job}: its trainers changed or ended during the window")
    shares: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        kind = "trainer" if pid in trainers else kind
        shares[kind] = shares.get(kind, 0.0) + (cpu - before.get(pid, (kind, 0.0))[1]) / elapsed
    shares = {kind: round(share, 4) for kind, share in sorted(shares.items())}
    return {**shares, "steps_per_s": round((steps_after - steps) / elapsed, 1)}


def _running_trainers(job: str, home: Path) -> tuple[set[int], float]:
    """The job's trainers, and their mean step count."""
    tasks = status_json(home, job)["jobs"][0]["tasks"]
    if not all(t["state"] == "running" and t["pid"] for t in tasks):
        raise RuntimeError(f"job {job}: not every task is training")
    return {t["pid"] for t in tasks}, statistics.mean(t["step"] or 0 for t in tasks)


def _standbys(job: str) -> list[bool]:
    """Whether each standby its keepers hold for the job is ready."""
    from worker.warm.registry import entries

    return [e.standby_ready for e in entries() if e.job == job and e.standby]


def cpu_shares(root: Path, home: Path, epochs: int, seconds: float = 8.0) -> dict[str, dict]:
    """CPU seconds per second of wall time, by kind of process, and the trainers' steps/s, in
    three windows of a job with every default on: steady training before the standbys (epoch
    3 on), while both standbys import TensorFlow (once the trainers have trained
    [restart] standby_delay), and once both are ready."""
    no_kept_standbys()
    out = subprocess.run(
        [PY, "-m", "orchestrator", "launch", "--detach", str(config(root, "defaults", epochs))],
        capture_output=True, text=True, env=orch_env(home), cwd=REPO, check=True,
    )  # fmt: skip
    job = out.stdout.split("job ", 1)[1].split()[0].rstrip(":")

    def trained(n: int) -> bool:
        tasks = status_json(home, job)["jobs"][0]["tasks"]
        return all((t.get("epoch") or 0) >= n for t in tasks)

    wait(lambda: trained(3), 300, 0.5)
    try:
        if _standbys(job):
            raise RuntimeError(f"job {job}: a standby started before standby_delay")
        training = _window(job, home, seconds)
        # Both standbys begun. Their imports are measured while one still runs: with the page
        # cache warm an import can end within the training window (then there is none).
        wait(lambda: len(_standbys(job)) == 2, 300, 0.1)
        importing = _window(job, home, seconds) if not all(_standbys(job)) else {}
        wait(lambda: _standbys(job) == [True, True], 300, 0.5)
        steady = _window(job, home, seconds)
    finally:
        subprocess.run([PY, "-m", "orchestrator", "stop", job], capture_output=True,
                       env=orch_env(home), cwd=REPO, check=False)  # fmt: skip
    return {"training": training, "standbys_importing": importing, "standbys_ready": steady}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "overhead.json")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="orch-overhead-"))
    home = root / "home"
    rounds: list[dict[str, float]] = []
    order = ["raw", *VARIANTS]
    for n in range(args.rounds):
        random.Random(n).shuffle(order)
        measured: dict[str, float] = {}
        for name in order:
            if name == "raw":
                measured[name] = raw_run(root, args.epochs)["throughput"]
            else:
                out = launch(config(root, name, args.epochs), home)
                measured[name] = middle_rate(epoch_rates(out), args.epochs)
        rounds.append(measured)
        print(f"round {n + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in measured.items()),
              flush=True)  # fmt: skip
    summary: dict[str, dict] = {}
    for name in VARIANTS if rounds else ():
        ratios = [r[name] / r["raw"] for r in rounds]
        summary[name] = {
            "steps_per_s": round(statistics.median(r[name] for r in rounds), 1),
            "ratio": round(statistics.median(ratios), 3),
            "spread": [round(min(ratios), 3), round(max(ratios), 3)],
        }
    raw = statistics.median(r["raw"] for r in rounds) if rounds else 0.0
    if rounds:
        print(f"\nhand-started: {raw:.1f} steps/s (median of {len(rounds)} rounds)")
    for name, row in summary.items():
        low, high = row["spread"]
        print(f"{name:14} {row['steps_per_s']:7.1f} steps/s  {row['ratio']:.3f}x "
              f"({low:.2f}-{high:.2f})")  # fmt: skip
    shares = cpu_shares(root, home, 1000)
    print("\nCPU in steady training (cores busy), every default on:")
    for window, busy in shares.items():
        ours = sum(v for k, v in busy.items() if k not in ("trainer", "steps_per_s"))
        print(f"  {window:20} " + ", ".join(f"{k} {v:.3f}" for k, v in busy.items())
              + f"; ours beside the trainers {ours:.3f}")  # fmt: skip
    result = {"raw_steps_per_s": round(raw, 1), "variants": summary, "rounds": rounds,
              "cpu_cores_busy": shares}  # fmt: skip
    if not rounds and args.out.exists():  # --rounds 0: the CPU shares, added to the last run
        result = {**json.loads(args.out.read_text()), "cpu_cores_busy": shares}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
