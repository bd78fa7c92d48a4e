"""orchestrate's Keras callbacks, built for whichever Keras the script uses: tf-keras (`tf.keras`
under orchestrate) or Keras 3 (`import keras`). The classes are made by factories so this module
imports no TensorFlow: the bootstrap imports it before the user's script, and builds the
classes only once that script has imported its Keras.

- progress: epoch, step, loss, steps/s, and fit's totals, to the agent (read off the training
  thread from fit's step counter: no batch hook, no device sync per step);
- preemption: SIGTERM ends training at an epoch boundary (within about AGREEMENT_PERIOD), after
  that epoch's BackupAndRestore checkpoint, on every worker at once, with the preemption exit code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

from worker.progress import ProgressWriter, StepRate, fit_step_counter, read_counter
from worker.spec import ENV_PREEMPTION_EXIT_CODE, Phase, StepSignal

DEFAULT_PREEMPTION_EXIT_CODE = 42  # restart.preemption_exit_code's default

# Marks on our classes, so a fit that already has one is never given a second (a script that
# uses worker.runtime's callbacks under the bootstrap).
PROGRESS_MARK = "orchestrate_progress"
PREEMPTION_MARK = "orchestrate_preemption"
_AGREE_ATTRIBUTE = "_orchestrate_preemption_agree"  # on the strategy

FIRST_STEP_POLL = 0.05  # seconds between reads of fit's step counter until its first step

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
    """Reports Keras fit's progress to a ProgressWriter from epoch hooks and a sampler thread.

    No batch hook: any `on_train_batch_end` makes Keras call back between every two steps,
    which cost 10-16 % of throughput with two MWMS workers on two cores. The sampler reads
    fit's own step counter instead (and this worker's running loss), off the training
    thread: every FIRST_STEP_POLL seconds until the first step, then at the writer's pace.
    The loss is the epoch's (its logs), and between epochs this worker's running mean.
    """

    params: dict[str, Any]
    model: Any

    def __init__(self, writer: ProgressWriter) -> None:
        super().__init__()
        self._supports_tf_logs = True  # it reads the epoch's logs only: never a sync per step
        self.writer = writer
        self._lock = threading.Lock()  # the sampler and the training thread both report
        self._initial_epoch: int | None = None
        self._counter: Any = None  # fit's step counter (a variable), once training began
        self._base = 0  # its value when this fit began
        self._steps = 0  # steps of this fit, as last read
        self._epoch_base = 0  # self._steps when this epoch began
        self._loss: float | None = None
        self._rate = StepRate()
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        params = getattr(self, "params", None) or {}
        self._counter = fit_step_counter(getattr(self, "model", None))
        self._base = read_counter(self._counter) or 0
        self.writer.update(
            force=True,
            phase=Phase.TRAINING,
            step_signal=StepSignal.KERAS,
            epochs=int(params.get("epochs") or 0),
            steps_per_epoch=int(params.get("steps") or 0),
        )
        if self._counter is not None:
            self._stop.clear()
            self._sampler = threading.Thread(target=self._sample, name="orchestrate-progress",
                                             daemon=True)  # fmt: skip
            self._sampler.start()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._stop_sampler()
        self._read_steps()
        self._flush(force=True, phase=Phase.FINISHED)  # evaluation, saving: no steps, not hung

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        steps = self._read_steps()
        with self._lock:
            if self._initial_epoch is None:
                self._initial_epoch = epoch
            self._epoch_base = steps
            self.writer.update(force=True, epoch=epoch + 1, epoch_step=0,
                               initial_epoch=self._initial_epoch)  # fmt: skip

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        metrics = {k: float(v) for k, v in (logs or {}).items() if _is_number(v)}
        self._read_steps()
        if "loss" in metrics:
            self._loss = metrics["loss"]  # the epoch's logs are true means
        self._flush(force=True, metrics=metrics)

    def _sample(self) -> None:
        interval = FIRST_STEP_POLL
        last = self._steps
        while not self._stop.wait(interval):
            steps = self._read_steps()
            if steps == last:
                continue
            first = last == 0
            last = steps
            if first:  # the first step includes tracing: the pace is measured after it
                with self._lock:
                    self._rate.restart()
                interval = max(FIRST_STEP_POLL, self.writer.min_interval)
            loss = _local_running_loss(self.model)
            if loss is not None:
                self._loss = loss
            self._flush(force=first)

    def _stop_sampler(self) -> None:
        self._stop.set()
        if self._sampler is not None and self._sampler is not threading.current_thread():
            self._sampler.join(timeout=2.0)
        self._sampler = None

    def _read_steps(self) -> int:
        """Steps this fit has taken (read from its counter); the last count if unreadable."""
        value = read_counter(self._counter)
        with self._lock:
            if value is not None and value - self._base > self._steps:
                self._rate.add(value - self._base - self._steps)
                self._steps = value - self._base
            return self._steps

    def _global_step(self) -> int:
        """Steps of the whole training, the same count before and after a resume: the epochs
        a restored checkpoint skipped (fit's initial_epoch) count as done when fit knows its
        steps per epoch. 0 until this attempt's first step."""
        if not self._steps:
            return 0
        per_epoch = int((getattr(self, "params", None) or {}).get("steps") or 0)
        return (self._initial_epoch or 0) * per_epoch + self._steps

    def _flush(self, force: bool, **extra: Any) -> None:
        with self._lock:
            self.writer.update(
                force=force,
                step=self._global_step(),
                epoch_step=self._steps - self._epoch_base,
                loss=self._loss,
                steps_per_sec=self._rate.current(),
                **extra,
            )


def _local_running_loss(model: Any) -> float | None:
    """This worker's running mean loss over the epoch so far, from tf-keras's loss tracker,
    read from this worker's own replicas: reading the tracker whole would all-reduce across
    the workers, and they must not meet in a collective of ours at different times."""
    tracker: Any = getattr(getattr(model, "compiled_loss", None), "_total_loss_mean", None)
    if tracker is None:
        return None
    try:
        total = _local_sum(tracker.total)
        count = _local_sum(tracker.count)
    except Exception:  # another Keras, or not built yet: the loss comes with each epoch
        return None
    return total / count if count else None


def _local_sum(variable: Any) -> float:
    """A variable's value summed over this worker's own copies (a SyncOnRead one has one per
    local replica)."""
    values = getattr(variable, "values", None)
    parts = values if isinstance(values, tuple) else (variable,)
    return float(sum(float(part.numpy()) for part in parts))


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


AGREEMENT_PERIOD = 2.0  # seconds: how often, at most, the workers agree on a SIGTERM


def epochs_until_next_agreement(seconds_summed: float, replicas: int, epochs: int) -> int:
    """Epochs to train before the workers next agree whether one was signalled: as many as fit
    in AGREEMENT_PERIOD at the pace since the last agreement (`seconds_summed` over `replicas`
    replicas and `epochs` epochs, all-reduced: every worker computes the same number). At
    least 1: epochs longer than the period agree at each boundary."""
    if replicas <= 0 or epochs <= 0 or not seconds_summed > 0:
        return 1
    per_epoch = seconds_summed / replicas / epochs
    return max(1, min(1000, int(AGREEMENT_PERIOD // per_epoch)))


def _agreement_function(tf: Any, strategy: Any) -> Any:
    """The all-reduce the workers agree by, one per strategy, kept on it: a script that calls
    fit again and again (a loop over its data, a tuner) gets a new callback each time, and a
    new function each time would be traced again at every fit, with TensorFlow's warning of
    excessive retracing in the script's log."""
    agree = getattr(strategy, _AGREE_ATTRIBUTE, None)
    if agree is None:

        @tf.function
        def agree(mine: Any) -> Any:
            per_replica = strategy.run(lambda: tf.identity(mine))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        with contextlib.suppress(AttributeError, TypeError):  # a strategy that takes none
            setattr(strategy, _AGREE_ATTRIBUTE, agree)
    return agree


class _PreemptionMixin:
    """SIGTERM (a preempting scheduler, or `orchestrate stop`) ends training at an epoch
    boundary, after that epoch's BackupAndRestore checkpoint, on every worker at once, with the
    preemption exit code: orchestrate restarts the group without counting it.

    The workers agree with one all-reduce (the signal may reach only one of them): at every
    epoch boundary when epochs are long, every AGREEMENT_PERIOD seconds or so when they are
    short (an all-reduce costs milliseconds: at each of many short epochs, a few % of
    throughput), and always at the last one. The all-reduce carries the pace too, so every
    worker picks the same next boundary from the same numbers; no clock is compared.
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
        self._replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
        self.on_train_begin()
        self._agree = _agreement_function(tf, strategy)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._signalled = True

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._since = time.monotonic()  # this worker's own clock, for durations only
        self._epochs_since = 0  # epochs ended since the last agreement
        self._due_in = 1  # epochs from the last agreement to the next

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epochs_since += 1
        params = getattr(self, "params", None) or {}
        last = epoch + 1 >= int(params.get("epochs") or 0) or bool(
            getattr(getattr(self, "model", None), "stop_training", False)
        )
        # The last epoch always agrees: BackupAndRestore deletes its checkpoint as fit ends.
        if last or self._epochs_since >= self._due_in:
            self._agreement(epoch)

    def _agreement(self, epoch: int) -> None:
        """One all-reduce of (signalled, seconds since the last one); exits when any worker
        was signalled, else sets the next boundary."""
        elapsed = time.monotonic() - self._since
        mine = self._tf.constant([1.0 if self._signalled else 0.0, elapsed], dtype="float32")
        signalled, seconds_summed = (float(v) for v in self._agree(mine).numpy())
        if signalled > 0:
            print(f"preempted: checkpointed epoch {epoch + 1}, exiting with "
                  f"{self.exit_code} for a restart", flush=True)  # fmt: skip
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.exit_code)  # not SystemExit: TensorFlow's threads would hold exit
        self._due_in = epochs_until_next_agreement(
            seconds_summed, self._replicas, self._epochs_since
        )
        self._since, self._epochs_since = time.monotonic(), 0

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        # Past fit, SIGTERM does what it did before (a handler set in C cannot be put back:
        # then ours stays, and only sets a flag, much as TensorFlow's own swallows it).
        if self._installed and isinstance(self._previous, int):
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False
