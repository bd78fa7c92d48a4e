"""The training that scripts/bench.py times, launched by orchestrate or by hand (--raw).

The digits MLP under MultiWorkerMirroredStrategy, printing BENCH lines: the wall-clock time of
the first finished training step, and each epoch's steps per second. With --raw it uses only
what a hand-written MWMS script would (the strategy made directly, BackupAndRestore), not
orchestrate's strategy helper or callbacks.

Started by path (measure.TRAINER): it imports only `worker` and TensorFlow, nothing of scripts.
"""

from __future__ import annotations

import argparse
import time

from worker import runtime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument("--raw", action="store_true")
    args = parser.parse_args()

    import tensorflow as tf

    ctx = runtime.task_context()
    # --raw: the strategy as a hand-written script makes it (no wait for the leader's port).
    if args.raw:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = runtime.make_strategy(ctx)
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    data = runtime.shard_arrays(
        strategy, ctx, ((x / 16.0).astype("float32"), y.astype("int64")), args.global_batch_size
    )

    class Timing(tf.keras.callbacks.Callback):
        first_done = False
        _supports_tf_logs = True  # it reads no logs: no per-step device sync on its account

        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            if not self.first_done:
                self.first_done = True
                print(f"BENCH first_step {time.time():.6f}", flush=True)

        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            rate = data.steps_per_epoch / (time.perf_counter() - self.started)
            print(f"BENCH epoch {epoch + 1} {rate:.3f}", flush=True)

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Input(shape=(64,)),
                tf.keras.layers.Dense(128, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer="adam",
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    if args.raw:
        callbacks = [tf.keras.callbacks.BackupAndRestore(str(ctx.backup_dir))]
    else:
        callbacks = runtime.callbacks(ctx, strategy)
    model.fit(
        data.dataset,
        epochs=args.epochs,
        steps_per_epoch=data.steps_per_epoch,
        callbacks=[*callbacks, Timing()],
        verbose=0,
    )
    print("BENCH done", flush=True)


if __name__ == "__main__":
    main()
