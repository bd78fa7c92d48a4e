"""The client of the host helper (`python -m worker.hostd`) on one SSH exec channel: JSON-line
requests out, replies matched by id, every call with a timeout."""

from __future__ import annotations

import json
import threading
from typing import Any

import paramiko

from orchestrator.errors import TransportError


class HelperTimeout(TransportError):
    """The host helper gave no answer in time."""


class HelperClient:
    """The host helper (`python -m worker.hostd`) on one exec channel: JSON-line requests out,
    replies matched by id. Started once per connection."""

    def __init__(self, channel: paramiko.Channel, label: str, ready_timeout: float) -> None:
        self.channel = channel
        self.label = label
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._closed = False
        self._reader = channel.makefile("rb")
        ready = self._reader.readline()
        if not ready.startswith(b'{"ready"'):
            err = channel.makefile_stderr("rb").read().decode(errors="replace").strip()
            raise TransportError(
                f"{label}: cannot start the worker helper (is orchestrate installed for the "
                f"configured python?): {(err or ready.decode(errors='replace'))[-300:]}"
            )
        threading.Thread(target=self._read, name=f"hostd-{label}", daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self._reader:
                reply = json.loads(line)
                with self._lock:
                    waiter = self._waiting.pop(reply.get("id"), None)
                if waiter is not None:
                    waiter[1].append(reply)
                    waiter[0].set()
        except (OSError, EOFError, ValueError, paramiko.SSHException):
            pass
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, {}
        for event, _ in waiting.values():
            event.set()  # no reply: the caller sees the channel closed

    def call(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        event: threading.Event = threading.Event()
        slot: list[Any] = []
        with self._lock:
            if self._closed:
                raise EOFError("worker helper channel closed")
            self._next += 1
            request_id = self._next
            self._waiting[request_id] = (event, slot)
            self.channel.sendall(
                json.dumps({"id": request_id, "op": op, "args": args}).encode() + b"\n"
            )
        if not event.wait(timeout):
            with self._lock:
                self._waiting.pop(request_id, None)
            raise HelperTimeout(f"{self.label}: {op} timed out after {timeout:g}s")
        if not slot:
            raise EOFError("worker helper channel closed")
        reply = slot[0]
        if not reply.get("ok"):
            raise TransportError(f"{self.label}: {op} failed: {reply.get('error')}")
        return reply.get("result")

    @property
    def closed(self) -> bool:
        return self._closed or self.channel.closed
