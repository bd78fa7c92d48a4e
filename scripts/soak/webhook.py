"""A `[notify]` webhook for the chaos soak that misbehaves, on loopback: the first try of each
event gets, in turn, garbage instead of HTTP, an answer trickled a byte at a time, or a 302;
the next try of the same event is accepted (204). So every event must still arrive, once
accepted, and nothing may follow the redirect."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

BEHAVIOURS = ("garbage", "trickle", "redirect")
TRICKLE_SECONDS = 5.0  # longer than the hook's timeout: the notifier must give the try up


@dataclass
class Delivery:
    event: str
    job: str
    tries: int = 0
    accepted: bool = False


@dataclass
class MisbehavingWebhook:
    deliveries: dict[bytes, Delivery] = field(default_factory=dict)
    followed: list[str] = field(default_factory=list)  # requests that were not a POST
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.5)
        self.port = self.server.getsockname()[1]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="webhook", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def close(self) -> None:
        self._done.set()
        self._thread.join(5)
        self.server.close()

    def of_job(self, job: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries.values() if d.job == job]

    def _serve(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(10.0)
        try:
            method, body = _read_request(conn)
            if method != "POST":
                with self.lock:
                    self.followed.append(method)
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                return
            with self.lock:
                delivery = self.deliveries.get(body)
                if delivery is None:
                    document: Any = json.loads(body)
                    delivery = Delivery(str(document.get("event")), str(document.get("job")))
                    self.deliveries[body] = delivery
                delivery.tries += 1
                first = delivery.tries == 1
                behaviour = BEHAVIOURS[len(self.deliveries) % len(BEHAVIOURS)]
                if not first:
                    delivery.accepted = True
            if not first:
                conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
            elif behaviour == "garbage":
                conn.sendall(b"HELLO\r\n\r\n")
            elif behaviour == "redirect":
                conn.sendall(
                    b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:"
                    + str(self.port).encode()
                    + b"/moved\r\nContent-Length: 0\r\n\r\n"
                )
            else:  # a byte at a time, past the notifier's timeout
                answer = b"HTTP/1.1 204 No Content\r\n\r\n"
                pause = TRICKLE_SECONDS / len(answer)
                for byte in answer:
                    conn.sendall(bytes([byte]))
                    time.sleep(pause)
        except (OSError, ValueError):
            pass  # the notifier gave the try up (the trickle), or sent no JSON
        finally:
            conn.close()


def _read_request(conn: socket.socket) -> tuple[str, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ValueError("closed before the headers ended")
        data += chunk
        if len(data) > 1 << 20:
            raise ValueError("headers too long")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method = lines[0].split(" ")[0]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return method, body[:length]
