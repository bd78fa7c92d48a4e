"""Run a training entrypoint, unmodified, with orchestrate's instrumentation inside it:

    python .../worker/bootstrap.py SCRIPT [ARG...]
    python .../worker/bootstrap.py -m MODULE [ARG...]

The agent starts every trainer this way (unless `[entrypoint] instrument = false`). The script
sees what `python SCRIPT ARG...` (or `python -m MODULE ARG...`) would show it: `sys.argv`,
`__main__` and its `__file__`, `sys.path[0]`, stdin, signal handlers, the exit code, and
exceptions with their tracebacks (our frames taken out). Only `sys.orig_argv` tells.

Started by path, not with -m, so it works from any working directory; it then imports only the
standard library and its own package before the script runs, and reports STARTING at once (the
interpreter is up; TensorFlow may take seconds to import).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # Run by path: sys.path[0] is this package's directory; import the package from its parent.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import atexit
import builtins
import contextlib
import importlib.machinery
import runpy
import signal
import types
from types import TracebackType
from typing import Any

from worker import progress, stacks
from worker.instrument import Instrumentation
from worker.spec import ENV_ATTEMPT, ENV_TASK_DIR, Phase
from worker.warm import import_env, imports_ahead
from worker.warm.standby import ENV_STANDBY

_OUR_FILES = frozenset(
    os.path.normcase(os.path.abspath(f))
    for f in (__file__, sys.modules["worker.instrument"].__file__ or "")
)


def _parse(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """(module, script, args) from this bootstrap's own arguments."""
    if argv[:1] == ["-m"] and len(argv) >= 2:
        return argv[1], None, argv[2:]
    if argv and not argv[0].startswith("-"):
        return None, argv[0], argv[1:]
    raise SystemExit("usage: bootstrap.py (SCRIPT | -m MODULE) [ARG...]")


def _script_dir(script: str) -> str:
    # As the interpreter does: the directory of the script, its own symlink followed.
    return os.path.dirname(os.path.realpath(script))


def _fresh_main() -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    return main


def _our_frame(tb: TracebackType) -> bool:
    name = tb.tb_frame.f_code.co_filename
    return os.path.normcase(os.path.abspath(name)) in _OUR_FILES


def _without_our_frames(tb: TracebackType | None) -> TracebackType | None:
    frames = []
    while tb is not None:
        if not _our_frame(tb):
            frames.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for frame in reversed(frames):
        rebuilt = TracebackType(rebuilt, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return rebuilt


def _run_script(path: str, args: list[str]) -> None:
    main = _fresh_main()
    # As the interpreter does: joined to the working directory, not normalised ('..' stays).
    absolute = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    if os.path.isdir(path) or not os.path.isfile(path):  # a directory or zip with __main__.py
        sys.argv = [path, *args]
        runpy.run_path(path, run_name="__main__")
        return
    main.__file__ = absolute
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", absolute)
    main.__spec__ = None
    main.__package__ = None
    sys.argv = [path, *args]
    with open(absolute, "rb") as source:  # compile() honours a coding cookie in the bytes
        code = compile(source.read(), absolute, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _run_module(name: str, args: list[str]) -> None:
    _fresh_main()
    sys.argv = ["-m", *args]
    # What `python -m` itself calls: it finds the module, sets sys.argv[0] to its file and
    # runs it in __main__'s namespace (its two frames show in tracebacks there too).
    runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]


def _forget_our_package_if_shadowed() -> None:
    """A script whose own directory holds a `worker` module must import that one, as it would
    without us: forget ours (the hooks keep what they need)."""
    ours = os.path.realpath(sys.modules["worker"].__file__ or "")
    found = importlib.machinery.PathFinder.find_spec("worker", sys.path)
    if found is not None and os.path.realpath(found.origin or "") != ours:
        for name in [n for n in sys.modules if n == "worker" or n.startswith("worker.")]:
            del sys.modules[name]


def _die_as_the_interpreter_would(exc: BaseException) -> None:
    # The default hook prints the exception's own __traceback__, whatever it is passed.
    trimmed = _without_our_frames(exc.__traceback__)
    sys.excepthook(type(exc), exc.with_traceback(trimmed), trimmed)
    if isinstance(exc, KeyboardInterrupt):  # exit by SIGINT, as CPython does
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(1)


def main() -> None:
    module, script, args = _parse(sys.argv[1:])
    # Set only by _start_cold, for the agent's check of /proc/PID/environ (which keeps it):
    # the script and its children see the environment a cold start has.
    os.environ.pop(ENV_STANDBY, None)
    if os.environ.get("ORCHESTRATE_AGENT_PID"):  # in an image: the agent is not our parent
        from worker.container import die_with_agent

        die_with_agent()
    stacks.install_in_trainer(os.environ.get(ENV_TASK_DIR), os.environ.get(ENV_ATTEMPT))
    writer = progress.shared()
    writer.phase(Phase.STARTING)
    global _recorder
    task_dir = os.environ.get(ENV_TASK_DIR)
    if task_dir and os.environ.get(imports_ahead.ENV_RECORD_IMPORTS) == "1":
        _recorder = imports_ahead.Recorder(task_dir, import_env.READ_LATER | import_env.PER_JOB)
    writer.before_training = _training_begins
    instrumentation = Instrumentation(writer)
    instrumentation.finder().install()
    atexit.register(instrumentation.stop)
    sys.path[0] = os.getcwd() if module is not None else _script_dir(script or "")
    _forget_our_package_if_shadowed()
    try:
        if module is not None:
            _run_module(module, args)
        else:
            _run_script(script or "", args)
    except SystemExit:
        raise
    except BaseException as exc:
        _die_as_the_interpreter_would(exc)


def _may_leave_idle() -> bool:
    """Whether this process may go back from SCHED_IDLE to the normal policy: root (or
    CAP_SYS_NICE, not checked), or an RLIMIT_NICE that allows nice 0. Otherwise the kernel
    refuses, and a trainer would be left at idle priority: the standby then imports at normal
    priority instead."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 20


def _scheduling(idle: bool) -> None:
    """The standby imports at idle priority, beside a trainer that wants the CPU; activated,
    every thread it has goes back to the normal policy."""
    if not _may_leave_idle():
        return
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    threads = [0] if idle else [int(t) for t in os.listdir("/proc/self/task")]
    for tid in threads:
        # Not permitted here: the standby just competes at normal priority.
        with contextlib.suppress(OSError):
            os.sched_setscheduler(tid, policy, os.sched_param(0))


def standby(control_fd: int) -> None:
    """A warm standby (worker/warm/keeper.py): import TensorFlow (and tf-keras) under the task's
    environment, no user code; say ready; wait for the activation; then start the entrypoint
    exactly as a cold start does, with the activation's environment, directory and log."""
    import json
    import socket

    control = socket.socket(fileno=control_fd)
    _scheduling(idle=True)
    initial = dict(os.environ)
    import tensorflow  # noqa: F401

    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        with contextlib.suppress(ImportError):
            import tf_keras  # noqa: F401
    ahead = os.environ.pop(imports_ahead.ENV_WARM_IMPORTS, "")
    imports_ahead.import_ahead(ahead.split(",") if ahead else [])
    # What the imports set themselves (TensorFlow sets TF2_BEHAVIOR...): a cold trainer has
    # them after the same imports, so the activation's environment gets them too.
    imports_set = {k: v for k, v in os.environ.items() if initial.get(k) != v}
    control.sendall(b"ready\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = control.recv(1 << 16)
        if not chunk:  # the keeper is gone: so are we, never having run anything
            os._exit(0)
        data += chunk
    control.close()
    order = json.loads(data)
    _scheduling(idle=False)
    os.environ.clear()
    os.environ.update(order["env"])
    os.environ.update({k: v for k, v in imports_set.items() if k not in order["env"]})
    os.chdir(order["cwd"])
    log = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.argv = [sys.argv[0], *order["target"]]
    target = order["target"]
    script_dir = os.getcwd() if target[:1] == ["-m"] else _script_dir(target[0])
    # Upgraded while the standby waited, or shadowed by a module of the script's own: the
    # script must get what a cold start would import.
    changed = imports_ahead.stale() or imports_ahead.shadowed(script_dir)
    if changed:
        print(f"orchestrate: {changed} is not what this warm standby imported ahead: starting "
              "over cold", file=sys.stderr, flush=True)  # fmt: skip
        _exec_cold(order, {})
    import_env.watch(dict(os.environ), lambda names, library: _start_cold(names, order, library),
                     imports_ahead.roots(imports_ahead.imported), _script_set)  # fmt: skip
    main()


_recorder: imports_ahead.Recorder | None = None


def _script_set() -> list[str]:
    return _recorder.script_set if _recorder is not None else []


def _training_begins() -> None:
    """Before TRAINING is first written: no start over cold past this; the record for the
    task's next standby."""
    import_env.stop_watching()
    if _recorder is not None:
        _recorder.record()


def _start_cold(names: list[str], order: dict[str, Any], library: bool) -> None:
    """The script set an import-time variable itself (worker.warm.import_env): become a fresh
    interpreter running it cold, as the agent would have started it (same pid, same log).
    `library`: before importing a library the standby imported ahead (not TensorFlow): the
    cold run records no imports ahead, and the task's next attempts may start warm."""
    what = "a library this warm trainer had imported ahead" if library else "TensorFlow"
    if progress.shared().current.phase not in (Phase.NONE, Phase.STARTING, Phase.IMPORTED):
        # Past the strategy's rendezvous a restart would cost the peers theirs: warn only.
        late = f"orchestrate: the script set {', '.join(names)} before importing {what}, "
        print(late + "after this warm trainer had; it goes on warm", file=sys.stderr, flush=True)
        return
    if library:
        print(f"orchestrate: the script sets {', '.join(names)} before importing {what}: "
              "starting over cold", file=sys.stderr, flush=True)  # fmt: skip
        _exec_cold(order, {})
        return
    import_env.mark_undone(names)
    if not _exec_cold(order, {import_env.ENV_UNDONE: ",".join(names)}):
        with contextlib.suppress(OSError):  # the task's next attempts may be warm again
            os.unlink(os.path.join(os.environ.get(ENV_TASK_DIR, ""), import_env.UNDONE_FILE))


def _exec_cold(order: dict[str, Any], extra: dict[str, str]) -> bool:
    """Become a fresh interpreter running the entrypoint (same pid, same log). Returns only
    if that failed (False: it goes on warm, saying so)."""
    sys.stdout.flush()
    # Still the keeper's standby child to the agent, which may check it after this exec.
    env = {**order["env"], ENV_STANDBY: "1", **extra}
    argv = [sys.executable, os.path.abspath(__file__), *order["target"]]
    try:
        os.execve(sys.executable, argv, env)
    except OSError as exc:
        print(f"orchestrate: could not start over cold ({exc}): it goes on warm",
              file=sys.stderr, flush=True)  # fmt: skip
        return False
    return True  # only where execve is a stand-in


if __name__ == "__main__":
    if sys.argv[1:2] == ["--standby"]:
        standby(int(sys.argv[2]))
    else:
        main()
