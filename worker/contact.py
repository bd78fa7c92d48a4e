"""Whether the coordinator still reaches this host, and whether any peer does.

Each supervisor read of a host (the helper's `observe`) touches one small file per agent on the
host's own disk (never the shared directory, which a partition may take away too). An agent
whose file has not been touched for `orphan_timeout` and that cannot reach any peer task is cut
off from everything: it stops its trainer, so a partitioned host never trains on alone.
Standard library only."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from collections.abc import Iterable

from worker.private_dir import open_private, private_dir

# How long one peer probe may take.
PEER_PROBE_TIMEOUT = 1.0


def contact_dir() -> str:
    """This user's private directory for the marks (made 0700, owner and mode checked: another
    user may have made it first, or planted links in it; UnsafeDirectory then)."""
    return private_dir("contact")


def contact_path(agent_pid: int) -> str:
    return os.path.join(contact_dir(), str(int(agent_pid)))


def touch(agent_pids: Iterable[int]) -> None:
    """The coordinator reached this host just now (best effort: never fails a read)."""
    pids = list(agent_pids)
    if not pids:
        return
    try:
        directory = contact_dir()  # checked once a read, not once a mark
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            # Opened without following a link, then touched through the descriptor.
            fd = open_private(os.path.join(directory, str(int(pid))), os.O_WRONLY | os.O_CREAT)
            try:
                os.utime(fd)
            finally:
                os.close(fd)


def contact_age(agent_pid: int) -> float | None:
    """Seconds since the coordinator last reached this agent's host; None: never (a local
    job, or not yet). Both times are this host's clock."""
    try:
        return time.time() - os.stat(contact_path(agent_pid), follow_symlinks=False).st_mtime
    except OSError:
        return None


def forget(agent_pid: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(contact_path(agent_pid))


def peer_endpoints(tf_config: dict[str, object], task_type: str, index: int) -> list[str]:
    cluster = tf_config.get("cluster", {})
    peers: list[str] = []
    if isinstance(cluster, dict):
        for kind, endpoints in cluster.items():
            for i, endpoint in enumerate(endpoints or []):
                if (kind, i) != (task_type, index):
                    peers.append(str(endpoint))
    return peers


def reachable(endpoint: str, timeout: float = PEER_PROBE_TIMEOUT) -> bool:
    """Whether the peer's host answers at all: a connection accepted or refused is an answer
    (its trainer may be gone, its host is there); a timeout or no route is not."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return True
    except OSError as exc:
        return exc.errno in (errno.ECONNRESET,)
    except ValueError:
        return True  # not an address we can judge: never a reason to stop


def cut_off(agent_pid: int, peers: list[str], orphan_timeout: float) -> bool:
    """The coordinator has not reached us for orphan_timeout and no peer answers. Never for a
    task without peers, or when the coordinator never reached us (nothing to lose)."""
    if orphan_timeout <= 0 or not peers:
        return False
    age = contact_age(agent_pid)
    if age is None or age < orphan_timeout:
        return False
    return not any(reachable(p) for p in peers)
