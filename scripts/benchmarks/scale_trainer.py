"""A stand-in trainer for scripts/benchmarks/scale.py (standard library only, no TensorFlow): it
trains like a real one as the coordinator sees it, so the measurement is of the coordinator. It
reports progress the way the Keras callback does (a step count and a loss in the progress file,
written at most every 0.5 s) and prints a line a second, like `fit(verbose=2)`. Started by
path (scale.TRAINER)."""

import json
import os
import sys
import time

path = os.environ.get("ORCHESTRATE_PROGRESS_FILE")
step, started, printed = 0, time.monotonic(), 0.0
while True:
    time.sleep(0.25)  # four steps a second: 256 of them share this machine's 2 cores
    step += 1
    now = time.monotonic()
    if path and step % 2 == 0:
        progress = {"phase": "training", "epoch": 1 + step // 40, "step": step,
                    "loss": 1.0 / step, "steps_per_sec": step / (now - started),
                    "step_signal": "keras", "epochs": 1000, "steps_per_epoch": 40,
                    "epoch_step": step % 40}  # fmt: skip
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(progress, fh)
        os.replace(tmp, path)
    if now - printed >= 1.0:
        printed = now
        print(f"40/40 - 1s - loss: {1.0 / step:.4f} - step {step}", flush=True)
    if len(sys.argv) > 1 and step >= int(sys.argv[1]):
        break
