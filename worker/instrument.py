"""What the bootstrap adds to an unmodified training script, from the inside, without importing
anything before the script does.

Post-import hooks (a finder on sys.meta_path that runs a function right after a module has
loaded) wait for the script's own imports:

- `tensorflow` loaded: phase IMPORTED; MultiWorkerMirroredStrategy's constructor reports
  JOINING before the rendezvous and JOINED after it, and a task connects to the coordination
  leader once it listens (worker.leader_wait); the wait clock (worker.wait_clock) times
  collectives and input, its totals written with the progress;
- `tf_keras` or `keras` loaded: `Model.fit` gains the progress callback (and, when the script's
  own BackupAndRestore is among its callbacks, the preemption callback); every optimizer made
  is remembered, and a thread reads its `iterations` every half second: the step signal of a
  custom training loop, read off the training thread (no device sync on the training step).
- `tf.train.Checkpoint`'s writes and reads: the whole step at each checkpoint a custom loop
  writes, so that a resumed attempt's STEP goes on from it (worker.checkpoint_steps).

Each hook is wrapped so that a failure in it is reported once and never breaks the script.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from worker import leader_wait, wait_clock
from worker.callbacks import (
    PREEMPTION_MARK,
    PROGRESS_MARK,
    preemption_callback_class,
    progress_callback_class,
)
from worker.checkpoint_steps import CheckpointSteps, Mark, steps_to_add
from worker.progress import ProgressWriter, StepRate, read_counter
from worker.spec import ENV_TASK_DIR, ENV_TIME_WAITS, Phase, StepSignal

OPTIMIZER_POLL_SECONDS = 0.5
_MARK = "_orchestrate_wrapped"


def _warn(what: str, exc: BaseException) -> None:
    print(f"orchestrate: {what} not instrumented ({type(exc).__name__}: {exc})",
          file=sys.stderr, flush=True)  # fmt: skip


class _HookedLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the hook; the module keeps the real loader."""

    def __init__(self, loader: importlib.abc.Loader, hook: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _run_hook(self._hook, module)


def _run_hook(hook: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        hook(module)
    except Exception as exc:  # our problem, never the script's
        _warn(module.__name__, exc)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs hook(module) once a watched top-level module has finished loading."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self._hooks = dict(hooks)
        self._busy: set[str] = set()

    def install(self) -> None:
        for name in [n for n in self._hooks if n in sys.modules]:  # loaded before us
            _run_hook(self._hooks.pop(name), sys.modules[name])
        sys.meta_path.insert(0, self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        hook = self._hooks.get(fullname)
        if hook is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)  # the other finders' answer
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        # Not forgotten here: a find_spec may be a probe (importlib.util.find_spec) that
        # never loads; the hook is dropped once the module has really loaded.
        spec.loader = _HookedLoader(spec.loader, functools.partial(self._loaded, fullname))
        return spec

    def _loaded(self, name: str, module: ModuleType) -> None:
        hook = self._hooks.pop(name, None)
        if hook is not None:
            hook(module)


class Instrumentation:
    """The hooks of one training process, reporting through one ProgressWriter."""

    def __init__(self, writer: ProgressWriter) -> None:
        self.writer = writer
        self._tf: Any = None
        self._optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._poller: threading.Thread | None = None
        self._fit_seen = threading.Event()  # Keras fit reports steps itself from then on
        self._stop = threading.Event()
        self._first_iterations: int | None = None  # the optimizers' count when first read
        # A custom loop's steps before the optimizers' count began (a restored checkpoint
        # that left the optimizer out); a restore's mark until the optimizers can be read.
        self._steps_before = 0
        self._restored: Mark | None = None
        self._checkpoint_steps: CheckpointSteps | None = None

    def finder(self) -> PostImportFinder:
        return PostImportFinder(
            {"tensorflow": self._on_tensorflow, "tf_keras": self._on_keras, "keras": self._on_keras}
        )

    def stop(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=2 * OPTIMIZER_POLL_SECONDS)

    def _final_read(self) -> None:
        """At the script's end: the optimizers' last count (the poller reads every half
        second, so its last value may be a few steps short), and the training is over."""
        if self._fit_seen.is_set() or self._poller is None:
            return
        self._stop.set()
        self._poller.join(timeout=2 * OPTIMIZER_POLL_SECONDS)
        value = self._iterations()
        if value is not None and value != self._first_iterations:
            self.writer.update(force=True, step=self._whole_step(value), phase=Phase.FINISHED)
        elif self.writer.current.phase == Phase.TRAINING:
            self.writer.update(force=True, phase=Phase.FINISHED)

    # --- tensorflow -------------------------------------------------------------------
    def _on_tensorflow(self, tf: ModuleType) -> None:
        self._tf = tf
        if os.environ.get(ENV_TIME_WAITS, "1") != "0":
            try:
                self.writer.counters = wait_clock.install(tf).seconds
            except Exception as exc:  # another TensorFlow's internals: no wait shares
                _warn("waits for peers and input", exc)
        try:
            leader_wait.install(tf)
        except Exception as exc:  # another TensorFlow's internals: it connects as it would
            _warn("waiting for the coordination leader", exc)
        try:
            self._wrap_checkpoints(tf.train.Checkpoint)
        except Exception as exc:  # another TensorFlow's internals: STEP counts per attempt
            _warn("checkpoints", exc)
        if self.writer.current.phase in (Phase.NONE, Phase.STARTING):
            self.writer.phase(Phase.IMPORTED)
        strategy_class = tf.distribute.MultiWorkerMirroredStrategy
        init = strategy_class.__init__
        if getattr(init, _MARK, False):
            return
        writer = self.writer

        @functools.wraps(init)
        def __init__(strategy: Any, *args: Any, **kwargs: Any) -> None:
            writer.phase(Phase.JOINING)  # the rendezvous: blocks until every peer connects
            init(strategy, *args, **kwargs)
            try:  # a script that builds its own cluster: where it really listens
                listening = own_cluster_address(strategy, os.environ.get("TF_CONFIG", ""))
            except Exception:  # ours, never the script's: status shows TF_CONFIG's address
                listening = ""
            writer.update(force=True, phase=Phase.JOINED, listening=listening)

        setattr(__init__, _MARK, True)
        strategy_class.__init__ = __init__

    # --- keras ------------------------------------------------------------------------
    def _on_keras(self, keras: ModuleType) -> None:
        model = keras.Model
        if not getattr(model.fit, _MARK, False):
            model.fit = self._wrap_fit(model.fit, keras)
        bases = [keras.optimizers.Optimizer]
        legacy = getattr(keras.optimizers, "legacy", None)
        if legacy is not None and isinstance(getattr(legacy, "Optimizer", None), type):
            bases.append(legacy.Optimizer)
        for base in bases:
            if not getattr(base.__init__, _MARK, False):
                base.__init__ = self._wrap_optimizer_init(base.__init__)

    def _wrap_fit(self, fit: Callable[..., Any], keras: ModuleType) -> Callable[..., Any]:
        signature = inspect.signature(fit)
        instrumentation = self

        @functools.wraps(fit)
        def wrapped_fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(model, *args, **kwargs)
                callbacks = instrumentation._callbacks_for(
                    model, keras, bound.arguments.get("callbacks")
                )
            except Exception as exc:  # a call fit itself will reject, or ours failed
                _warn("model.fit", exc)
                return fit(model, *args, **kwargs)
            if callbacks is not None:
                bound.arguments["callbacks"] = callbacks
            instrumentation._fit_seen.set()
            instrumentation.writer.training_begins()
            return fit(*bound.args, **bound.kwargs)

        setattr(wrapped_fit, _MARK, True)
        return wrapped_fit

    def _callbacks_for(self, model: Any, keras: ModuleType, given: Any) -> list[Any] | None:
        """The script's callbacks plus ours; None: leave them as they are."""
        if given is not None and not isinstance(given, list | tuple):
            return None  # a CallbackList the script built itself
        callbacks = list(given or [])
        base = keras.callbacks.Callback
        if not any(getattr(cb, PROGRESS_MARK, False) for cb in callbacks):
            callbacks.append(progress_callback_class(base)(self.writer))
        backup = keras.callbacks.BackupAndRestore
        if (
            self._tf is not None
            and any(isinstance(cb, backup) for cb in callbacks)
            and not any(getattr(cb, PREEMPTION_MARK, False) for cb in callbacks)
        ):
            strategy = getattr(model, "distribute_strategy", None)
            strategy = strategy or self._tf.distribute.get_strategy()
            # Last: it runs after the epoch's BackupAndRestore checkpoint is written.
            callbacks.append(preemption_callback_class(base, self._tf)(strategy))
        return callbacks

    # --- optimizers (custom training loops) --------------------------------------------
    def _wrap_optimizer_init(self, init: Callable[..., None]) -> Callable[..., None]:
        instrumentation = self

        @functools.wraps(init)
        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            init(optimizer, *args, **kwargs)
            instrumentation._remember(optimizer)

        setattr(__init__, _MARK, True)
        return __init__

    def _remember(self, optimizer: Any) -> None:
        try:
            self._optimizers.add(optimizer)
        except TypeError:
            return
        if self._poller is None and not self._fit_seen.is_set():
            if self.writer.current.step_signal == StepSignal.NONE:
                self.writer.update(force=True, step_signal=StepSignal.OPTIMIZER)
            self._poller = threading.Thread(
                target=self._poll_optimizers, name="orchestrate-progress", daemon=True
            )
            self._poller.start()
            # Registered now, after TensorFlow's own exit handlers: it runs before them.
            atexit.register(self._final_read)

    def _iterations(self) -> int | None:
        values = []
        for optimizer in list(self._optimizers):
            try:  # a legacy optimizer makes its counter on first access
                value = read_counter(optimizer.iterations)
            except Exception:
                value = None
            if value is not None:
                values.append(value)
        return max(values) if values else None

    def _poll_optimizers(self) -> None:
        """Until Keras fit takes over: the optimizers' iterations, which a restored checkpoint
        restores too, so the count means the same before and after a resume; written only
        once they advanced from what was first seen (a restored count is not a step taken)."""
        baseline: int | None = None
        last = None
        rate = StepRate()
        while not self._stop.wait(OPTIMIZER_POLL_SECONDS):
            if self._fit_seen.is_set():
                return
            value = self._iterations()
            if value is None:
                continue
            if baseline is None:
                baseline = last = self._first_iterations = value
                continue
            if value == last:
                continue
            rate.add(value - (last or 0))
            last = value
            self.writer.update(
                force=True,
                phase=Phase.TRAINING,
                step_signal=StepSignal.OPTIMIZER,
                step=self._whole_step(value),
                steps_per_sec=rate.current(),
            )

    def _whole_step(self, iterations: int) -> int:
        restored, self._restored = self._restored, None
        if restored is not None:  # the optimizers could not be read when it was restored
            self._steps_before = steps_to_add(restored, iterations)
        return self._steps_before + iterations

    # --- checkpoints (a custom loop's step across attempts) ------------------------------
    def _wrap_checkpoints(self, checkpoint_class: Any) -> None:
        """Each checkpoint written (save, write, a CheckpointManager's: all through `_write`)
        marks the whole step; a restore (restore calls read) takes the count from its mark."""
        name = "_write" if hasattr(checkpoint_class, "_write") else "write"
        write, read = getattr(checkpoint_class, name), checkpoint_class.read
        if getattr(read, _MARK, False):
            return
        self._checkpoint_steps = CheckpointSteps(os.environ.get(ENV_TASK_DIR))
        instrumentation = self

        @functools.wraps(write)
        def wrapped_write(checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
            path = write(checkpoint, *args, **kwargs)
            instrumentation._after_checkpoint(instrumentation._written, path)
            return path

        @functools.wraps(read)
        def wrapped_read(checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
            status = read(checkpoint, *args, **kwargs)
            save_path = args[0] if args else kwargs.get("save_path")
            instrumentation._after_checkpoint(instrumentation._read, save_path)
            return status

        for wrapped in (wrapped_write, wrapped_read):
            setattr(wrapped, _MARK, True)
        setattr(checkpoint_class, name, wrapped_write)
        checkpoint_class.read = wrapped_read

    def _after_checkpoint(self, what: Callable[[str], None], path: Any) -> None:
        if self._fit_seen.is_set() or not isinstance(path, str | os.PathLike):
            return  # fit counts its own steps; a graph-mode tensor names no file yet
        try:
            what(os.fspath(path))
        except Exception as exc:  # ours, never the script's
            _warn("checkpoints", exc)

    def _written(self, path: str) -> None:
        iterations = self._iterations()
        if iterations is not None and self._checkpoint_steps is not None:
            self._checkpoint_steps.wrote(path, self._whole_step(iterations), iterations)

    def _read(self, path: str) -> None:
        mark = self._checkpoint_steps.at(path) if self._checkpoint_steps else None
        if mark is None:
            return
        iterations = self._iterations()
        if iterations is None:  # no optimizer made yet: decided on its first count
            self._restored = mark
        else:
            self._steps_before, self._restored = steps_to_add(mark, iterations), None


def own_cluster_address(strategy: Any, tf_config: str) -> str:
    """Where the strategy's cluster resolver puts this task, when that is not where TF_CONFIG
    puts it (a script that builds its own resolver, e.g. SlurmClusterResolver); "" else."""
    resolver = strategy.cluster_resolver
    tasks = resolver.cluster_spec().as_dict().get(resolver.task_type) or []
    mine = tasks[resolver.task_id] if isinstance(tasks, list) else tasks.get(resolver.task_id)
    try:
        given = json.loads(tf_config)
        ours = given["cluster"][given["task"]["type"]][given["task"]["index"]]
    except (ValueError, KeyError, IndexError, TypeError):
        ours = None
    return str(mine) if mine and mine != ours else ""
