"""The queue (`scheduling.wait_for_resources`): a job that asks for GPUs or task slots another job
holds waits, `queued`, and launches once they are free; jobs wanting the same go one after the
other, in launch order. A preflight that finds GPUs busy with another program, or a host it
cannot reach, puts the job back in the queue to try again later, instead of failing it.

The turn is taken under the store's write lock (store.move_job_unless), so two queued jobs
never both see the same GPUs free. The wait runs on this supervisor's own clock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from orchestrator.config import ClusterConfig
from orchestrator.errors import HostsUnreachable, OrchestrateError, ResourcesBusy
from orchestrator.planning.claims import Claim, claims, first_overlap
from orchestrator.state.job_records import stored_config, supervisor_alive
from orchestrator.state.job_state import JobStateMachine
from orchestrator.state.states import JobState
from orchestrator.state.store import JobRecord

LOOK_EVERY = 1.0  # seconds between looks at what the other jobs hold
PROBE_AGAIN = 10.0  # seconds before hosts that were busy or unreachable are checked again
_WAITING_ORDER = (JobState.PENDING, JobState.QUEUED)  # not holding yet: they wait their turn


class QueueTimedOut(OrchestrateError):
    """The job waited `scheduling.queue_timeout` in the queue."""


def waitable(exc: Exception) -> bool:
    """Whether a failed preflight is one a queued job waits out: busy GPUs, unreachable hosts."""
    return isinstance(exc, ResourcesBusy) or (isinstance(exc, HostsUnreachable) and exc.waitable)


class Queue:
    def __init__(
        self,
        job_state: JobStateMachine,
        config: ClusterConfig,
        stop_requested: threading.Event,
        say: Callable[[str, str], None],
    ) -> None:
        self.job_state = job_state
        self.mine = claims(config)
        self.timeout = config.scheduling.queue_timeout
        self.stop_requested = stop_requested
        self.say = say  # (event kind, message): the job's events and its lines
        self.began = time.monotonic()
        self.said = ""
        self._theirs: dict[str, tuple[Claim, ...]] = {}

    def wait_turn(self) -> bool:
        """Wait until nothing this job asks for is held, then move it on to LAUNCHING. False:
        a stop was requested meanwhile. QueueTimedOut past `queue_timeout`."""
        while True:
            reason = self.job_state.move_unless(JobState.LAUNCHING, self._blocked)
            if not reason:
                return self.job_state.state == JobState.LAUNCHING
            if not self._wait(reason, LOOK_EVERY):
                return False

    def back(self, exc: Exception) -> bool:
        """The preflight found GPUs busy or hosts unreachable: back in the queue for a while
        (its cause says why). False: a stop was requested meanwhile."""
        self.job_state.to(JobState.QUEUED, last_cause=f"waiting: {exc}")
        return self._wait(f"waiting: {exc}", PROBE_AGAIN)

    def _wait(self, reason: str, seconds: float) -> bool:
        if reason != self.said:  # once per reason, not once per look
            self.said = reason
            self.say("queued", reason)
        waited = time.monotonic() - self.began
        if self.timeout and waited >= self.timeout:
            raise QueueTimedOut(f"waited {waited:.0f} s in the queue ({reason})")
        return not self.stop_requested.wait(seconds)

    def _blocked(self, jobs: list[JobRecord]) -> str:
        """Why this job may not launch now ("": it may): the first job that holds, or is queued
        before it for, what it asks for. `jobs` come oldest first."""
        ahead = True
        for other in jobs:
            if other.id == self.job_state.job_id:
                ahead = False
                continue
            waiting = other.state in _WAITING_ORDER
            if waiting and not (ahead and supervisor_alive(other) is not False):
                continue  # queued after this one, or its supervisor is gone
            wanted = first_overlap(self.mine, self._claims_of(other))
            if wanted is not None:
                how = "queued before it" if waiting else "held"
                return f"waiting for {wanted.describe()}: {how} by job {other.id}"
        return ""

    def _claims_of(self, job: JobRecord) -> tuple[Claim, ...]:
        if job.id not in self._theirs:
            try:
                self._theirs[job.id] = claims(stored_config(job))
            except (ValueError, OrchestrateError):  # a record this version cannot read (another
                # version's, a backend plug-in not installed here): nothing known held
                self._theirs[job.id] = ()
        return self._theirs[job.id]
