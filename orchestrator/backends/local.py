"""The local backend: one host, this machine; every task a local process on loopback."""

from __future__ import annotations

import sys

from orchestrator.config import LocalBackend
from orchestrator.transport.base import Transport
from orchestrator.transport.local import LocalTransport


class LocalHosts:
    kind = "local"

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
