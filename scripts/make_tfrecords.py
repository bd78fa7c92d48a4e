#!/usr/bin/env python3
"""Write scikit-learn's bundled digits as equal-sized TFRecord shards, for the TFRecord example:

    uv run python -m scripts.make_tfrecords runs/data --shards 8

Each record holds `image` (64 floats in [0, 1]), `label` (int64) and `id` (int64, the row).
The held-out rows (the same split as the digits example) go to test-*.tfrecord.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shards", type=int, default=8)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    ids = np.arange(len(y))
    train, test = train_test_split(ids, test_size=0.2, random_state=0, stratify=y)
    per_shard = len(train) // args.shards  # equal shards: the remainder is left out
    args.out.mkdir(parents=True, exist_ok=True)

    def write(path: Path, rows: np.ndarray) -> None:
        with tf.io.TFRecordWriter(str(path)) as writer:
            for row in rows:
                feature = {
                    "image": tf.train.Feature(float_list=tf.train.FloatList(value=x[row] / 16.0)),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[y[row]])),
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[row])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())

    for shard in range(args.shards):
        rows = train[shard * per_shard : (shard + 1) * per_shard]
        write(args.out / f"train-{shard:05d}-of-{args.shards:05d}.tfrecord", rows)
    write(args.out / "test-00000-of-00001.tfrecord", test)
    print(f"wrote {args.shards} x {per_shard} training records and {len(test)} test records "
          f"to {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
