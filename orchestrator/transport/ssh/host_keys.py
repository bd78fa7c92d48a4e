"""Host keys are checked strictly against known_hosts: an unknown key is refused with a message
that says how to trust it (or, opted in, trusted on first use and recorded); a changed key is
always refused (paramiko raises BadHostKeyException before any policy is asked)."""

from __future__ import annotations

import threading
from pathlib import Path

import paramiko


class UnknownHostKeyError(paramiko.SSHException):
    pass


def fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} SHA256:{key.fingerprint.split(':', 1)[-1]}"


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse, saying how to trust it; or (opt-in) record it. A changed key never
    reaches this policy: paramiko raises BadHostKeyException first."""

    def __init__(self, known_hosts: Path, trust_unknown: bool, lock: threading.Lock) -> None:
        self.known_hosts = known_hosts
        self.trust_unknown = trust_unknown
        self.lock = lock

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if not self.trust_unknown:
            host, _, port = hostname.strip("[").partition("]:")
            scan = f"ssh-keyscan {'-p ' + port + ' ' if port else ''}{host}"
            raise UnknownHostKeyError(
                f"unknown host key {fingerprint(key)} for {hostname}, not in {self.known_hosts}; "
                f"check it, then trust it with `{scan} >> {self.known_hosts}` "
                "(or set backend.trust_unknown_hosts = true)"
            )
        client.get_host_keys().add(hostname, key.get_name(), key)
        with self.lock:  # several hosts may be trusted at once: one writer at a time
            keys = paramiko.HostKeys()
            if self.known_hosts.exists():
                keys.load(str(self.known_hosts))
            keys.add(hostname, key.get_name(), key)
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            keys.save(str(self.known_hosts))
