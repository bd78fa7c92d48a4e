"""This user's private directory on the host's own disk, for what other users must not reach:
the standby keepers' sockets and the coordinator's contact marks.

/tmp is shared: another user may have made our directory first, or planted a symlink where we
are about to create a file. So the directory is made with mode 0700, then checked (a directory,
not a link, ours, no access for anyone else) every time it is used, and files in it are opened
with O_NOFOLLOW. A directory that fails the check is never used; the caller says why.
Standard library only."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile


class UnsafeDirectory(OSError):
    """The private directory exists but is not ours alone: it is not used."""


def base_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"orchestrate-{os.getuid()}")


def _check(path: str) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory (a link or a file put there)")
    if info.st_uid != os.getuid():
        raise UnsafeDirectory(f"{path} belongs to uid {info.st_uid}, not to us ({os.getuid()})")
    if info.st_mode & 0o077:
        raise UnsafeDirectory(f"{path} is open to others (mode {stat.S_IMODE(info.st_mode):o})")


def _ensure(path: str) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    _check(path)


def private_dir(name: str) -> str:
    """`<tmp>/orchestrate-<uid>/<name>`, made if missing and checked; UnsafeDirectory (an
    OSError) when it, or its parent, is not ours alone."""
    base = base_dir()
    _ensure(base)
    path = os.path.join(base, name)
    _ensure(path)
    return path


def open_private(path: str, flags: int, mode: int = 0o600) -> int:
    """os.open that never follows a link at the last component."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
