"""What this user's standby keepers (worker/warm/keeper.py) on this host are doing, for the host
helper, the job sweep and `orchestrate standbys`.

Each keeper writes `keeper-<pid>.json` in the private directory of its socket (ours alone:
worker/private_dir.py) whenever its state changes: the job and task it serves (or none: kept
for the next job), its standby and trainer pids, the standby's memory, and until when it is
kept (this host's monotonic clock: only this host reads it). An entry counts only while its
pid is alive and is a keeper of ours on this host; any other is removed. A warm trainer was
started before its job, so its environment lacks the job's id: the entry is how a sweep or a
stacks request finds it. A keeper removes its socket as it ends; the sockets of keepers that
were killed are swept (sweep_sockets) as a keeper starts and after a clear. Standard library
only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import signal
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

from worker.atomic import write_json_atomic
from worker.private_dir import open_private, private_dir

DIR_NAME = "standby"
ENTRY_LIMIT = 4096  # bytes of one entry: anything longer was not written by a keeper
SOCKET_MIN_AGE = 60.0  # seconds: a keeper records its entry within moments of its bind


@dataclass(frozen=True)
class KeeperEntry:
    pid: int
    host: str
    job: str  # "" while kept for the next job
    task: int
    state: str  # "serving" (a job's keeper) or "kept" (between jobs)
    fingerprint: str
    standby: int  # pid, 0: none
    standby_ready: bool
    trainer: int  # pid, 0: none
    rss: int  # the standby's resident memory, bytes
    kept_left: float  # seconds it is still kept (when kept; by this host's monotonic clock)
    kept_until: float = 0.0  # monotonic
    socket: str = ""  # where it listens

    def describe(self) -> str:
        task = f"spare {spare_slot(self.task)}" if self.task < 0 else f"worker-{self.task}"
        what = "kept" if self.state == "kept" else f"job {self.job} {task}"
        standby = f"standby {self.standby}" if self.standby else "no standby"
        ready = "" if self.standby_ready or not self.standby else " (importing)"
        left = f", {self.kept_left:.0f}s left" if self.state == "kept" else ""
        return f"keeper {self.pid}: {what}, {standby}{ready}, {self.rss >> 20} MB{left}"


def this_host() -> str:
    """This host as keepers tell hosts apart: its name and its network namespace. Containers
    or namespaces that share one /tmp, one kernel and even one name still bind different
    addresses: a trainer must start in a standby of its own network."""
    try:
        net = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return socket.gethostname()
    return f"{socket.gethostname()}@net{net}"


def socket_path(job_id: str, task_index: int) -> str:
    """The task's keeper socket in this user's private directory (UnsafeDirectory, an
    OSError, when that directory is not ours alone). The host (this_host) is part of it: hosts that
    share that directory (one /tmp for several containers or namespaces) each keep their own,
    and a task moved to another host never starts in a standby of the host it left."""
    name = f"{job_id}-{task_index}-{this_host()}.sock"
    if len(name) > 60:  # a unix socket path has at most 107 bytes
        name = hashlib.sha256(name.encode()).hexdigest()[:32] + ".sock"
    return os.path.join(directory(), name)


SPARE_SLOTS = 16  # standbys a spare host keeps for the tasks it may take over, at most


def spare_task(slot: int) -> int:
    """The number a spare host's slot-th keeper is named by until a task takes its standby
    (negative: never a task's own)."""
    return -1 - slot


def spare_slot(task: int) -> int:
    return -1 - task


def kept_socket_path(fingerprint: str, n: int) -> str:
    """The n-th socket of standbys kept for the next job under this fingerprint, on this host."""
    name = f"kept-{fingerprint[:16]}-{n}-{this_host()}.sock"
    if len(name) > 60:
        name = "kept-" + hashlib.sha256(name.encode()).hexdigest()[:32] + ".sock"
    return os.path.join(directory(), name)


def memory_available() -> tuple[int, int]:
    """(MemAvailable, MemTotal) in bytes; (0, 0) when unknown."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return values.get("MemAvailable", 0), values.get("MemTotal", 0)


STANDBY_ESTIMATE = 800 << 20  # bytes a standby needs, about (TensorFlow and tf-keras imported)


def room_for_standby() -> str:
    """'' when this host has memory to spare for a standby, else why not."""
    available, total = memory_available()
    if not total:
        return ""
    if available - STANDBY_ESTIMATE < total // 10:
        return (
            f"{available >> 20} MB available, a standby takes about {STANDBY_ESTIMATE >> 20} MB "
            "and 10% of memory is kept free"
        )
    return ""


def directory() -> str:
    return private_dir(DIR_NAME)


def _path(pid: int) -> str:
    return os.path.join(directory(), f"keeper-{pid}.json")


def record(entry: KeeperEntry) -> None:
    with contextlib.suppress(OSError):
        write_json_atomic(_path(entry.pid), asdict(entry), mode=0o600)


def forget(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(_path(pid))


def _is_keeper(pid: int) -> bool:
    """pid is alive, ours, and runs a keeper: `python .../worker/warm/keeper.py ...` (this worker
    package's or another copy's)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    if len(argv) <= 2:
        return False
    program = os.path.realpath(os.fsdecode(argv[1]))
    return program.endswith("/worker/warm/keeper.py")


def parse(raw: object) -> KeeperEntry | None:
    """An entry from its JSON form (as a keeper or a host helper wrote it); None if it is not
    one. Strings are cut short: nothing read here is trusted to be small."""
    try:
        assert isinstance(raw, dict)
        return KeeperEntry(
            pid=int(raw["pid"]), host=str(raw["host"])[:255], job=str(raw["job"])[:64],
            task=int(raw["task"]), state=str(raw["state"])[:16],
            fingerprint=str(raw["fingerprint"])[:64], standby=int(raw["standby"]),
            standby_ready=bool(raw["standby_ready"]), trainer=int(raw["trainer"]),
            rss=int(raw["rss"]), kept_left=float(raw.get("kept_left", 0.0)),
            kept_until=float(raw["kept_until"]), socket=str(raw["socket"])[:200],
        )  # fmt: skip
    except (AssertionError, ValueError, TypeError, KeyError):
        return None


def _read(data: bytes) -> KeeperEntry | None:
    try:
        entry = parse(json.loads(data))
    except ValueError:
        return None
    if entry is None or entry.state != "kept":
        return entry
    return replace(entry, kept_left=max(0.0, entry.kept_until - time.monotonic()))


def _stored() -> Iterator[tuple[str, str, KeeperEntry | None]]:
    """(path, name, the entry, None when garbled) of each keeper-*.json here."""
    try:
        where = directory()
        names = os.listdir(where)
    except OSError:
        return
    for name in names:
        if not (name.startswith("keeper-") and name.endswith(".json")):
            continue
        path = os.path.join(where, name)
        try:
            fd = open_private(path, os.O_RDONLY)
            with os.fdopen(fd, "rb") as fh:
                data = fh.read(ENTRY_LIMIT + 1)
        except OSError:
            continue
        yield path, name, _read(data) if len(data) <= ENTRY_LIMIT else None


def entries(every_host: bool = False) -> list[KeeperEntry]:
    """This host's live keepers of ours (`every_host`: also those of other hosts that share
    this directory and kernel: namespaces, containers); stale or garbled entries are removed."""
    host = this_host()
    found = []
    for path, name, entry in _stored():
        if entry is not None and not every_host and entry.host != host:
            continue  # another host sharing this /tmp (its pids are not ours to judge)
        if entry is None or name != f"keeper-{entry.pid}.json" or not _is_keeper(entry.pid):
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        found.append(entry)
    return found


def sweep_sockets() -> list[str]:
    """Remove the socket files here that no keeper serves: a keeper killed (SIGKILL, its network
    namespace or its allocation gone) never removed its own. One stays while a live keeper's
    entry names it, or another host's entry (its pids are not ours to judge), or while it is
    younger than SOCKET_MIN_AGE (a keeper between its bind and its first entry). Nothing is
    connected to: a live keeper would take the probe for an agent. Returns the names removed."""
    host = this_host()
    named = {e.socket for e in entries()}
    named |= {e.socket for _, _, e in _stored() if e is not None and e.host != host}
    try:
        where = directory()
        names = os.listdir(where)
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(where, name)
        if not name.endswith(".sock") or path in named:
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        # The file's age by this host's own clock, the one that stamped it.
        young = time.time() - info.st_mtime < SOCKET_MIN_AGE
        if young or not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(name)
    return removed


def parent_of(pid: int) -> int:
    """The pid's parent, from /proc; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def trainers_of(job_id: str) -> list[int]:
    """The warm trainers serving this job here: each its keeper's child, as the keeper says."""
    return [
        e.trainer
        for e in entries()
        if e.job == job_id and e.trainer > 1 and parent_of(e.trainer) == e.pid
    ]


def kept_bytes(but: int = 0) -> int:
    """Memory of the standbys kept between jobs here (all but keeper `but`)."""
    return sum(e.rss for e in entries() if e.state == "kept" and e.pid != but)


@contextlib.contextmanager
def budget_lock() -> Iterator[None]:
    """Keepers deciding whether to stay, one at a time: the budget is checked and taken at once."""
    fd = open_private(os.path.join(directory(), "kept.lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def release(job_id: str) -> int:
    """The job ended: tell its keepers here at once (each keeps its standby for the next job or
    ends); returns how many answered. A keeper not told decides when its linger ends."""
    told = 0
    for entry in entries():
        # The record names the socket: it must be this job's task's own (a forged record
        # cannot point the release at another job's keeper).
        if entry.job != job_id or entry.socket != socket_path(job_id, entry.task):
            continue
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2.0)
            sock.connect(entry.socket)
            sock.sendall(b'{"op": "release"}\n')
            if sock.recv(64):  # its answer: it has decided (nothing: it serves an agent still)
                told += 1
    return told


def clear(every_host: bool = False, kept_only: bool = True) -> list[int]:
    """End the keepers of ours here that keep a standby for the next job (`kept_only` False:
    every keeper, those serving a job too), their standbys with them; the pids told. Each is
    checked right before, and signalled through a pidfd opened on it then."""
    ended = []
    for entry in entries(every_host):
        if kept_only and entry.state != "kept":
            continue
        try:
            pidfd = os.pidfd_open(entry.pid)
        except OSError:
            continue
        try:
            if _is_keeper(entry.pid):
                signal.pidfd_send_signal(pidfd, signal.SIGTERM)
                ended.append(entry.pid)
        except OSError:
            pass
        finally:
            os.close(pidfd)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_is_keeper(pid) for pid in ended):
        time.sleep(0.05)
    sweep_sockets()
    return ended


class NameTaken(OSError):
    """Another keeper serves this task's socket already."""


def bind_socket(path: str) -> socket.socket:
    """Listen-ready `path` for a keeper: bound anew, or taken over from a keeper that died
    (no one listens there); NameTaken while another keeper serves it."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        return server
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            server.close()
            raise
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:  # a socket file no keeper listens on: a keeper that died; take it over
        os.unlink(path)
        server.bind(path)
        return server
    finally:
        probe.close()
    server.close()
    raise NameTaken(f"{path} is served already")
