"""SshTransport: one host, one reused SSH connection.

- argv lists are quoted once, here, with shlex.join;
- one connection per host, reused, opened on a socket we create with TCP_NODELAY (paramiko does
  not set it and loses 40-85 ms per round trip to Nagle + delayed ACKs);
- ~/.ssh/config (through fabric) and ssh-agent are honoured;
- host keys are checked strictly against known_hosts, on every hop of a ProxyJump chain: an
  unknown key is refused with a message that says how to trust it (or, opted in, trusted on
  first use and recorded); a changed or revoked key is always refused;
- every call has a timeout; read-only calls survive a dropped connection (reconnect, retry once).
"""

from __future__ import annotations

import contextlib
import shlex
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import paramiko
from fabric import Connection

from orchestrator.config import SshBackend, SshHost
from orchestrator.errors import TransportError
from orchestrator.transport import worker_package
from orchestrator.transport.base import CommandResult, ProcessRef
from orchestrator.transport.host_ops import HostOps
from orchestrator.transport.ssh.connect import (
    NETWORK_ERRORS,
    close_hops,
    new_connection,
    open_connection,
)
from orchestrator.transport.ssh.helper import HelperClient, HelperTimeout
from orchestrator.transport.ssh.host_keys import (
    HostKeyPolicy,
)

_T = TypeVar("_T")


class SshTransport(HostOps):
    """One host, one reused SSH connection."""

    def __init__(
        self,
        host: SshHost,
        backend: SshBackend,
        known_hosts_lock: threading.Lock | None = None,
    ) -> None:
        self.host = host
        self.host_label = host.label
        self.backend = backend
        self.known_hosts = (backend.known_hosts or Path("~/.ssh/known_hosts")).expanduser()
        self._policy = HostKeyPolicy(
            self.known_hosts, backend.trust_unknown_hosts, known_hosts_lock or threading.Lock()
        )
        self._lock = threading.Lock()
        self._sftp_lock = threading.Lock()
        self._conn: Connection | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._helper: HelperClient | None = None
        self._helper_lock = threading.Lock()
        self.python = host.python or backend.python
        self.quick_timeout = backend.connect_timeout + 5

    # --- connection -------------------------------------------------------------------
    def _connect(self) -> paramiko.Transport:
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                transport = self._conn.client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
            self._drop_locked()
            return self._open_locked()

    def new_connection(self) -> Connection:
        """A Connection to this host, not yet open, every hop prepared (see connect.py)."""
        return new_connection(self.host, self.backend, self._policy)

    def _open_locked(self) -> paramiko.Transport:
        self._conn, transport = open_connection(
            self.host, self.backend, self._policy, self.known_hosts
        )
        return transport

    def _drop_locked(self) -> None:
        if self._helper is not None:
            self._helper.channel.close()
            self._helper = None
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None
        if self._conn is not None:
            close_hops(self._conn)
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._drop_locked()

    def _retrying(self, what: str, action: Callable[[], _T]) -> _T:
        """Run an idempotent action; if the connection broke, reconnect and try once more."""
        try:
            return action()
        except NETWORK_ERRORS:
            self.close()
        try:
            return action()
        except NETWORK_ERRORS as exc:
            self.close()
            raise TransportError(f"{self.host_label}: {what} failed: {exc}") from None

    # --- commands ---------------------------------------------------------------------
    def command_line(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
        """The one place an argv becomes a shell command line."""
        if env:
            argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
        return shlex.join(argv)

    def _exec(
        self, command: str, stdin: bytes | None, timeout: float | None
    ) -> tuple[int, bytes, bytes]:
        timeout = timeout or self.backend.command_timeout
        transport = self._connect()
        channel = transport.open_session(timeout=self.backend.connect_timeout)
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            pause = 0.0005
            while True:
                progressed = False
                while channel.recv_ready():
                    out += channel.recv(65536)
                    progressed = True
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                    progressed = True
                if (
                    channel.exit_status_ready()
                    and not channel.recv_ready()
                    and not channel.recv_stderr_ready()
                ):
                    break
                if time.monotonic() > deadline:
                    raise TransportError(
                        f"{self.host_label}: command timed out after {timeout:g}s: {command[:80]}"
                    )
                if not progressed:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.01)
            return channel.recv_exit_status(), bytes(out), bytes(err)
        finally:
            channel.close()

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        command = self.command_line(argv, env)
        try:
            code, out, err = self._exec(command, stdin, timeout)
        except NETWORK_ERRORS as exc:
            self.close()
            raise TransportError(f"{self.host_label}: running {argv[0]} failed: {exc}") from None
        return CommandResult(self.host_label, tuple(argv), code, out, err)

    def start_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        stdin_file: tuple[str, bytes] | None = None,
    ) -> ProcessRef:
        """One round trip to the host helper: write the file (mode 0600, new directories 0700),
        start argv in a new session with every standard stream redirected, return its pid and
        identity. Not retried: a start that may have happened must not happen twice."""
        args: dict[str, Any] = {"argv": list(argv), "log_path": log_path, "env": dict(env or {})}
        if stdin_file is not None:
            args["file"] = [stdin_file[0], stdin_file[1].decode("latin-1")]  # bytes, losslessly
        try:
            started = self._helper_call("start", args, self.backend.command_timeout)
            return ProcessRef(int(started["pid"]), str(started["ident"]))
        except NETWORK_ERRORS as exc:
            self.close()
            raise TransportError(f"{self.host_label}: starting {argv[0]} failed: {exc}") from None

    # --- files ------------------------------------------------------------------------
    def _with_sftp(self, what: str, action: Callable[[paramiko.SFTPClient], _T]) -> _T:
        def attempt() -> _T:
            with self._sftp_lock:
                if self._sftp is None:
                    # Not SFTPClient.from_transport: its channel open waits up to an hour on
                    # a host that went away. SFTP requests are small: one that takes longer
                    # than a connect means the host is gone, and nothing may stall on it.
                    timeout = self.backend.connect_timeout
                    channel = self._connect().open_session(timeout=timeout)
                    channel.settimeout(timeout)
                    channel.invoke_subsystem("sftp")
                    self._sftp = paramiko.SFTPClient(channel)
                return action(self._sftp)

        return self._retrying(what, attempt)

    def put_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        def put(sftp: paramiko.SFTPClient) -> None:
            _sftp_makedirs(sftp, str(PurePosixPath(path).parent))
            tmp = f"{path}.tmp"
            with sftp.open(tmp, "wb") as fh:
                fh.chmod(mode)
                fh.write(data)
            sftp.posix_rename(tmp, path)

        self._with_sftp(f"writing {path}", put)

    def get_file(self, path: str, local_path: Path) -> None:
        local_path.parent.mkdir(parents=True, exist_ok=True)
        self._with_sftp(f"reading {path}", lambda sftp: sftp.get(path, str(local_path)))

    def get_tree(self, path: str, local_dir: Path) -> int:
        def walk(sftp: paramiko.SFTPClient) -> int:
            try:
                sftp.stat(path)
            except FileNotFoundError:
                return 0
            count = 0
            pending = [(path, local_dir)]
            while pending:
                remote, local = pending.pop()
                local.mkdir(parents=True, exist_ok=True)
                for entry in sftp.listdir_attr(remote):
                    child = f"{remote}/{entry.filename}"
                    if stat.S_ISDIR(entry.st_mode or 0):
                        pending.append((child, local / entry.filename))
                    else:
                        sftp.get(child, str(local / entry.filename))
                        count += 1
            return count

        return self._with_sftp(f"copying {path}", walk)

    def read_file(self, path: str, offset: int = 0) -> bytes | None:
        def read(sftp: paramiko.SFTPClient) -> bytes | None:
            try:
                with sftp.open(path, "rb") as fh:
                    fh.seek(offset)
                    return fh.read()
            except FileNotFoundError:
                return None

        return self._with_sftp(f"reading {path}", read)

    # --- the host helper -------------------------------------------------------------
    def _get_helper(self) -> HelperClient:
        with self._helper_lock:
            if self._helper is None or self._helper.closed:
                # Bounded: a host that takes the exec request but never says ready raises
                # HelperTimeout (channel closed); _helper_call then drops the connection.
                # The helper runs from this coordinator's copy of the worker package on the
                # host, sent on this channel first if the host lacks it (worker.ship).
                self._helper = HelperClient.start(
                    self._connect(),
                    self.command_line(worker_package.helper_argv(self.python)),
                    self.host_label,
                    self.backend.connect_timeout,
                    worker_package.payload,
                )
            return self._helper

    def _helper_call(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        try:
            return self._get_helper().call(op, args, timeout)
        except HelperTimeout:
            # No answer in time: the host or the link is gone. Drop the connection so the next
            # call reconnects (and fails fast while the host is away) rather than waiting out
            # its own timeout on a dead socket.
            self.close()
            raise

    def worker_argv(self, program: str, *args: str) -> list[str]:
        copy = self._retrying("starting the worker helper", lambda: self._get_helper().root)
        return worker_package.program_argv(self.python, copy, program, *args)

    def worker_call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        limit = timeout or self.backend.command_timeout
        return self._retrying(op, lambda: self._helper_call(op, args, limit))

    def observe_call(self, args: dict[str, Any], timeout: float | None) -> Any:
        # One helper request instead of SFTP open/read/close per file: one round trip a read.
        try:  # one try (no reconnect and retry): a lost host must be seen within host_timeout
            return self._helper_call("watch", args, timeout or self.backend.connect_timeout)
        except NETWORK_ERRORS as exc:
            self.close()
            raise TransportError(f"{self.host_label}: observe failed: {exc}") from None


def _sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = PurePosixPath(path).parts
    current = PurePosixPath(parts[0])
    for part in parts[1:]:
        current = current / part
        try:
            sftp.stat(str(current))
        except FileNotFoundError:
            sftp.mkdir(str(current), mode=0o700)
