"""Atomic file writes (temp file in the same directory + rename), so a reader never sees half
a file. Only `os` and `json`: the host helper imports this and must start fast."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from typing import Any

_counter = itertools.count()


def makedirs_private(path: str | os.PathLike[str]) -> None:
    """Create missing directories, each mode 0700 (os.makedirs applies mode to the leaf alone)."""
    missing = []
    current = os.fspath(path)
    while current and not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    target = os.fspath(path)
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{next(_counter)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)  # the umask may have narrowed os.open's mode
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any, mode: int = 0o644) -> None:
    write_bytes_atomic(path, json.dumps(data, separators=(",", ":")).encode(), mode)
