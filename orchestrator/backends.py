"""Backends answer "where do tasks run and how do we reach them": one transport per host.

The local backend is one host (this machine, loopback addresses); the SSH backend one host per
cluster.toml entry. A scheduler backend (Slurm) would hand out hosts the same way.
"""

from __future__ import annotations

import sys
from typing import Protocol

from orchestrator.config import ClusterConfig, LocalBackend, SshBackend
from orchestrator.transport.base import Transport
from orchestrator.transport.local import LocalTransport


class Backend(Protocol):
    kind: str
    # Seconds between process-liveness checks (each may be a remote command); 0: every tick.
    alive_check_interval: float

    def host_count(self) -> int: ...

    def transport(self, host_index: int) -> Transport: ...

    def python(self, host_index: int) -> str: ...

    def close(self) -> None: ...


class LocalHosts:
    kind = "local"
    alive_check_interval = 0.0

    def __init__(self, config: LocalBackend) -> None:
        self._python = config.python or sys.executable
        self._transport = LocalTransport("local", self._python)

    def host_count(self) -> int:
        return 1

    def transport(self, host_index: int) -> Transport:
        return self._transport

    def python(self, host_index: int) -> str:
        return self._python

    def close(self) -> None:
        self._transport.close()


def open_backend(config: ClusterConfig) -> Backend:
    if isinstance(config.backend, LocalBackend):
        return LocalHosts(config.backend)
    assert isinstance(config.backend, SshBackend)
    from orchestrator.transport.ssh import SshHosts  # paramiko is imported only for SSH jobs

    return SshHosts(config.backend)
