"""The SSH transport: the only package that imports fabric/paramiko.

- host_keys.py: strict checking against known_hosts (or, opted in, trust on first use);
- helper.py: the client of the worker package's host helper, one per connection;
- transport.py: SshTransport, one reused connection per host.
"""

from orchestrator.transport.ssh.host_keys import UnknownHostKeyError
from orchestrator.transport.ssh.transport import SshTransport

__all__ = ["SshTransport", "UnknownHostKeyError"]
