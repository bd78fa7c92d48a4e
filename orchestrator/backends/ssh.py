"""The SSH backend: one host per cluster.toml entry, each reached by its own SshTransport."""

from __future__ import annotations

import threading

from orchestrator.backends.agent_hosts import AgentHosts
from orchestrator.backends.capabilities import SSH
from orchestrator.config import ClusterConfig, SshBackend
from orchestrator.errors import LaunchError
from orchestrator.transport.fanout import each
from orchestrator.transport.ssh import SshTransport


class SshHosts(AgentHosts):
    """One transport per cluster.toml host, connections opened on first use."""

    kind = "ssh"
    capabilities = SSH

    def __init__(self, config: SshBackend) -> None:
        lock = threading.Lock()
        super().__init__(
            [SshTransport(h, config, lock) for h in config.hosts],
            [h.python or config.python for h in config.hosts],
        )
        self.config = config

    def run_setup(self, config: ClusterConfig) -> None:
        """Each host's `setup` commands, in order, once per job, before any agent starts."""
        hosts = self.config.hosts
        timeout = self.config.command_timeout

        def setup(i: int) -> None:
            for argv in hosts[i].setup:
                result = self.transport(i).run(argv, timeout=timeout)
                if not result.ok:
                    raise LaunchError(f"setup {argv!r} exited {result.exit_code}: {result.tail()}")

        results = each(range(len(hosts)), setup)
        if not results.ok:
            raise LaunchError(
                "setup failed, nothing started: "
                + results.describe_failures(lambda i: hosts[i].label)
            )
