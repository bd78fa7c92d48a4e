"""The backend seam: the `Backend` protocol every backend implements, and the values that cross
it (a launch request, the hooks a backend reports through, what a launch and a sweep return)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.backends.capabilities import Capabilities
from orchestrator.backends.preflight import HostReport
from orchestrator.backends.task_handle import TaskHandle
from orchestrator.config import ClusterConfig
from orchestrator.planning.plan import LaunchPlan
from orchestrator.state.store import JobRecord
from orchestrator.transport.base import Observation, Transport, Watching
from orchestrator.transport.fanout import HostResults
from worker.spec import JobLayout, WorkerSpec


@dataclass(frozen=True)
class LaunchRequest:
    """One attempt to start: on which hosts (by position in cluster.toml)."""

    config: ClusterConfig
    job_id: str
    layout: JobLayout
    attempt: int
    hosts: tuple[int, ...]
    force: bool = False  # `launch --force`: GPUs busy with other programs are used anyway
    # Whether restarts may be warm, decided once for the job (the config and the backend's
    # capabilities): keepers start, and every spec says so.
    warm: bool = False


class LaunchHooks(Protocol):
    """What a backend tells the supervision side while it starts an attempt."""

    stop_requested: threading.Event

    def say(self, text: str) -> None:
        """A line for the console."""

    def host_answered(self, report: HostReport, seconds: float) -> None:
        """A host passed its preflight."""

    def queued(self, text: str) -> None:
        """What the job waits for (a scheduler's queue): an event, and the job's cause meanwhile."""

    def remember(self, backend_state: str) -> None:
        """Keep this for the job (its record's `backend_state`, opaque to all but the backend):
        what a later supervisor's `adopt` or a `sweep` needs, e.g. a scheduler's job id."""

    def planned(self, plan: LaunchPlan) -> list[WorkerSpec]:
        """The plan is known: its tasks are recorded (pending); returns each task's spec."""

    def started(self, task: TaskHandle) -> None:
        """A task runs: recorded at once, whatever becomes of the launch."""


@dataclass(frozen=True)
class Launched:
    plan: LaunchPlan
    agents: list[TaskHandle]
    gpu_counts: dict[int, int] = field(default_factory=dict)  # GPUs per host, at preflight


@dataclass(frozen=True)
class Sweep:
    """What a stop without a supervisor confirmed: hosts it could not reach (label -> why) and
    processes still alive after it (label -> pids), and the hosts (by position) whose tasks it
    could not confirm stopped."""

    unreachable: dict[str, str]
    left: dict[str, list[int]]
    unconfirmed_hosts: frozenset[int] = frozenset()

    @property
    def confirmed(self) -> bool:
        return not self.unreachable and not self.left

    def describe(self) -> str:
        parts = [f"{h} unreachable ({why})" for h, why in self.unreachable.items()]
        parts += [f"{h} still runs pids {pids}" for h, pids in self.left.items()]
        return "; ".join(parts)


class Backend(Protocol):
    kind: str
    capabilities: Capabilities

    def host_count(self) -> int: ...

    def transport(self, host_index: int) -> Transport: ...

    def python(self, host_index: int) -> str: ...

    def launch(self, request: LaunchRequest, hooks: LaunchHooks) -> Launched | None:
        """Start one attempt's tasks: preflight (or the scheduler's equivalent), plan, specs,
        agents. Raises HostsUnreachable when a host cannot be reached, OrchestrateError when a
        host is unfit or a task fails to start (nothing of the attempt left running). None: a
        stop was requested while waiting (for an allocation)."""
        ...

    def observe(
        self,
        host_index: int,
        tasks: Sequence[TaskHandle] | None,
        files: Sequence[tuple[str, int]],
        timeout: float | None = None,
        watching: Watching | None = None,
    ) -> Observation:
        """One host's tasks and files in one round trip (Transport.observe), with `alive` and
        `watching.known_alive` as task indices; None: liveness not asked. One try."""
        ...

    def alive_tasks(self, host_index: int, tasks: Sequence[TaskHandle]) -> set[int]:
        """The indices of these tasks (all on this host) that still run."""
        ...

    def ask_stacks(self, task: TaskHandle) -> bool:
        """Ask the task to write its trainer's stacks (worker.stacks); False: it cannot."""
        ...

    def stop_agents(self, agents: Sequence[TaskHandle], grace: float) -> HostResults[int, None]:
        """Stop these tasks and everything they started (SIGTERM, grace, SIGKILL), keyed by
        task index: a failure is a task whose stop was not confirmed."""
        ...

    def adopt(self, job: JobRecord, layout: JobLayout) -> None:
        """A supervisor taking a running job over: find what it needs of the backend's own."""
        ...

    def sweep(self, job: JobRecord, grace: float) -> Sweep:
        """No supervisor: stop every process of the job, found by its id, on every host."""
        ...

    def end_standbys(self, job_id: str) -> None:
        """The job ended: no standby of it waits for a next attempt; each is kept for the
        user's next job (within the budget) or ends."""
        ...

    def keep_spare_warm(self, host_index: int, specs: Sequence[WorkerSpec]) -> None:
        """Have a spare host (in no attempt's group) keep a standby for each of `specs` (one
        host's tasks), for the task that may move there; a visit, repeated while it stays a
        spare. Raises OrchestrateError when the host does not answer."""
        ...

    def standbys(self, clear: bool) -> HostResults[int, list[dict[str, Any]]]:
        """The standbys this user keeps between jobs on each host (worker.warm.registry' entries);
        `clear`: end them first."""
        ...

    def finish(self, layout: JobLayout, succeeded: bool) -> None:
        """The job ended: give back what the backend holds for it (never raises)."""
        ...

    def lasting_call(self, host_index: int, op: str, args: dict[str, Any], timeout: float) -> Any:
        """A host helper operation whose effects outlive the call (listeners: `check`)."""
        ...

    def close(self) -> None: ...
