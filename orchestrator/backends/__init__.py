"""Backends answer "where do tasks run, how do we start, reach and stop them". Each backend is a
plug-in (registry.py) that owns its whole lifecycle behind the `Backend` protocol (base.py); the
supervisor, the CLI and the stop path never ask which backend they hold.

- local.py: one host, this machine; every task a local process on loopback.
- ssh.py: one host per cluster.toml entry, reached over SSH.
- slurm.py: one host per node of a Slurm allocation; every attempt one srun step in it.

local and ssh start an agent per task themselves (agent_hosts.py); Slurm's srun starts them.
"""

from __future__ import annotations

from orchestrator.backends.base import (
    Backend,
    Capabilities,
    Launched,
    LaunchHooks,
    LaunchRequest,
    Sweep,
    TaskHandle,
)
from orchestrator.backends.registry import BackendPlugin, plugin_for, register_backend
from orchestrator.config import ClusterConfig

__all__ = [
    "Backend",
    "BackendPlugin",
    "Capabilities",
    "LaunchHooks",
    "LaunchRequest",
    "Launched",
    "Sweep",
    "TaskHandle",
    "check_before_register",
    "dry_run_notes",
    "open_backend",
    "plugin_for",
    "register_backend",
]


def open_backend(config: ClusterConfig) -> Backend:
    return plugin_for(config.backend.type).open(config.backend)


def check_before_register(config: ClusterConfig, config_path: str) -> None:
    """The backend's own verdict on a job before it is registered (raises ConfigError naming the
    file and key). Nothing is started either way."""
    plugin_for(config.backend.type).check_before_register(config, config_path)


def dry_run_notes(config: ClusterConfig) -> list[str]:
    """What `launch --dry-run` adds for the backend."""
    return plugin_for(config.backend.type).dry_run_notes(config)
