"""The SSH backend: one host per cluster.toml entry, each reached by its own SshTransport."""

from __future__ import annotations

import threading

from orchestrator.config import SshBackend
from orchestrator.transport.base import Transport
from orchestrator.transport.ssh import SshTransport


class SshHosts:
    """The SSH backend: one transport per cluster.toml host, connections opened on first use."""

    kind = "ssh"

    def __init__(self, config: SshBackend) -> None:
        lock = threading.Lock()
        self._transports = [SshTransport(h, config, lock) for h in config.hosts]
        self._pythons = [h.python or config.python for h in config.hosts]

    def host_count(self) -> int:
        return len(self._transports)

    def transport(self, host_index: int) -> Transport:
        return self._transports[host_index]

    def python(self, host_index: int) -> str:
        return self._pythons[host_index]

    def close(self) -> None:
        for transport in self._transports:
            transport.close()
