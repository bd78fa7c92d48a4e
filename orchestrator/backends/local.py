"""The local backend: one host, this machine; every task a local process on loopback."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from orchestrator.backends.agent_hosts import AgentHosts
from orchestrator.backends.capabilities import LOCAL
from orchestrator.backends.preflight import PROBE_TIMEOUT
from orchestrator.config import ClusterConfig, LocalBackend
from orchestrator.errors import OrchestrateError, TransportError
from orchestrator.transport.local import LocalTransport


class LocalHosts(AgentHosts):
    kind = "local"
    capabilities = LOCAL

    def __init__(self, config: LocalBackend) -> None:
        python = config.python or sys.executable
        super().__init__([LocalTransport("local", python)], [python])

    def prepare(self, config: ClusterConfig) -> None:
        # On one machine there is nothing to mount: make the directory. On SSH hosts a missing
        # shared_dir is a preflight error (an unmounted share must not be papered over).
        with contextlib.suppress(OrchestrateError):
            self.transport(0).run(
                ["mkdir", "-p", str(config.job.shared_dir)], timeout=PROBE_TIMEOUT
            )

    def lasting_call(self, host_index: int, op: str, args: dict[str, Any], timeout: float) -> Any:
        """In this process: it checks this machine's network whichever interpreter runs the
        tasks, and a listener must outlive the call (a one-off interpreter would not)."""
        from worker import hostd

        try:
            return hostd.handle(op, args)
        except (OSError, ValueError, KeyError) as exc:
            raise TransportError(f"local: {op} failed: {exc}") from None
