"""Host keys are checked strictly against known_hosts, on every hop (a ProxyJump host too): an
unknown key is refused with a message that says how to trust it (or, opted in, trusted on first
use and recorded); a changed key and a key marked `@revoked` are always refused.

known_hosts is read tolerantly, as ssh reads it: a line we cannot use (a comment, a key type
paramiko does not know such as sk-ssh-ed25519@openssh.com, a bad line) is skipped, never fatal.
`@cert-authority` lines are not used: paramiko cannot check host certificates. Trusting a key
appends exactly one line to the file (one O_APPEND write, fsync, under an flock of the file and
a thread lock): every other byte of the user's file stays as it was.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import hmac
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

REVOKED = "@revoked"
CERT_AUTHORITY = "@cert-authority"
SSH_PORT = 22


class HostKeyError(paramiko.SSHException):
    """A host key was refused, or known_hosts could not be read or written. One line, naming
    the host (as known_hosts names it)."""


class UnknownHostKeyError(HostKeyError):
    pass


class RevokedHostKeyError(HostKeyError):
    pass


def fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} SHA256:{key.fingerprint.split(':', 1)[-1]}"


def host_key_name(host: str, port: int) -> str:
    """How known_hosts (and paramiko) name a host: `host` on port 22, else `[host]:port`."""
    return host if port == SSH_PORT else f"[{host}]:{port}"


@dataclass(frozen=True)
class KnownHostLine:
    marker: str | None  # None, "@revoked" or "@cert-authority"
    patterns: tuple[str, ...]
    key_type: str
    blob: bytes  # the key as the wire sends it

    def matches(self, name: str) -> bool:
        """OpenSSH's host matching: comma-separated patterns with `*` and `?`, `!` negates,
        `|1|salt|hash` is a hashed name; case-insensitive."""
        name = name.lower()
        found = False
        for pattern in self.patterns:
            negated = pattern.startswith("!")
            pattern = pattern[1:] if negated else pattern
            hit = (
                _hashed_match(pattern, name)
                if pattern.startswith("|1|")
                else _glob(pattern.lower()).fullmatch(name) is not None
            )
            if hit and negated:
                return False
            found = found or hit
        return found

    def pkey(self) -> paramiko.PKey | None:
        """The key, or None where paramiko cannot read it (an unknown type, a bad blob)."""
        try:
            key: paramiko.PKey = paramiko.PKey.from_type_string(self.key_type, self.blob)
        except Exception:  # paramiko raises many kinds on odd key data: skip the line, as ssh does
            return None
        return key


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(
        "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    )


def _hashed_match(pattern: str, name: str) -> bool:
    try:
        _, _, salt, digest = pattern.split("|")
        salt_bytes, expected = base64.b64decode(salt), base64.b64decode(digest)
    except (ValueError, binascii.Error):
        return False
    actual = hmac.new(salt_bytes, name.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(actual, expected)


def parse_line(line: str) -> KnownHostLine | None:
    """One known_hosts line, or None for a comment, a blank or a line we cannot read."""
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker = None
    if fields[0].startswith("@"):
        marker, fields = fields[0], fields[1:]
        if marker not in (REVOKED, CERT_AUTHORITY):
            return None  # ssh ignores a line with a marker it does not know
    if len(fields) < 3:
        return None
    patterns, key_type, data = fields[:3]
    try:
        blob = base64.b64decode(data, validate=True)
    except (ValueError, binascii.Error):
        return None
    return KnownHostLine(marker, tuple(patterns.split(",")), key_type, blob)


class KnownHosts:
    """The usable contents of a known_hosts file."""

    def __init__(self, lines: Sequence[KnownHostLine]) -> None:
        self.lines = tuple(lines)

    @classmethod
    def parse(cls, data: bytes) -> KnownHosts:
        text = data.decode("utf-8", errors="replace")
        return cls([line for line in map(parse_line, text.splitlines()) if line is not None])

    @classmethod
    def load(cls, path: Path) -> KnownHosts:
        try:
            return cls.parse(path.read_bytes())
        except FileNotFoundError:
            return cls([])
        except OSError as exc:
            raise HostKeyError(f"cannot read known_hosts {path}: {exc.strerror or exc}") from None

    def host_keys(self, name: str) -> list[paramiko.PKey]:
        """The keys known for the host (plain lines only), without any it also lists as revoked."""
        keys = []
        for line in self.lines:
            if line.marker is None and line.matches(name) and not self._revoked(name, line.blob):
                key = line.pkey()
                if key is not None:
                    keys.append(key)
        return keys

    def is_revoked(self, name: str, key: paramiko.PKey) -> bool:
        return self._revoked(name, key.asbytes())

    def _revoked(self, name: str, blob: bytes) -> bool:
        return any(
            line.marker == REVOKED and line.blob == blob and line.matches(name)
            for line in self.lines
        )

    def has_cert_authority(self, name: str) -> bool:
        return any(line.marker == CERT_AUTHORITY and line.matches(name) for line in self.lines)


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Every connection (each hop of a ProxyJump chain too) is `prepare`d: its client's table
    holds exactly the usable known keys of that host, so paramiko prefers their types and
    raises BadHostKeyException for a different key of a known type (a changed key never reaches
    this policy). Any other key reaches `missing_host_key`: revoked → refused; recorded since
    (by another thread or process) → accepted; otherwise refused with how to trust it, or
    (opt-in) recorded."""

    def __init__(self, known_hosts: Path, trust_unknown: bool, lock: threading.Lock) -> None:
        self.known_hosts = known_hosts
        self.trust_unknown = trust_unknown
        self.lock = lock

    def load(self) -> KnownHosts:
        return KnownHosts.load(self.known_hosts)

    def prepare(self, client: paramiko.SSHClient, host: str, port: int) -> None:
        """Before `client` connects to host:port: its known keys, and this policy for the rest."""
        name = host_key_name(host, port)
        table = client.get_host_keys()
        table.clear()
        for key in self.load().host_keys(name):
            table.add(name, key.get_name(), key)
        client.set_missing_host_key_policy(self)

    def revoked_message(self, name: str, key: paramiko.PKey) -> str:
        return (
            f"host key {fingerprint(key)} for {name} is marked @revoked in {self.known_hosts}; "
            "refusing to connect"
        )

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        known = self.load()
        if self._known(known, hostname, key):
            return
        if not self.trust_unknown:
            raise UnknownHostKeyError(self._unknown_message(known, hostname, key))
        self._record(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)

    def _known(self, known: KnownHosts, name: str, key: paramiko.PKey) -> bool:
        """True: the file has this key for the host. False: the host has no key of this type.
        Raises for a revoked key, and for another key of the same type (a changed key)."""
        if known.is_revoked(name, key):
            raise RevokedHostKeyError(self.revoked_message(name, key))
        same_type = [k for k in known.host_keys(name) if k.get_name() == key.get_name()]
        if any(k.asbytes() == key.asbytes() for k in same_type):
            return True
        if same_type:
            host = name[1:].rpartition("]:")[0] if name.startswith("[") else name
            raise paramiko.BadHostKeyException(host, key, same_type[0])
        return False

    def _unknown_message(self, known: KnownHosts, name: str, key: paramiko.PKey) -> str:
        host, _, port = name.strip("[").partition("]:")
        scan = f"ssh-keyscan {'-p ' + port + ' ' if port else ''}{host}"
        note = ""
        if known.has_cert_authority(name):
            note = (
                f" (it has @cert-authority lines for {name}, which orchestrate does not use: "
                "paramiko cannot check host certificates, so add the host's own key)"
            )
        return (
            f"unknown host key {fingerprint(key)} for {name}, not in {self.known_hosts}{note}; "
            f"check it, then trust it with `{scan} >> {self.known_hosts}` "
            "(or set backend.trust_unknown_hosts = true)"
        )

    def _record(self, name: str, key: paramiko.PKey) -> None:
        """Append one line for the host, keeping every other byte of the file. Several hosts
        (threads here, or other orchestrate processes) may be trusted at once: the thread lock
        and an flock of the file make the check-then-append one step."""
        line = f"{name} {key.get_name()} {key.get_base64()}\n".encode()
        path = self.known_hosts
        with self.lock:
            try:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                created = not path.exists()
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            except OSError as exc:
                raise HostKeyError(
                    f"cannot record the host key for {name} in {path}: {exc.strerror or exc}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                current = _read_all(fd)
                if self._known(KnownHosts.parse(current), name, key):
                    return  # recorded meanwhile by another thread or process
                if current and not current.endswith(b"\n"):
                    line = b"\n" + line  # the last line stays whole
                written = os.write(fd, line)  # O_APPEND: one write, at the end
                if written != len(line):
                    raise OSError(f"short write ({written} of {len(line)} bytes)")
                os.fsync(fd)
                if created:
                    _fsync_dir(path.parent)
            except OSError as exc:
                raise HostKeyError(
                    f"cannot record the host key for {name} in {path}: {exc.strerror or exc}"
                ) from None
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)  # releases the flock


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks, offset = [], 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
