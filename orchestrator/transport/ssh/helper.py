"""The client of the host helper (worker.hostd) on one SSH exec channel: JSON-line requests
out, replies matched by id, every call with a timeout, starting it too: a host that never
answers fails with HelperTimeout, naming it, rather than stalling its caller. A host without
the worker package's copy asks for it first (worker.ship) and is sent it on the same channel."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import paramiko

from orchestrator.errors import TransportError

STDERR_LIMIT = 65536
LINE_LIMIT = 65536  # the helper's first lines are short: a longer one is not ours


class HelperTimeout(TransportError):
    """The host helper gave no answer in time."""


class HelperClient:
    """The host helper (worker.hostd) on one exec channel: JSON-line requests out, replies
    matched by id. Started once per connection; `root` is where its worker package is."""

    @classmethod
    def start(
        cls,
        transport: paramiko.Transport,
        command: str,
        label: str,
        timeout: float,
        payload: Callable[[], bytes] = bytes,
    ) -> HelperClient:
        """Open a channel, run `command` (the helper) on it and wait for its ready line, sending
        `payload()` if it asks for the worker package first; each step within `timeout`. On any
        failure the channel is closed."""
        channel = transport.open_session(timeout=timeout)
        expired = threading.Event()

        def expire() -> None:  # exec_command waits for the host's reply with no timeout
            expired.set()
            channel.close()

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            channel.exec_command(command)
        except BaseException:
            channel.close()
            if not expired.is_set():
                raise
        finally:
            timer.cancel()
        if expired.is_set():  # the wait was cut short (or only just ended): the channel is gone
            raise HelperTimeout(
                f"{label}: the worker helper did not start: no reply to the exec request "
                f"within {timeout:g}s"
            )
        return cls(channel, label, timeout, payload)

    def __init__(
        self,
        channel: paramiko.Channel,
        label: str,
        ready_timeout: float,
        payload: Callable[[], bytes] = bytes,
    ) -> None:
        self.channel = channel
        self.label = label
        self.root = ""
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._closed = False
        self._broken = ""  # why the channel was given up, when the host sent garbage
        self._reader = channel.makefile("rb")
        deadline = time.monotonic() + ready_timeout
        try:
            channel.settimeout(ready_timeout)  # for these reads only: the reader thread waits
            ready = self._reader.readline(LINE_LIMIT)
            if ready.startswith(b'{"need"'):  # no copy of the worker package there yet
                data = payload()
                with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                    # A helper that exited instead says why on stderr, read below.
                    channel.sendall(b"%d\n" % len(data) + data)
                deadline = time.monotonic() + ready_timeout
                ready = self._reader.readline(LINE_LIMIT)
        except TimeoutError:
            channel.close()
            raise HelperTimeout(
                f"{label}: the worker helper sent no ready line within {ready_timeout:g}s"
            ) from None
        except BaseException:
            channel.close()
            raise
        try:
            self.root = str(json.loads(ready)["root"])
        except (ValueError, TypeError, KeyError):
            err = _stderr(channel, max(deadline, time.monotonic() + 1.0))
            channel.close()
            detail = " ".join((err or ready.decode(errors="replace")).split())  # one line
            raise TransportError(
                f"{label}: cannot start the worker helper: "
                f"{detail[-300:] or 'it exited with no output'}"
            ) from None
        channel.settimeout(None)
        threading.Thread(target=self._read, name=f"hostd-{label}", daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self._reader:
                try:
                    reply = json.loads(line)
                    call_id = reply["id"]
                except (ValueError, TypeError, KeyError):
                    reply = call_id = None
                if type(reply) is not dict or type(call_id) is not int:
                    # What the host sent is not ours to guess at: every call fails now, the
                    # host named, rather than waiting out its timeout.
                    self._broken = (
                        f"{self.label}: the worker helper sent a malformed reply "
                        f"({line[:80].decode(errors='replace')!r})"
                    )
                    self.channel.close()
                    break
                with self._lock:
                    waiter = self._waiting.pop(reply["id"], None)
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
                if self._broken:
                    raise TransportError(self._broken)
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
            if self._broken:
                raise TransportError(self._broken)
            raise EOFError("worker helper channel closed")
        reply = slot[0]
        if not reply.get("ok"):
            raise TransportError(f"{self.label}: {op} failed: {reply.get('error')}")
        return reply.get("result")

    @property
    def closed(self) -> bool:
        return self._closed or self.channel.closed


def _stderr(channel: paramiko.Channel, deadline: float) -> str:
    """What the helper wrote to stderr, up to its end or the deadline (a helper that wrote a bad
    first line may still be running)."""
    out = bytearray()
    while len(out) < STDERR_LIMIT:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            channel.settimeout(remaining)
            chunk = channel.recv_stderr(4096)
        except (OSError, EOFError, paramiko.SSHException):  # TimeoutError is an OSError
            break
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace").strip()
