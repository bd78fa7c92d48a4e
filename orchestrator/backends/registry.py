"""Backends as plug-ins: each registers its `[backend]` section, how it opens, its capabilities,
its check before a job is registered and its notes for `launch --dry-run`. The built-in ones
are registered here, each opened lazily (paramiko is imported only for an SSH job); another
registers itself with `register_backend`, from its own package (found through the
`orchestrate.backends` entry points: see orchestrator.config.registry)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.backends.capabilities import LOCAL, SLURM, SSH, Capabilities
from orchestrator.config import (
    BackendSection,
    ClusterConfig,
    LocalBackend,
    SlurmBackend,
    SshBackend,
    register_section,
)
from orchestrator.config.registry import ensure_section, section_type
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend


def _nothing_to_check(config: ClusterConfig, config_path: str) -> None:
    return None


def _no_notes(config: ClusterConfig) -> list[str]:
    return []


def _no_allocation(backend_state: str) -> str | None:
    return None


@dataclass(frozen=True)
class BackendPlugin:
    section: type[BackendSection]
    # The backend for one job, from its section (connections are opened on first use).
    open: Callable[[Any], Backend]
    capabilities: Capabilities
    # Its verdict on a job before it is registered: raises ConfigError naming the file and
    # key; nothing is started either way.
    check_before_register: Callable[[ClusterConfig, str], None] = _nothing_to_check
    # What `launch --dry-run` adds (e.g. a scheduler's submission lines).
    dry_run_notes: Callable[[ClusterConfig], list[str]] = _no_notes
    # What `status` calls the job's allocation, from the state the backend keeps for it
    # (`LaunchHooks.remember`); None: nothing to name.
    allocation: Callable[[str], str | None] = _no_allocation
    # Whether a task (its handle's ref) still runs, told from this machine without opening
    # the backend (`status` of a job whose supervisor is gone); None: it cannot tell.
    task_alive_here: Callable[[str], bool] | None = None

    @property
    def type(self) -> str:
        return section_type(self.section)


_plugins: dict[str, BackendPlugin] = {}
_lock = threading.Lock()


def register_backend(plugin: BackendPlugin) -> None:
    """cluster.toml's `[backend] type = ...` names this backend from now on."""
    with _lock:
        known = _plugins.get(plugin.type)
        if known is not None and known is not plugin:
            raise ValueError(f"backend type {plugin.type!r} is registered already")
        register_section(plugin.section)
        _plugins[plugin.type] = plugin


def plugin_for(backend_type: str) -> BackendPlugin:
    """The plug-in of a job's backend type (an installed plug-in is imported on first use)."""
    ensure_section(backend_type)
    plugin = _plugins.get(backend_type)
    if plugin is None:
        raise ConfigError(f"backend.type: no backend {backend_type!r} is installed here")
    return plugin


def _local_task_alive(ref: str) -> bool:
    from orchestrator.backends.agents import agent_alive_here

    return agent_alive_here(ref)


def _open_local(section: LocalBackend) -> Backend:
    from orchestrator.backends.local import LocalHosts

    return LocalHosts(section)


def _open_ssh(section: SshBackend) -> Backend:
    from orchestrator.backends.ssh import SshHosts  # imports paramiko

    return SshHosts(section)


def _open_slurm(section: SlurmBackend) -> Backend:
    from orchestrator.backends.slurm import SlurmHosts

    return SlurmHosts(section)


def _check_slurm_submission(config: ClusterConfig, config_path: str) -> None:
    from orchestrator.backends.slurm_allocation import check_submission  # sbatch --test-only

    check_submission(config, config_path)


def _slurm_dry_run(config: ClusterConfig) -> list[str]:
    from orchestrator.backends.slurm_commands import dry_run_lines  # its sbatch and srun lines

    return dry_run_lines(config)


register_backend(BackendPlugin(LocalBackend, _open_local, LOCAL, task_alive_here=_local_task_alive))
register_backend(BackendPlugin(SshBackend, _open_ssh, SSH))
register_backend(
    BackendPlugin(
        SlurmBackend, _open_slurm, SLURM, _check_slurm_submission, _slurm_dry_run,
        allocation=lambda slurm_job: slurm_job or None,  # its state is its Slurm job id
    )
)  # fmt: skip
