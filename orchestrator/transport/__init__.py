"""The transport seam: how the coordinator reaches a host. The launcher and supervisor talk
only to `Transport`; `local.py` runs on this machine, `ssh.py` (the only module that imports
fabric/paramiko) on remote hosts."""

from orchestrator.transport.base import CommandResult, Transport

__all__ = ["CommandResult", "Transport"]
