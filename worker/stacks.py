"""The Python stacks of a task, taken before a hung or late group is stopped (the evidence
would go with it). The supervisor asks the agent (SIGUSR1, checked by identity); the agent takes
them with py-spy where the host has it, else through the handler the bootstrap installed in the
trainer: `faulthandler` on SIGUSR2, every thread, into the task's stacks file. Standard library
only: this runs on the hosts."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import IO

from worker.proctl import is_job_process, is_stopped

ASK_AGENT = signal.SIGUSR1  # the supervisor to the agent: take the stacks now
ASK_TRAINER = signal.SIGUSR2  # the agent to the trainer: faulthandler writes them
SETTLE = 3.0  # seconds the agent waits for the trainer's dump to be written
_held: list[IO[str]] = []  # faulthandler writes to a file kept open for the process's life


def stacks_path(task_dir: str | PurePath, attempt: int | str) -> Path:
    return Path(task_dir) / f"stacks-attempt-{attempt}.txt"


def done_path(task_dir: str | PurePath, attempt: int | str) -> Path:
    """Written by the agent once the stacks are taken: the line it logged."""
    return Path(task_dir) / f"stacks-attempt-{attempt}.done"


def install_in_trainer(task_dir: str | None, attempt: str | None) -> None:
    """In the trainer (the bootstrap): SIGUSR2 writes every thread's stack to the task's
    stacks file. Its existence tells the agent the handler is there."""
    if not task_dir or attempt is None:
        return
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        out = open(stacks_path(task_dir, attempt), "w")  # noqa: SIM115 - held open on purpose
        faulthandler.register(ASK_TRAINER, file=out, all_threads=True, chain=False)
        _held.append(out)


def take(trainer_pid: int, path: Path, job_id: str) -> str:
    """The trainer's stacks into `path`; what was done, as a line for the task's log. Right
    before each look at the pid, and before the signal: is it still a live process of this job
    (> 1, not a zombie, the job's id in its environment), not a pid reused since?"""

    def is_ours() -> bool:
        return is_job_process(trainer_pid, job_id)

    if not is_ours():
        return "no Python stacks: the trainer is gone"
    spy = shutil.which("py-spy")
    for native in (["--native"], []) if spy else ():  # native frames too, where it can
        try:
            argv = [str(spy), "dump", "--full-filenames", *native, "--pid", str(trainer_pid)]
            done = subprocess.run(argv, capture_output=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout:
            path.write_bytes(done.stdout)
            return f"Python stacks of every thread (py-spy) before the stop: {path}"
    if not path.exists():  # no handler in this trainer: a signal would end it
        return "no Python stacks: py-spy is not on this host and the trainer has no handler"
    if is_stopped(trainer_pid):  # its handler cannot run: waiting for it would only delay the stop
        return "no Python stacks: the trainer is stopped (SIGSTOP or a debugger)"
    before = path.stat().st_size
    if not is_ours():
        return "no Python stacks: the trainer is gone"
    try:
        os.kill(trainer_pid, ASK_TRAINER)
    except OSError as exc:
        return f"no Python stacks: {exc}"
    deadline, size = time.monotonic() + SETTLE, before
    while time.monotonic() < deadline:  # written once it stops growing
        time.sleep(0.2)
        now = path.stat().st_size
        if now > before and now == size:
            return f"Python stacks of every thread before the stop: {path}"
        size = now
    return f"Python stacks of every thread before the stop (maybe cut short): {path}"


# --- reading them (the coordinator) ------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def short(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line} {self.function}"


_FAULTHANDLER = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_PYSPY = re.compile(r"^\s+(\S.*) \((.*):(\d+)\)$")


def threads(text: str) -> list[list[Frame]]:
    """Each thread's frames, innermost first (faulthandler's or py-spy's dump)."""
    found: list[list[Frame]] = []
    for line in text.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            found.append([])
        elif found and (m := _FAULTHANDLER.match(line)):
            found[-1].append(Frame(m.group(1), int(m.group(2)), m.group(3)))
        elif found and (m := _PYSPY.match(line)):
            found[-1].append(Frame(m.group(2), int(m.group(3)), m.group(1)))
    return [t for t in found if t]


def where(text: str, roots: list[str]) -> str | None:
    """Where a dump shows the task: its own code's innermost frame, else what the dump says
    instead (garbage collection, native code); None for an empty dump."""
    frame = own_frame(text, roots)
    if frame is not None:
        return frame.short()
    if "Garbage-collecting" in text or "gc_collect_main" in text:
        return "garbage collection (no Python frame)"
    if text.strip():
        stacks = threads(text)
        return f"library code ({stacks[0][0].short()})" if stacks else "native code (no frame)"
    return None


def own_frame(text: str, roots: list[str]) -> Frame | None:
    """The innermost frame of the script's own code (a file under one of `roots`, not an
    installed package), in the thread that runs the script (its `<module>` frame) first."""
    stacks = threads(text)

    def own(frame: Frame) -> bool:
        path = frame.file
        if "site-packages" in path or "dist-packages" in path:
            return False
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

    main = [t for t in stacks if any(f.function == "<module>" and own(f) for f in t)]
    for frames in main + stacks:
        for frame in frames:
            if own(frame):
                return frame
    return None
