"""Every task's own TensorBoard run (JOB_DIR/tensorboard/worker-N/train), and a profile of a
few steps on request. worker.runtime's callbacks() adds it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import tensorflow as tf

from worker.context import TaskContext
from worker.progress import fit_step_counter, read_counter
from worker.spec import ENV_PROFILE_STEPS


def tensorboard_installed() -> bool:
    """tf.summary needs the tensorboard package; a host without it trains without logs."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        return True
    print("orchestrate: tensorboard is not installed here: no TensorBoard logs", flush=True)
    return False


class TaskTensorBoard(tf.keras.callbacks.Callback):
    """Every task's own TensorBoard run, JOB_DIR/tensorboard/worker-N/train: the epoch's logs
    (loss, metrics) and steps/s as scalars.

    Not tf.keras.callbacks.TensorBoard: under MultiWorkerMirroredStrategy it keeps only the
    chief's logs (the others write to a temporary directory that it deletes). No batch hook:
    one would make Keras run its per-step callback machinery (7-13 % of a small model's
    throughput under MWMS), so the epoch's steps come from fit's own step counter."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self.log_dir = log_dir
        self._writer = tf.summary.create_file_writer(str(log_dir / "train"))
        self._epoch_started = time.perf_counter()
        self._epoch_first_step: int | None = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_started = time.perf_counter()
        self._epoch_first_step = read_counter(fit_step_counter(self.model))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        seconds = time.perf_counter() - self._epoch_started
        steps = _difference(read_counter(fit_step_counter(self.model)), self._epoch_first_step)
        with self._writer.as_default(step=epoch):
            for name, value in (logs or {}).items():
                tf.summary.scalar(f"epoch_{name}", value)
            if steps is not None and seconds > 0:
                tf.summary.scalar("epoch_steps_per_sec", steps / seconds)
        self._writer.flush()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._writer.close()


class ProfilingTaskTensorBoard(TaskTensorBoard):
    """TaskTensorBoard that also profiles training steps first..last (1-based, counted over
    this process's fits) into the same run: the only variant with batch hooks."""

    def __init__(self, log_dir: Path, first: int, last: int) -> None:
        super().__init__(log_dir)
        self.profile_steps = (first, last)
        self._step = 0
        self._profiling = False

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self._profiling and self._step + 1 == self.profile_steps[0]:
            tf.profiler.experimental.start(str(self.log_dir))
            self._profiling = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._step += 1
        if self._profiling and self._step >= self.profile_steps[1]:
            tf.profiler.experimental.stop()
            self._profiling = False

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._profiling:
            tf.profiler.experimental.stop()
            self._profiling = False
        super().on_train_end(logs)


def _difference(now: int | None, then: int | None) -> int | None:
    """Steps between two counter reads; None when either is unknown or the counter went back
    (a new fit resets tf-keras's counter)."""
    if now is None or then is None or now < then:
        return None
    return now - then


def tensorboard_callback(ctx: TaskContext) -> TaskTensorBoard:
    """ORCHESTRATE_PROFILE_STEPS="10,20" also profiles those training steps."""
    profile = os.environ.get(ENV_PROFILE_STEPS, "")
    steps = [int(s) for s in profile.split(",") if s.strip()]
    log_dir = ctx.job_dir / "tensorboard" / f"{ctx.task_type}-{ctx.task_index}"
    if steps:
        return ProfilingTaskTensorBoard(log_dir, steps[0], steps[-1])
    return TaskTensorBoard(log_dir)
