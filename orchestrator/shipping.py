"""The worker package this coordinator ships to its hosts (worker.ship): its files, digest and
payload, read once per process, and the argv that runs one of its programs from a copy."""

from __future__ import annotations

import functools
import os

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
    """The SSH host helper's command (worker.ship.helper_argv), made once per interpreter."""
    return tuple(ship.helper_argv(python, digest()))


def program_argv(python: str, copy: str, program: str, *args: str) -> list[str]:
    """`python COPY/worker PROGRAM ARG...` (worker/__main__.py): as `python -m worker.PROGRAM`,
    from the copy, with nothing installed."""
    return [python, f"{copy}/worker", program, *args]


def copy_under(root: str) -> str:
    """This package's copy under root (a Slurm job's shared directory), installed if missing."""
    return ship.installed(root, digest()) or ship.install(root, digest(), payload())


def local_copy() -> str:
    """This package's copy in this user's cache on this machine, installed if missing (looked
    for on every use, which also marks it used: a long job's copy is never pruned under it)."""
    return ship.find(digest()) or ship.install_somewhere(digest(), payload())
