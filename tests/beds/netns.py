"""Network namespaces for the test beds (ssh.py: SSH hosts; slurm.py: Slurm nodes): a bridge
with a gateway address, a namespace per host joined to it by a veth pair, and emptying and
removing them again. Needs root and iproute2. Traffic goes only to the addresses a bed assigns
itself, in a private range."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def free_subnet(prefix: str) -> str:
    """A /24 under `prefix` (e.g. "10.231") that no route of this machine uses yet."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    for _ in range(100):
        subnet = f"{prefix}.{secrets.randbelow(254) + 1}"
        if f"{subnet}." not in routes:
            return subnet
    raise RuntimeError(f"no free {prefix}.x.0/24 subnet")


def free_subnets(prefix: str, count: int) -> list[str]:
    """`count` distinct free /24s under `prefix`."""
    subnets: list[str] = []
    while len(subnets) < count:
        subnet = free_subnet(prefix)
        if subnet not in subnets:
            subnets.append(subnet)
    return subnets


def add_bridge(bridge: str, gateway: str) -> None:
    ip("link", "add", bridge, "type", "bridge")
    ip("addr", "add", f"{gateway}/24", "dev", bridge)
    ip("link", "set", bridge, "up")


def wire(namespace: str, bridge: str, veth: str, peer: str, address: str, prefix: int = 24) -> None:
    """Join an existing namespace to the bridge: `veth` on the bridge, `peer` inside as eth0
    with `address`/`prefix`, both up, and loopback up."""
    ip("link", "add", veth, "type", "veth", "peer", "name", peer)
    ip("link", "set", peer, "netns", namespace)
    ip("link", "set", veth, "master", bridge)
    ip("link", "set", veth, "up")
    ip("-n", namespace, "link", "set", "lo", "up")
    ip("-n", namespace, "link", "set", peer, "name", "eth0")
    ip("-n", namespace, "addr", "add", f"{address}/{prefix}", "dev", "eth0")
    ip("-n", namespace, "link", "set", "eth0", "up")


def pids(namespace: str, check: bool = False) -> list[int]:
    """The processes in the namespace (`ip netns pids`)."""
    out = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=check
    )
    return [int(p) for p in out.stdout.split()]


def holds(namespace: str, pid: int) -> bool:
    """Whether pid runs in the namespace (so was started by the bed, or through it)."""
    return pid in pids(namespace)


def kill_processes(namespace: str) -> None:
    """SIGTERM, then SIGKILL, every process in the namespace (all started by the bed or
    through it), waiting up to 3 s for each to take."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        found = pids(namespace)
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if not pids(namespace):
                return
            time.sleep(0.05)


def remove(namespaces: list[str], bridge: str | None) -> None:
    """Empty and delete the namespaces, then the bridge; what is already gone is skipped."""
    for namespace in namespaces:
        kill_processes(namespace)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    if bridge:
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
