"""The preemption callback the bootstrap adds to a plain `fit` script with BackupAndRestore,
with real TensorFlow: with short epochs the workers agree on a SIGTERM every couple of seconds
(not at every epoch boundary: an all-reduce each), yet a SIGTERM still ends training at an epoch
whose checkpoint a restart resumes from, and one in the last epoch is never lost."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from worker.agent import BOOTSTRAP

SCRIPT = """
import os, signal, sys, time
import numpy as np
import tensorflow as tf

EPOCHS, STEPS = 24, 20
SIGNAL_AT = int(sys.argv[2])  # the epoch (1-based) at whose start this process gets SIGTERM
strategy = tf.distribute.MultiWorkerMirroredStrategy()
x = np.random.default_rng(0).normal(size=(STEPS * 8, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int64")

def slowly(a, b):
    time.sleep(0.01)  # 0.2-s epochs: many of them in the agreement period
    return a, b

def slow(a, b):
    a2, b2 = tf.numpy_function(slowly, [a, b], [a.dtype, b.dtype])
    return tf.ensure_shape(a2, a.shape), tf.ensure_shape(b2, b.shape)

data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True).map(slow).repeat()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd",
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

class Epochs(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"epoch {epoch + 1} begins", flush=True)
        if epoch + 1 == SIGNAL_AT:
            os.kill(os.getpid(), signal.SIGTERM)

backup = tf.keras.callbacks.BackupAndRestore(sys.argv[1])
model.fit(data, epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0, callbacks=[backup, Epochs()])
print("fit ended", flush=True)
"""


def _run(script: Path, backup: Path, signal_at: int) -> tuple[int, str]:
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, BOOTSTRAP, str(script), str(backup), str(signal_at)],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_short_epochs_agree_on_a_sigterm_now_and_then_and_the_last_epoch_always(
    tmp_path: Path,
) -> None:
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    backup = tmp_path / "backup"

    # SIGTERM as epoch 4 begins: training goes on to the next agreement, usually a few epochs
    # later (the agreement is no longer at every boundary); epoch 4's own end where epochs
    # are slow (a busy machine: about 2 s of epochs between agreements), never before it. Then
    # every worker exits with the preemption code after that epoch's checkpoint.
    code, out = _run(script, backup, signal_at=4)
    assert code == 42, out[-3000:]
    stopped = int(re.findall(r"preempted: checkpointed epoch (\d+), exiting with 42", out)[-1])
    assert 4 <= stopped < 24, out[-3000:]
    assert "fit ended" not in out

    # A restart resumes after that epoch; a SIGTERM in the last epoch ends in the preemption
    # code too (BackupAndRestore deletes its checkpoint as fit ends: waiting past it would
    # lose the signal, or the work), with the last epoch checkpointed.
    code, out = _run(script, backup, signal_at=24)
    assert code == 42, out[-3000:]
    assert re.findall(r"epoch (\d+) begins", out)[0] == str(stopped + 1), out[-3000:]
    assert "preempted: checkpointed epoch 24, exiting with 42" in out
    assert backup.exists()

    # Resumed past the last epoch, fit has nothing left to train and ends as it would.
    code, out = _run(script, backup, signal_at=0)
    assert code == 0 and "fit ended" in out, out[-3000:]
    assert "epoch" not in out.replace("fit ended", "")


MANY_FITS = """
import sys
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int64")
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd",
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
for n in range(8):  # a fit per round, as a loop over the data or a tuner has
    backup = tf.keras.callbacks.BackupAndRestore(f"{sys.argv[1]}/{n}")
    model.fit(x, y, epochs=2, batch_size=8, verbose=0, callbacks=[backup])
print("fits ended", flush=True)
"""


def test_a_script_calling_fit_again_and_again_traces_the_agreement_once(tmp_path: Path) -> None:
    """Each fit gets its own preemption callback; their all-reduce is one function of the
    strategy, traced once: TensorFlow's warning of excessive retracing (which would name our
    function in the script's log) never comes."""
    script = tmp_path / "fits.py"
    script.write_text(MANY_FITS)
    code, out = _run(script, tmp_path / "backup", signal_at=0)
    assert code == 0 and "fits ended" in out, out[-3000:]
    assert "retracing" not in out, out[-3000:]
