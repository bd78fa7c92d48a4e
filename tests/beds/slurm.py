"""A Slurm test bed on this machine: munged and slurmctld here, and one slurmd per network
namespace (its own address on a bridge, its own hostname and hosts file), with every file
(slurm.conf, state, spool, logs, munge key and socket) under one directory. Nothing under /etc
is changed: clients find the cluster through SLURM_CONF.

From the repository root:

    sudo .venv/bin/python -m tests.beds.slurm up 3 --dir /tmp/orchestrate-slurmbed
    export SLURM_CONF=/tmp/orchestrate-slurmbed/slurm.conf
    sinfo; orchestrate launch /tmp/orchestrate-slurmbed/cluster.toml
    sudo .venv/bin/python -m tests.beds.slurm down --dir /tmp/orchestrate-slurmbed

Needs root, iproute2, util-linux (nsenter, unshare), and Debian's slurm-wlm and munge packages.
Traffic goes only to the addresses it creates. The namespaces share this machine's filesystem,
which stands in for the cluster's shared filesystem.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.beds import netns
from tests.beds.base import (
    Bed,
    Member,
    Progress,
    cluster_toml,
    missing,
    spawn,
    tool,
    wait_until,
)

STATE_FILE = "slurmbed.json"
PARTITION = "debug"
URGENT = "urgent"  # a partition whose jobs preempt the default partition's
CONTROLLER = "ctl"

SLURM_CONF = """\
# Written by tests/beds/slurm.py: a test cluster, no cgroups, no accounting daemon.
# cred_expire=10: a requeued job may start again after 10 s (Slurm's default: 120 s).
ClusterName=orchbed{token}
SlurmctldHost={controller}({gateway})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/spool/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=300
SchedulerParameters=sched_interval=2
JobRequeue=1
# A job in the "urgent" partition preempts one in the default partition: Slurm signals it,
# waits GraceTime, and requeues it.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{nodes}
PartitionName={partition} Nodes=ALL Default=YES State=UP PriorityTier=1 GraceTime=30
PartitionName={urgent} Nodes=ALL State=UP PriorityTier=10 PreemptMode=OFF
"""


@dataclass(frozen=True)
class SlurmNode(Member):
    slurmd_pid: int


@dataclass(frozen=True)
class SlurmBed(Bed):
    nodes: list[SlurmNode]
    munged_pid: int
    slurmctld_pid: int
    slurm_conf: str
    partition: str

    state_file = STATE_FILE
    members = "nodes"
    member_type = SlurmNode
    what = "Slurm test bed"
    bridge_prefix = "sb"
    up_help = "start a controller and N nodes"

    def env(self) -> dict[str, str]:
        """This process's environment with the bed's slurm.conf for Slurm's clients."""
        return {**os.environ, "SLURM_CONF": self.slurm_conf}

    @classmethod
    def missing_requirements(cls) -> str | None:
        tools = ("ip", "nsenter", "unshare", "slurmctld", "slurmd", "sbatch", "munged")
        hint = "apt-get install slurm-wlm munge iproute2 util-linux"
        reason = missing("network namespaces, slurmd", tools, hint, _installed)
        if reason:
            return reason
        try:
            pwd.getpwnam("munge")
        except KeyError:
            return "needs the munge user (apt-get install munge)"
        return None

    @classmethod
    def prepare(cls, root: Path) -> None:
        if root.exists():
            shutil.rmtree(root)
        for sub in ("state", "spool", "log", "munge", "shared"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)

    @classmethod
    def build(cls, count: int, root: Path, epochs: int, token: str, progress: Progress) -> SlurmBed:
        subnet = netns.free_subnet("10.232")
        gateway = f"{subnet}.1"
        bridge = progress.state["bridge"]
        munged_pid = _start_munge(root, progress)
        netns.add_bridge(bridge, gateway)
        nodes: list[SlurmNode] = []
        names = [f"n{i}" for i in range(count)]
        addresses = [f"{subnet}.{10 + i}" for i in range(count)]
        hosts = root / "hosts"
        hosts.write_text(
            "127.0.0.1 localhost\n"
            + f"{gateway} {CONTROLLER}\n"
            + "".join(f"{a} {n}\n" for n, a in zip(names, addresses, strict=True))
        )
        conf = _write_conf(root, token, gateway, names, addresses)
        env = {**os.environ, "SLURM_CONF": str(conf)}
        ctld = spawn(
            [tool("unshare"), "--uts", "sh", "-c",
             f'hostname {CONTROLLER} && exec "$0" -D -i -f "$1"', tool("slurmctld"), str(conf)],
            root / "log" / "slurmctld.out", env,
        )  # fmt: skip
        progress["pids"] = [munged_pid, ctld]
        for i, (name, address) in enumerate(zip(names, addresses, strict=True)):
            namespace = f"slb{token}{name}"
            veth, peer = f"sv{token}{i}", f"sp{token}{i}"
            progress.add_namespace(namespace, bridge, veth, peer, address)
            # nsenter (not `ip netns exec`, which remounts /sys and hides the cgroup tree
            # slurmd reads), a hostname of its own, and the bed's hosts file over /etc/hosts.
            pid = spawn(
                [tool("nsenter"), f"--net=/run/netns/{namespace}", tool("unshare"), "--uts",
                 "--mount", "--propagation", "private", "sh", "-c",
                 f'hostname {name} && mount --bind "$2" /etc/hosts && exec "$0" -D -N {name} '
                 '-f "$1"', tool("slurmd"), str(conf), str(hosts)],
                root / "log" / f"slurmd-{name}.out", env,
            )  # fmt: skip
            nodes.append(SlurmNode(name, namespace, address, veth, pid))
            progress.record(nodes[-1])
        _wait_idle(env, count, 20.0)
        cluster = root / "cluster.toml"
        cluster.write_text(_cluster_toml(root, count, epochs))
        return cls(
            root=str(root), token=token, bridge=bridge, gateway=gateway, nodes=nodes,
            munged_pid=munged_pid, slurmctld_pid=ctld, slurm_conf=str(conf),
            partition=PARTITION, cluster_toml=str(cluster), python=sys.executable,
        )  # fmt: skip

    @classmethod
    def stop_daemons(cls, state: dict[str, Any]) -> None:
        """slurmctld, then munged (a half-built bed recorded them as [munged, slurmctld])."""
        if "slurmctld_pid" in state:
            pids = [state["slurmctld_pid"], state["munged_pid"]]
        else:
            pids = list(reversed(state.get("pids", [])))
        for pid in pids:
            _stop_pid(int(pid))

    def describe(self, seconds: float) -> list[str]:
        return [
            *(f"{n.name}  {n.address}  netns {n.namespace}  slurmd {n.slurmd_pid}"
              for n in self.nodes),
            f"up in {seconds:.2f}s",
            f"export SLURM_CONF={self.slurm_conf}",
            f"cluster.toml: {self.cluster_toml}",
        ]  # fmt: skip


def missing_requirements() -> str | None:
    """Why a Slurm test bed cannot be made here, or None."""
    return SlurmBed.missing_requirements()


def up(count: int, root: Path, epochs: int = 4) -> SlurmBed:
    """Create a controller and `count` nodes under `root` (made empty first)."""
    return SlurmBed.up(count, root, epochs)


def down(root: Path) -> None:
    """Tear down what `up` made under root: every process in the nodes' namespaces (slurmd and
    the jobs it started), the namespaces, slurmctld and munged, the bridge. Safe to call twice
    and on a half-built bed."""
    SlurmBed.down(root)


def _installed(name: str) -> bool:
    return shutil.which(name) is not None or os.path.exists(f"/usr/sbin/{name}")


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _write_conf(
    root: Path, token: str, gateway: str, names: list[str], addresses: list[str]
) -> Path:
    cpus = os.cpu_count() or 1
    conf = root / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(
            token=token,
            controller=CONTROLLER,
            gateway=gateway,
            ctld_port=_free_port("127.0.0.1"),
            slurmd_port=6818,
            munge_socket=root / "munge" / "munge.socket",
            root=root,
            partition=PARTITION,
            urgent=URGENT,
            nodes="\n".join(
                f"NodeName={n} NodeAddr={a} NodeHostname={n} CPUs={cpus} State=UNKNOWN"
                for n, a in zip(names, addresses, strict=True)
            ),
        )
    )
    return conf


def _start_munge(root: Path, progress: Progress) -> int:
    munge = pwd.getpwnam("munge")
    folder = root / "munge"
    os.chown(folder, munge.pw_uid, munge.pw_gid)
    folder.chmod(0o711)  # clients (slurmd as root, srun) reach the socket: o+x
    key = folder / "munge.key"
    as_munge = ["runuser", "-u", "munge", "--"]
    subprocess.run([*as_munge, tool("mungekey"), "-c", "-k", str(key)], check=True)
    subprocess.run(
        [*as_munge, tool("munged"), "--force", f"--socket={folder / 'munge.socket'}",
         f"--key-file={key}", f"--pid-file={folder / 'munged.pid'}",
         f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}"],
        check=True, capture_output=True,
    )  # fmt: skip
    if not wait_until((folder / "munged.pid").exists, 5, 0.02):
        raise RuntimeError("munged did not start: " + _tail(folder / "munged.log"))
    pid = int((folder / "munged.pid").read_text().split()[0])
    progress["pids"] = [pid]
    return pid


def _wait_idle(env: dict[str, str], count: int, timeout: float) -> None:
    """Until every node is idle in sinfo."""
    last = [""]

    def idle() -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=env
        )
        last[0] = (out.stdout + out.stderr).strip()
        # A node in two partitions is listed twice.
        states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
        return len(states) == count and all(s == "idle" for s in states.values())

    if not wait_until(idle, timeout):
        raise RuntimeError(f"the Slurm nodes did not come up idle: {last[0]}")


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-3:])
    return ""


def _cluster_toml(root: Path, count: int, epochs: int) -> str:
    return cluster_toml(
        "Written by tests/beds/slurm.py: the example on the test bed's Slurm cluster.",
        "slurmbed", root, epochs,
        ['type = "slurm"', f'partition = "{PARTITION}"', f"nodes = {count}",
         'time = "00:30:00"', f'python = "{sys.executable}"'],
    )  # fmt: skip


def _stop_pid(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return False

        if wait_until(gone, 3):
            return


if __name__ == "__main__":
    sys.exit(SlurmBed.main(__doc__ or "", "python -m tests.beds.slurm",
                           Path("/tmp/orchestrate-slurmbed"), 4))  # fmt: skip
