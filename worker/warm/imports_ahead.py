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
says ready. Once activated, `worker.warm.import_env` also watches the script's first imports of
these modules. Standard library only."""

from __future__ import annotations

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
from worker.warm import import_env

ENV_WARM_IMPORTS = "ORCHESTRATE_WARM_IMPORTS"  # the standby's list, comma-separated
ENV_RECORD_IMPORTS = "ORCHESTRATE_RECORD_IMPORTS"  # "1" in a trainer's: record its list
WARM_IMPORTS_FILE = "warm-imports.json"  # in the task's directory
MAX_NAMES = 4000
MAX_BYTES = 256 << 10
MAX_JOINED = 96 << 10  # the standby's variable: Linux takes at most 128 KiB in one
# Imported by every standby anyway (TensorFlow: thousands of names), or never to be imported
# ahead (ours; a script's main module under any name).
SKIP_ROOTS = frozenset({"tensorflow", "worker", "__main__", "__mp_main__"})
# Where os.environ's writes pass through (setdefault, update) on their way from the writer.
_ENV_PLUMBING = frozenset({"os", "_collections_abc", "collections.abc"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")

# The names this process imported as a standby (bootstrap.standby), for its own record, and
# their files as they were then (path -> (mtime_ns, size)): `stale` compares at activation.
imported: list[str] = []
_files: dict[str, tuple[int, int]] = {}


def library_dirs() -> tuple[str, ...]:
    """The interpreter's standard library and site-packages, and any other `site-packages` or
    `dist-packages` on its path (a `.pth` may add one). Never a project's own directory (an
    editable install, PYTHONPATH): the user's code is not imported ahead."""
    import sysconfig  # only here: the bootstrap imports this module before every script

    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if paths.get(k)}
    site = ("site-packages", "dist-packages")
    dirs.update(p for p in sys.path
                if os.path.isabs(p) and os.path.basename(os.path.normpath(p)) in site)  # fmt: skip
    return tuple(sorted(os.path.join(os.path.abspath(d), "") for d in dirs))


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
            and "__main__" not in name.split(".")
        ):
            joined += len(name) + 1
            if len(seen) >= MAX_NAMES or joined > MAX_JOINED:
                break
            seen[name] = None
    return list(seen)


class Recorder:
    """Made before the script runs; `record` once as training begins. Until then it watches
    who sets environment variables: a library may, as it is imported (TensorFlow does), and
    will again in a standby; the script's own code setting one means nothing is recorded."""

    def __init__(self, task_dir: str, ignored: frozenset[str]) -> None:
        self.path = os.path.join(task_dir, WARM_IMPORTS_FILE)
        self.before = set(sys.modules)
        self.ignored = ignored  # read later, or per attempt
        self.script_set: list[str] = []  # the first variable the script's own code set
        self.why = ""  # and where: said in the file
        self.done = False
        self.dirs = library_dirs()
        self.ours = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")
        self._by_library: dict[str, bool] = {}
        environ = type(os.environ)
        self._set, self._del = environ.__setitem__, environ.__delitem__
        recorder = self

        def __setitem__(env: Any, key: str, value: str) -> None:
            if key not in recorder.ignored and env.get(key) != value:
                recorder._written(key)
            recorder._set(env, key, value)

        def __delitem__(env: Any, key: str) -> None:
            if key not in recorder.ignored:
                recorder._written(key)
            recorder._del(env, key)

        environ.__setitem__ = __setitem__  # type: ignore[method-assign]
        environ.__delitem__ = __delitem__  # type: ignore[method-assign]

    def _written(self, key: str) -> None:
        """A variable changes: the script's doing, unless a library's or ours (the first frame
        past os.environ's own plumbing tells)."""
        if self.done or self.script_set:
            return
        frame = sys._getframe(2)
        while frame is not None and frame.f_globals.get("__name__") in _ENV_PLUMBING:
            frame = frame.f_back  # type: ignore[assignment]
        writer = frame.f_globals.get("__name__", "") if frame is not None else ""
        if not self._library(str(writer)):
            self.script_set = [key]
            self.why = f"{writer or 'code of the script'} sets {key}"

    def _library(self, name: str) -> bool:
        """Not the script's code: a loaded module without a file of its own (frozen, built in),
        one whose file lies in the library directories, or ours. Code of no loaded module
        (`exec` with globals of its own) counts as the script's."""
        known = self._by_library.get(name)
        if known is None:
            module = sys.modules.get(name)
            origin = _origin(module)
            if module is None:
                known = False
            else:
                known = origin is None or origin.startswith((*self.dirs, self.ours))
            self._by_library[name] = known
        return known

    def record(self) -> None:
        if self.done:
            return
        self.done = True
        environ = type(os.environ)
        environ.__setitem__ = self._set  # type: ignore[method-assign]
        environ.__delitem__ = self._del  # type: ignore[method-assign]
        names: list[str] = []
        if not self.script_set:
            # Of those imported ahead, the packages this trainer's imports named (the script
            # may have dropped one); then what it imported that the standby had not.
            used = import_env.ahead_used
            again = [n for n in imported if n.partition(".")[0] in used]
            new = [n for n, m in list(sys.modules.items())
                   if n not in self.before and _from_library(m, self.dirs)]  # fmt: skip
            names = valid([*again, *new])
        with contextlib.suppress(OSError):  # only a restart's speed depends on it
            write_json_atomic(self.path, {"modules": names, "not_recorded": self.why})


def read(task_dir: str) -> list[str]:
    """The task's last trainer's list ([] if none or unreadable: a trainer wrote it)."""
    try:
        with open(os.path.join(task_dir, WARM_IMPORTS_FILE), "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            return []
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):  # nesting deep enough for the parser
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
    for name in imported:
        origin = _origin(sys.modules.get(name))
        if origin is not None:
            with contextlib.suppress(OSError):
                stat = os.stat(origin)
                _files[origin] = (stat.st_mtime_ns, stat.st_size)


def shadowed(script_dir: str) -> str:
    """A package imported ahead that the script's own directory holds a module of the same
    name for (a cold start would import that one, first on its path): its name, or ''."""
    try:
        entries = set(os.listdir(script_dir))
    except OSError:
        return ""
    for root in sorted(roots(imported)):
        if {root, f"{root}.py"} & entries:
            return root
    return ""


def stale() -> str:
    """A file of a module imported ahead that changed since (a package upgraded while the
    standby waited): its path, or ''. The script must not run the old code."""
    for path, (mtime, size) in _files.items():
        try:
            stat = os.stat(path)
        except OSError:
            return path
        if (stat.st_mtime_ns, stat.st_size) != (mtime, size):
            return path
    return ""


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
