"""Backends answer "where do tasks run, how do we start, reach and stop them". Each backend owns
its whole lifecycle in its own module, behind the `Backend` protocol below; the supervisor, the
CLI and the stop path never ask which backend they hold.

- local.py: one host, this machine; every task a local process on loopback.
- ssh.py: one host per cluster.toml entry, reached over SSH.
- slurm.py: one host per node of a Slurm allocation; every attempt one srun step in it.

local and ssh start an agent per task themselves (agent_hosts.py); Slurm's srun starts them.
The protocol and the values that cross it are in base.py.
"""

from __future__ import annotations

from orchestrator.backends.base import (
    Backend,
    Capabilities,
    Launched,
    LaunchHooks,
    LaunchRequest,
    Sweep,
)
from orchestrator.config import ClusterConfig, LocalBackend, SlurmBackend, SshBackend

__all__ = [
    "Backend",
    "Capabilities",
    "LaunchHooks",
    "LaunchRequest",
    "Launched",
    "Sweep",
    "check_before_register",
    "dry_run_notes",
    "open_backend",
]


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


def check_before_register(config: ClusterConfig, config_path: str) -> None:
    """The backend's own verdict on a job before it is registered (Slurm: sbatch --test-only);
    raises ConfigError naming the file and key. Nothing is started either way."""
    if isinstance(config.backend, SlurmBackend):
        from orchestrator.backends.slurm_allocation import check_submission

        check_submission(config, config_path)


def dry_run_notes(config: ClusterConfig) -> list[str]:
    """What `launch --dry-run` adds for the backend (Slurm: its sbatch and srun lines)."""
    if isinstance(config.backend, SlurmBackend):
        from orchestrator.backends.slurm_commands import dry_run_lines

        return dry_run_lines(config)
    return []
