"""The task's TensorBoard callback with real TensorFlow under MultiWorkerMirroredStrategy: each
epoch's steps/s comes from fit's step counter, right to the step, and only the profiling variant
has batch hooks (any batch hook makes Keras run its per-step callback machinery: slower)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys, time
from pathlib import Path
import numpy as np
import tensorflow as tf
from tf_keras.src.callbacks import CallbackList
from worker.tensorboard_logs import ProfilingTaskTensorBoard, TaskTensorBoard

STEPS, EPOCHS = 120, 3
log_dir = Path(sys.argv[1])
x = np.random.default_rng(0).normal(size=(STEPS * 8, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int64")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True).repeat()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd",
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

class EpochTimer(tf.keras.callbacks.Callback):
    # Listed first and last around ours: its span holds ours to within microseconds.
    def __init__(self):
        super().__init__()
        self.seconds = []
    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.started)

ours = TaskTensorBoard(log_dir)
timer = EpochTimer()
model.fit(data, epochs=EPOCHS, steps_per_epoch=STEPS, callbacks=[timer, ours], verbose=0)

rates = {}
for event_file in (log_dir / "train").glob("events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(str(event_file)):
        for value in event.summary.value:
            if value.tag == "epoch_steps_per_sec":
                rates[event.step] = float(tf.make_ndarray(value.tensor))
steps = [rates[e] * timer.seconds[e] for e in sorted(rates)]
print("RESULT " + json.dumps({
    "epochs": sorted(rates),
    "steps": steps,
    "hooks": CallbackList([TaskTensorBoard(log_dir / "b")], model=model)._should_call_train_batch_hooks,
    "profiling_hooks": CallbackList([ProfilingTaskTensorBoard(log_dir / "c", 3, 5)],
                                    model=model)._should_call_train_batch_hooks,
}), flush=True)
"""


def test_epoch_steps_per_second_come_from_fits_counter_without_a_batch_hook(
    tmp_path: Path,
) -> None:
    script = tmp_path / "board.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "board")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    assert result["epochs"] == [0, 1, 2]
    # steps/s x the epoch's seconds: the epoch's 120 steps, not a count off by a fit or a batch.
    assert all(abs(steps - 120) < 0.5 for steps in result["steps"]), result["steps"]
    assert result["hooks"] is False
    assert result["profiling_hooks"] is True
