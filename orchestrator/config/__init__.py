"""cluster.toml: what it may hold (`model`, `values`), how it is read (`load`) and the rules
across its keys (`rules`). Everything else imports from here."""

from orchestrator.config.base import LOOPBACK, BackendSection, HostPlace
from orchestrator.config.load import load_config, parse_config, parse_stored_config
from orchestrator.config.model import (
    PER_GPU,
    ClusterConfig,
    EntrypointSection,
    JobSection,
    LocalBackend,
    PortsSection,
    RestartSection,
    SlurmBackend,
    SshBackend,
    SshHost,
    StrategySection,
    SupervisionSection,
    slurm_node_label,
)
from orchestrator.config.registry import register_section
from orchestrator.config.values import DEFAULT_SSH_PORT, MAX_PORT, normalized_address

__all__ = [
    "DEFAULT_SSH_PORT",
    "LOOPBACK",
    "MAX_PORT",
    "PER_GPU",
    "BackendSection",
    "ClusterConfig",
    "EntrypointSection",
    "HostPlace",
    "JobSection",
    "LocalBackend",
    "PortsSection",
    "RestartSection",
    "SlurmBackend",
    "SshBackend",
    "SshHost",
    "StrategySection",
    "SupervisionSection",
    "load_config",
    "normalized_address",
    "parse_config",
    "parse_stored_config",
    "register_section",
    "slurm_node_label",
]
