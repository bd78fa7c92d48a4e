"""The GPU check, for a machine with NVIDIA GPUs: the example's kind of job on the local
backend with `gpus_per_task`, and the same script started by hand, side by side.

    python -m scripts.gpu_check [--workers 2] [--epochs 3]

Prints, per task: CUDA_VISIBLE_DEVICES, the GPUs TensorFlow sees, the NVML samples in
`orchestrate status --json`; then the first-step time and steps/s of the job against the same
script started by hand with TF_CONFIG and CUDA_VISIBLE_DEVICES set (the raw baseline). Exits 2
(saying so) on a machine without an NVIDIA GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchmarks.measure import free_ports

REPO = Path(__file__).resolve().parents[1]

# A plain MWMS Keras script (imports nothing of orchestrate's): says what it sees, times its
# first step and its steady steps/s.
TRAIN = """
import json, os, sys, time
started = time.perf_counter()
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

strategy = tf.distribute.MultiWorkerMirroredStrategy()
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
seen = [d.name for d in tf.config.list_physical_devices("GPU")]
x, y = load_digits(return_X_y=True)
x = np.repeat((x / 16.0).astype("float32"), 20, axis=0)
y = np.repeat(y, 20)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((64,)), tf.keras.layers.Dense(1024, "relu"),
                                 tf.keras.layers.Dense(1024, "relu"), tf.keras.layers.Dense(10)])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Clock(tf.keras.callbacks.Callback):
    first = None
    marks = []

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self.first is None:
            self.first = now - started
        self.marks.append(now)


clock = Clock()
model.fit(x, y, batch_size=256 * strategy.num_replicas_in_sync, epochs=int(sys.argv[1]),
          callbacks=[clock], verbose=0)
steady = clock.marks[len(clock.marks) // 5:]
rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
print("gpu_check " + json.dumps({"task": index, "cuda_visible_devices":
      os.environ.get("CUDA_VISIBLE_DEVICES"), "tensorflow_gpus": seen,
      "first_step_s": round(clock.first, 2), "steps_per_s": round(rate, 1)}), flush=True)
"""


def gpus() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return [ln for ln in out.stdout.splitlines() if ln.startswith("GPU ")]


def reports(text: str) -> list[dict]:
    return sorted((json.loads(ln.split("gpu_check ", 1)[1]) for ln in text.splitlines()
                   if "gpu_check {" in ln), key=lambda r: r["task"])  # fmt: skip


def by_hand(script: Path, workers: int, per_task: int, epochs: int) -> tuple[list[dict], float]:
    """The raw baseline: each worker started by hand with TF_CONFIG and its GPUs."""
    ports = free_ports(workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    started = time.perf_counter()
    procs = []
    for i in range(workers):
        task = {"cluster": cluster, "task": {"type": "worker", "index": i}}
        mine = ",".join(str(i * per_task + g) for g in range(per_task))
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": json.dumps(task),
               "CUDA_VISIBLE_DEVICES": mine}  # fmt: skip
        argv = [sys.executable, str(script), str(epochs)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    out = "".join(p.communicate(timeout=1800)[0] for p in procs)
    return reports(out), time.perf_counter() - started


def orchestrated(root: Path, script: Path, workers: int, per_task: int, epochs: int
                 ) -> tuple[list[dict], list[dict], float]:  # fmt: skip
    """The same script under `orchestrate launch`, its NVML samples read from status --json."""
    config = root / "cluster.toml"
    config.write_text(f"""
[job]
name = "gpu-check"
shared_dir = "{root / "shared"}"

[entrypoint]
script = "{script}"
args = ["{epochs}"]
env = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}

[backend]
type = "local"
workers = {workers}
gpus_per_task = {per_task}
""")
    env = {**os.environ, "ORCHESTRATE_HOME": str(root / "home")}
    cli = [sys.executable, "-m", "orchestrator"]
    started = time.perf_counter()
    argv = [*cli, "launch", "--plain", str(config)]
    log = open(root / "launch.out", "w+")  # noqa: SIM115 - read back below; a pipe could fill
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    samples: list[dict] = []
    while proc.poll() is None:
        time.sleep(2)
        status = subprocess.run([*cli, "status", "--json"], env=env, cwd=REPO,
                                capture_output=True, text=True, check=False)  # fmt: skip
        if status.returncode == 0 and status.stdout.strip():
            for job in json.loads(status.stdout)["jobs"][:1]:
                samples += [{"task": t["index"], "gpus": t["resources"]["gpus"]}
                            for t in job["tasks"] if t.get("resources")]  # fmt: skip
    wall = time.perf_counter() - started
    log.seek(0)
    out = log.read()
    log.close()
    if proc.returncode != 0:
        sys.exit(f"gpu_check: the job failed (exit {proc.returncode}):\n{out[-3000:]}")
    return reports(out), samples, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    found = gpus()
    if not found:
        print("gpu_check: no NVIDIA GPU here (nvidia-smi lists none): nothing to check")
        sys.exit(2)
    per_task = max(1, len(found) // args.workers)
    workers = min(args.workers, len(found))
    print(f"gpu_check: {len(found)} GPU(s); {workers} worker(s), {per_task} GPU(s) each")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        root = Path(tmp)
        script = root / "train.py"
        script.write_text(TRAIN)
        ours, samples, wall = orchestrated(root, script, workers, per_task, args.epochs)
        raw, raw_wall = by_hand(script, workers, per_task, args.epochs)
    for r in ours:
        mine = [s for s in samples if s["task"] == r["task"]]
        print(f"worker-{r['task']}: CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']} "
              f"TensorFlow sees {r['tensorflow_gpus']}; {len(mine)} NVML sample(s), last: "
              f"{mine[-1]['gpus'] if mine else 'none'}")  # fmt: skip
    print(f"{'':<12}{'first step (s)':>16}{'steps/s':>10}{'wall (s)':>10}")
    for name, rows, total in (("orchestrate", ours, wall), ("by hand", raw, raw_wall)):
        first = max(r["first_step_s"] for r in rows)
        rate = min(r["steps_per_s"] for r in rows)
        print(f"{name:<12}{first:>16.2f}{rate:>10.1f}{total:>10.1f}")
    ratio = min(r["steps_per_s"] for r in ours) / max(min(r["steps_per_s"] for r in raw), 1e-9)
    print(f"gpu_check: steps/s under orchestrate / by hand = {ratio:.2f}x")


if __name__ == "__main__":
    main()
