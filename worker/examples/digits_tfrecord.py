"""The digits MLP trained from TFRecord shards on the shared directory (written by
scripts/make_tfrecords.py), through runtime.tfrecord_dataset_fn: file-sharded across workers,
interleaved, cached, shuffled, batched per replica, prefetched.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from worker import runtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--global-batch-size", type=int, default=64)
    args = parser.parse_args()

    ctx = runtime.task_context()
    strategy = runtime.make_strategy(ctx)

    import numpy as np
    import tensorflow as tf

    spec = {
        "image": tf.io.FixedLenFeature([64], tf.float32),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_single_example(record, spec)
        return example["image"], example["label"]

    train_files = sorted(args.data_dir.glob("train-*.tfrecord"))
    records = sum(1 for f in train_files for _ in tf.data.TFRecordDataset(str(f)))
    steps = records // args.global_batch_size
    dataset = strategy.distribute_datasets_from_function(
        runtime.tfrecord_dataset_fn(train_files, parse, args.global_batch_size, cache=True)
    )
    print(f"worker {ctx.task_index}/{ctx.num_workers}: {len(train_files)} shard files, "
          f"{records} records, {steps} steps per epoch", flush=True)  # fmt: skip

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Input(shape=(64,)),
                tf.keras.layers.Dense(128, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.Adam(0.005),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=steps,
              callbacks=runtime.callbacks(ctx, strategy), verbose=2)  # fmt: skip

    test = tf.data.TFRecordDataset([str(p) for p in args.data_dir.glob("test-*.tfrecord")])
    images, labels = zip(*[(i.numpy(), int(lbl)) for i, lbl in test.map(parse)], strict=True)
    logits = model(np.stack(images), training=False).numpy()
    accuracy = float(np.mean(np.argmax(logits, axis=1) == np.array(labels)))
    print(f"final held-out accuracy: {accuracy:.4f} on {len(labels)} test images", flush=True)
    runtime.save_model(model, ctx)
    runtime.write_chief_json(ctx, "metrics.json", {"test_accuracy": accuracy})


if __name__ == "__main__":
    main()
