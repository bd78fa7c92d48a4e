"""The Transport protocol and its small result type."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class CommandResult:
    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, lines: int = 3) -> str:
        """The last lines of stderr (else stdout), for one-line error messages."""
        text = (self.stderr or self.stdout).decode(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])


@dataclass(frozen=True)
class ProcessRef:
    """A process we started on a host: its pid and its identity (worker.proctl.identity: the
    boot and its start time), so that a pid the kernel has since given to someone else is never
    signalled nor taken for ours. An empty identity (unknown) trusts the pid."""

    pid: int
    ident: str = ""


@dataclass(frozen=True)
class Observation:
    """One host's answer to a supervisor read (Transport.observe)."""

    alive: set[int] | None  # the pids found running; None when liveness was not asked
    files: tuple[bytes | None, ...]  # each file's bytes from its offset; None: no such file
    statuses: tuple[bytes | None, ...] = ()  # each status file whole; None: no such file
    keys: tuple[str, ...] = ()  # each status's worker.host_watch.status_key
    urgent: bool = False  # answered on a change, not on the keep-alive


@dataclass(frozen=True)
class Watching:
    """What a long poll (Transport.observe with `watching`) is told the caller already knows;
    the host answers at once when that changed in a way that matters, else after `wait`."""

    known_alive: frozenset[int] | None  # the pids alive at the last answer; None: unknown
    statuses: tuple[tuple[str, str | None], ...]  # (status file, its last key; None: unknown)
    wait: float  # the keep-alive: seconds the host may hold its answer
    step: float  # seconds between the host's looks


class HostChannel(Protocol):
    """What each transport implements for one host: run a command, start one detached, talk to
    the host helper, move files. Paths are the host's own (POSIX) paths. The questions about
    the host's processes are built on it once (transport.host_ops.HostOps)."""

    host_label: str
    python: str  # the host's interpreter (it needs TensorFlow, not this package)

    def worker_argv(self, program: str, *args: str) -> list[str]:
        """The argv that runs the worker's PROGRAM (worker/__main__.py) on the host, from the
        copy of this coordinator's worker package that the transport shipped there."""
        ...

    def worker_call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        """Run one operation of the worker package's host helper (worker.hostd.handle) on the
        host: probe, read_tokens, alive, watch, stop, start, remove. Remote transports keep one
        helper process per connection, so a call is one round trip; raise TransportError on
        failure."""
        ...

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run argv to completion; raise TransportError if the host cannot be reached or the
        command outlives `timeout`."""
        ...

    def start_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        stdin_file: tuple[str, bytes] | None = None,
    ) -> ProcessRef:
        """Start argv in a new session (its pid is its process group id), standard streams
        detached, output appended to log_path; return its pid and identity at once. With stdin_file
        (path, data), first write data to path (mode 0600, new directories 0700): remote
        transports do both in one round trip."""
        ...

    def put_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write data to path (parents created with mode 0700), atomically, with this mode."""
        ...

    def get_file(self, path: str, local_path: Path) -> None:
        """Copy one file from the host to this machine."""
        ...

    def get_tree(self, path: str, local_dir: Path) -> int:
        """Copy a directory tree from the host; return the number of files copied."""
        ...

    def read_file(self, path: str, offset: int = 0) -> bytes | None:
        """The bytes of path from offset to its end; None when the file does not exist."""
        ...

    def observe_call(self, args: dict[str, Any], timeout: float | None) -> Any:
        """The helper's `watch` message, tried once (worker_call retries a dropped connection:
        a supervisor's read must fail within its timeout instead)."""
        ...

    def close(self) -> None: ...


class Transport(HostChannel, Protocol):
    """What the coordinator may do on one host: the channel, and the questions about the host's
    processes built on it (HostOps)."""

    def alive_pids(self, procs: Sequence[ProcessRef]) -> set[int]:
        """Which of these processes run (zombies do not; nor does a pid now someone else's)."""
        ...

    def observe(
        self,
        procs: Sequence[ProcessRef] | None,
        files: Sequence[tuple[str, int]],
        timeout: float | None = None,
        contact: Sequence[int] = (),
        watching: Watching | None = None,
    ) -> Observation:
        """In one round trip: alive_pids(procs) (unless None), then read_file(path, offset) for
        each file (at most worker.host_watch.READ_LIMIT bytes of each). One try within
        `timeout` (the caller's next read is the retry). `contact`: agent pids told that their
        coordinator still reaches them (worker.contact). With `watching`, a long poll
        (worker.host_watch.watch): the answer also carries each status file, and comes when
        something changed or after `watching.wait`; `timeout` must leave room for that."""
        ...

    def stop_process_group(self, leader: ProcessRef, grace: float) -> bool:
        """SIGTERM the leader's group, wait up to grace seconds, then SIGKILL what is left;
        True when no process of the group remains. A pid that now names another process is
        never signalled."""
        ...

    def ask_stacks(self, agent: ProcessRef) -> bool:
        """Ask this agent (worker.stacks; checked by identity) to have its trainer write its
        stacks; False: no such agent."""
        ...

    def stop_job(self, job_id: str, grace: float) -> list[int]:
        """Stop every process of the job on the host, found by ORCHESTRATE_JOB_ID in its
        environment (recorded or not); return the pids left alive."""
        ...
