"""The worker package this coordinator ships to its hosts (worker.ship): its files, digest and
payload, read once per process, and the argv that runs one of its programs from a copy."""

from __future__ import annotations

import base64
import functools
import os
import zlib

import worker
from worker import ship


@functools.cache
def _files() -> tuple[tuple[str, bytes], ...]:
    return tuple(ship.package_files(os.path.dirname(os.path.abspath(worker.__file__))))


@functools.cache
def digest() -> str:
    return ship.digest_of(list(_files()))


@functools.cache
def payload() -> bytes:
    """The package as worker.ship.pack makes it (built only when a host lacks the copy)."""
    return ship.pack(list(_files()))


@functools.cache
def helper_argv(python: str) -> tuple[str, ...]:
    """The command that starts the SSH host helper from this package's copy on a host that may
    have none yet: worker/ship.py's own source (it finds the copy, or asks for it and installs
    it, then serves from it), compressed onto one line (login shells differ on newlines). Made
    once per interpreter."""
    with open(os.path.abspath(ship.__file__), "rb") as fh:
        source = base64.b64encode(zlib.compress(fh.read(), 9)).decode()
    code = f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{source}')))"
    return (python, "-c", code, "hostd", ship.PREFIX + digest())


def program_argv(python: str, copy: str, program: str, *args: str) -> list[str]:
    """`python COPY/worker PROGRAM ARG...` (worker/__main__.py): as `python -m worker.PROGRAM`,
    from the copy, with nothing installed."""
    return [python, f"{copy}/worker", program, *args]


def copy_under(root: str) -> str:
    """This package's copy under root (`<shared_dir>/.orchestrate`, a Slurm job's), installed if
    missing or no longer intact. Every task of a step runs it as the job's user on every node:
    UnsafeCache, one line, unless shared_dir is ours and closed to others' writes (whoever may
    write there could swap root between this check and the step's start)."""
    try:
        ship.check_parent(root)
    except ship.UnsafeCache as exc:
        shared = os.path.dirname(root)
        raise ship.UnsafeCache(
            f"{exc}: another user could swap the worker package that every task runs as you; "
            f"make it yours alone (chmod g-w,o-w {shared}) or set shared_dir to a directory "
            "only you can write"
        ) from None
    return ship.installed(root, digest()) or ship.install(root, digest(), payload())


def local_copy() -> str:
    """This package's copy in this user's cache on this machine, installed if missing or no
    longer intact (looked for, and hashed again, on every use, which also marks it used: a long
    job's copy is never pruned under it)."""
    return ship.find(digest()) or ship.install_somewhere(digest(), payload())
