"""The network half of `orchestrate check`, run by the host helper (worker.hostd): hold
listeners on this host's task ports, try TCP connections to every task port of the cluster, and
say which source address and interface this host would use to reach each peer.

Listeners answer each connection with the check's token and close it, so a connection that
reaches some other program on the port is told apart from one that reaches the check. They are
closed by `unlisten`, after `hold` seconds at the latest, and when the helper process ends (the
coordinator went away): a check leaves nothing behind. Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import selectors
import shutil
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MAX_HOLD = 600.0  # seconds: the longest a listener may be asked to stay
CONNECT_THREADS = 64
SIOCGIFADDR = 0x8915

_listeners: dict[str, _Listener] = {}
_lock = threading.Lock()


class _Listener:
    """Sockets bound to the ports, accepting on one thread until stopped or the deadline."""

    def __init__(self, key: str, sockets: list[socket.socket], token: bytes, hold: float) -> None:
        self.key = key
        self.sockets = sockets
        self.stopped = threading.Event()
        deadline = time.monotonic() + min(max(hold, 0.0), MAX_HOLD)
        self.thread = threading.Thread(target=self._serve, args=(token, deadline), daemon=True)
        self.thread.start()

    def _serve(self, token: bytes, deadline: float) -> None:
        """Accept, send the token, and close once the peer has: the side that closes first
        keeps the TIME_WAIT, which then holds the peer's ephemeral port, not a task port."""
        selector = selectors.DefaultSelector()
        accepted: set[socket.socket] = set()
        try:
            for sock in self.sockets:
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ)
            while not self.stopped.is_set() and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=0.1):
                    sock = key.fileobj  # type: ignore[assignment]
                    assert isinstance(sock, socket.socket)
                    if sock in accepted:  # the peer closed (or sent something): done
                        with contextlib.suppress(OSError):
                            if sock.recv(4096):
                                continue
                        selector.unregister(sock)
                        accepted.discard(sock)
                        sock.close()
                        continue
                    try:
                        conn, _ = sock.accept()
                    except OSError:
                        continue
                    try:
                        conn.settimeout(1.0)
                        conn.sendall(token)
                        conn.setblocking(False)
                        selector.register(conn, selectors.EVENT_READ)
                        accepted.add(conn)
                    except OSError:
                        conn.close()
        finally:
            selector.close()
            for sock in [*self.sockets, *accepted]:
                sock.close()
            with _lock:
                if _listeners.get(self.key) is self:
                    del _listeners[self.key]

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5.0)


def _bind(port: int) -> socket.socket:
    """A listening socket on every address of this host: IPv4 and IPv6 where both work."""
    if socket.has_dualstack_ipv6():
        with contextlib.suppress(OSError):
            return _listening(socket.AF_INET6, ("::", port))
    return _listening(socket.AF_INET, ("0.0.0.0", port))


def _listening(family: int, address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a trainer's server does
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def listen(key: str, ports: list[int], token: str, hold: float) -> list[str]:
    """Listen on each port (under `key`, replacing an earlier listener of that key) until
    unlisten(key) or `hold` seconds; per port "" when bound, else why not."""
    unlisten(key)
    sockets: list[socket.socket] = []
    errors: list[str] = []
    for port in ports:
        try:
            sockets.append(_bind(int(port)))
            errors.append("")
        except OSError as exc:
            errors.append(reason(exc))
    listener = _Listener(key, sockets, token.encode(), hold)
    with _lock:
        _listeners[key] = listener
    return errors


def unlisten(key: str) -> bool:
    """Close the listener of `key`; False when there was none (already closed)."""
    with _lock:
        listener = _listeners.pop(key, None)
    if listener is None:
        return False
    listener.stop()
    return True


def reason(exc: OSError) -> str:
    """A socket error in a few words: "connection refused", "timed out", "no route to host"."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the address: {exc.strerror or exc}"
    text = exc.strerror or str(exc) or type(exc).__name__
    return text[:1].lower() + text[1:]


def _try_connect(address: str, port: int, token: bytes, timeout: float) -> str:
    try:
        with socket.create_connection((address, port), timeout=timeout) as conn:
            got = b""
            with contextlib.suppress(OSError):
                while len(got) < len(token):
                    chunk = conn.recv(len(token) - len(got))
                    if not chunk:
                        break
                    got += chunk
    except OSError as exc:
        return reason(exc)
    return "" if got == token else "another program answers on this port"


def connect(targets: list[tuple[str, int]], token: str, timeout: float) -> list[str]:
    """Try a TCP connection to each (address, port), all at once, each within `timeout`; per
    target "" when it reached a listener of this check, else why not."""
    if not targets:
        return []
    expected = token.encode()
    with ThreadPoolExecutor(max_workers=min(len(targets), CONNECT_THREADS)) as pool:
        return list(
            pool.map(lambda t: _try_connect(str(t[0]), int(t[1]), expected, timeout), targets)
        )


def _ipv4_interfaces() -> dict[str, str]:
    """Each IPv4 address of this host (the primary one of each interface) -> interface."""
    found: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue
            found.setdefault(socket.inet_ntoa(reply[20:24]), name)
    return found


def _ipv6_interfaces() -> dict[str, str]:
    found: dict[str, str] = {}
    try:
        with open("/proc/net/if_inet6") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) >= 6:
            found.setdefault(str(ipaddress.IPv6Address(int(fields[0], 16))), fields[5])
    return found


def _ip_tool_interfaces() -> dict[str, str]:
    """Every address `ip -o addr` lists (secondary ones too) -> interface; {} without `ip`."""
    tool = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip") if os.path.exists(p)), None
    )
    if tool is None:
        return {}
    try:
        out = subprocess.run(
            [tool, "-o", "addr", "show"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[str, str] = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("inet", "inet6"):
            address = fields[3].split("/")[0]
            found.setdefault(address, fields[1].split("@")[0])
    return found


def interfaces_of(addresses: list[str]) -> dict[str, str]:
    """The interface that holds each of these local addresses ("" when it cannot be told):
    the cheap tables first, `ip` only for what they miss."""
    found: dict[str, str] = {}
    for table in (_ipv4_interfaces, _ipv6_interfaces, _ip_tool_interfaces):
        wanted = [a for a in addresses if a not in found]
        if not wanted:
            break
        names = table()
        found.update({a: names[a] for a in wanted if names.get(a)})
    return {a: found.get(a, "") for a in addresses}


def route(peers: list[str]) -> list[dict[str, Any]]:
    """For each peer, the source address and interface this host would use to reach it (the
    kernel's own choice: a UDP socket connected to it, which sends nothing); or the error."""
    answers: list[dict[str, Any]] = []
    for peer in peers:
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(peer, 9, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect(sockaddr)
                answers.append({"source": str(sock.getsockname()[0]).split("%")[0]})
        except OSError as exc:
            answers.append({"error": reason(exc)})
    names = interfaces_of(sorted({a["source"] for a in answers if "source" in a}))
    for answer in answers:
        if "source" in answer:
            answer["interface"] = names[answer["source"]]
    return answers


def handle(op: str, args: dict[str, Any]) -> Any:
    """The host helper's listen, unlisten, connect and route operations (worker.hostd)."""
    if op == "listen":
        ports = [int(p) for p in args["ports"]]
        return listen(str(args["key"]), ports, str(args["token"]), float(args["hold"]))
    if op == "unlisten":
        return unlisten(str(args["key"]))
    if op == "connect":
        targets = [(str(a), int(p)) for a, p in args["targets"]]
        return connect(targets, str(args["token"]), float(args["timeout"]))
    if op == "route":
        return route([str(p) for p in args["peers"]])
    raise ValueError(f"unknown operation {op!r}")
