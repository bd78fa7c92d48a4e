"""[notify]'s webhook: one HTTP POST, bounded as a whole by its timeout (the name's lookup,
connecting, TLS, the request and the answer's status line and headers), never redirected.

urllib bounds each socket read, not a try, and follows a 302 by sending a GET: the POST is made
here with http.client on a socket whose every read and write gets only what is left of the
try's time. A proxy in http_proxy / https_proxy (no_proxy honoured) is used as urllib would."""

from __future__ import annotations

import base64
import http.client
import io
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, cast

from orchestrator.config.values import oneline

Address = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]


RETRY_AFTER_LIMIT = 60.0  # seconds: a longer Retry-After is waited for this long at most


@dataclass(frozen=True)
class Answer:
    """How a POST went: `problem` is "" once answered 2xx, else what went wrong."""

    problem: str
    retry: bool = True  # worth another try (not a 4xx but 408 and 429)
    retry_after: float | None = None  # seconds the server asked for (Retry-After)


def post(url: str, body: bytes, timeout: float, headers: dict[str, str] | None = None) -> Answer:
    """POST body as JSON, with these extra headers; never raises."""
    deadline = time.monotonic() + timeout
    try:
        status, retry_after = _post(urllib.parse.urlsplit(url), body, deadline, headers or {})
    except TimeoutError:
        return Answer(f"no answer within {timeout:g}s")
    except http.client.BadStatusLine as exc:
        return Answer(f"not an HTTP answer: {oneline(exc)[:80]}")
    except Exception as exc:  # any failure to deliver is reported, never raised
        return Answer(oneline(exc)[:200] or type(exc).__name__)
    if 200 <= status < 300:
        return Answer("")
    if 300 <= status < 400:
        return Answer(f"HTTP {status} (redirects are not followed)")
    # A request the server refuses stays refused (a bad token, a bad body): not retried.
    retry = not (400 <= status < 500) or status in (408, 429)
    return Answer(f"HTTP {status}", retry, _seconds(retry_after))


def _seconds(retry_after: str | None) -> float | None:
    """Retry-After in seconds (a number; an HTTP date is not read: no clock is trusted)."""
    try:
        return min(max(float(retry_after), 0.0), RETRY_AFTER_LIMIT) if retry_after else None
    except ValueError:
        return None


def _post(
    target: urllib.parse.SplitResult, body: bytes, deadline: float, extra: dict[str, str]
) -> tuple[int, str | None]:
    host, https = target.hostname or "", target.scheme == "https"
    port = target.port or (443 if https else 80)
    where = target.netloc.rpartition("@")[2]  # host[:port] as the URL writes it
    headers = {**extra, "Host": where, "Content-Type": "application/json", "Connection": "close"}
    if target.username is not None:  # user:password@ in the URL: HTTP basic authentication
        headers["Authorization"] = _basic(target.username, target.password)
    path = (target.path or "/") + (f"?{target.query}" if target.query else "")
    proxy = _proxy(target.scheme, host)
    wire = _Wire(
        _connect(host, port, deadline)
        if proxy is None
        else _connect(proxy.hostname or "", proxy.port or 80, deadline),
        deadline,
    )
    try:
        if proxy is not None:
            auth = {} if proxy.username is None else {
                "Proxy-Authorization": _basic(proxy.username, proxy.password)
            }  # fmt: skip
            if https:
                _tunnel(wire, host, port, auth)
            else:  # a plain proxy is sent the whole URL
                path, headers = f"http://{where}{path}", {**headers, **auth}
        if https:
            wire.sock = _tls(wire.sock, host, deadline)
        # http.client writes the request and reads the answer through `wire`; the answer's
        # body is never read: its status decides.
        conn = http.client.HTTPConnection(host, port)
        conn.sock = cast(socket.socket, wire)
        conn.request("POST", path, body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.getheader("Retry-After")
    finally:
        wire.sock.close()


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


class _Wire:
    """The connection's socket as http.client uses it (sendall, makefile, close), each read
    and write given only what is left before the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(_left(self.deadline))  # sendall's timeout bounds the whole call
        self.sock.sendall(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_Reader(self))

    def close(self) -> None:
        self.sock.close()


class _Reader(io.RawIOBase):
    def __init__(self, wire: _Wire) -> None:
        self.wire = wire

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        self.wire.sock.settimeout(_left(self.wire.deadline))
        return self.wire.sock.recv_into(buffer)


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    last: OSError = OSError(f"{host}: no address")
    for family, kind, proto, _, address in _addresses(host, port, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last


def _addresses(host: str, port: int, deadline: float) -> list[Address]:
    """getaddrinfo has no timeout: it runs on a thread of its own, waited for until the
    deadline (a resolver that hangs ends on its own, later)."""
    found: list[Address] = []
    failed: list[Exception] = []

    def look_up() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except Exception as exc:
            failed.append(exc)

    thread = threading.Thread(target=look_up, name="notify-lookup", daemon=True)
    thread.start()
    thread.join(_left(deadline))
    if thread.is_alive():
        raise TimeoutError(f"looking up {host}: timed out")
    if failed:
        raise failed[0]
    return found


def _tls(sock: socket.socket, host: str, deadline: float) -> ssl.SSLSocket:
    wrapped = ssl.create_default_context().wrap_socket(
        sock, server_hostname=host, do_handshake_on_connect=False
    )
    wrapped.settimeout(_left(deadline))  # the handshake's timeout bounds the whole handshake
    wrapped.do_handshake()
    return wrapped


def _tunnel(wire: _Wire, host: str, port: int, auth: dict[str, str]) -> None:
    """CONNECT through the proxy to host:port (as http.client's own tunnel does)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {where} HTTP/1.1", f"Host: {where}", *(f"{k}: {v}" for k, v in auth.items())]
    wire.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
    answer = http.client.HTTPResponse(cast(socket.socket, wire), method="CONNECT")
    answer.begin()
    if answer.status != 200:
        raise OSError(f"proxy refused the tunnel: HTTP {answer.status}")


def _proxy(scheme: str, host: str) -> urllib.parse.SplitResult | None:
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    return urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")


def _basic(user: str, password: str | None) -> str:
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode("ascii")
