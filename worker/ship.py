"""The worker package, shipped: a copy per content digest in a directory of the user's own, so
that a host needs only Python (and the user's TensorFlow), never orchestrate installed, and
always runs the very worker code of the coordinator that started it.

A copy lives at `<root>/worker-<DIGEST>/worker/`, where root is `$XDG_CACHE_HOME/orchestrate`
(default `~/.cache/orchestrate`) on each host, or `<shared_dir>/.orchestrate` on Slurm, whose
nodes the coordinator reaches only through the shared directory. Installs are atomic (unpacked
beside, checked against the digest, renamed into place), so hosts sharing a home directory may
install at once. A directory that is not ours alone (another owner, a link, writable by others)
is never used, nor one whose parent others may write. A copy is hashed again at every use (1 ms):
one that no longer matches the digest in its name (an edit after install) is renamed away and
installed afresh. Old copies are pruned: never one a process of ours runs from, nor one of the
newest KEEP, nor one used within a day (the programs running from a copy renew it hourly).

On an SSH host this file's own source is the first thing to run (see
orchestrator.transport.worker_package's helper_argv): it finds the copy, or says `{"need": 1}`,
reads `SIZE\\n` and that many bytes of .tar.gz from stdin and installs them, then serves as the
host helper from the copy. Standard library only, and it imports nothing of the package it ships
(there may be none yet). What only packing and installing need (tarfile, zlib, shutil) is imported
where it is used: every agent imports this.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import sys
import tempfile
import threading
import time
from typing import BinaryIO

PREFIX = "worker-"
KEEP = 3  # newest copies kept whatever their age
IDLE_BEFORE_PRUNE = 86400.0  # seconds a copy must be unused before it may be pruned
_COPY_NAME = re.compile(PREFIX + r"([0-9a-f]{20})")


class UnsafeCache(OSError):
    """A cache directory that is not ours alone: it is not used."""


def cache_roots() -> list[str]:
    """Where this user's copies may live on this host, in order of preference: the cache
    directory, else (no writable home) a private directory under the temporary directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [
        os.path.join(base, "orchestrate"),
        os.path.join(tempfile.gettempdir(), f"orchestrate-{os.getuid()}", "cache"),
    ]


# --- the package, as the coordinator has it --------------------------------------------------
def package_files(package_dir: str) -> list[tuple[str, bytes]]:
    """Every .py file of the package, as ("worker/...", bytes), sorted."""
    parent = os.path.dirname(os.path.abspath(package_dir))
    found = []
    for folder, dirs, names in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as fh:
                    found.append((os.path.relpath(path, parent).replace(os.sep, "/"), fh.read()))
    return sorted(found)


def digest_of(files: list[tuple[str, bytes]]) -> str:
    hasher = hashlib.sha256()
    for name, data in files:
        hasher.update(b"%s\0%d\0" % (name.encode(), len(data)) + data)
    return hasher.hexdigest()[:20]


def pack(files: list[tuple[str, bytes]]) -> bytes:
    """The files as a .tar.gz that is the same bytes every time (no dates, no owners)."""
    import io
    import tarfile
    import zlib

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return zlib.compress(raw.getvalue(), 6)


def unpack(payload: bytes) -> list[tuple[str, bytes]]:
    """The files of a payload; ValueError for anything but plain files under `worker/`."""
    import io
    import tarfile
    import zlib

    files = []
    with tarfile.open(fileobj=io.BytesIO(zlib.decompress(payload)), mode="r") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if not member.isfile() or parts[0] != "worker" or {"", ".", ".."} & set(parts):
                raise ValueError(f"unexpected entry in the worker package: {member.name!r}")
            extracted = tar.extractfile(member)
            assert extracted is not None
            files.append((member.name, extracted.read()))
    return sorted(files)


# --- copies on this host ---------------------------------------------------------------------
def _check_ours(path: str) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeCache(f"{path} is not a directory (a link or a file put there)")
    if info.st_uid != os.getuid():
        raise UnsafeCache(f"{path} belongs to uid {info.st_uid}, not to us ({os.getuid()})")
    if info.st_mode & 0o022:
        raise UnsafeCache(f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o})")


def _private_root(root: str) -> None:
    missing = []
    current = root
    while current and not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
    _check_ours(root)


def installed(root: str, digest: str) -> str | None:
    """The copy's directory (to put on sys.path) if it is there, ours and intact; marks it
    used. A copy that is not intact is removed (None: install it again)."""
    path = os.path.join(root, PREFIX + digest)
    try:
        _check_ours(root)
        _check_ours(path)
    except FileNotFoundError:
        return None
    if not keep_if_intact(path, digest):
        return None
    mark_used(path)
    return os.path.realpath(path)  # what runs from it never goes through a link again


def digest_in_name(copy: str) -> str | None:
    """The digest a copy's directory is named for; None for a directory that is no copy."""
    match = _COPY_NAME.fullmatch(os.path.basename(copy))
    return match.group(1) if match else None


def intact(copy: str, digest: str) -> bool:
    """Whether the copy holds exactly the package it was installed as: its .py files hash to
    the digest (as digest_of: bytecode caches aside, which Python checks against the sources),
    and nothing Python could load instead is there (a link, an extension module, a stray file)."""
    try:
        if os.listdir(copy) != ["worker"]:
            return False
        files: list[tuple[str, bytes]] = []
        pending = ["worker"]
        while pending:
            folder = pending.pop()
            with os.scandir(os.path.join(copy, folder)) as entries:
                for entry in entries:
                    name = f"{folder}/{entry.name}"
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":
                            pending.append(name)
                    elif entry.is_file(follow_symlinks=False) and entry.name.endswith(".py"):
                        fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
                        with os.fdopen(fd, "rb") as fh:
                            files.append((name, fh.read()))
                    else:
                        return False
        return digest_of(sorted(files)) == digest
    except OSError:
        return False


def keep_if_intact(copy: str, digest: str) -> bool:
    """True when the copy is intact; else it is renamed away (its name then holds a whole copy
    or none) and removed, and False. A copy a racing install put there meanwhile is kept."""
    import shutil

    try:
        seen = os.lstat(copy).st_ino
    except FileNotFoundError:
        return False
    if intact(copy, digest):
        return True
    trash = f"{os.path.dirname(copy)}/.tmp-{os.path.basename(copy)}-{os.urandom(6).hex()}"
    try:
        os.rename(copy, trash)
    except FileNotFoundError:
        return False  # another process took it away first
    if os.lstat(trash).st_ino != seen:  # not the one found broken: a racing install's, back
        with contextlib.suppress(OSError):
            os.rename(trash, copy)
            return False  # the caller's install finds it there
    shutil.rmtree(trash, ignore_errors=True)
    return False


def mark_used(copy: str) -> None:
    """A copy in use is not pruned: its time is renewed at each use, and hourly by the
    programs running from it (a job's hosts may all be others than the pruning one's)."""
    with contextlib.suppress(OSError):
        os.utime(copy)


def install(root: str, digest: str, payload: bytes) -> str:
    """Unpack the payload as the copy `digest` under root (unless a racing install did first)
    and return its directory. ValueError when the payload is not that copy."""
    import shutil

    _private_root(root)
    final = os.path.join(root, PREFIX + digest)
    files = unpack(payload)
    if digest_of(files) != digest:
        raise ValueError(f"the worker package received does not match its digest {digest}")
    staging = tempfile.mkdtemp(prefix=".tmp-", dir=root)
    try:
        for name, data in files:
            path = os.path.join(staging, *name.split("/"))
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        _compile(staging)
        for last in (False, True):
            try:
                os.rename(staging, final)
                break
            except OSError:
                if installed(root, digest) is not None:  # a racing install's, intact
                    break
                if last:  # not a copy that was broken (removed: try again): a real failure
                    raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    prune(root, keep=PREFIX + digest)
    return os.path.realpath(final)


def _compile(folder: str) -> None:
    """Bytecode for the copy, as pip makes at install: where Python may not write its caches
    (PYTHONDONTWRITEBYTECODE) every agent and trainer would compile the package from source
    again, 25 ms of an agent's start. Best effort: the sources stay the truth."""
    import compileall

    with contextlib.suppress(Exception):  # a Python too old for it: from source
        compileall.compile_dir(folder, quiet=2)


def find(digest: str) -> str | None:
    """The copy `digest` in the first of cache_roots() that has it, if any."""
    for root in cache_roots():
        with contextlib.suppress(OSError):  # an unsafe or unreadable root is passed over
            check_parent(root)
            found = installed(root, digest)
            if found is not None:
                return found
    return None


def install_somewhere(digest: str, payload: bytes) -> str:
    """install() in the first of cache_roots() that works; OSError naming each that did not."""
    problems = []
    for root in cache_roots():
        try:
            if os.path.isdir(os.path.dirname(root)):
                check_parent(root)  # before anything is made in it
            _private_root(root)
            check_parent(root)
            return install(root, digest, payload)
        except OSError as exc:
            problems.append(f"{root}: {exc}")
    raise OSError("no directory of ours to install the worker package in: " + "; ".join(problems))


def check_parent(root: str) -> None:
    """A cache's parent (~/.cache, /tmp/orchestrate-UID, a Slurm job's shared_dir) is ours and
    closed to others' writes too: whoever may write there could swap the cache between our
    check and our use."""
    parent = os.path.dirname(root)
    info = os.lstat(parent)
    if stat.S_ISLNK(info.st_mode):
        # ~/.cache may be the user's own link to another disk; a link in a directory others
        # may write (/tmp) may be theirs, and be pointed elsewhere once we have checked.
        above = os.stat(os.path.dirname(parent))
        if above.st_mode & 0o022 or above.st_uid not in (0, os.getuid()):
            raise UnsafeCache(f"{parent} is a link in a directory others may write")
        info = os.stat(parent)
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise UnsafeCache(f"{parent} is not ours alone (uid {info.st_uid}, mode "
                          f"{stat.S_IMODE(info.st_mode):o})")  # fmt: skip


def copies_in_use() -> set[str]:
    """The copies (`worker-<digest>`) named in the command line of a process of ours here."""
    names: set[str] = set()
    uid = os.getuid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                names.update(_COPY_NAME.findall(fh.read().decode(errors="replace")))
        except OSError:
            continue
    return {PREFIX + digest for digest in names}


def prune(root: str, keep: str) -> None:
    """Remove old copies under root (see the module's docstring) and stale unpackings. Ages
    are counted from the copy just used, stamped by the same clock as the others (a shared
    home's file server): never from this host's clock, which may be off by days."""
    import shutil

    mark_used(os.path.join(root, keep))
    try:
        now = os.stat(os.path.join(root, keep)).st_mtime
    except OSError:
        now = time.time()
    copies = []
    for entry in os.scandir(root):
        with contextlib.suppress(OSError):
            age = now - entry.stat(follow_symlinks=False).st_mtime
            if entry.name.startswith(".tmp-") and age > 3600:
                shutil.rmtree(entry.path, ignore_errors=True)
            elif _COPY_NAME.fullmatch(entry.name) and entry.name != keep:
                copies.append((age, entry.name))
    copies.sort()
    old = [name for age, name in copies[KEEP:] if age > IDLE_BEFORE_PRUNE]
    if old:
        busy = copies_in_use()
        for name in old:
            if name not in busy:
                # Renamed away first: a copy is whole under its name, or not there at all.
                trash = os.path.join(root, f".tmp-{name}-{os.getpid()}")
                with contextlib.suppress(OSError):
                    os.rename(os.path.join(root, name), trash)
                    shutil.rmtree(trash, ignore_errors=True)


# --- the SSH host helper, started from a copy ------------------------------------------------
def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            raise ValueError(f"the worker package ended after {len(data)} of {size} bytes")
        data += chunk
    return bytes(data)


def renew(copy: str) -> None:
    """mark_used, hourly, for as long as the process runs (on a daemon thread)."""
    while True:
        mark_used(copy)
        time.sleep(3600)


def _serve_helper(digest: str) -> int:
    import tarfile
    import zlib

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    try:
        path = find(digest)
        if path is None:
            stdout.write(b'{"need": 1}\n')
            stdout.flush()
            size = int(stdin.readline())
            path = install_somewhere(digest, _read_exactly(stdin, size))
    except (OSError, ValueError, tarfile.TarError, zlib.error) as exc:
        print(f"cannot install the worker package: {exc}", file=sys.stderr)
        return 1
    sys.path.insert(0, path)
    threading.Thread(target=renew, args=(path,), name="renew", daemon=True).start()
    from worker import hostd  # the copy's, now first on sys.path

    return hostd.serve(stdin, stdout, lambda: keep_if_intact(path, digest))


if __name__ == "__main__" and sys.argv[1:2] == ["hostd"]:
    sys.exit(_serve_helper(sys.argv[2].removeprefix(PREFIX)))
