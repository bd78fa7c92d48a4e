"""What a warm standby imports besides TensorFlow: the library modules the task's trainer
imported last time ([restart] warm_imports). A script's own imports (scikit-learn, pandas, a
dataset library) can take as long as its whole warm start; a standby that imported them ahead
hands the next attempt a process in which they are done.

The trainer records them once, as training begins (`Recorder`): every module it imported, in
import order, whose file lies in the interpreter's library directories (site-packages and the
standard library): never the script's own modules, never ours. It records nothing when the
script changed the environment by then: a library imported under another environment than
the script's could differ, and a standby cannot know what the script would set. The agent
reads the list (a trainer wrote it: bounded, every name checked) and passes it to the keeper
with the standby's order; the standby imports each name, ignoring any that fails, before it
says ready. Once activated, `worker.import_env` also watches the script's first imports of
these modules. Standard library only."""

from __future__ import annotations

import builtins
import contextlib
import importlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from worker.atomic import write_json_atomic

ENV_WARM_IMPORTS = "ORCHESTRATE_WARM_IMPORTS"  # the standby's list, comma-separated
ENV_RECORD_IMPORTS = "ORCHESTRATE_RECORD_IMPORTS"  # "1" in a trainer's: record its list
WARM_IMPORTS_FILE = "warm-imports.json"  # in the task's directory
MAX_NAMES = 4000
MAX_BYTES = 256 << 10
MAX_JOINED = 96 << 10  # the standby's variable: Linux takes at most 128 KiB in one
# Imported by every standby anyway (TensorFlow: thousands of names), or never to be imported
# ahead (ours; a script's main module under any name).
SKIP_ROOTS = frozenset({"tensorflow", "worker", "__main__", "__mp_main__"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")

# The names this process imported as a standby (bootstrap.standby), for its own record.
imported: list[str] = []


def library_dirs() -> tuple[str, ...]:
    import sysconfig  # only here: the bootstrap imports this module before every script

    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if paths.get(k)}
    return tuple(os.path.join(os.path.abspath(d), "") for d in sorted(dirs))


def _origin(module: object) -> str | None:
    """The module's file, absolute; None for one without (frozen, built in, namespace)."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(module, "__file__", None)
    if not isinstance(origin, str) or not os.path.isabs(origin):
        return None
    return os.path.abspath(origin)


def _from_library(module: object, dirs: tuple[str, ...]) -> bool:
    origin = _origin(module)
    return origin is not None and origin.startswith(dirs)


def valid(names: Iterable[object]) -> list[str]:
    """The names that may be imported ahead: dotted identifiers, not ours, each once, the first
    MAX_NAMES of them within MAX_JOINED characters."""
    seen: dict[str, None] = {}
    joined = 0
    for name in names:
        if (
            isinstance(name, str)
            and name not in seen
            and _NAME.match(name)
            and name.partition(".")[0] not in SKIP_ROOTS
        ):
            joined += len(name) + 1
            if len(seen) >= MAX_NAMES or joined > MAX_JOINED:
                break
            seen[name] = None
    return list(seen)


class Recorder:
    """Made before the script runs; `record` once as training begins. Until then it watches
    the script's imports: the environment must be as the last import left it (a library may
    set variables as it is imported, TensorFlow does, and will again in a standby); a
    variable the script set itself in between means nothing is recorded."""

    def __init__(self, task_dir: str, ignored: frozenset[str]) -> None:
        self.path = os.path.join(task_dir, WARM_IMPORTS_FILE)
        self.before = set(sys.modules)
        self.ignored = ignored  # read later, or per attempt
        self.env = dict(os.environ)
        self.script_set_variables = False
        self.done = False
        self.dirs = library_dirs()
        self.ours = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")
        self._by_library: dict[str, bool] = {}
        self._real = builtins.__import__
        builtins.__import__ = self._import

    def _import(self, name: str, globals: Any = None, *args: Any, **kwargs: Any) -> Any:
        if self.done or self.script_set_variables:
            return self._real(name, globals, *args, **kwargs)
        importer = str((globals or {}).get("__name__", ""))
        if self._library(importer):
            return self._real(name, globals, *args, **kwargs)
        now, then = dict(os.environ), self.env
        if any(now.get(k) != then.get(k) for k in (now.keys() | then.keys()) - self.ignored):
            self.script_set_variables = True
            return self._real(name, globals, *args, **kwargs)
        try:
            return self._real(name, globals, *args, **kwargs)
        finally:
            self.env = dict(os.environ)

    def _library(self, importer: str) -> bool:
        """Not the script's code: a module without a file of its own (frozen, built in), one
        whose file lies in the library directories, or ours (the instrumentation imports
        inside TensorFlow's import, after TensorFlow set its variables)."""
        known = self._by_library.get(importer)
        if known is None:
            origin = _origin(sys.modules.get(importer))
            known = origin is None or origin.startswith((*self.dirs, self.ours))
            self._by_library[importer] = known
        return known

    def record(self) -> None:
        if self.done:
            return
        self.done = True
        if builtins.__import__ == self._import:  # else another hook wraps ours: it passes
            builtins.__import__ = self._real
        names: list[str] = []
        if not self.script_set_variables:
            new = [n for n, m in list(sys.modules.items())
                   if n not in self.before and _from_library(m, self.dirs)]  # fmt: skip
            names = valid([*imported, *new])
        with contextlib.suppress(OSError):  # only a restart's speed depends on it
            write_json_atomic(self.path, {"modules": names})


def read(task_dir: str) -> list[str]:
    """The task's last trainer's list ([] if none or unreadable: a trainer wrote it)."""
    try:
        with open(os.path.join(task_dir, WARM_IMPORTS_FILE), "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            return []
        data = json.loads(raw)
    except (OSError, ValueError):
        return []
    modules = data.get("modules") if isinstance(data, dict) else None
    return valid(modules) if isinstance(modules, list) else []


def import_ahead(names: Sequence[str]) -> None:
    """In the standby, after TensorFlow: each name in order; one that fails is left out (the
    script, if it imports it, meets the failure itself). `imported` then holds every module
    this brought in, for the record of the trainer this standby becomes."""
    before = set(sys.modules)
    dirs = library_dirs()
    for name in valid(names):
        if name not in sys.modules and _in_library(name.partition(".")[0], dirs):
            with contextlib.suppress(Exception, SystemExit):
                importlib.import_module(name)
    imported[:] = valid(n for n in list(sys.modules) if n not in before)


def _in_library(root: str, dirs: tuple[str, ...]) -> bool:
    """The top-level package is loaded already, or found in the library directories: a name
    that resolves elsewhere here (a directory on PYTHONPATH) is not imported ahead."""
    if root in sys.modules:
        return True
    with contextlib.suppress(Exception):
        spec = importlib.util.find_spec(root)
        origin = spec.origin if spec is not None else None
        return isinstance(origin, str) and os.path.abspath(origin).startswith(dirs)
    return False


def roots(names: Iterable[str]) -> frozenset[str]:
    return frozenset(n.partition(".")[0] for n in names)
