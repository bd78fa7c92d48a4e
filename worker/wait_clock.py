"""How long a trainer waits for its peers and for its input, measured inside its own steps.

Under MultiWorkerMirroredStrategy every step waits for the slowest task: all tasks report the
same steps/s, so step rates alone cannot name a straggler. What differs is where each task's
step time goes: a fast task spends part of every step blocked in the gradient all-reduce,
waiting for the slow one; the slow one arrives last and hardly waits.

When TensorFlow is imported (worker.instrument), every collective the strategy traces
(CollectiveReplicaLauncher.all_reduce and all_gather, which MWMS's gradient aggregation goes
through) gets a timestamp when its input is ready and one when its result is, and every
distributed iterator's get_next one at the step's start and one when the batch is there. The
differences are added to two float64 variables on the host's CPU; the progress writer reads
them (with the time) at most every half second. A graph op each, no device sync, no Python
call inside the step.

On GPUs the timestamps are taken on the host, when the device ops are enqueued: the waits
measured there are a lower bound.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

_MARK = "_orchestrate_timed"


class WaitClock:
    """Seconds this process's steps spent in collectives and waiting for input, so far."""

    def __init__(self, tf: Any) -> None:
        self._tf = tf
        self._lock = threading.Lock()
        self._collective: Any = None
        self._input: Any = None

    def _counter(self, which: str) -> Any:
        """The variable, made at first use (outside any strategy's variable creator: a
        plain local variable, never mirrored or synchronised)."""
        with self._lock:
            variable = getattr(self, which)
            if variable is None:
                from tensorflow.python.framework import ops
                from tensorflow.python.ops import resource_variable_ops

                with ops.init_scope(), ops.device("/cpu:0"):
                    variable = resource_variable_ops.ResourceVariable(
                        0.0, dtype=self._tf.float64, trainable=False, name=f"orchestrate{which}"
                    )
                setattr(self, which, variable)
            return variable

    def add(self, which: str, started: Any, ended: Any) -> None:
        self._counter(which).assign_add(ended - started)

    def seconds(self) -> dict[str, float]:
        """{"collective_seconds", "input_seconds", "clock"}; only those measured so far."""
        values: dict[str, float] = {}
        for which, key in (("_collective", "collective_seconds"), ("_input", "input_seconds")):
            variable = getattr(self, which)
            if variable is not None:
                try:
                    values[key] = float(variable.numpy())
                except Exception:  # being torn down at exit
                    return {}
        if values:
            values["clock"] = time.time()
        return values


def _after(tf: Any, values: Any) -> Any:
    """A timestamp taken once every tensor in `values` is ready."""
    tensors = [
        v for v in tf.nest.flatten(values, expand_composites=True) if isinstance(v, tf.Tensor)
    ]
    with tf.control_dependencies(tensors):
        return tf.timestamp()


def install(tf: Any) -> WaitClock:
    """Time this process's collectives and distributed input from now on."""
    from tensorflow.python.distribute import cross_device_utils, input_lib

    clock = WaitClock(tf)
    launcher = cross_device_utils.CollectiveReplicaLauncher
    for name in ("all_reduce", "_all_gather"):
        method = getattr(launcher, name)
        if not getattr(method, _MARK, False):
            setattr(launcher, name, _timed_collective(tf, clock, method))
    iterator = input_lib.DistributedIteratorBase
    if not getattr(iterator.get_next, _MARK, False):
        iterator.get_next = _timed_input(tf, clock, iterator.get_next)
    return clock


def _timed_collective(tf: Any, clock: WaitClock, method: Any) -> Any:
    @functools.wraps(method)
    def timed(launcher: Any, input_tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if tf.executing_eagerly():
            return method(launcher, input_tensor, *args, **kwargs)
        started = _after(tf, input_tensor)
        result = method(launcher, input_tensor, *args, **kwargs)
        clock.add("_collective", started, _after(tf, result))
        return result

    setattr(timed, _MARK, True)
    return timed


def _timed_input(tf: Any, clock: WaitClock, method: Any) -> Any:
    @functools.wraps(method)
    def timed(iterator: Any, *args: Any, **kwargs: Any) -> Any:
        if tf.executing_eagerly():
            return method(iterator, *args, **kwargs)
        started = tf.timestamp()  # no inputs: runs as the step starts
        result = method(iterator, *args, **kwargs)
        clock.add("_input", started, _after(tf, result))
        return result

    setattr(timed, _MARK, True)
    return timed
