#!/usr/bin/env python3
"""A Slurm test bed on this machine: munged and slurmctld here, and one slurmd per network
namespace (its own address on a bridge, its own hostname and hosts file), with every file
(slurm.conf, state, spool, logs, munge key and socket) under one directory. Nothing under /etc
is changed: clients find the cluster through SLURM_CONF.

    sudo python scripts/slurmbed.py up 3 --dir /tmp/orchestrate-slurmbed
    export SLURM_CONF=/tmp/orchestrate-slurmbed/slurm.conf
    sinfo; orchestrate launch /tmp/orchestrate-slurmbed/cluster.toml
    sudo python scripts/slurmbed.py down --dir /tmp/orchestrate-slurmbed

Needs root, iproute2, util-linux (nsenter, unshare), and Debian's slurm-wlm and munge packages.
Traffic goes only to the addresses it creates. The namespaces share this machine's filesystem,
which stands in for the cluster's shared filesystem.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import netns  # noqa: E402

STATE_FILE = "slurmbed.json"
PARTITION = "debug"
URGENT = "urgent"  # a partition whose jobs preempt the default partition's
CONTROLLER = "ctl"


@dataclass(frozen=True)
class SlurmNode:
    name: str
    namespace: str
    address: str
    veth: str  # the bridge-side end
    slurmd_pid: int


@dataclass(frozen=True)
class SlurmBed:
    root: str
    token: str
    bridge: str
    gateway: str
    nodes: list[SlurmNode]
    munged_pid: int
    slurmctld_pid: int
    slurm_conf: str
    partition: str
    cluster_toml: str
    python: str

    @classmethod
    def load(cls, root: Path) -> SlurmBed:
        data = json.loads((root / STATE_FILE).read_text())
        data["nodes"] = [SlurmNode(**n) for n in data["nodes"]]
        return cls(**data)

    def env(self) -> dict[str, str]:
        """This process's environment with the bed's slurm.conf for Slurm's clients."""
        return {**os.environ, "SLURM_CONF": self.slurm_conf}


def missing_requirements() -> str | None:
    """Why a Slurm test bed cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, slurmd)"
    for tool in ("ip", "nsenter", "unshare", "slurmctld", "slurmd", "sbatch", "munged"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"needs {tool} (apt-get install slurm-wlm munge iproute2 util-linux)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "needs the munge user (apt-get install munge)"
    return None


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


SLURM_CONF = """\
# Written by scripts/slurmbed.py: a test cluster, no cgroups, no accounting daemon.
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


def up(count: int, root: Path, epochs: int = 4) -> SlurmBed:
    """Create a controller and `count` nodes under `root` (made empty first)."""
    reason = missing_requirements()
    if reason:
        raise RuntimeError(f"cannot build the Slurm test bed: {reason}")
    if (root / STATE_FILE).exists() or (root / (STATE_FILE + ".partial")).exists():
        down(root)
    if root.exists():
        shutil.rmtree(root)
    for sub in ("state", "spool", "log", "munge", "shared"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    token = secrets.token_hex(3)
    subnet = netns.free_subnet("10.232")
    gateway = f"{subnet}.1"
    bridge = f"sb{token}"
    state: dict[str, object] = {"root": str(root), "bridge": bridge, "nodes": [], "pids": []}
    _save_partial(root, state)
    try:
        munged_pid = _start_munge(root, state)
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
        env = {**os.environ, "SLURM_CONF": str(conf)}
        ctld = _spawn(
            [_tool("unshare"), "--uts", "sh", "-c",
             f'hostname {CONTROLLER} && exec "$0" -D -i -f "$1"', _tool("slurmctld"), str(conf)],
            root / "log" / "slurmctld.out", env,
        )  # fmt: skip
        state["pids"] = [munged_pid, ctld]
        _save_partial(root, state)
        for i, (name, address) in enumerate(zip(names, addresses, strict=True)):
            namespace = f"slb{token}{name}"
            veth, peer = f"sv{token}{i}", f"sp{token}{i}"
            netns.ip("netns", "add", namespace)
            state["nodes"].append({"namespace": namespace})  # type: ignore[attr-defined]
            _save_partial(root, state)
            netns.wire(namespace, bridge, veth, peer, address)
            # nsenter (not `ip netns exec`, which remounts /sys and hides the cgroup tree
            # slurmd reads), a hostname of its own, and the bed's hosts file over /etc/hosts.
            pid = _spawn(
                [_tool("nsenter"), f"--net=/run/netns/{namespace}", _tool("unshare"), "--uts",
                 "--mount", "--propagation", "private", "sh", "-c",
                 f'hostname {name} && mount --bind "$2" /etc/hosts && exec "$0" -D -N {name} '
                 '-f "$1"', _tool("slurmd"), str(conf), str(hosts)],
                root / "log" / f"slurmd-{name}.out", env,
            )  # fmt: skip
            nodes.append(SlurmNode(name, namespace, address, veth, pid))
            state["nodes"][-1] = asdict(nodes[-1])  # type: ignore[index]
            _save_partial(root, state)
        _wait_idle(env, count, 20.0)
        cluster = root / "cluster.toml"
        cluster.write_text(_cluster_toml(root, count, epochs))
        bed = SlurmBed(
            root=str(root), token=token, bridge=bridge, gateway=gateway, nodes=nodes,
            munged_pid=munged_pid, slurmctld_pid=ctld, slurm_conf=str(conf),
            partition=PARTITION, cluster_toml=str(cluster), python=sys.executable,
        )  # fmt: skip
        (root / STATE_FILE).write_text(json.dumps(asdict(bed), indent=2))
        return bed
    except BaseException:
        down(root)
        raise


def _start_munge(root: Path, state: dict[str, object]) -> int:
    munge = pwd.getpwnam("munge")
    folder = root / "munge"
    os.chown(folder, munge.pw_uid, munge.pw_gid)
    folder.chmod(0o711)  # clients (slurmd as root, srun) reach the socket: o+x
    key = folder / "munge.key"
    as_munge = ["runuser", "-u", "munge", "--"]
    subprocess.run([*as_munge, _tool("mungekey"), "-c", "-k", str(key)], check=True)
    subprocess.run(
        [*as_munge, _tool("munged"), "--force", f"--socket={folder / 'munge.socket'}",
         f"--key-file={key}", f"--pid-file={folder / 'munged.pid'}",
         f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}"],
        check=True, capture_output=True,
    )  # fmt: skip
    deadline = time.monotonic() + 5
    while not (folder / "munged.pid").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("munged did not start: " + _tail(folder / "munged.log"))
        time.sleep(0.02)
    pid = int((folder / "munged.pid").read_text().split()[0])
    state["pids"] = [pid]
    _save_partial(root, state)
    return pid


def _spawn(argv: list[str], log_path: Path, env: dict[str, str]) -> int:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
            start_new_session=True,
        ).pid  # fmt: skip


def _wait_idle(env: dict[str, str], count: int, timeout: float) -> None:
    """Until every node is idle in sinfo."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=env
        )
        last = (out.stdout + out.stderr).strip()
        # A node in two partitions is listed twice.
        states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
        if len(states) == count and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the Slurm nodes did not come up idle: {last}")


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-3:])
    return ""


def _cluster_toml(root: Path, count: int, epochs: int) -> str:
    return "\n".join(
        [
            "# Written by scripts/slurmbed.py: the example on the test bed's Slurm cluster.",
            "[job]",
            'name = "slurmbed"',
            f'shared_dir = "{root / "shared"}"',
            "",
            "[entrypoint]",
            'module = "worker.examples.digits"',
            f'args = ["--epochs", "{epochs}"]',
            'env = { TF_CPP_MIN_LOG_LEVEL = "2" }',
            f'workdir = "{REPO}"',
            "",
            "[backend]",
            'type = "slurm"',
            f'partition = "{PARTITION}"',
            f"nodes = {count}",
            'time = "00:30:00"',
            f'python = "{sys.executable}"',
            "",
        ]
    )


def _save_partial(root: Path, state: dict[str, object]) -> None:
    (root / (STATE_FILE + ".partial")).write_text(json.dumps(state))


def _stop_pid(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.05)


def down(root: Path) -> None:
    """Tear down what `up` made under root: every process in the nodes' namespaces (slurmd and
    the jobs it started), the namespaces, the bridge, slurmctld and munged. Safe to call twice
    and on a half-built bed."""
    path = root / STATE_FILE
    if not path.exists():
        path = root / (STATE_FILE + ".partial")
    if not path.exists():
        return
    state = json.loads(path.read_text())
    # Every process in the namespaces is slurmd or a job it started.
    netns.remove([node["namespace"] for node in state.get("nodes", [])], None)
    # slurmctld, then munged (a half-built bed recorded them as [munged, slurmctld]).
    if "slurmctld_pid" in state:
        pids = [state["slurmctld_pid"], state["munged_pid"]]
    else:
        pids = list(reversed(state.get("pids", [])))
    for pid in pids:
        _stop_pid(int(pid))
    netns.remove([], state.get("bridge"))
    for name in (STATE_FILE, STATE_FILE + ".partial"):
        (root / name).unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start a controller and N nodes")
    p_up.add_argument("count", type=int)
    p_up.add_argument("--dir", type=Path, default=Path("/tmp/orchestrate-slurmbed"))
    p_up.add_argument("--epochs", type=int, default=4)
    p_down = sub.add_parser("down", help="remove them")
    p_down.add_argument("--dir", type=Path, default=Path("/tmp/orchestrate-slurmbed"))
    args = parser.parse_args()
    if args.command == "up":
        started = time.monotonic()
        try:
            bed = up(args.count, args.dir, args.epochs)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for node in bed.nodes:
            print(f"{node.name}  {node.address}  netns {node.namespace}  slurmd {node.slurmd_pid}")
        print(f"up in {time.monotonic() - started:.2f}s")
        print(f"export SLURM_CONF={bed.slurm_conf}")
        print(f"cluster.toml: {bed.cluster_toml}")
        return 0
    down(args.dir)
    print(f"removed the Slurm test bed in {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
