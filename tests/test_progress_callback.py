"""The progress a plain `fit` script reports through the bootstrap, with real TensorFlow: steps
and a loss mid-epoch, exact totals at the end, and no per-batch callback on our account (Keras
would run its batch-hook machinery between every two steps: measurably slower)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from worker.agent import BOOTSTRAP

SCRIPT = """
import json, sys, time
import numpy as np
import tensorflow as tf

STEPS = 300
x = np.random.default_rng(0).normal(size=(STEPS * 8, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int64")

def slowly(a, b):
    time.sleep(0.01)  # a real input pipeline's pace: the epoch lasts a few seconds
    return a, b

def slow(a, b):
    a2, b2 = tf.numpy_function(slowly, [a, b], [a.dtype, b.dtype])
    return tf.ensure_shape(a2, a.shape), tf.ensure_shape(b2, b.shape)

data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True).map(slow)
model = tf.keras.Sequential([tf.keras.layers.Input(shape=(4,)), tf.keras.layers.Dense(2)])
model.compile(optimizer="sgd",
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(data, epochs=2, verbose=0)

from tf_keras.src.callbacks import CallbackList
from worker.callbacks import PROGRESS_MARK, progress_callback_class
from worker.progress import ProgressWriter

ours = progress_callback_class(tf.keras.callbacks.Callback)(ProgressWriter(None))
hooks = CallbackList([ours], model=model)._should_call_train_batch_hooks
print("RESULT " + json.dumps({"batch_hooks": hooks}), flush=True)
"""


def test_a_fit_reports_steps_and_loss_mid_epoch_without_a_batch_hook(tmp_path: Path) -> None:
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    progress = tmp_path / "progress.json"
    env = {
        **os.environ,
        "ORCHESTRATE_PROGRESS_FILE": str(progress),
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    proc = subprocess.Popen(
        [sys.executable, BOOTSTRAP, str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[dict] = []
    try:
        while proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):  # not there yet, or mid-write
                seen.append(json.loads(progress.read_text()))
            time.sleep(0.05)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    mid_epoch = [
        p
        for p in seen
        if p.get("phase") == "training" and 0 < p.get("epoch_step", 0) < p.get("steps_per_epoch")
    ]
    assert mid_epoch, seen[-3:]
    # The first epoch's loss comes from this worker's running mean before the epoch ends.
    assert any(p["epoch"] == 1 and p["loss"] is not None for p in mid_epoch), mid_epoch[-3:]
    assert any(p["steps_per_sec"] for p in mid_epoch), mid_epoch[-3:]
    steps = sorted({p["step"] for p in seen})
    assert len(steps) >= 4  # seen advancing, not only at the epochs' ends
    final = json.loads(progress.read_text())
    assert final["phase"] == "finished" and final["step"] == 600 and final["epoch"] == 2
    assert final["loss"] == final["metrics"]["loss"]  # the last epoch's, from fit's logs
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    assert result == {"batch_hooks": False}
