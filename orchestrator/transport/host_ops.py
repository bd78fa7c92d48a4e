"""What the coordinator does to a host's processes, implemented once over the host helper's
messages (worker.hostd): which of them live, stopping a process group, stopping every process
of a job. A transport carries the messages (`worker_call`); it does not implement these again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.transport.base import ProcessRef

# The helper's answer to a stop comes after the grace; this much more for the round trip.
STOP_SLACK = 30.0


class HostOps:
    # How long a quick question (which processes live) may take; None: the transport's default.
    quick_timeout: float | None = None

    def worker_call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        raise NotImplementedError

    def alive_pids(self, procs: Sequence[ProcessRef]) -> set[int]:
        if not procs:
            return set()
        args = {"pids": [p.pid for p in procs], "idents": [p.ident for p in procs]}
        return {int(pid) for pid in self.worker_call("alive", args, self.quick_timeout)}

    def stop_process_group(self, leader: ProcessRef, grace: float) -> bool:
        args = {"pgid": leader.pid, "grace": grace, "ident": leader.ident}
        return bool(self.worker_call("stop", args, grace + STOP_SLACK))

    def stop_job(self, job_id: str, grace: float) -> list[int]:
        left = self.worker_call("stop_job", {"job_id": job_id, "grace": grace}, grace + STOP_SLACK)
        return [int(pid) for pid in left]
