#!/usr/bin/env python3
"""P12/P13: the Slurm backend on the Slurm test bed (tests/beds/slurm.py: slurmctld here, three
slurmd in network namespaces), real TensorFlow, the plain `fit` script of P9 (it imports nothing
of orchestrate). Needs root, slurm-wlm and munge.

P12: a trainer SIGKILLed (once every task's standby is ready) -> training resumed, a new srun
     step in the same allocation whose agents start the standbys, against
     a cold start of the same job through sbatch (`orchestrate launch`: submit, allocation,
     step, TensorFlow, rendezvous), in the same run. Both to every task's first training step.
P13: that cold start (`orchestrate launch` to the end of every task's first epoch) against the
     same script submitted by hand: `sbatch` of an `srun` whose tasks build TF_CONFIG from
     Slurm's variables themselves, with a fixed port.

    sudo uv run python -m scripts.benchmarks.slurm [--repeat N]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchmarks import measure
from scripts.benchmarks.measure import epochs_logged, kill_job_process, wait, wait_epochs_past
from scripts.benchmarks.rows import Row, measure_alone
from tests.beds import slurm as slurmbed

REPO = Path(__file__).resolve().parents[2]

PY = sys.executable
PLAIN = REPO / "tests" / "fixtures" / "plain_fit.py"
EPOCHS = 400  # far more than a measurement lasts: every run is ended on purpose
RAW_PORT = 23457
# The hand-written task of P13: TF_CONFIG from Slurm's own variables, then the plain script.
RAW_TASK = """
import json, os, subprocess, sys
nodes = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                       capture_output=True, text=True, check=True).stdout.split()
cluster = {"worker": [f"{n}:PORT" for n in nodes]}
os.environ["TF_CONFIG"] = json.dumps(
    {"cluster": cluster, "task": {"type": "worker", "index": int(os.environ["SLURM_PROCID"])}})
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def orchestrate(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "orchestrator", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300, check=False)  # fmt: skip


def job_json(env: dict[str, str], job: str) -> dict:
    return json.loads(orchestrate(env, "status", job, "--json").stdout)["jobs"][0]


def job_toml(bed: slurmbed.SlurmBed, root: Path, name: str) -> Path:
    shared = root / f"shared-{name}"
    shared.mkdir()
    path = root / f"{name}.toml"
    path.write_text(
        f"""
[job]
name = "{name}"
shared_dir = "{shared}"

[entrypoint]
script = "{PLAIN}"
args = ["--bench", "--epochs", "{EPOCHS}", "--backup-dir", "{shared}/backup"]
env = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}
workdir = "{REPO}"

[backend]
type = "slurm"
partition = "{bed.partition}"
nodes = 3
python = "{PY}"

[restart]
backoff = 0.2
{measure.RESTART_EXTRA}
"""
    )
    return path


def orchestrated(
    bed: slurmbed.SlurmBed, root: Path, env: dict[str, str], n: int
) -> tuple[float, float, float]:
    """One job: launch -> every task's first step (cold), launch -> every task's first epoch
    done (cold, to compare with P13's hand-made job), then a trainer SIGKILLed at epoch 2 ->
    every task's first step of the next attempt (restart)."""
    path = job_toml(bed, root, f"bench{n}")
    started = time.time()
    out = orchestrate(env, "launch", "--detach", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split()[1]
    logs = [root / f"shared-bench{n}" / job_id / "logs" / f"worker-{i}.log" for i in range(3)]
    try:

        def first_steps(attempt: int) -> list[float] | None:
            tasks = job_json(env, job_id)["tasks"]
            done = [
                t["first_step_at"] for t in tasks if t["attempt"] == attempt and t["first_step_at"]
            ]
            return done if len(done) == 3 else None

        # The measured windows are waited out on the logs alone: an `orchestrate status` every
        # 0.1 s is a Python start each time, CPU taken from the trainers it times (the by-hand
        # side is waited out on its logs too). The supervisor records each first step as it
        # sees it, so reading them afterwards gives the same times.
        wait(lambda: all(epochs_logged(log) >= 1 for log in logs), 240, 0.05)
        cold_epoch = time.time() - started
        cold = max(wait(lambda: first_steps(0), 60, 0.5)) - started  # type: ignore[arg-type]
        wait(lambda: all(epochs_logged(log) >= 2 for log in logs), 240, 0.2)
        # A restart as it comes in a run of some length: each task's keeper (the job's keeper
        # step) holds a standby that has imported TensorFlow.
        wait(lambda: all("warm standby ready" in log.read_text() for log in logs), 240, 0.2)
        victim = next(t for t in job_json(env, job_id)["tasks"] if t["index"] == 1)
        before = [epochs_logged(log) for log in logs]
        killed = time.time()
        kill_job_process(victim["pid"], job_id)
        wait_epochs_past(logs, before)
        restart = max(wait(lambda: first_steps(1), 60, 0.5)) - killed  # type: ignore[arg-type]
        return cold, cold_epoch, restart
    finally:
        orchestrate(env, "stop", job_id)


def raw(bed: slurmbed.SlurmBed, root: Path, env: dict[str, str], n: int) -> float:
    """The same script submitted by hand: sbatch -> every task's first epoch done."""
    run_dir = root / f"raw{n}"
    run_dir.mkdir()
    task = run_dir / "task.py"
    task.write_text(RAW_TASK.replace("PORT", str(RAW_PORT)))
    logs = [run_dir / f"w{i}.log" for i in range(3)]
    line = (
        f"TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 srun --output={run_dir}/w%t.log "
        f"{PY} {task} {PLAIN} --bench --epochs {EPOCHS} --backup-dir {run_dir}/backup"
    )
    started = time.time()
    out = subprocess.run(
        ["sbatch", "--parsable", "-N3", "--ntasks-per-node=1", f"--chdir={run_dir}",
         f"--output={run_dir}/batch.out", "--wrap", line],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    slurm_job = out.stdout.strip().split(";")[0]
    try:
        wait(lambda: all(epochs_logged(log) >= 1 for log in logs), 240, 0.05)
        return time.time() - started
    finally:
        subprocess.run(["scancel", slurm_job], env=env, capture_output=True)

        def gone() -> bool:
            out = subprocess.run(
                ["squeue", "-h", "-j", slurm_job], env=env, capture_output=True, text=True
            )
            return not out.stdout.strip()

        wait(gone, 60, 0.2)


def slurm_rows(root: Path, repeat: int, p12: Row, p13: Row) -> None:
    reason = slurmbed.missing_requirements()
    if reason:
        p12.skipped = p13.skipped = f"no Slurm test bed: {reason}"
        return
    bed_root = Path(tempfile.mkdtemp(prefix="orch-bench-slurmbed-", dir="/tmp"))
    try:
        bed = slurmbed.up(3, bed_root)
        env = {**os.environ, "SLURM_CONF": bed.slurm_conf, "ORCHESTRATE_HOME": str(root / "home")}
        for n in range(repeat):
            p13.baseline.append(raw(bed, root, env, n))
            cold, cold_epoch, restart = orchestrated(bed, root, env, n)
            p12.baseline.append(cold)
            p12.values.append(restart)
            p13.values.append(cold_epoch)
        p12.note = "3 Slurm nodes, plain fit script; rounds (restart/cold): " + ", ".join(
            f"{a:.1f}/{b:.1f}" for a, b in zip(p12.values, p12.baseline, strict=True)
        )
        p13.note = "rounds (ours/by hand): " + ", ".join(
            f"{a:.1f}/{b:.1f}" for a, b in zip(p13.values, p13.baseline, strict=True)
        )
    finally:
        slurmbed.down(bed_root)
        shutil.rmtree(bed_root, ignore_errors=True)


def rows() -> tuple[Row, Row]:
    p12 = Row(
        "P12",
        "Slurm: trainer SIGKILLed -> resumed warm, a new step in the allocation",
        "s",
        kind="ratio",
        target_ratio=0.5,
        paired=True,  # each round's restart against that round's cold start
        baseline_label="a cold start through sbatch (`launch` to first steps)",
        target="<= 0.5x the cold start",
    )
    p13 = Row(
        "P13",
        "Slurm: `launch` to every task's first epoch done",
        "s",
        kind="ratio",
        target_ratio=1.1,
        paired=True,
        baseline_label="sbatch + srun by hand, TF_CONFIG from Slurm's variables",
        target="<= 1.1x by hand",
    )
    return p12, p13


def main() -> int:
    p12, p13 = rows()
    return measure_alone(
        __doc__ or "", "scripts/benchmarks/slurm.py", [p12, p13],
        lambda tmp, repeat: slurm_rows(tmp, repeat, p12, p13),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
