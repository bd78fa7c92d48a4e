"""The beds a chaos soak (scripts/chaos.py) runs its jobs on: this machine (local), the
namespaced SSH hosts of tests/beds/ssh.py, and the Slurm cluster of tests/beds/slurm.py. Each
writes a job's backend section, names the fault kinds it adds to the common ones, injects those,
and tears itself down. Only processes the bed or the job started are ever signalled."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.beds import netns
from tests.beds import slurm as slurmbed
from tests.beds import ssh as testbed
from tests.beds.checked_signal import signal_checked

REPO = Path(__file__).resolve().parents[2]
COMMON = (
    "trainer_kill", "agent_kill", "trainer_hang", "preemption", "supervisor_kill",
    "supervisor_stall", "stop_resume", "attach_live",
)  # fmt: skip
HOST_TIMEOUT, KEEPALIVE = 5.0, 1.0  # the defaults: a row may say `running` this long after
HOST_WAIT = 8.0  # the SSH bed's: a host away longer than this is replaced by the spare


def later(seconds: float, action: Any) -> None:
    """Run `action` after `seconds` on a thread (the end of a fault: a link up, sshd back)."""
    timer = threading.Timer(seconds, action)
    timer.daemon = True
    timer.start()


WARM = ("keeper_kill", "standby_kill")  # where warm restarts are on (local, SSH)


class LocalBed:
    name = "local"
    kinds: tuple[str, ...] = (*COMMON, *WARM)
    shared: Path | None = None  # a small tmpfs, to be filled (root only)

    def env(self) -> dict[str, str]:
        return {}

    def prepare(self, shared: Path) -> None:
        """The shared directory as a 64 MiB tmpfs, so `shared_full` can fill it (root only)."""
        if os.geteuid() != 0:
            return
        shared.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs", str(shared)],
                       check=True)  # fmt: skip
        self.shared = shared
        self.kinds = (*self.kinds, "shared_full")

    def unprepare(self, shared: Path) -> None:
        if self.shared is not None:
            subprocess.run(["umount", "--lazy", str(self.shared)], check=False)
            self.shared = None

    def _fill(self, seconds: float) -> str:
        """Fill the shared tmpfs to the last byte, and free it `seconds` later."""
        assert self.shared is not None
        filler = self.shared / ".chaos-fill"
        with open(filler, "wb", buffering=0) as out:
            for size in (1 << 20, 4096, 1):
                with contextlib.suppress(OSError):
                    while True:
                        out.write(b"\0" * size)
        later(seconds, lambda: filler.unlink(missing_ok=True))
        return f"shared_dir full for {seconds:g} s"

    def backend_toml(self) -> str:
        return 'type = "local"\nworkers = 2\n'

    def supervision_toml(self) -> str:
        return ""

    def restart_toml(self) -> str:
        return ""

    def inject(self, kind: str, view: dict[str, Any], task: int) -> str:
        trainer = view["tasks"][task]["pid"]
        from worker.warm.registry import entries  # each keeper's own record: the job it serves now

        keepers = [
            e.pid for e in entries(every_host=True)
            if e.job == view["id"] and e.task == task and _same_host(e.pid, trainer)
        ]  # fmt: skip
        if kind == "keeper_kill" and keepers:

            def serving(pid: int) -> bool:
                return any(e.pid == pid and e.job == view["id"] for e in entries(every_host=True))

            signal_checked(keepers[0], signal.SIGKILL, serving, f"a keeper of {view['id']}")
            return f"keeper {keepers[0]} killed"
        standbys = [
            pid for pid, argv in _processes()
            if "--standby" in argv and _parent(pid) in keepers and pid != trainer
        ]  # fmt: skip
        if kind == "standby_kill" and standbys:

            def held(pid: int) -> bool:
                return _parent(pid) in keepers

            signal_checked(standbys[0], signal.SIGKILL, held, "a standby of the job's keepers")
            return f"standby {standbys[0]} killed"
        if kind in WARM:
            return f"no {kind.split('_')[0]} to kill"
        if kind == "shared_full":
            return self._fill(3.0 + 3.0 * task)
        raise ValueError(f"{self.name} has no fault kind {kind}")

    def close(self) -> None:
        pass


class SshBed(LocalBed):
    """Three hosts: two train, one is the spare; host_wait is short so a long cut replaces."""

    name = "ssh"
    kinds = (*LocalBed.kinds, "link_short", "link_about", "link_long", "sshd_kill", "host_reboot",
             "helper_kill")  # fmt: skip

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="chaos-ssh-", dir="/tmp"))
        self.bed = testbed.up(3, self.root)
        self.hosts = {h.name: h for h in self.bed.hosts}
        self.sshd = {h.name: h.sshd_pid for h in self.bed.hosts}
        self.lock = threading.Lock()

    def prepare(self, shared: Path) -> None:
        pass

    def backend_toml(self) -> str:
        lines = [
            'type = "ssh"', 'user = "root"', f'identity_file = "{self.bed.identity_file}"',
            f'known_hosts = "{self.bed.known_hosts}"', f'python = "{sys.executable}"',
            "connect_timeout = 5.0",
        ]  # fmt: skip
        for i, host in enumerate(self.bed.hosts):
            spare = "\nspare = true" if i == 2 else ""
            lines += ["", "[[backend.hosts]]", f'address = "{host.address}"',
                      f'name = "{host.name}"{spare}']  # fmt: skip
        return "\n".join(lines) + "\n"

    def supervision_toml(self) -> str:
        return f"host_wait = {HOST_WAIT}\n"

    def restart_toml(self) -> str:
        return "quarantine = 10\n"

    def inject(self, kind: str, view: dict[str, Any], task: int) -> str:
        host = self.hosts[view["tasks"][task]["host"]]
        if kind.startswith("link_"):
            away = {"link_short": 2.0, "link_about": HOST_TIMEOUT,
                    "link_long": HOST_TIMEOUT + HOST_WAIT + 4.0}[kind]  # fmt: skip
            subprocess.run(["ip", "link", "set", host.veth, "down"], check=True)
            later(away, lambda: subprocess.run(["ip", "link", "set", host.veth, "up"], check=True))
            return f"{host.name} cut off for {away:g} s"
        if kind == "sshd_kill":
            self._kill_sshd(host.name)
            later(2.0, lambda: self._start_sshd(host.name))
            return f"{host.name}'s sshd killed, back after 2 s"
        if kind == "helper_kill":  # the supervisor's helper on the host: the oldest one there
            inside = set(netns.pids(host.namespace))
            helpers = [
                pid for pid, argv in _processes()
                if argv[1:2] == ["-c"] and argv[3:4] == ["hostd"] and pid in inside
            ]  # fmt: skip
            if not helpers:
                return f"no host helper on {host.name}"
            pid = min(helpers, key=_started)
            os.kill(pid, signal.SIGKILL)
            return f"{host.name}'s host helper {pid} killed"
        if kind == "host_reboot":
            killed = self._kill_all(host)
            later(2.0, lambda: self._start_sshd(host.name))
            return f"{host.name} rebooted: {killed} processes killed, sshd back after 2 s"
        return super().inject(kind, view, task)

    def _kill_sshd(self, name: str) -> None:
        with self.lock:
            pid = self.sshd[name]
            if _cmdline(pid).find(str(self.hosts[name].host_dir).encode()) < 0:
                raise SystemExit(f"chaos: pid {pid} is not {name}'s sshd: not signalled")
            os.kill(pid, signal.SIGKILL)

    def _start_sshd(self, name: str) -> None:
        host = self.hosts[name]
        with self.lock:
            self.sshd[name] = testbed.start_sshd(host.namespace, name, Path(host.host_dir))

    def _kill_all(self, host: testbed.TestHost) -> int:
        """Every process in the host's namespace (its sshd and what came in through it), at once."""
        self._kill_sshd(host.name)
        pids = [p for p in netns.pids(host.namespace, check=True) if p > 1]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids) + 1

    def close(self) -> None:
        testbed.down(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


class SlurmBed(LocalBed):
    """Three nodes; the job takes two. A preemption by Slurm: a job in the urgent partition."""

    name = "slurm"
    kinds = (*COMMON, "slurm_preempt")

    def __init__(self) -> None:
        # Not under a private tmp (0700): munged runs as the munge user and must reach its key.
        self.root = Path(tempfile.mkdtemp(prefix="chaos-slurm-", dir="/tmp"))
        self.bed = slurmbed.up(3, self.root)

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.bed.slurm_conf}

    def prepare(self, shared: Path) -> None:
        pass

    def backend_toml(self) -> str:
        return (f'type = "slurm"\npartition = "{slurmbed.PARTITION}"\nnodes = 2\n'
                f'python = "{sys.executable}"\n')  # fmt: skip

    def inject(self, kind: str, view: dict[str, Any], task: int) -> str:
        if kind == "slurm_preempt":
            urgent = subprocess.run(
                ["sbatch", "--parsable", "-p", slurmbed.URGENT, "-N2", "--exclusive",
                 f"--output={self.root}/urgent-%j.out", "--wrap", "sleep 1"],
                capture_output=True, text=True, check=True, env={**os.environ, **self.env()},
            ).stdout.strip()  # fmt: skip
            return f"Slurm job {urgent} in {slurmbed.URGENT} preempts {view['allocation']}"
        return super().inject(kind, view, task)

    def close(self) -> None:
        env = {**os.environ, **self.env()}
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                                env=env).stdout.split()  # fmt: skip
        if queued:
            subprocess.run(["scancel", *queued], capture_output=True, env=env)
            time.sleep(2)
        slurmbed.down(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


def _processes() -> list[tuple[int, list[str]]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            argv = _cmdline(int(entry.name)).decode(errors="replace").split("\0")[:-1]
            if argv:
                found.append((int(entry.name), argv))
    return found


def _stat(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _parent(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def _started(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[19]) if fields else 0


def _net(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _same_host(pid: int, other: int) -> bool:
    return bool(_net(pid)) and _net(pid) == _net(other)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def open_bed(name: str) -> LocalBed:
    reason = {"ssh": testbed.missing_requirements, "slurm": slurmbed.missing_requirements}.get(
        name, lambda: None
    )()
    if reason:
        raise SystemExit(f"chaos: cannot build the {name} bed: {reason}")
    return {"local": LocalBed, "ssh": SshBed, "slurm": SlurmBed}[name]()
