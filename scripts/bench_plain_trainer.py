"""The plain training script scripts/bench.py's P9 times: a user's own MultiWorkerMirroredStrategy
`fit` script that imports nothing of orchestrate (it reads TF_CONFIG through TensorFlow, keeps
its own BackupAndRestore), printing each epoch's steps per second as a BENCH line. orchestrate
runs it with and without its bootstrap; the script cannot tell."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--backup-dir", required=True)
# The in-process A/B of P9: alternate fit calls without and with the callbacks the bootstrap
# adds (progress, preemption), ROUNDS times; print each pair's steps/s. Only this mode imports
# anything of orchestrate.
parser.add_argument("--ab", type=int, default=0, metavar="ROUNDS")
# The in-process A/B of bench_sampling.py: alternate fit calls without and with the wait clock
# (worker.wait_clock: timestamps around every collective and every batch's input).
parser.add_argument("--ab-waits", type=int, default=0, metavar="ROUNDS")
args = parser.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
index = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
workers = strategy.num_replicas_in_sync
x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype("float32")
batch = 16  # per worker (global 32, as P3's trainer)
rows = len(x) // workers // batch * batch
mine = np.arange(len(x))[index::workers][:rows]
dataset = tf.data.Dataset.from_tensor_slices((x[mine], y[mine])).shuffle(rows).repeat().batch(batch)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
dataset = dataset.with_options(options)
steps = rows // batch

with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(64,)),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )


class EpochRate(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        rate = steps / (time.perf_counter() - self.started)
        print(f"BENCH epoch {epoch + 1} {rate:.3f}", flush=True)


if args.ab_waits:
    from tensorflow.python.distribute import cross_device_utils, input_lib

    from worker import wait_clock

    launcher = cross_device_utils.CollectiveReplicaLauncher
    iterator = input_lib.DistributedIteratorBase
    plain = (launcher.all_reduce, launcher._all_gather, iterator.get_next)
    clock = wait_clock.install(tf)
    timed = (launcher.all_reduce, launcher._all_gather, iterator.get_next)

    def fit_with(methods: tuple, steps_: int) -> float:
        launcher.all_reduce, launcher._all_gather, iterator.get_next = methods
        model.train_function = None  # traced again, with or without the timestamps
        started = time.perf_counter()
        model.fit(dataset, epochs=1, steps_per_epoch=steps_, verbose=0)
        return steps_ / (time.perf_counter() - started)

    fit_with(plain, steps)
    fit_with(timed, steps)  # warm up both
    long = 10 * steps
    for _ in range(args.ab_waits):
        print(f"BENCH ab {fit_with(plain, long):.3f} {fit_with(timed, long):.3f}", flush=True)
    print(f"BENCH clock {json.dumps(clock.seconds())}", flush=True)
    raise SystemExit(0)

if args.ab:
    from worker.callbacks import preemption_callback_class, progress_callback_class
    from worker.progress import ProgressWriter

    base = tf.keras.callbacks.Callback
    writer = ProgressWriter(Path(args.backup_dir) / "progress.json")
    ours = [progress_callback_class(base)(writer), preemption_callback_class(base, tf)(strategy)]
    model.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=ours, verbose=0)  # warm up
    long = 10 * steps  # one fit call's own set-up is then a small share
    for _ in range(args.ab):
        rates = []
        for callbacks in ([], ours):
            started = time.perf_counter()
            model.fit(dataset, epochs=1, steps_per_epoch=long, callbacks=callbacks, verbose=0)
            rates.append(long / (time.perf_counter() - started))
        print(f"BENCH ab {rates[0]:.3f} {rates[1]:.3f}", flush=True)
    raise SystemExit(0)

model.fit(
    dataset,
    epochs=args.epochs,
    steps_per_epoch=steps,
    callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup_dir), EpochRate()],
    verbose=0,
)
