"""Helpers a training script uses under orchestrate. Importing this module imports TensorFlow
(after telling the agent this task has started: the import alone can take seconds).

from worker import runtime
ctx = runtime.task_context()              # reads TF_CONFIG (set by the agent)
strategy = runtime.make_strategy(ctx)     # created at program start, before anything else
data = runtime.shard_arrays(strategy, ctx, (x, y), global_batch_size=64)
with strategy.scope():
    model = build_and_compile()
model.fit(data.dataset, epochs=10, steps_per_epoch=data.steps_per_epoch,
          callbacks=runtime.callbacks(ctx))
runtime.save_model(model, ctx)            # every worker calls it: saving is collective
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# tf.keras in TF 2.21 is Keras 3, whose fit() fails under MWMS: the legacy tf-keras works. This
# must be set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from worker import callbacks as _callbacks
from worker import progress as _progress
from worker.spec import (
    ENV_JOB_DIR,
    ENV_PROFILE_STEPS,
    ENV_PROGRESS_FILE,
    ENV_STRATEGY,
    ENV_TASK_DIR,
    Phase,
    StepSignal,
    write_json_atomic,
)

# Report STARTING before importing TensorFlow, which takes seconds here and can take a minute
# on a cold NFS: the startup deadline then tells a task that is still loading from one that
# never ran (it names them "starting" and "never reported"). Under the bootstrap this was
# reported when the interpreter came up, and later phases may already be known.
if _progress.shared().current.phase == Phase.NONE:
    _progress.shared().phase(Phase.STARTING)

import numpy as np
import tensorflow as tf


@dataclass(frozen=True)
class TaskContext:
    """Who this process is in the cluster and where its files go."""

    task_type: str
    task_index: int
    num_workers: int
    job_dir: Path
    task_dir: Path
    progress_file: Path | None

    @property
    def is_chief(self) -> bool:
        # With no `chief` job in the cluster, worker 0 is chief (MWMS convention).
        return self.task_type == "chief" or (self.task_type == "worker" and self.task_index == 0)

    @property
    def backup_dir(self) -> Path:
        return self.job_dir / "checkpoints" / "backup"

    @property
    def model_dir(self) -> Path:
        return self.job_dir / "model"


def task_context(default_dir: str | os.PathLike[str] = "orchestrate-run") -> TaskContext:
    """Read TF_CONFIG and the agent's environment; outside orchestrate, a single local task."""
    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    cluster = tf_config.get("cluster", {})
    task = tf_config.get("task", {})
    num_workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    job_dir = Path(os.environ.get(ENV_JOB_DIR, default_dir))
    task_index = int(task.get("index", 0))
    task_dir = Path(os.environ.get(ENV_TASK_DIR, job_dir / "tasks" / str(task_index)))
    progress = os.environ.get(ENV_PROGRESS_FILE)
    ctx = TaskContext(
        task_type=task.get("type", "worker"),
        task_index=task_index,
        num_workers=max(num_workers, 1),
        job_dir=job_dir,
        task_dir=task_dir,
        progress_file=Path(progress) if progress else None,
    )  # STARTING was reported when this module was imported
    return ctx


def report_phase(ctx: TaskContext, phase: Phase) -> None:
    """Tell the agent how far this task got (outside model.fit, where the callback reports)."""
    _progress.shared().phase(phase)


def make_strategy(
    ctx: TaskContext, settings: dict[str, Any] | None = None
) -> tf.distribute.Strategy:
    """The strategy cluster.toml's [strategy] asks for (passed by the agent in
    ORCHESTRATE_STRATEGY; settings override it):

    - multi_worker_mirrored (default): MultiWorkerMirroredStrategy when TF_CONFIG names a
      cluster, else the default strategy;
    - mirrored: MirroredStrategy over `devices` (default: every GPU, else the CPU);
    - one_device: OneDeviceStrategy on `devices[0]` (default: the first GPU, else the CPU);
    - tpu: resolve the TPU at `tpu`, connect, initialise it, TPUStrategy.

    `logical_cpus = N` first splits the CPU into N logical devices (mirrored without GPUs).
    Create it at program start: MWMS requires TF_CONFIG before any other TensorFlow work.
    """
    cfg = settings if settings is not None else json.loads(os.environ.get(ENV_STRATEGY, "{}"))
    kind = cfg.get("kind", "multi_worker_mirrored")
    devices = list(cfg.get("devices") or [])
    if cfg.get("logical_cpus"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * int(cfg["logical_cpus"])
        )
        if kind == "mirrored" and not devices:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if kind == "mirrored":
        return tf.distribute.MirroredStrategy(devices=devices or None)
    if kind == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(
            devices[0] if devices else (gpus[0].name if gpus else "/cpu:0")
        )
    if kind == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=cfg.get("tpu", ""))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if "TF_CONFIG" in os.environ and ctx.num_workers >= 1:
        report_phase(ctx, Phase.JOINING)  # blocks here until every peer has connected
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        report_phase(ctx, Phase.JOINED)
        return strategy
    return tf.distribute.get_strategy()


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


# Reports epoch/step/loss/steps-per-second to the agent (through worker.progress's writer).
ProgressReporter = _callbacks.progress_callback_class(tf.keras.callbacks.Callback)


def _tensorboard_installed() -> bool:
    """tf.summary needs the tensorboard package; a host without it trains without logs."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        return True
    print("orchestrate: tensorboard is not installed here: no TensorBoard logs", flush=True)
    return False


class TaskTensorBoard(tf.keras.callbacks.Callback):
    """Every task's own TensorBoard run, JOB_DIR/tensorboard/worker-N/train: the epoch's logs
    (loss, metrics) and steps/s as scalars, and optionally a profile of a few steps.

    Not tf.keras.callbacks.TensorBoard: under MultiWorkerMirroredStrategy it keeps only the
    chief's logs (the others write to a temporary directory that it deletes)."""

    def __init__(self, log_dir: Path, profile_steps: tuple[int, int] | None = None) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self.log_dir = log_dir
        self.profile_steps = profile_steps
        self._writer = tf.summary.create_file_writer(str(log_dir / "train"))
        self._step = 0
        self._profiling = False

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_started, self._epoch_steps = time.perf_counter(), 0

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.profile_steps and self._step + 1 == self.profile_steps[0]:
            tf.profiler.experimental.start(str(self.log_dir))
            self._profiling = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._step += 1
        self._epoch_steps += 1
        if self._profiling and self.profile_steps and self._step >= self.profile_steps[1]:
            tf.profiler.experimental.stop()
            self._profiling = False

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        seconds = time.perf_counter() - self._epoch_started
        with self._writer.as_default(step=epoch):
            for name, value in (logs or {}).items():
                tf.summary.scalar(f"epoch_{name}", value)
            if seconds > 0:
                tf.summary.scalar("epoch_steps_per_sec", self._epoch_steps / seconds)
        self._writer.flush()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._profiling:
            tf.profiler.experimental.stop()
            self._profiling = False
        self._writer.close()


def tensorboard_callback(ctx: TaskContext) -> TaskTensorBoard:
    """ORCHESTRATE_PROFILE_STEPS="10,20" also profiles those training steps."""
    profile = os.environ.get(ENV_PROFILE_STEPS, "")
    steps = [int(s) for s in profile.split(",") if s.strip()]
    return TaskTensorBoard(
        ctx.job_dir / "tensorboard" / f"{ctx.task_type}-{ctx.task_index}",
        (steps[0], steps[-1]) if steps else None,
    )


# SIGTERM: checkpoint at the next epoch boundary on every worker, exit with the preemption
# exit code (cluster.toml's restart.preemption_exit_code, passed by the agent).
PreemptionCheckpoint = _callbacks.preemption_callback_class(tf.keras.callbacks.Callback, tf)


def callbacks(
    ctx: TaskContext, strategy: tf.distribute.Strategy | None = None
) -> list[tf.keras.callbacks.Callback]:
    """BackupAndRestore on the shared directory (resume after a restart), progress reporting,
    and, given the strategy, a checkpoint-then-exit on preemption (SIGTERM).

    tf-keras's BackupAndRestore is multi-worker aware: the chief writes the backup, the other
    workers write to temporary directories that it removes. Order matters: the epoch's backup
    is written before the preemption check runs.
    """
    result: list[tf.keras.callbacks.Callback] = [
        tf.keras.callbacks.BackupAndRestore(backup_dir=str(ctx.backup_dir))
    ]
    if ctx.progress_file is not None:
        # Steps will be observed: the startup deadline waits for the first one (not only for
        # the rendezvous), even without the bootstrap.
        _progress.shared().update(force=True, step_signal=StepSignal.KERAS)
        result.append(ProgressReporter(_progress.shared()))
    if _tensorboard_installed():
        result.append(tensorboard_callback(ctx))
    if strategy is not None:
        result.append(PreemptionCheckpoint(strategy))
    return result


def save_model(model: tf.keras.Model, ctx: TaskContext) -> Path | None:
    """Save the final model. Every worker must call this (saving is collective): the chief saves
    to the real path, the others to a temporary path that is removed right after."""
    if ctx.is_chief:
        model.save(str(ctx.model_dir))
        return ctx.model_dir
    scratch = ctx.job_dir / "tmp" / f"{ctx.task_type}-{ctx.task_index}" / "model"
    model.save(str(scratch))
    shutil.rmtree(scratch.parent, ignore_errors=True)
    return None


def write_chief_json(ctx: TaskContext, name: str, data: Any) -> None:
    """Write a small result file once, from the chief only."""
    if ctx.is_chief:
        write_json_atomic(ctx.job_dir / name, data)
