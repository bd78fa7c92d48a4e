"""A fourth backend, for tests only, written as any plug-in would be: its own `[backend]`
section, registered at import (`register_backend`), found by other processes through the
`orchestrate.backends` entry point of an installed distribution.

    [backend]
    type = "loopback"
    addresses = ["127.0.0.2", "127.0.0.3"]   # one host each, on this machine
    record = "/path/calls.log"               # optional: each lifecycle call, one per line

Each host's tasks are local processes listening on the host's own loopback address. Nothing
outside this file knows it exists; it records each lifecycle call it gets, so that a test can
see the whole lifecycle went through the seam (from every process: `launch`, `stop`, `attach`
and `check` each open it in their own)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from orchestrator.backends import BackendPlugin, register_backend
from orchestrator.backends.agents import AgentTasks, agent_alive_here, start_agents
from orchestrator.backends.base import Launched, LaunchHooks, LaunchRequest, Sweep, TaskHandle
from orchestrator.backends.capabilities import Capabilities
from orchestrator.backends.preflight import preflight
from orchestrator.config import BackendSection, HostPlace
from orchestrator.planning.plan import plan_on_hosts
from orchestrator.state.store import JobRecord
from orchestrator.transport.fanout import HostResults, each
from orchestrator.transport.local import LocalTransport
from worker.spec import JobLayout, WorkerSpec


class LoopbackSection(BackendSection):
    type: Literal["loopback"]
    addresses: Annotated[list[Annotated[str, Field(pattern=r"^127\.\d+\.\d+\.\d+$")]],
                         Field(min_length=1)]  # fmt: skip
    record: str | None = None

    def places(self) -> tuple[HostPlace, ...]:
        return tuple(HostPlace(f"lo-{a.rpartition('.')[2]}", a) for a in self.addresses)


CAPABILITIES = Capabilities(warm_restarts=False)


class LoopbackHosts(AgentTasks):
    kind = "loopback"
    capabilities = CAPABILITIES

    def __init__(self, section: LoopbackSection) -> None:
        self._transports = [LocalTransport(p.label, sys.executable) for p in section.places()]
        self._record = Path(section.record) if section.record else None
        self.calls: list[str] = []

    def _called(self, call: str) -> None:
        self.calls.append(call)
        if self._record is not None:
            with self._record.open("a") as f:
                f.write(call + "\n")

    def host_count(self) -> int:
        return len(self._transports)

    def transport(self, host_index: int) -> LocalTransport:
        return self._transports[host_index]

    def python(self, host_index: int) -> str:
        return sys.executable

    def launch(self, request: LaunchRequest, hooks: LaunchHooks) -> Launched | None:
        self._called(f"launch {request.attempt} on {list(request.hosts)}")
        config = request.config
        reports = preflight(config, self, request.job_id, request.hosts, hooks.host_answered)
        ports = {h: r.ports for h, r in reports.items()}
        plan = plan_on_hosts(config, ports, {}, request.hosts)
        specs = hooks.planned(plan)
        agents = start_agents(self, plan, specs, config.supervision.stop_grace, hooks.started)
        return Launched(plan, agents)

    def ask_stacks(self, task: TaskHandle) -> bool:
        self._called("ask_stacks")
        return super().ask_stacks(task)

    def stop_agents(self, agents: Sequence[TaskHandle], grace: float) -> HostResults[int, None]:
        self._called(f"stop {sorted(a.task_index for a in agents)}")
        return super().stop_agents(agents, grace)

    def adopt(self, job: JobRecord, layout: JobLayout) -> None:
        self._called("adopt")

    def sweep(self, job: JobRecord, grace: float) -> Sweep:
        self._called("sweep")
        results = each(
            range(self.host_count()), lambda h: self.transport(h).stop_job(job.id, grace)
        )
        left = {self.transport(h).host_label: p for h, p in results.succeeded.items() if p}
        return Sweep({}, left, frozenset(h for h, p in results.succeeded.items() if p))

    def end_standbys(self, job_id: str) -> None:
        self._called("end_standbys")

    def keep_spare_warm(self, host_index: int, specs: Sequence[WorkerSpec]) -> None:
        self._called(f"keep_spare_warm {host_index}")

    def standbys(self, clear: bool) -> HostResults[int, list[dict[str, Any]]]:
        self._called(f"standbys clear={clear}")
        return each(range(self.host_count()), lambda h: [])  # it keeps none

    def finish(self, layout: JobLayout, succeeded: bool) -> None:
        self._called(f"finish succeeded={succeeded}")

    def lasting_call(self, host_index: int, op: str, args: dict[str, Any], timeout: float) -> Any:
        self._called(f"lasting_call {op}")
        from worker import hostd  # in this process: a listener must outlive the call

        if "key" in args:  # every host's listener lives in this one process: one key each
            args = {**args, "key": f"{args['key']}@{host_index}"}
        return hostd.handle(op, args)

    def close(self) -> None:
        self._called("close")


PLUGIN = BackendPlugin(
    LoopbackSection, LoopbackHosts, CAPABILITIES, task_alive_here=agent_alive_here
)
register_backend(PLUGIN)
