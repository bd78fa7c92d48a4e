"""What the coordinator asks of a host's processes and files, implemented once over the host
helper's messages (worker.hostd): a supervisor's read (which processes live, new log bytes,
status files: one `watch`), which processes live, stopping a process group, stopping every
process of a job, asking an agent for its trainer's stacks. A transport carries the messages
(`worker_call`, `observe_call`); it does not implement these again."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from orchestrator.transport.base import Observation, ProcessRef, Watching

# The helper's answer to a stop comes after the grace; this much more for the round trip.
STOP_SLACK = 30.0


class HostOps:
    # How long a quick question (which processes live) may take; None: the transport's default.
    quick_timeout: float | None = None

    def worker_call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        raise NotImplementedError

    def observe_call(self, args: dict[str, Any], timeout: float | None) -> Any:
        """The `watch` message, tried once: a lost host must be seen within host_timeout, not
        after retries (the caller's next read is the retry)."""
        return self.worker_call("watch", args, timeout)

    def observe(
        self,
        procs: Sequence[ProcessRef] | None,
        files: Sequence[tuple[str, int]],
        timeout: float | None = None,
        contact: Sequence[int] = (),
        watching: Watching | None = None,
    ) -> Observation:
        return observation_of(
            self.observe_call(watch_args(procs, files, contact, watching), timeout)
        )

    def alive_pids(self, procs: Sequence[ProcessRef]) -> set[int]:
        if not procs:
            return set()
        args = {"pids": [p.pid for p in procs], "idents": [p.ident for p in procs]}
        return {int(pid) for pid in self.worker_call("alive", args, self.quick_timeout)}

    def stop_process_group(self, leader: ProcessRef, grace: float) -> bool:
        args = {"pgid": leader.pid, "grace": grace, "ident": leader.ident}
        return bool(self.worker_call("stop", args, grace + STOP_SLACK))

    def ask_stacks(self, agent: ProcessRef) -> bool:
        """Ask an agent (checked by identity) to have its trainer write its stacks."""
        args = {"pid": agent.pid, "ident": agent.ident}
        return bool(self.worker_call("ask_stacks", args, 5.0))  # a hung group waits on it

    def stop_job(self, job_id: str, grace: float) -> list[int]:
        left = self.worker_call("stop_job", {"job_id": job_id, "grace": grace}, grace + STOP_SLACK)
        return [int(pid) for pid in left]


def watch_args(
    procs: Sequence[ProcessRef] | None,
    files: Sequence[tuple[str, int]],
    contact: Sequence[int],
    watching: Watching | None,
) -> dict[str, Any]:
    """The host helper's `watch` request (worker.hostd); without `watching`, answered at once."""
    args: dict[str, Any] = {
        "pids": None,
        "logs": [list(f) for f in files],
        "contact": list(contact),
    }
    if procs is not None:
        args.update(pids=[p.pid for p in procs], idents=[p.ident for p in procs])
    if watching is not None:
        known = watching.known_alive
        args.update(
            known_alive=None if known is None else sorted(known),
            statuses=[list(s) for s in watching.statuses],
            wait=watching.wait,
            step=watching.step,
        )
    return args


def _decoded(items: list[str | None]) -> tuple[bytes | None, ...]:
    return tuple(None if d is None else base64.b64decode(d) for d in items)


def observation_of(reply: dict[str, Any]) -> Observation:
    alive = reply["alive"]
    return Observation(
        None if alive is None else set(alive),
        _decoded(reply["logs"]),
        _decoded(reply.get("statuses", [])),
        tuple(reply.get("keys", [])),
        bool(reply.get("urgent")),
    )
