"""cluster.toml: what it may hold (`model`, `values`), how it is read (`load`) and the rules
across its keys (`rules`). Everything else imports from here."""

from orchestrator.config.load import load_config, parse_config
from orchestrator.config.model import (
    Backend,
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
)
from orchestrator.config.values import DEFAULT_SSH_PORT, MAX_PORT, normalized_address

__all__ = [
    "DEFAULT_SSH_PORT",
    "MAX_PORT",
    "Backend",
    "ClusterConfig",
    "EntrypointSection",
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
]
