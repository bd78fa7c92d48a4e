"""Warm standby trainers: `python .../worker/warm/keeper.py JOB_ID TASK_INDEX LINGER LOG KEEP
KEEP_BYTES [--in-image]`.

A restart costs a new interpreter and a TensorFlow import (seconds) before the user's script
even starts. The keeper, one per task per host, holds a standby interpreter that has imported
TensorFlow (`bootstrap.py --standby`: no user code) and waits; the next attempt's agent asks the
keeper to activate it with the new TF_CONFIG, and the standby runs the entrypoint through the
same bootstrap as a cold start.

Why a keeper: the agent of an attempt is stopped with its process group at a restart, so it
cannot be the standby's parent across attempts; the keeper is (own session), knows the
trainer's exact exit status, and passes it to the agent that activated it. The keeper keeps the
agent's promises: a trainer never outlives the agent that runs it (the agent's connection
closes: the trainer is killed), and nothing outlives the job (no agent for LINGER seconds: the
keeper ends its standby and exits; the supervisor also sweeps the job's processes at the end).

Agents find the keeper by a unix socket file named for the job and task, in this user's private
directory on the host's own disk (worker/private_dir.py: 0700, ours, checked): another user can
neither bind the name first nor connect to it. (An abstract socket name would be open to every
user of the network namespace: the first to bind it wins.) Each side checks the other with
SO_PEERCRED: the keeper serves only this user; the agent speaks only to this task's keeper
(this user, and a process whose arguments are `keeper.py JOB TASK`), and sends nothing before.
JSON lines, agent -> keeper:
  {"op": "prepare", "fingerprint": F, "env": {...}, "python": P}  start a standby (if none, or
      replace one whose fingerprint differs); the keeper answers {"ok": true} at once and
      later {"standby": PID, "rss": BYTES} once the standby has imported TensorFlow
  {"op": "activate", "fingerprint": F, "env": {...}, "target": [...], "cwd": D, "log": L}
      -> {"ok": true, "pid": PID} (the standby is now this agent's trainer) or
         {"ok": false, "reason": "..."} (the agent starts a cold trainer)
keeper -> agent: {"exit": CODE} when the trainer ended (128+N for signal N).
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import Any

if not __package__:  # run as a file (python .../worker/warm/keeper.py): import as a package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from worker.warm import imports_ahead, registry
from worker.warm.registry import NameTaken, bind_socket, kept_socket_path, socket_path
from worker.warm.standby import Child, rss_bytes

READY = b"ready\n"
MAX_STANDBY_DEATHS = 3
MAX_KEPT = 64  # standbys kept for one environment on one host
KEPT_ESTIMATE = 600 << 20  # what a standby still importing will hold, about


def _say(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"[orchestrate] keeper: {message}", file=sys.stderr, flush=True)


class Keeper:
    def __init__(self, job_id: str, task_index: int, linger: float, log: str, keep: float,
                 keep_bytes: int, image_env: dict[str, str] | None = None) -> None:  # fmt: skip
        # In an image (worker/container.py): the image's own environment (PATH, HOME), which
        # each environment an agent sends completes, as a cold start in the image gets it.
        self.image_env = image_env or {}
        self.job_id = job_id
        self.task_index = task_index
        self.linger = linger
        self.log = log
        self.keep = keep  # seconds a standby is kept for the next job (0: never)
        self.keep_bytes = keep_bytes  # the most memory this user's kept standbys here may hold
        self.kept_until: float | None = None  # kept for the next job until then (monotonic)
        self.socket = socket_path(job_id, task_index)
        self.server = bind_socket(self.socket)
        self.server.listen(4)
        self.agent: socket.socket | None = None
        self.agent_buffer = b""
        self.standby: Child | None = None
        self.trainer: Child | None = None
        self.alone_since: float | None = None  # no agent connected since then
        self.prepared: dict[str, Any] | None = None  # the latest prepare request
        self.deaths = 0  # standbys that died while waiting
        self.ending = False  # told to stop while a trainer ran: once it has ended

    def on_stop_signal(self, signum: int, frame: object) -> None:
        """SIGTERM: the end of the job, or on Slurm any SIGTERM to the job's steps (a
        preemption, the time limit). A running trainer is its agent's, which has the same
        signal and waits out its checkpoint: the keeper ends only after it, and tells the
        agent how it ended (killed here, a preemption's checkpoint would be lost)."""
        self.ending = True
        if self.trainer is None:
            raise SystemExit(0)  # main() ends the standby

    def record(self) -> None:
        standby = self.standby
        registry.record(registry.KeeperEntry(
            pid=os.getpid(), host=registry.this_host(),
            job="" if self.kept_until is not None else self.job_id, task=self.task_index,
            state="kept" if self.kept_until is not None else "serving",
            fingerprint=standby.fingerprint if standby else "",
            standby=standby.proc.pid if standby else 0,
            standby_ready=bool(standby and standby.ready),
            trainer=self.trainer.proc.pid if self.trainer else 0,
            rss=self._standby_size(),
            kept_left=0.0, kept_until=self.kept_until or 0.0, socket=self.socket,
        ))  # fmt: skip

    def _standby_size(self) -> int:
        """What the standby holds, or will once it has imported TensorFlow."""
        standby = self.standby
        if standby is None:
            return 0
        return max(rss_bytes(standby.proc.pid), 0 if standby.ready else KEPT_ESTIMATE)

    def _rebind(self, path: str) -> bool:
        """Listen at `path` instead (kept: a name the next job finds by fingerprint; adopted:
        the new job's task name); False when that name is served already."""
        try:
            server = bind_socket(path)
        except OSError:
            return False
        server.listen(4)
        with contextlib.suppress(OSError):  # before the close: nobody can take the name between
            os.unlink(self.socket)
        self.server.close()
        self.server, self.socket = server, path
        return True

    def _keep_or_end(self) -> bool:
        """The job is over (released, or no agent for `linger`): keep the standby for the next
        job of this user, Python and environment, within the time and memory budget; False:
        end (the caller ends the standby)."""
        standby = self.standby
        if self.keep <= 0 or standby is None or standby.proc.poll() is not None:
            return False
        if self.kept_until is not None:  # kept already
            return True
        size = self._standby_size()
        available, total = registry.memory_available()
        with registry.budget_lock():
            held = registry.kept_bytes(but=os.getpid())
            if held + size > self.keep_bytes:
                _say(f"not kept: {(held + size) >> 20} MB would pass the budget "
                     f"({self.keep_bytes >> 20} MB)")  # fmt: skip
                return False
            if total and available < total // 10:
                _say(f"not kept: {available >> 20} MB available; 10% of memory is kept free")
                return False
            for n in range(MAX_KEPT):
                if self._rebind(kept_socket_path(standby.fingerprint, n)):
                    break
            else:
                return False
            self.kept_until = time.monotonic() + self.keep
            self.record()
        _say(f"standby {standby.proc.pid} kept for the next job, {self.keep:g}s at most")
        return True

    def _send(self, message: dict[str, Any]) -> None:
        if self.agent is not None:
            try:
                self.agent.sendall(json.dumps(message).encode() + b"\n")
            except OSError:
                self._agent_gone()

    def _agent_gone(self) -> None:
        if self.agent is not None:
            self.agent.close()
        self.agent = None
        self.agent_buffer = b""
        self.alone_since = time.monotonic()
        if self.trainer is not None:  # the trainer never outlives its agent
            self.trainer.kill()
            self.trainer = None

    def _accept(self) -> None:
        conn, _ = self.server.accept()
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid() or self.agent is not None:  # another user, or a second agent
            conn.close()
            return
        self.agent = conn
        self.alone_since = None

    def _prepare(self, request: dict[str, Any]) -> dict[str, Any]:
        self.prepared = request
        imports = imports_ahead.valid(request.get("imports") or [])
        if self.standby is not None and (
            self.standby.fingerprint != request["fingerprint"]
            or self.standby.proc.poll() is not None
            # A spare's first standby is made before any trainer recorded its imports.
            or (self.task_index < 0 and self.standby.imports != imports)
        ):
            self.standby.kill()  # another environment, or it died: replaced, never used
            self.standby = None
        self.log = str(request.get("log", self.log))  # the task's (of the job it serves now)
        if self.standby is None:
            try:
                self.standby = Child(request["python"], self._env(request), request["fingerprint"],
                                     self.log, imports)  # fmt: skip
            except OSError:  # the list too long for this host's exec limits: without it
                if not imports:
                    raise
                self.standby = Child(request["python"], self._env(request), request["fingerprint"],
                                     self.log, [])  # fmt: skip
                self.standby.imports = imports  # asked for: not asked again
        return {"ok": True}

    def _env(self, request: dict[str, Any]) -> dict[str, str]:
        return {**self.image_env, **request["env"]}

    def _replace_dead_standby(self) -> None:
        """A standby that died while waiting is replaced (a few times: one that cannot import
        TensorFlow would only die again), never used."""
        assert self.standby is not None
        self.standby.proc.wait()
        self.standby.close()
        was_ready, self.standby = self.standby.ready, None
        self.deaths += 1
        self.record()
        if self.kept_until is not None:  # kept: nobody to prepare it for
            return
        if self.prepared is not None and self.deaths <= MAX_STANDBY_DEATHS:
            # One that died while importing goes without the libraries imported ahead: one of
            # them may be what killed it. One that was ready had imported them all.
            imports = self.prepared.get("imports") if was_ready else []
            self._prepare({**self.prepared, "imports": imports})

    def _activate(self, request: dict[str, Any]) -> dict[str, Any]:
        standby = self.standby
        if self.trainer is not None:
            return {"ok": False, "reason": "the previous trainer is still running"}
        if standby is None:
            return {"ok": False, "reason": "no standby"}
        if standby.proc.poll() is not None:
            self.standby = None
            standby.close()
            return {"ok": False, "reason": f"the standby died (exit {standby.proc.returncode})"}
        job_id, task_index = str(request["job_id"]), int(request["task_index"])
        mine = (job_id, task_index) == (self.job_id, self.task_index)
        if standby.fingerprint != request["fingerprint"]:
            if self.kept_until is not None or not mine:
                # Kept, a spare's or another task's: made for another environment, left for it.
                return {"ok": False, "reason": "a standby made for another environment"}
            self.standby = None
            standby.kill()
            return {"ok": False, "reason": "the environment or Python changed"}
        if not standby.ready:
            return {"ok": False, "reason": "the standby is still importing TensorFlow",
                    "importing": True}  # fmt: skip
        order = {k: request[k] for k in ("target", "cwd", "log")} | {"env": self._env(request)}
        try:
            standby.control.sendall(json.dumps(order).encode() + b"\n")
        except OSError as exc:
            self.standby = None
            standby.kill()
            return {"ok": False, "reason": f"the standby did not take it ({exc})"}
        standby.active = True
        self.trainer, self.standby = standby, None
        if self.kept_until is not None or not mine:
            # Adopted by the job that activated it (the next job, or this one after a gap
            # longer than the linger): it serves that job, on its task's name, by its settings.
            self.job_id, self.task_index, self.kept_until = job_id, task_index, None
            self._rebind(socket_path(job_id, task_index))
            self.linger = float(request.get("linger", self.linger))
            self.keep = float(request.get("keep", self.keep))
            self.keep_bytes = int(request.get("keep_bytes", self.keep_bytes))
            self.log = str(request.get("standby_log", self.log))
        self.record()
        return {"ok": True, "pid": standby.proc.pid}

    def _on_agent_data(self) -> None:
        assert self.agent is not None
        try:
            data = self.agent.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._agent_gone()
            return
        self.agent_buffer += data
        while b"\n" in self.agent_buffer:
            line, self.agent_buffer = self.agent_buffer.split(b"\n", 1)
            request = json.loads(line)
            if request["op"] == "prepare":
                self._send(self._prepare(request))
                self.record()
            elif request["op"] == "activate":
                self._send(self._activate(request))
            elif request["op"] == "release":  # the job ended (worker.warm.registry.release)
                kept = self._keep_or_end()
                self._send({"ok": True, "kept": kept})
                if not kept:
                    raise SystemExit(0)  # main() ends the standby

    def serve(self) -> int:
        self.alone_since = time.monotonic()
        while True:
            watched: list[Any] = [self.server]
            if self.agent is not None:
                watched.append(self.agent)
            if self.standby is not None:
                watched += [self.standby.pidfd]
                if not self.standby.ready:
                    watched.append(self.standby.control)
            if self.trainer is not None:
                watched.append(self.trainer.pidfd)
            ready, _, _ = select.select(watched, [], [], 1.0)
            # A new connection last: the old agent's goodbye, read first, makes room for it.
            ready.sort(key=lambda item: item is self.server)
            for item in ready:
                if item is self.server:
                    self._accept()
                elif item is self.agent:
                    self._on_agent_data()
                elif self.standby is not None and item is self.standby.control:
                    if self.standby.control.recv(len(READY)) == READY:
                        self.standby.ready = True
                        pid = self.standby.proc.pid
                        self._send({"standby": pid, "rss": rss_bytes(pid)})
                        self.record()
                elif self.standby is not None and item == self.standby.pidfd:
                    self._replace_dead_standby()
                elif self.trainer is not None and item == self.trainer.pidfd:
                    returncode = self.trainer.proc.wait()
                    code = 128 - returncode if returncode < 0 else returncode
                    self.trainer.close()
                    self.trainer = None
                    self._send({"exit": code})
                    self.record()
            if self.ending and self.trainer is None:
                return 0
            if self.agent is not None or self.trainer is not None:
                continue
            if self.kept_until is not None:  # kept: until its time is up or its standby dies
                if self.standby is None or time.monotonic() > self.kept_until:
                    return 0
            elif (
                self.alone_since is not None
                and time.monotonic() - self.alone_since > self.linger
                and not self._keep_or_end()
            ):
                return 0


def main(argv: list[str]) -> int:
    job_id, task_index, linger, log = argv[0], int(argv[1]), float(argv[2]), argv[3]
    keep, keep_bytes = float(argv[4]), int(argv[5])
    in_image = argv[6:7] == ["--in-image"]
    try:
        keeper = Keeper(job_id, task_index, linger, log, keep, keep_bytes,
                        dict(os.environ) if in_image else None)  # fmt: skip
    except NameTaken as exc:  # another keeper serves this task: the agent uses that one
        _say(f"not started: {exc}")
        return 0
    except OSError as exc:  # the private directory is not ours alone, or the bind failed
        _say(f"cannot serve warm restarts: {exc}")
        return 3
    signal.signal(signal.SIGTERM, keeper.on_stop_signal)
    keeper.record()
    registry.sweep_sockets()  # those of keepers killed before they could remove their own
    try:
        return keeper.serve()
    finally:  # a stop or the end of the job: nothing of ours lives on (PDEATHSIG does too)
        for child in (keeper.standby, keeper.trainer):
            if child is not None:
                child.kill()
        registry.forget(os.getpid())
        with contextlib.suppress(OSError):
            os.unlink(keeper.socket)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
