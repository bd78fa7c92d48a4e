"""The agent's side of warm restarts (worker/standby.py is the keeper's): find the task's keeper,
activate its standby as this attempt's trainer, or start a keeper and have it prepare a standby
for the next attempt. Standard library only."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.spec import ENV_ATTEMPT

STANDBY = str(Path(__file__).resolve().with_name("standby.py"))
# What differs between attempts and is given only at activation.
_PER_ATTEMPT = frozenset({"TF_CONFIG", ENV_ATTEMPT})
# Inherited variables that change what importing TensorFlow does; the rest (SSH_CLIENT, ...)
# may differ from one agent to the next without making a standby stale.
_IMPORT_PREFIXES = ("PATH", "LD_", "PYTHON", "CUDA", "TF_", "XLA", "OMP_", "MKL", "NCCL",
                    "KMP_", "VIRTUAL_ENV", "ORCHESTRATE_")  # fmt: skip
STANDBY_ESTIMATE = 800 << 20  # bytes a standby needs, about (TensorFlow and tf-keras imported)
REPLY_TIMEOUT = 10.0


def standby_env(trainer_env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in trainer_env.items() if k not in _PER_ATTEMPT}


def fingerprint(trainer_env: dict[str, str], python: str, user_env: dict[str, str]) -> str:
    """What a standby was made under: Python (its file, as it is now) and the variables that
    shape the import. A standby whose fingerprint differs is replaced, never used."""
    try:
        stat = os.stat(os.path.realpath(python))
        binary = f"{os.path.realpath(python)}:{stat.st_ino}:{stat.st_mtime_ns}"
    except OSError:
        binary = python
    relevant = {
        k: v
        for k, v in standby_env(trainer_env).items()
        if k in user_env or k.startswith(_IMPORT_PREFIXES)
    }
    blob = json.dumps([binary, sorted(relevant.items())])
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def memory_available() -> tuple[int, int]:
    """(MemAvailable, MemTotal) in bytes; (0, 0) when unknown."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return values.get("MemAvailable", 0), values.get("MemTotal", 0)


def room_for_standby() -> str:
    """'' when this host has memory to spare for a standby, else why not."""
    available, total = memory_available()
    if not total:
        return ""
    if available - STANDBY_ESTIMATE < total // 10:
        return (
            f"{available >> 20} MB available, a standby takes about {STANDBY_ESTIMATE >> 20} MB "
            "and 10% of memory is kept free"
        )
    return ""


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
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def connect(cls, name: str, on_standby: Callable[[int, int], None]) -> KeeperLink | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(name)
        except OSError:
            sock.close()
            return None
        return cls(sock, on_standby)

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
                message = json.loads(line)
                if "exit" in message:
                    self.exit_code = int(message["exit"])
                    self.exited.set()
                elif "standby" in message:
                    self.on_standby(int(message["standby"]), int(message.get("rss", 0)))
                else:
                    self.replies.put(message)

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
            return self.replies.get(timeout=REPLY_TIMEOUT)
        except (OSError, queue.Empty) as exc:
            return {"ok": False, "reason": f"the keeper did not answer ({exc})"}

    def close(self) -> None:
        # shutdown first: the reader thread's pending recv would keep a bare close() from
        # reaching the keeper.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


def start_keeper(name: str, job_id: str, task_index: int, linger: float, log: str,
                 on_standby: Callable[[int, int], None]) -> KeeperLink | None:  # fmt: skip
    """Start the task's keeper (its own session: it outlives this agent) and connect to it."""
    with open(log, "ab") as out:
        subprocess.Popen(
            [sys.executable, STANDBY, job_id, str(task_index), str(linger), log],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        link = KeeperLink.connect(name, on_standby)
        if link is not None:
            return link
        time.sleep(0.05)
    return None


class WarmTrainer:
    """A trainer that was a standby: the keeper's child, not ours. Popen's surface, as far as
    the agent uses it; the exit status comes from the keeper."""

    def __init__(self, pid: int, link: KeeperLink) -> None:
        self.pid = pid
        self.link = link
        self.returncode: int | None = None

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
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(9)
