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
from pathlib import Path
from typing import Any

# tf.keras in TF 2.21 is Keras 3, whose fit() fails under MWMS: the legacy tf-keras works. This
# must be set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from worker import callbacks as _callbacks
from worker import leader_wait
from worker import progress as _progress
from worker.spec import (
    ENV_STRATEGY,
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

import tensorflow as tf

from worker.context import TaskContext, report_phase, task_context
from worker.pipelines import ShardedData, shard_arrays, tfrecord_dataset_fn
from worker.tensorboard_logs import TaskTensorBoard, tensorboard_callback, tensorboard_installed

__all__ = [  # the API a training script uses (several names live in modules of their own)
    "PreemptionCheckpoint",
    "ProgressReporter",
    "ShardedData",
    "TaskContext",
    "TaskTensorBoard",
    "callbacks",
    "make_strategy",
    "report_phase",
    "save_model",
    "shard_arrays",
    "task_context",
    "tensorboard_callback",
    "tfrecord_dataset_fn",
    "write_chief_json",
]


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
        leader_wait.install(tf)  # without the bootstrap too
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        report_phase(ctx, Phase.JOINED)
        return strategy
    return tf.distribute.get_strategy()


# Reports epoch/step/loss/steps-per-second to the agent (through worker.progress's writer).
ProgressReporter = _callbacks.progress_callback_class(tf.keras.callbacks.Callback)


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
    if tensorboard_installed():
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
