"""cluster.toml: what it may hold (`model`, `values`), how it is read (`load`) and the rules
across its keys (`rules`). Everything else imports from here."""

from orchestrator.config.load import load_config, parse_config
from orchestrator.config.model import (
    LOOPBACK,
    PER_GPU,
    Backend,
    ClusterConfig,
    EntrypointSection,
    HostPlace,
    JobSection,
    LocalBackend,
    PortsSection,
    RestartSection,
    SlurmBackend,
    SshBackend,
    SshHost,
    StrategySection,
    SupervisionSection,
    host_gpus_per_task,
    host_slots,
    slurm_node_label,
)
from orchestrator.config.values import DEFAULT_SSH_PORT, MAX_PORT, normalized_address

__all__ = [
    "DEFAULT_SSH_PORT",
    "LOOPBACK",
    "MAX_PORT",
    "PER_GPU",
    "Backend",
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
    "host_gpus_per_task",
    "host_slots",
    "load_config",
    "normalized_address",
    "parse_config",
    "slurm_node_label",
]
