"""orchestrate's Keras callbacks, built for whichever Keras the script uses: tf-keras (`tf.keras`
under orchestrate) or Keras 3 (`import keras`). The classes are made by factories so this module
imports no TensorFlow: the bootstrap imports it before the user's script, and builds the
classes only once that script has imported its Keras.

- progress: epoch, step, loss, steps/s, and fit's totals, to the agent (every batch counted,
  the loss read only when written, so no device sync per step);
- preemption: SIGTERM ends training at the next epoch boundary, after that epoch's
  BackupAndRestore checkpoint, on every worker at once, with the preemption exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from worker.progress import ProgressWriter
from worker.spec import ENV_PREEMPTION_EXIT_CODE, Phase, StepSignal

DEFAULT_PREEMPTION_EXIT_CODE = 42  # restart.preemption_exit_code's default

# Marks on our classes, so a fit that already has one is never given a second (a script that
# uses worker.runtime's callbacks under the bootstrap).
PROGRESS_MARK = "orchestrate_progress"
PREEMPTION_MARK = "orchestrate_preemption"

_classes: dict[tuple[str, type], type] = {}


def preemption_exit_code() -> int:
    """cluster.toml's restart.preemption_exit_code, as the agent passes it."""
    try:
        return int(os.environ.get(ENV_PREEMPTION_EXIT_CODE, DEFAULT_PREEMPTION_EXIT_CODE))
    except ValueError:
        return DEFAULT_PREEMPTION_EXIT_CODE


def progress_callback_class(base: type) -> type:
    """A progress callback class deriving from `base` (a Keras `callbacks.Callback`)."""
    key = ("progress", base)
    if key not in _classes:
        _classes[key] = type("ProgressReporter", (_ProgressMixin, base), {PROGRESS_MARK: True})
    return _classes[key]


def preemption_callback_class(base: type, tf: Any) -> type:
    """A preemption callback class deriving from `base`; `tf` is the tensorflow module."""
    key = ("preemption", base)
    if key not in _classes:
        _classes[key] = type(
            "PreemptionCheckpoint", (_PreemptionMixin, base), {PREEMPTION_MARK: True, "_tf": tf}
        )
    return _classes[key]


class _ProgressMixin:
    """Reports to a ProgressWriter; the step signal is Keras fit's own batches."""

    params: dict[str, Any]

    def __init__(self, writer: ProgressWriter) -> None:
        super().__init__()
        # Take the logs as tensors: reading a value every step would force a device sync every
        # step; the loss is read only when written (at most every min_interval seconds).
        self._supports_tf_logs = True
        self.writer = writer
        self._initial_epoch: int | None = None
        self._step = 0
        self._epoch_step = 0
        self._loss: Any = None  # a tensor (or float) until written
        self._scaled = True
        self._window_start = time.monotonic()
        self._window_steps = 0
        self._steps_per_sec: float | None = None
        self._loss_scale = 1.0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        params = getattr(self, "params", None) or {}
        self._loss_scale = 1.0 / _summed_replicas(getattr(self, "model", None))
        self.writer.update(
            force=True,
            phase=Phase.TRAINING,
            step_signal=StepSignal.KERAS,
            epochs=int(params.get("epochs") or 0),
            steps_per_epoch=int(params.get("steps") or 0),
        )

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._flush(force=True, phase=Phase.FINISHED)  # evaluation, saving: no steps, not hung

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._initial_epoch is None:
            self._initial_epoch = epoch
        self._epoch_step = 0
        self.writer.update(force=True, epoch=epoch + 1, epoch_step=0,
                           initial_epoch=self._initial_epoch)  # fmt: skip

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._step += 1
        self._epoch_step += 1
        self._window_steps += 1
        if self._step == 1:  # the first step includes tracing: the pace is measured after it
            self._window_start, self._window_steps = time.monotonic(), 0
        if logs and "loss" in logs:
            self._loss = logs["loss"]
            self._scaled = False
        if self._step == 1 or self.writer.due():
            self._flush(force=self._step == 1)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        metrics = {k: float(v) for k, v in (logs or {}).items() if _is_number(v)}
        if "loss" in metrics:
            self._loss = metrics["loss"]
            self._scaled = True  # the epoch's logs are true means
        self._flush(force=True, metrics=metrics)

    def _global_step(self) -> int:
        """Steps of the whole training, the same count before and after a resume: the epochs
        a restored checkpoint skipped (fit's initial_epoch) count as done when fit knows its
        steps per epoch. 0 until this attempt's first step."""
        if not self._step:
            return 0
        per_epoch = int((getattr(self, "params", None) or {}).get("steps") or 0)
        return (self._initial_epoch or 0) * per_epoch + self._step

    def _flush(self, force: bool, **extra: Any) -> None:
        now = time.monotonic()
        elapsed = now - self._window_start
        if elapsed >= 1.0 and self._window_steps:
            self._steps_per_sec = self._window_steps / elapsed
            self._window_start, self._window_steps = now, 0
        loss = None
        if self._loss is not None:
            try:
                loss = float(self._loss) * (1.0 if self._scaled else self._loss_scale)
            except (TypeError, ValueError):
                loss = None
        self.writer.update(
            force=force,
            step=self._global_step(),
            epoch_step=self._epoch_step,
            loss=loss,
            steps_per_sec=self._steps_per_sec,
            **extra,
        )


def _summed_replicas(model: Any) -> int:
    """How many replicas' values tf-keras adds up in its per-batch logs: its reduction "auto"
    is "sum" except on TPUs, so under N replicas a batch's loss reads N times the mean."""
    method = getattr(model, "distribute_reduction_method", None)
    strategy = getattr(model, "distribute_strategy", None)
    if method not in ("auto", "sum") or strategy is None:
        return 1
    if method == "auto" and "TPU" in type(strategy).__name__:
        return 1
    return max(int(getattr(strategy, "num_replicas_in_sync", 1) or 1), 1)


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


class _PreemptionMixin:
    """SIGTERM (a preempting scheduler, or `orchestrate stop`) ends training at the next epoch
    boundary, after that epoch's BackupAndRestore checkpoint, on every worker at once, with the
    preemption exit code: orchestrate restarts the group without counting it.

    The workers agree with one all-reduce per epoch (the signal may reach only one of them).
    TensorFlow's own PreemptionCheckpointHandler is enabled by tf-keras on GCP only, hence this.
    A SIGTERM handler the script installed itself is left alone (and then this does nothing).
    """

    _tf: Any

    def __init__(self, strategy: Any, exit_code: int | None = None) -> None:
        super().__init__()
        tf = self._tf
        self.exit_code = preemption_exit_code() if exit_code is None else exit_code
        # A plain flag, not a threading.Event: a handler must take no lock (a second SIGTERM
        # can run the handler again inside the first, between two bytecodes).
        self._signalled = False
        self._previous = signal.getsignal(signal.SIGTERM)
        self._installed = False
        # A Python handler the script installed is the script's business; TensorFlow's own
        # (installed in C when MWMS starts) shows as SIG_DFL or None and swallows SIGTERM.
        if threading.current_thread() is threading.main_thread() and not callable(self._previous):
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True

        @tf.function
        def count_signalled(flag: Any) -> Any:
            per_replica = strategy.run(lambda: tf.identity(flag))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        self._count_signalled = count_signalled

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._signalled = True

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        flag = self._tf.constant(1.0 if self._signalled else 0.0)
        if float(self._count_signalled(flag)) > 0:
            print(f"preempted: checkpointed epoch {epoch + 1}, exiting with "
                  f"{self.exit_code} for a restart", flush=True)  # fmt: skip
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.exit_code)  # not SystemExit: TensorFlow's threads would hold exit

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        # Past fit, SIGTERM does what it did before (a handler set in C cannot be put back:
        # then ours stays, and only sets a flag, much as TensorFlow's own swallows it).
        if self._installed and isinstance(self._previous, int):
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False
