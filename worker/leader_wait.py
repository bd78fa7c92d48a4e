"""A MultiWorkerMirroredStrategy task connects to the coordination service leader only once
the leader is listening.

MWMS starts each task's gRPC server and connects it to the leader (the chief, else worker 0)
in one step. A task that gets there before the leader listens is refused, and gRPC retries
only after its reconnect backoff, which TensorFlow caps at 1 s: measured here, two workers
started by hand pay that second in about half of their starts, and always when worker 0
starts 0.4 s after worker 1. So the hook below, installed when the script imports
TensorFlow, first polls the leader's port (a plain TCP connect, every 10 ms, bounded), then
lets TensorFlow connect at once. The leader itself, and every other case, goes on unchanged.

Standard library only, but for the hook, which patches TensorFlow's eager Context.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import time
from typing import Any

POLL_SECONDS = 0.01
CONNECT_TIMEOUT = 1.0  # one probe of a host that drops packets
WAIT_CAP = 30.0  # then TensorFlow's own retries take over (1 s apart at most), as without us
_MARK = "_orchestrate_waits_for_leader"


def coordination_leader(jobs: dict[str, dict[int, str]]) -> tuple[str, int] | None:
    """The (job, index) TensorFlow makes the coordination service leader
    (multi_worker_util.coordination_leader): ps 0, else chief 0, else worker 0."""
    for job in ("ps", "chief", "worker"):
        if job in jobs and 0 in jobs[job]:
            return job, 0
    return None


def split_address(address: str) -> tuple[str, int] | None:
    """("host", port) from "host:port" or "[v6]:port" (a "grpc://" prefix allowed); None if
    it has no numeric port."""
    address = address.split("://", 1)[-1]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def leader_to_wait_for(
    jobs: dict[str, dict[int, str]], job_name: str, task_index: int
) -> tuple[str, int] | None:
    """The leader's (host, port) when this task (job_name, task_index) is not the leader
    itself; None: nothing to wait for."""
    leader = coordination_leader(jobs)
    if leader is None or leader == (job_name, task_index):
        return None
    return split_address(jobs[leader[0]][leader[1]])


def wait_until_listening(host: str, port: int, cap: float = WAIT_CAP) -> bool:
    """Whether host:port accepted a TCP connection within `cap` seconds (monotonic)."""
    deadline = time.monotonic() + cap
    while True:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
            return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)


def _jobs(server_def: Any) -> dict[str, dict[int, str]]:
    return {job.name: dict(job.tasks) for job in server_def.cluster.job}


def install(tf: Any) -> None:
    """Wrap Context.enable_collective_ops (MWMS calls it just before the context starts the
    server and connects): a task that is not the leader waits for it there first."""
    del tf  # imported: its internals are
    from tensorflow.python.eager import context

    enable = context.Context.enable_collective_ops
    if getattr(enable, _MARK, False):
        return

    @functools.wraps(enable)
    def enable_collective_ops(self: Any, server_def: Any) -> Any:
        with contextlib.suppress(Exception):  # a ServerDef we cannot read: TensorFlow as is
            leader = leader_to_wait_for(
                _jobs(server_def), server_def.job_name, int(server_def.task_index)
            )
            if leader is not None:
                wait_until_listening(*leader)
        return enable(self, server_def)

    setattr(enable_collective_ops, _MARK, True)
    context.Context.enable_collective_ops = enable_collective_ops
