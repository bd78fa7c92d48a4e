"""A warm trainer imported TensorFlow before the script ran, under the task's environment. A
script that sets a variable TensorFlow reads when it is imported (TF_CPP_MIN_LOG_LEVEL,
CUDA_VISIBLE_DEVICES, TF_ENABLE_ONEDNN_OPTS, XLA_FLAGS, ...) before its own `import
tensorflow` would not get what it asked for. So the warm trainer watches the script's first
import of TensorFlow (or Keras): if such a variable changed since the activation, it starts
over cold, in the same process (exec: the same pid, a fresh interpreter, the activation's
environment), writes `warm-undone` in the task's directory so that the task's later attempts
start cold, and says so. Standard library only."""

from __future__ import annotations

import builtins
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from worker.spec import (
    ENV_ATTEMPT,
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_PROGRESS_FILE,
    ENV_TASK_DIR,
)

# Inherited variables that change what importing TensorFlow does (also what a standby's
# fingerprint covers); TF_CONFIG, the job and the attempt are read later, and differ every
# attempt or job: a standby is made without them (it may serve the user's next job).
IMPORT_PREFIXES = ("PATH", "LD_", "PYTHON", "CUDA", "TF_", "XLA", "OMP_", "MKL", "NCCL",
                   "KMP_", "VIRTUAL_ENV", "ORCHESTRATE_")  # fmt: skip
PER_JOB = frozenset(
    {"TF_CONFIG", ENV_ATTEMPT, ENV_JOB_ID, ENV_JOB_DIR, ENV_TASK_DIR, ENV_PROGRESS_FILE}
)
# What a script may set before its import that the import itself reads. PATH, LD_* and PYTHON*
# are read when the interpreter starts, cold or warm: a script setting them changes neither.
SCRIPT_PREFIXES = ("TF_", "CUDA", "XLA", "OMP_", "MKL", "KMP_", "NCCL")
# Read later (devices, the first op, a strategy): they take effect in a warm trainer too.
READ_LATER = frozenset({"TF_CONFIG", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR",
                        "TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC",
                        "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS"})  # fmt: skip
WATCHED = frozenset({"tensorflow", "tf_keras", "keras"})
# Our own modules that import TensorFlow for the instrumentation (not for the script).
OURS = frozenset(
    {"worker.instrument", "worker.wait_clock", "worker.callbacks", "worker.leader_wait"}
)
UNDONE_FILE = "warm-undone"
ENV_UNDONE = "ORCHESTRATE_WARM_UNDONE"  # set in the cold start that follows: what changed


def import_relevant(name: str) -> bool:
    return name.startswith(IMPORT_PREFIXES) and name not in PER_JOB


def changed(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The variables a script may set that TensorFlow's import reads, and that differ."""
    names = {k for k in (*before, *now) if k.startswith(SCRIPT_PREFIXES) and k not in READ_LATER}
    return sorted(k for k in names if before.get(k) != now.get(k))


# Top-level names of the modules imported ahead that an import statement named in this warm
# trainer before its training began: worker.warm.imports_ahead records only those again.
ahead_used: set[str] = set()
_stops: list[Callable[[], None]] = []


def watch(
    activation_env: Mapping[str, str],
    start_cold: Callable[[list[str], bool], None],
    ahead: frozenset[str] = frozenset(),
    script_set: Callable[[], list[str]] = list,
) -> None:
    """Until the script first imports TensorFlow or Keras (itself, or through any module of
    its own or ours that it calls, such as worker.runtime): then compare, and call
    start_cold(names, False) with what changed. Imports by TensorFlow itself or by our
    instrumentation pass.

    `ahead`: the top-level names of the library modules the standby imported besides
    (worker.warm.imports_ahead). Then each of the script's imports of those is looked at too, until
    its training begins (stop_watching): once the script's own code set a variable
    (`script_set`, worker.warm.imports_ahead.Recorder's attribution), start_cold(names, True)."""
    real = builtins.__import__
    real_import_module = importlib.import_module
    watched = WATCHED | ahead
    done = False

    def stop() -> None:
        nonlocal done
        done = True
        if builtins.__import__ is checking:  # steady training pays nothing
            builtins.__import__ = real
        if importlib.import_module is import_module:
            importlib.import_module = real_import_module

    def look(name: str, globals: Any) -> None:
        root = name.partition(".")[0]
        if root in ahead:
            ahead_used.add(root)
        importer = str((globals or {}).get("__name__", ""))
        # By the importer's name, not its file (warm_imports.Recorder's rule for who set a
        # variable): any other library's first import of TensorFlow, or worker.runtime's,
        # runs for the script and meets the script's environment.
        if root in watched and importer.partition(".")[0] not in watched and importer not in OURS:
            differs, library = changed(activation_env, os.environ), False
            if not differs and root in ahead:
                differs, library = script_set(), True
            if differs or not ahead:  # without libraries ahead: one look
                stop()
            if differs:
                start_cold(differs, library)

    def checking(name: str, globals: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not done:
            look(name, globals)
        return real(name, globals, *args, **kwargs)

    def import_module(name: str, package: str | None = None) -> Any:
        """importlib.import_module("tensorflow") passes no import statement: looked at too."""
        if not done and not name.startswith("."):  # a relative name is the script's own module
            look(name, sys._getframe(1).f_globals)
        return real_import_module(name, package)

    _stops[:] = [stop]
    builtins.__import__ = checking
    importlib.import_module = import_module


def stop_watching() -> None:
    """Training began: a start over cold would cost the peers their rendezvous."""
    for stop in _stops:
        stop()


def mark_undone(names: list[str]) -> None:
    """Tell the task's later attempts (worker.warm.activation.undone_reason) and the log."""
    print(f"orchestrate: the script sets {', '.join(names)} before importing TensorFlow, which "
          "this warm trainer had imported already: starting over cold (this task's next "
          "attempts start cold too)", file=sys.stderr, flush=True)  # fmt: skip
    task_dir = os.environ.get(ENV_TASK_DIR)
    if task_dir:
        with contextlib.suppress(OSError), open(os.path.join(task_dir, UNDONE_FILE), "w") as fh:
            fh.write(",".join(names) + "\n")


def undone_reason(task_dir: str) -> str:
    """Why this task's trainers start cold ('' when they may start warm): a script of this
    task set import-time variables itself. The names are the trainer's: shown cut and
    printable."""
    try:
        with open(os.path.join(task_dir, UNDONE_FILE), errors="replace") as fh:
            names = fh.read(200).strip()
    except OSError:
        return ""
    shown = "".join(c if c.isprintable() else "?" for c in names) or "a variable"
    return f"the script sets {shown} before importing TensorFlow"
