"""A test bed of N SSH hosts on this machine: a network namespace each, joined by a bridge,
with addresses this module assigns in a private range, an OpenSSH sshd per namespace with its
own host key and hostname, an authorized client key, a known_hosts file, and a ready
cluster.toml. The namespaces share this machine's filesystem, which stands in for the shared
filesystem.

From the repository root:

    sudo .venv/bin/python -m tests.beds.ssh up 3 --dir /tmp/orchestrate-testbed
    orchestrate launch /tmp/orchestrate-testbed/cluster.toml
    sudo .venv/bin/python -m tests.beds.ssh down --dir /tmp/orchestrate-testbed

Needs root, iproute2 (ip), util-linux (unshare) and openssh-server (sshd, ssh-keygen). Traffic
goes only to the addresses it creates.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.beds import netns
from tests.beds.base import Bed, Member, Progress, cluster_toml, missing, spawn, tool, wait_port

SSHD = tool("sshd")
STATE_FILE = "testbed.json"
PER_SUBNET = 240

SSHD_CONFIG = """\
Port 22
ListenAddress {address}
HostKey {host_key}
PidFile {host_dir}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
MaxStartups 200:30:400
LogLevel ERROR
"""


@dataclass(frozen=True)
class TestHost(Member):
    sshd_pid: int
    host_dir: str


@dataclass(frozen=True)
class Testbed(Bed):
    hosts: list[TestHost]
    identity_file: str
    known_hosts: str

    state_file = STATE_FILE
    members = "hosts"
    member_type = TestHost
    what = "test bed"
    bridge_prefix = "ob"
    up_help = "create N hosts"

    @classmethod
    def missing_requirements(cls) -> str | None:
        reason = missing("network namespaces, sshd", ("ip", "unshare", "ssh-keygen"),
                         "apt-get install iproute2 util-linux openssh-client")  # fmt: skip
        if reason:
            return reason
        if not os.path.exists(SSHD):
            return "needs sshd (apt-get install openssh-server)"
        probe = f"orchprobe{secrets.token_hex(3)}"
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return None

    @classmethod
    def prepare(cls, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)

    @classmethod
    def build(cls, count: int, root: Path, epochs: int, token: str, progress: Progress) -> Testbed:
        # 240 hosts to a /24; a bigger bed takes more /24s on the same bridge (one link: inside,
        # each host sees the whole 10.231/16 on it).
        subnets = netns.free_subnets("10.231", (count + PER_SUBNET - 1) // PER_SUBNET)
        gateway = f"{subnets[0]}.1"
        bridge = progress.state["bridge"]
        netns.add_bridge(bridge, gateway)
        for subnet in subnets[1:]:
            netns.ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        identity = root / "id_ed25519"
        client_pub = _keygen(identity, "orchestrate-testbed")
        (root / "authorized_keys").write_text(client_pub + "\n")
        known_lines = []
        hosts: list[TestHost] = []
        for i in range(count):
            name = f"h{i}"
            namespace = f"orch{token}{name}"
            address = f"{subnets[i // PER_SUBNET]}.{10 + i % PER_SUBNET}"
            veth, peer = f"ov{token}{i}", f"on{token}{i}"
            host_dir = root / "hosts" / name
            host_dir.mkdir(parents=True, exist_ok=True)
            prefix = 24 if len(subnets) == 1 else 16
            progress.add_namespace(namespace, bridge, veth, peer, address, prefix)
            host_key = host_dir / "ssh_host_ed25519_key"
            host_pub = _keygen(host_key, name)
            known_lines.append(f"{address} {' '.join(host_pub.split()[:2])}")
            config = host_dir / "sshd_config"
            config.write_text(
                SSHD_CONFIG.format(address=address, host_key=host_key, host_dir=host_dir, root=root)
                + session_env()
            )
            sshd_pid = start_sshd(namespace, name, host_dir)
            hosts.append(TestHost(name, namespace, address, veth, sshd_pid, str(host_dir)))
            progress.record(hosts[-1])
        for host in hosts:
            wait_port(host.address, 22, 15)
        known_hosts = root / "known_hosts"
        known_hosts.write_text("\n".join(known_lines) + "\n")
        (root / "shared").mkdir(exist_ok=True)
        cluster = root / "cluster.toml"
        cluster.write_text(_cluster_toml(hosts, root, identity, known_hosts, epochs))
        return cls(
            root=str(root), token=token, bridge=bridge, gateway=gateway, hosts=hosts,
            identity_file=str(identity), known_hosts=str(known_hosts),
            cluster_toml=str(cluster), python=sys.executable,
        )  # fmt: skip

    def describe(self, seconds: float) -> list[str]:
        return [
            *(f"{h.name}  {h.address}  netns {h.namespace}  sshd pid {h.sshd_pid}"
              for h in self.hosts),
            f"cluster.toml: {self.cluster_toml}",
            f"ssh: ssh -i {self.identity_file} -o UserKnownHostsFile={self.known_hosts} "
            f"root@{self.hosts[0].address}",
        ]  # fmt: skip


def session_env() -> str:
    """sshd's lines that give each session what this machine's podman needs (a
    containers.conf of the test image's fixture, where a plain `podman run` fails here)."""
    conf = os.environ.get("CONTAINERS_CONF")
    return f"SetEnv CONTAINERS_CONF={conf}\n" if conf else ""


def missing_requirements() -> str | None:
    """Why a test bed cannot be made here, or None."""
    return Testbed.missing_requirements()


def up(count: int, root: Path, epochs: int = 8) -> Testbed:
    """Create `count` hosts under `root` and return the test bed."""
    return Testbed.up(count, root, epochs)


def down(root: Path) -> None:
    """Tear down everything `up` made under root: processes in the namespaces, namespaces,
    bridge. Safe to call twice, and on a half-built bed."""
    Testbed.down(root)


def start_sshd(namespace: str, name: str, host_dir: Path) -> int:
    """Start a host's sshd (its config written by `up`) in its namespace, under its own
    hostname; its pid. Also how a host comes back after a simulated reboot."""
    return spawn(
        ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c",
         'hostname "$1" && exec "$2" -D -e -f "$3"', "sh", name, SSHD,
         str(host_dir / "sshd_config")],
        host_dir / "sshd.log",
    )  # fmt: skip


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )
    return Path(f"{path}.pub").read_text().strip()


def _cluster_toml(
    hosts: list[TestHost], root: Path, identity: Path, known_hosts: Path, epochs: int
) -> str:
    backend = [
        'type = "ssh"',
        'user = "root"',
        f'identity_file = "{identity}"',
        f'known_hosts = "{known_hosts}"',
        f'python = "{sys.executable}"',
        "connect_timeout = 5.0",
    ]
    for host in hosts:
        backend += ["", "[[backend.hosts]]", f'address = "{host.address}"', f'name = "{host.name}"']
    return cluster_toml(
        "Written by tests/beds/ssh.py: the example on the namespaced SSH test hosts.",
        "testbed", root, epochs, backend,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(Testbed.main(__doc__ or "", "python -m tests.beds.ssh",
                          Path("/tmp/orchestrate-testbed"), 8))  # fmt: skip
