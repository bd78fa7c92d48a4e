"""One attempt of a job: its plan, its agents, what the supervisor has seen of it (`Watch`, on
the coordinator's clock) and each task's log tailer. Made by attempt_control.py when a group
starts (or is adopted) and passed explicitly to whatever reads or stops it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.backends.base import TaskHandle
from orchestrator.logs.logstream import LogTailer
from orchestrator.planning.plan import LaunchPlan
from orchestrator.supervision.observations import TaskObservation
from worker.spec import TaskStatus


@dataclass
class Watch:
    """Per-attempt bookkeeping of what the supervisor has seen (coordinator clock). Written by
    the ingest alone, one round at a time (ingest.py); everything else reads it through the
    methods below."""

    started: float
    seq: dict[int, int] = field(default_factory=dict)
    seq_changed: dict[int, float] = field(default_factory=dict)
    step: dict[int, int] = field(default_factory=dict)
    step_changed: dict[int, float] = field(default_factory=dict)
    first_step: set[int] = field(default_factory=set)
    last: dict[int, dict[str, object]] = field(default_factory=dict)
    host_ok: dict[int, float] = field(default_factory=dict)  # host -> last read that worked
    host_error: dict[int, str] = field(default_factory=dict)  # host -> why its last read failed
    # What each task looked like at its host's last answer, ages left out (added each round).
    seen: dict[int, TaskObservation] = field(default_factory=dict)
    raw_status: dict[int, bytes | None] = field(default_factory=dict)
    status: dict[int, TaskStatus | None] = field(default_factory=dict)  # parsed, this attempt's
    resources_kept: dict[int, float] = field(default_factory=dict)  # task -> when kept (monotonic)

    # --- what the rest reads (the fields above are the ingest's) -------------------------
    def elapsed(self, now: float) -> float:
        """Seconds since the attempt began."""
        return now - self.started

    def silent_for(self, host: int, now: float) -> float:
        """Seconds since the host's last good read (since the attempt began, if none)."""
        return now - self.host_ok.get(host, self.started)

    def answered_ago(self, host: int, now: float) -> float:
        """Seconds since the host's last good read (0 if it never answered)."""
        return now - self.host_ok.get(host, now)

    def failing(self, host: int) -> bool:
        """The host's last read failed."""
        return host in self.host_error

    def failing_hosts(self) -> set[int]:
        return set(self.host_error)

    def why_failing(self, host: int) -> str:
        return self.host_error.get(host, "")

    def statuses(self) -> dict[int, TaskStatus | None]:
        """Each task's status as last read in this attempt."""
        return dict(self.status)

    def last_reported(self, task: int, key: str) -> object:
        """What the task last reported for `key` (its row in the store: epoch, step, ...)."""
        return self.last.get(task, {}).get(key)


@dataclass(frozen=True)
class Attempt:
    """One attempt's running group. The tailers outlive it: a restart appends to each task's
    log, and the next attempt reads on from the same offsets."""

    number: int
    plan: LaunchPlan
    agents: list[TaskHandle]
    tailers: Mapping[int, LogTailer]
    watch: Watch = field(default_factory=lambda: Watch(started=time.monotonic()))
    gpu_counts: Mapping[int, int] = field(default_factory=dict)  # GPUs per host, at preflight

    def hosts(self) -> tuple[int, ...]:
        return tuple(sorted({t.host_index for t in self.plan.tasks}))


def agents_by_host(agents: list[TaskHandle]) -> dict[int, list[TaskHandle]]:
    by_host: dict[int, list[TaskHandle]] = {}
    for agent in agents:
        by_host.setdefault(agent.host_index, []).append(agent)
    return by_host
