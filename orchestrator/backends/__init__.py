"""Backends answer "where do tasks run and how do we reach them": one transport per host.

The local backend is one host (this machine, loopback addresses); the SSH backend one host per
cluster.toml entry; the Slurm backend one host per node of its allocation.
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.config import ClusterConfig, LocalBackend, SlurmBackend, SshBackend
from orchestrator.transport.base import Transport


class Backend(Protocol):
    kind: str
    # Seconds between process-liveness checks (each may be a remote command); 0: every tick.

    def host_count(self) -> int: ...

    def transport(self, host_index: int) -> Transport: ...

    def python(self, host_index: int) -> str: ...

    def close(self) -> None: ...


def open_backend(config: ClusterConfig) -> Backend:
    if isinstance(config.backend, LocalBackend):
        from orchestrator.backends.local import LocalHosts

        return LocalHosts(config.backend)
    if isinstance(config.backend, SlurmBackend):
        from orchestrator.backends.slurm import SlurmHosts

        return SlurmHosts(config.backend)
    assert isinstance(config.backend, SshBackend)
    from orchestrator.backends.ssh import SshHosts  # paramiko is imported only for SSH jobs

    return SshHosts(config.backend)
