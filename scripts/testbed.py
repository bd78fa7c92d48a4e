#!/usr/bin/env python3
"""A test bed of N SSH hosts on this machine: a network namespace each, joined by a bridge,
with addresses this script assigns in a private range, an OpenSSH sshd per namespace with its
own host key and hostname, an authorized client key, a known_hosts file, and a ready
cluster.toml. The namespaces share this machine's filesystem, which stands in for the shared
filesystem.

    sudo python scripts/testbed.py up 3 --dir /tmp/orchestrate-testbed
    orchestrate launch /tmp/orchestrate-testbed/cluster.toml
    sudo python scripts/testbed.py down --dir /tmp/orchestrate-testbed

Needs root, iproute2 (ip), util-linux (unshare) and openssh-server (sshd, ssh-keygen). Traffic
goes only to the addresses it creates.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import netns  # noqa: E402

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
STATE_FILE = "testbed.json"


@dataclass(frozen=True)
class TestHost:
    name: str
    namespace: str
    address: str
    veth: str  # the bridge-side end; `ip link set VETH down` cuts the host off
    sshd_pid: int
    host_dir: str


@dataclass(frozen=True)
class Testbed:
    root: str
    token: str
    bridge: str
    gateway: str
    hosts: list[TestHost]
    identity_file: str
    known_hosts: str
    cluster_toml: str
    python: str

    @classmethod
    def load(cls, root: Path) -> Testbed:
        data = json.loads((root / STATE_FILE).read_text())
        data["hosts"] = [TestHost(**h) for h in data["hosts"]]
        return cls(**data)


def missing_requirements() -> str | None:
    """Why a test bed cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    for tool in ("ip", "unshare", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install iproute2 util-linux openssh-client)"
    if not os.path.exists(SSHD):
        return "needs sshd (apt-get install openssh-server)"
    probe = f"orchprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _wait_port(address: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )
    return (
        path.with_suffix(".pub").read_text().strip()
        if path.suffix
        else Path(f"{path}.pub").read_text().strip()
    )


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


PER_SUBNET = 240


def up(count: int, root: Path, epochs: int = 8) -> Testbed:
    """Create `count` hosts under `root` (made empty first) and return the test bed."""
    reason = missing_requirements()
    if reason:
        raise RuntimeError(f"cannot build the test bed: {reason}")
    if (root / STATE_FILE).exists():
        down(root)
    root.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(3)
    # 240 hosts to a /24; a bigger bed takes more /24s on the same bridge (one link: inside,
    # each host sees the whole 10.231/16 on it).
    subnets: list[str] = []
    while len(subnets) < (count + PER_SUBNET - 1) // PER_SUBNET:
        subnet = netns.free_subnet("10.231")
        if subnet not in subnets:
            subnets.append(subnet)
    gateway = f"{subnets[0]}.1"
    bridge = f"ob{token}"
    hosts: list[TestHost] = []
    state = {"root": str(root), "token": token, "bridge": bridge, "hosts": hosts}
    # Record progress as we go, so `down` can undo a half-built bed.
    _save_partial(root, state)
    try:
        netns.add_bridge(bridge, gateway)
        for subnet in subnets[1:]:
            netns.ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        identity = root / "id_ed25519"
        client_pub = _keygen(identity, "orchestrate-testbed")
        (root / "authorized_keys").write_text(client_pub + "\n")
        known_lines = []
        for i in range(count):
            name = f"h{i}"
            namespace = f"orch{token}{name}"
            address = f"{subnets[i // PER_SUBNET]}.{10 + i % PER_SUBNET}"
            veth, peer = f"ov{token}{i}", f"on{token}{i}"
            host_dir = root / "hosts" / name
            host_dir.mkdir(parents=True, exist_ok=True)
            netns.ip("netns", "add", namespace)
            hosts.append(TestHost(name, namespace, address, veth, 0, str(host_dir)))
            _save_partial(root, state)
            netns.wire(namespace, bridge, veth, peer, address, 24 if len(subnets) == 1 else 16)
            host_key = host_dir / "ssh_host_ed25519_key"
            host_pub = _keygen(host_key, name)
            known_lines.append(f"{address} {' '.join(host_pub.split()[:2])}")
            config = host_dir / "sshd_config"
            config.write_text(
                SSHD_CONFIG.format(address=address, host_key=host_key, host_dir=host_dir, root=root)
            )
            sshd_pid = start_sshd(namespace, name, host_dir)
            hosts[-1] = TestHost(name, namespace, address, veth, sshd_pid, str(host_dir))
            _save_partial(root, state)
        for host in hosts:
            _wait_port(host.address, 22, 15)
        known_hosts = root / "known_hosts"
        known_hosts.write_text("\n".join(known_lines) + "\n")
        shared = root / "shared"
        shared.mkdir(exist_ok=True)
        cluster = root / "cluster.toml"
        cluster.write_text(_cluster_toml(hosts, root, identity, known_hosts, epochs))
        bed = Testbed(
            root=str(root), token=token, bridge=bridge, gateway=gateway, hosts=hosts,
            identity_file=str(identity), known_hosts=str(known_hosts),
            cluster_toml=str(cluster), python=sys.executable,
        )  # fmt: skip
        (root / STATE_FILE).write_text(json.dumps(asdict(bed), indent=2))
        return bed
    except BaseException:
        down(root)
        raise


def start_sshd(namespace: str, name: str, host_dir: Path) -> int:
    """Start a host's sshd (its config written by `up`) in its namespace, under its own
    hostname; its pid. Also how a host comes back after a simulated reboot."""
    config = host_dir / "sshd_config"
    log = open(host_dir / "sshd.log", "ab")  # noqa: SIM115 - handed to the child
    sshd = subprocess.Popen(
        ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c",
         'hostname "$1" && exec "$2" -D -e -f "$3"', "sh", name, SSHD, str(config)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
    )  # fmt: skip
    log.close()
    return sshd.pid


def _cluster_toml(
    hosts: list[TestHost], root: Path, identity: Path, known_hosts: Path, epochs: int
) -> str:
    lines = [
        "# Written by scripts/testbed.py: the example on the namespaced SSH test hosts.",
        "[job]",
        'name = "testbed"',
        f'shared_dir = "{root / "shared"}"',
        "",
        "[entrypoint]",
        'module = "worker.examples.digits"',
        f'args = ["--epochs", "{epochs}"]',
        'env = { TF_CPP_MIN_LOG_LEVEL = "2" }',
        f'workdir = "{REPO}"',
        "",
        "[backend]",
        'type = "ssh"',
        'user = "root"',
        f'identity_file = "{identity}"',
        f'known_hosts = "{known_hosts}"',
        f'python = "{sys.executable}"',
        "connect_timeout = 5.0",
    ]
    for host in hosts:
        lines += ["", "[[backend.hosts]]", f'address = "{host.address}"', f'name = "{host.name}"']
    return "\n".join(lines) + "\n"


def _save_partial(root: Path, state: dict[str, object]) -> None:
    data = dict(state)
    data["hosts"] = [asdict(h) for h in state["hosts"]]  # type: ignore[attr-defined]
    (root / (STATE_FILE + ".partial")).write_text(json.dumps(data))


def _is_our_process(pid: int, namespace: str) -> bool:
    """Only processes inside our namespace (sshd, and what our tests started through it)."""
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return str(pid) in out.stdout.split()


def down(root: Path) -> None:
    """Tear down everything `up` made under root: processes in the namespaces, namespaces,
    bridge. Safe to call twice, and on a half-built bed."""
    state_path = root / STATE_FILE
    if not state_path.exists():
        state_path = root / (STATE_FILE + ".partial")
    if not state_path.exists():
        return
    state = json.loads(state_path.read_text())
    # Every process in the namespaces was started by this test bed (sshd) or through it.
    netns.remove([host["namespace"] for host in state["hosts"]], state["bridge"])
    for name in (STATE_FILE, STATE_FILE + ".partial"):
        (root / name).unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="create N hosts")
    p_up.add_argument("count", type=int)
    p_up.add_argument("--dir", type=Path, default=Path("/tmp/orchestrate-testbed"))
    p_up.add_argument("--epochs", type=int, default=8)
    p_down = sub.add_parser("down", help="remove them")
    p_down.add_argument("--dir", type=Path, default=Path("/tmp/orchestrate-testbed"))
    args = parser.parse_args()
    if args.command == "up":
        try:
            bed = up(args.count, args.dir, args.epochs)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for host in bed.hosts:
            print(f"{host.name}  {host.address}  netns {host.namespace}  sshd pid {host.sshd_pid}")
        print(f"cluster.toml: {bed.cluster_toml}")
        print(
            f"ssh: ssh -i {bed.identity_file} -o UserKnownHostsFile={bed.known_hosts} "
            f"root@{bed.hosts[0].address}"
        )
        return 0
    down(args.dir)
    print(f"removed the test bed in {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
