"""The agent's side of warm restarts (worker/warm/keeper.py is the keeper's): find the task's
keeper, activate its standby as this attempt's trainer, or start a keeper and have it prepare a
standby for the next attempt. Standard library only."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.warm.import_env import PER_JOB, import_relevant
from worker.warm.keeper import MAX_KEPT
from worker.warm.registry import (
    SPARE_SLOTS,
    kept_socket_path,
    parent_of,
    socket_path,
    spare_task,
)
from worker.warm.standby import ENV_STANDBY

KEEPER = str(Path(__file__).resolve().with_name("keeper.py"))
REPLY_TIMEOUT = 10.0
# A standby still importing TensorFlow is waited for this long at most: it is ahead of a cold
# start, which would import everything again beside it.
IMPORT_PATIENCE = 30.0
IMPORT_POLL = 0.2


def standby_env(trainer_env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in trainer_env.items() if k not in PER_JOB}


def _python_identity(python: str) -> list[str]:
    """What makes an interpreter the one it is: its binary (path, inode, mtime), the path it is
    called by and its venv (a venv's python is a link to the base one), and, when it is this
    agent's own, where its TensorFlow is (found, not imported) and when that was installed."""
    identity = [os.path.abspath(python)]
    for path in (os.path.realpath(python),
                 os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(python))),
                              "pyvenv.cfg")):  # fmt: skip
        try:
            stat = os.stat(path)
            identity.append(f"{path}:{stat.st_ino}:{stat.st_mtime_ns}")
        except OSError:
            identity.append(path)
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        try:
            spec = importlib.util.find_spec("tensorflow")
            origin = spec.origin if spec and spec.origin else ""
            stat = os.stat(origin)
            identity.append(f"{origin}:{stat.st_ino}:{stat.st_mtime_ns}")
        except (OSError, ImportError, ValueError):
            pass
    return identity


def fingerprint(
    trainer_env: dict[str, str], python: str, user_env: dict[str, str], image: str = ""
) -> str:
    """What a standby was made under: Python (_python_identity, or the image's by name), this
    worker package and the variables that shape the import. A standby whose fingerprint
    differs is never used."""
    relevant = {
        k: v for k, v in standby_env(trainer_env).items() if k in user_env or import_relevant(k)
    }
    identity = [image, python] if image else _python_identity(python)
    blob = json.dumps([identity, KEEPER, sorted(relevant.items())])
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class KeeperLink:
    """A connection to the task's keeper: requests and their replies in order, plus what the
    keeper says unasked (a standby ready, the warm trainer's exit)."""

    def __init__(self, sock: socket.socket, on_standby: Callable[[int, int], None]) -> None:
        self.sock = sock
        self.on_standby = on_standby
        self.replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self.exit_code: int | None = None
        self.exited = threading.Event()
        self.lost = threading.Event()
        self.keeper_pid = 0
        self.closed = False
        self.import_waited = 0.0  # seconds an activation waited for the standby's import
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def connect(
        cls, path: str, on_standby: Callable[[int, int], None]
    ) -> tuple[KeeperLink | None, str]:
        """The link to the keeper at `path`, verified before anything is sent; (None, '') when
        no keeper listens, (None, why) when one is not to be trusted."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            return None, ""
        problem = _not_our_keeper(sock)
        if problem:
            sock.close()
            return None, problem
        link = cls(sock, on_standby)
        link.keeper_pid = _peer(sock)[0]
        return link, ""

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self.lost.set()
                self.exited.set()  # nothing more will come: a warm trainer counts as gone
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                    if not isinstance(message, dict):
                        raise ValueError("not an object")
                    if "exit" in message:
                        self.exit_code = int(message["exit"])
                        self.exited.set()
                    elif "standby" in message:
                        self.on_standby(int(message["standby"]), int(message.get("rss", 0)))
                    else:
                        self.replies.put(message)
                except (ValueError, TypeError):  # garbage from the keeper: the link is lost
                    data = b""
                    break
            if not data:
                self.lost.set()
                self.exited.set()
                return

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            return {"ok": False, "reason": f"the keeper did not answer ({exc})"}
        deadline = time.monotonic() + REPLY_TIMEOUT
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                return self.replies.get(timeout=0.05)
            if self.lost.is_set():  # closed: serving another agent, or gone
                break
        return {"ok": False, "reason": "the keeper did not answer"}

    def activate(
        self, order: dict[str, Any], give_up: threading.Event | None = None
    ) -> tuple[WarmTrainer | None, str]:
        """Have the keeper run this attempt's trainer in its standby: (the trainer, '') or
        (None, why the start is cold). A standby still importing is asked again until it is
        ready (IMPORT_PATIENCE at most, or until `give_up` is set). A pid the keeper names is
        verified before it becomes a trainer; one that fails the check closes this link (the
        keeper is not trusted)."""
        began = time.monotonic()
        deadline, asked = began + IMPORT_PATIENCE, 0
        while True:
            reply, asked = self.request({"op": "activate", **order}), asked + 1
            waiting = reply.get("importing") is True and time.monotonic() < deadline
            if not waiting or (give_up is not None and give_up.wait(IMPORT_POLL)):
                break
            if give_up is None:
                time.sleep(IMPORT_POLL)
        if not reply.get("ok"):
            return None, str(reply.get("reason", "no standby"))[:200]
        pid = reply.get("pid")
        problem = verify_trainer(pid, self.keeper_pid)
        if problem:  # never signalled, never recorded
            self.close()
            return None, problem
        self.import_waited = time.monotonic() - began if asked > 1 else 0.0
        try:
            return WarmTrainer(int(pid), self), ""  # type: ignore[arg-type]
        except OSError as exc:
            self.close()
            return None, f"the standby is gone ({exc})"

    def close(self) -> None:
        self.closed = True
        # shutdown first: the reader thread's pending recv would keep a bare close() from
        # reaching the keeper.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


def warm_start(
    job_id: str,
    task_index: int,
    order: dict[str, Any],
    on_standby: Callable[[int, int], None],
    keep: bool,
    give_up: threading.Event | None = None,
    tasks: int = 0,
) -> tuple[WarmTrainer | None, KeeperLink | None, str]:
    """This attempt's trainer from the task's own keeper or, when it has none here (it moved
    to this host), from one this host keeps as the job's spare, or the keeper of another of
    the job's `tasks` that moved away, or (`keep`) one kept from this user's last job under the
    same fingerprint: (the trainer, the keeper, ''), or (None, the task's own keeper if any,
    why the start is cold; '' when there was no keeper to ask)."""
    try:
        own = socket_path(job_id, task_index)
        spares = [socket_path(job_id, spare_task(n)) for n in range(SPARE_SLOTS)]
        others = [socket_path(job_id, n) for n in range(tasks) if n != task_index]
        kept = [kept_socket_path(order["fingerprint"], n) for n in range(MAX_KEPT)] if keep else []
    except OSError as exc:
        return None, None, f"no private directory for the keeper's socket: {exc}"
    why = ""
    for path in [own, *spares, *others, *kept]:
        link, problem = KeeperLink.connect(path, on_standby)
        if link is None:
            if problem and path == own:
                return None, None, problem
            why = problem or why
            continue
        trainer, problem = link.activate(order, give_up)
        if trainer is not None:
            return trainer, link, ""
        if path == own:  # the task's keeper: kept to prepare the next attempt's standby
            return None, None if link.closed else link, problem
        link.close()  # a kept one busy with another task, or not ready: the next one
        why = problem
    return None, None, why


def _peer(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a unix socket, from the kernel."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0")[:-1]]
    except OSError:
        return []


def _not_our_keeper(sock: socket.socket) -> str:
    """'' when the process serving the socket is a keeper of this user's, from this copy of the
    worker package (the socket is in our private directory: nobody else could bind it)."""
    pid, uid = _peer(sock)
    if uid != os.getuid():
        return f"the keeper's socket is served by uid {uid}, not by us"
    argv = _argv(pid)
    ours = len(argv) >= 2 and os.path.realpath(argv[1]) == KEEPER
    return "" if ours else f"the keeper's socket is served by pid {pid}, not a keeper of ours"


def _environ(pid: int, patience: float = 2.0) -> list[bytes] | None:
    """The environment `pid` was started with; None when it is gone. A standby that starts over
    cold (bootstrap's exec) shows none for a moment in the middle of its exec: the kernel has
    its new memory but not yet its environment's place in it. Only then is it read again."""
    deadline = time.monotonic() + patience
    while True:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
        except OSError:
            return None
        if environ != [b""] or time.monotonic() > deadline:
            return environ
        time.sleep(0.01)


def verify_trainer(pid: object, keeper_pid: int) -> str:
    """'' when `pid`, as the keeper named it, is the keeper's child and a standby (one it made):
    the only pid the agent will signal. A pid told by another process is a claim, not a fact."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return f"the keeper named pid {pid!r}"
    parent = parent_of(pid)
    environ = _environ(pid)
    if not parent or environ is None:
        return f"the keeper named pid {pid}, which is gone"
    if parent != keeper_pid:
        return f"the keeper named pid {pid}, which is not its child"
    if f"{ENV_STANDBY}=1".encode() not in environ:
        return f"the keeper named pid {pid}, which is not a standby"
    return ""


class WarmTrainer:
    """A trainer that was a standby: the keeper's child, not ours. Popen's surface, as far as
    the agent uses it; the exit status comes from the keeper."""

    def __init__(self, pid: int, link: KeeperLink) -> None:
        """`pid` was verified (verify_trainer); a pidfd taken now keeps it that process: a
        signal never reaches another that reuses the number."""
        self.pid = pid
        self.link = link
        self.returncode: int | None = None
        self.pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None and self.link.exited.is_set():
            self.returncode = self.link.exit_code if self.link.exit_code is not None else 137
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self.link.exited.wait(REPLY_TIMEOUT if timeout is None else timeout):
            raise subprocess.TimeoutExpired("warm trainer", timeout or REPLY_TIMEOUT)
        return self.poll()  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.pidfd, signum)

    def kill(self) -> None:
        self.send_signal(9)
