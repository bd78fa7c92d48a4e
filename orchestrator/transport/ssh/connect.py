"""Opening an SSH connection to a host: ~/.ssh/config applied (through fabric), every hop of a
ProxyJump chain given our host-key policy and timeouts, and every failure one line."""

from __future__ import annotations

import contextlib
import shlex
import socket
from pathlib import Path
from typing import cast

import paramiko
from fabric import Connection

from orchestrator.config import SshBackend, SshHost
from orchestrator.errors import TransportError
from orchestrator.transport.ssh.host_keys import (
    HostKeyError,
    HostKeyPolicy,
    fingerprint,
    host_key_name,
)

KEEPALIVE_SECONDS = 5
# paramiko's transport thread wakes at this socket timeout to see whether it was closed (0.1 s
# by default): ten wakeups a second per host were most of an idle supervisor's cost at scale.
# Once connected, once a second is enough; a close still returns at once (the thread then ends
# within the second), and SSH keep-alives are sent every KEEPALIVE_SECONDS as before.
IDLE_CHECK_SECONDS = 1.0
NETWORK_ERRORS = (OSError, EOFError, paramiko.SSHException)


def new_connection(host: SshHost, backend: SshBackend, policy: HostKeyPolicy) -> Connection:
    """A Connection to this host, not yet open, with ~/.ssh/config applied (fabric makes
    a gateway Connection per ProxyJump hop, each with paramiko's AutoAddPolicy: any key
    accepted). Every hop gets the same host-key checks (our known keys for its own host,
    our policy) and our timeouts before it opens."""
    identity = host.identity_file or backend.identity_file
    connect_kwargs: dict[str, object] = {}
    if identity is not None:
        connect_kwargs["key_filename"] = [str(identity.expanduser())]
    conn = Connection(
        host.address,
        user=host.user or backend.user,
        port=host.port or backend.port,
        connect_timeout=backend.connect_timeout,
        connect_kwargs=connect_kwargs,
    )
    for i, hop in enumerate(connection_hops(conn)):
        policy.prepare(hop.client, hop.host, int(hop.port))
        if i > 0:  # a gateway: fabric leaves its timeouts unset (the channel open: an hour)
            if hop.connect_timeout is None:
                hop.connect_timeout = backend.connect_timeout
            hop.connect_kwargs = {
                "channel_timeout": backend.connect_timeout,
                **hop.connect_kwargs,
            }
    return conn


def open_connection(
    host: SshHost, backend: SshBackend, policy: HostKeyPolicy, known_hosts: Path
) -> tuple[Connection, paramiko.Transport]:
    """Open a connection to the host (TCP_NODELAY on a direct socket; every hop checked and
    kept alive); each failure is one TransportError naming the host and the hop chain."""
    label = host.label
    try:
        conn = new_connection(host, backend, policy)
    except HostKeyError as exc:
        raise TransportError(f"{label}: {exc}") from None
    where = " via ".join(f"{hop.user}@{hop.host}:{hop.port}" for hop in connection_hops(conn))
    try:
        if conn.gateway is None:  # with a ProxyJump/ProxyCommand, fabric makes the socket
            sock = socket.create_connection((conn.host, conn.port), backend.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.connect_kwargs["sock"] = sock
        conn.open()
    except paramiko.BadHostKeyException as exc:
        close_hops(conn)
        name = _key_name_of(conn, exc.hostname)
        revoked = False
        with contextlib.suppress(HostKeyError):
            revoked = policy.load().is_revoked(name, exc.key)
        if revoked:
            raise TransportError(f"{label}: {policy.revoked_message(name, exc.key)}") from None
        raise TransportError(
            f"{label}: host key for {name} has CHANGED "
            f"(now {fingerprint(exc.key)}, {known_hosts} has "
            f"{fingerprint(exc.expected_key)}); refusing to connect. If the change is "
            f"expected, remove the old key: "
            f"ssh-keygen -R {shlex.quote(name)} -f {known_hosts}"
        ) from None
    except HostKeyError as exc:
        close_hops(conn)
        raise TransportError(f"{label}: {exc}") from None
    except paramiko.AuthenticationException as exc:
        close_hops(conn)
        raise TransportError(f"{label}: authentication failed for {where}: {exc}") from None
    except TimeoutError:
        close_hops(conn)
        raise TransportError(
            f"{label}: cannot connect to {where}: timed out after {backend.connect_timeout:g}s"
        ) from None
    except NETWORK_ERRORS as exc:
        close_hops(conn)
        raise TransportError(f"{label}: cannot connect to {where}: {exc}") from None
    except BaseException:
        close_hops(conn)
        raise
    for hop in connection_hops(conn):
        hop_transport = hop.client.get_transport()
        if hop_transport is not None:
            hop_transport.set_keepalive(KEEPALIVE_SECONDS)
            hop_transport.sock.settimeout(IDLE_CHECK_SECONDS)
    transport = conn.client.get_transport()
    assert transport is not None
    return conn, transport


def connection_hops(conn: Connection) -> list[Connection]:
    """The connection, then its gateway Connections (ProxyJump hops), target first. A
    ProxyCommand gateway (a string) is the user's own command: no hop of ours."""
    hops: list[Connection] = []
    node: object = conn
    # Fabric makes every ProxyJump hop a Connection of its own (never a subclass).
    while type(node) is Connection and all(node is not hop for hop in hops):
        hop = cast(Connection, node)
        hops.append(hop)
        node = hop.gateway
    return hops


def close_hops(conn: Connection) -> None:
    """Close the connection and every gateway under it. Fabric's close leaves gateways open,
    and does nothing where open() failed (a refused host key, failed authentication) although
    paramiko's transport is running by then: close the client too."""
    for hop in connection_hops(conn):
        with contextlib.suppress(Exception):
            hop.close()
        with contextlib.suppress(Exception):
            hop.client.close()


def _key_name_of(conn: Connection, hostname: str) -> str:
    """The known_hosts name of the hop that paramiko reported by its bare host name."""
    for hop in connection_hops(conn):
        if hop.host == hostname:
            return host_key_name(hop.host, int(hop.port))
    return hostname
