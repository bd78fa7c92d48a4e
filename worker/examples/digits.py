"""Train a small Keras MLP on scikit-learn's bundled handwritten digits (1,797 real 8x8 images,
no download) with MultiWorkerMirroredStrategy; reaches >= 0.95 held-out accuracy.

Run under orchestrate (`orchestrate launch cluster.example.toml`) or alone (one local worker).
"""

from __future__ import annotations

import argparse

from worker import runtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=0.005)
    args = parser.parse_args()

    ctx = runtime.task_context()
    strategy = runtime.make_strategy(ctx)  # first: MWMS needs TF_CONFIG before other TF work

    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    y = y.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    data = runtime.shard_arrays(strategy, ctx, (x_train, y_train), args.global_batch_size)
    print(
        f"worker {ctx.task_index}/{ctx.num_workers}: {len(data.shard_indices)} of "
        f"{len(x_train)} training images, {data.steps_per_epoch} steps per epoch, "
        f"{strategy.num_replicas_in_sync} replica(s) in sync",
        flush=True,
    )

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Input(shape=(64,)),
                tf.keras.layers.Dense(args.hidden, activation="relu"),
                tf.keras.layers.Dense(args.hidden, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.Adam(args.learning_rate),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )

    model.fit(
        data.dataset,
        epochs=args.epochs,
        steps_per_epoch=data.steps_per_epoch,
        callbacks=runtime.callbacks(ctx, strategy),
        verbose=2,
    )

    logits = model(x_test, training=False).numpy()
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    print(f"final held-out accuracy: {accuracy:.4f} on {len(x_test)} test images", flush=True)
    saved = runtime.save_model(model, ctx)
    if saved is not None:
        print(f"saved final model to {saved}", flush=True)
    runtime.write_chief_json(
        ctx, "metrics.json", {"test_accuracy": accuracy, "test_images": len(x_test)}
    )


if __name__ == "__main__":
    main()
