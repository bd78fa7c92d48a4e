"""Input pipelines sharded across workers: in-memory arrays (equal, disjoint shards) and
TFRecord files on the shared directory (by file, else by record). worker.runtime re-exports
them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from worker.context import TaskContext
from worker.spec import write_json_atomic


@dataclass(frozen=True)
class ShardedData:
    dataset: Any  # a tf.distribute.DistributedDataset
    steps_per_epoch: int
    shard_indices: np.ndarray  # rows of the input this worker trains on


def shard_arrays(
    strategy: tf.distribute.Strategy,
    ctx: TaskContext,
    arrays: Sequence[np.ndarray],
    global_batch_size: int,
    seed: int = 0,
) -> ShardedData:
    """Give each worker a disjoint, equal-sized shard of in-memory arrays.

    Equal shards matter: under MWMS every worker must run the same number of steps, or the
    collectives of the longer one wait forever. Each epoch is one pass over the shard.
    """
    num_rows = len(arrays[0])
    pipelines = ctx.num_workers
    local_replicas = max(strategy.num_replicas_in_sync // pipelines, 1)
    per_replica = max(global_batch_size // strategy.num_replicas_in_sync, 1)
    rows_per_step = per_replica * local_replicas
    order = np.random.default_rng(seed).permutation(num_rows)
    shard = order[ctx.task_index :: pipelines]
    steps = (num_rows // pipelines) // rows_per_step
    if steps < 1:
        raise ValueError(
            f"{num_rows} rows are too few for {pipelines} workers at global batch "
            f"{global_batch_size}"
        )
    shard = shard[: steps * rows_per_step]

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        tensors = tuple(a[shard] for a in arrays)
        ds = tf.data.Dataset.from_tensor_slices(tensors)
        ds = ds.shuffle(len(shard), seed=seed + ctx.task_index, reshuffle_each_iteration=True)
        return ds.repeat().batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    ctx.task_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(ctx.task_dir / "shard.json", {"indices": shard.tolist()})
    return ShardedData(dataset=dataset, steps_per_epoch=steps, shard_indices=shard)


def tfrecord_dataset_fn(
    files: Sequence[str | os.PathLike[str]],
    parse: Any,
    global_batch_size: int,
    *,
    cache: bool = False,
    shuffle_buffer: int = 10_000,
    seed: int = 0,
    repeat: bool = True,
) -> Any:
    """A dataset_fn for `strategy.distribute_datasets_from_function` over TFRecord files on the
    shared directory, following the tf.data performance guide:

    - shard by FILE when there are at least as many files as workers (each worker opens only
      its own files), else by DATA (every worker reads every file, keeps every n-th record);
    - interleave the files in parallel, `map(parse)` in parallel;
    - optionally cache after parsing (small datasets, or a costly parse), shuffle, repeat;
    - batch at the per-replica size (global_batch_size / replicas), prefetch with AUTOTUNE.

    Give equal-sized shards (scripts/make_tfrecords.py writes them): then every worker runs the
    same number of steps, and with steps_per_epoch = records / global_batch_size each epoch sees
    every record exactly once across the workers.
    """
    paths = sorted(str(f) for f in files)

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        workers, index = input_context.num_input_pipelines, input_context.input_pipeline_id
        if len(paths) >= workers:  # FILE policy
            names = tf.data.Dataset.from_tensor_slices(paths).shard(workers, index)
            ds = names.interleave(
                tf.data.TFRecordDataset,
                cycle_length=max(1, min(len(paths) // workers, 8)),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=False,
            )
        else:  # DATA policy: fewer files than workers
            ds = tf.data.TFRecordDataset(paths).shard(workers, index)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        ds = ds.with_options(options)  # sharded above, explicitly
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        if cache:
            ds = ds.cache()
        if shuffle_buffer:
            ds = ds.shuffle(shuffle_buffer, seed=seed + index, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        per_replica = input_context.get_per_replica_batch_size(global_batch_size)
        return ds.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return dataset_fn
