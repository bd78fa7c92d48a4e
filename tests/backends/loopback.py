"""A fourth backend, for tests only: every host of an SSH cluster.toml runs on this machine, as
local processes listening on the host's own loopback address (127.0.0.2, 127.0.0.3, ...).

It is written against orchestrator.backends.base.Backend alone: no line of the supervisor,
the attempts or the stop path knows it exists. It records each lifecycle call it gets, so that
a test can see the whole lifecycle went through the seam."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from orchestrator.agents import AgentRef, start_agents, stop_agent_groups
from orchestrator.backends.base import Launched, LaunchHooks, LaunchRequest, Sweep
from orchestrator.backends.capabilities import Capabilities
from orchestrator.config import SshBackend
from orchestrator.fanout import HostResults, each
from orchestrator.plan import plan_on_hosts
from orchestrator.preflight import preflight
from orchestrator.store import JobRecord
from orchestrator.transport.local import LocalTransport
from worker.spec import JobLayout


class LoopbackHosts:
    kind = "loopback"
    capabilities = Capabilities(warm_restarts=False)

    def __init__(self, config: SshBackend) -> None:
        self._transports = [LocalTransport(h.label, sys.executable) for h in config.hosts]
        self.calls: list[str] = []

    def host_count(self) -> int:
        return len(self._transports)

    def transport(self, host_index: int) -> LocalTransport:
        return self._transports[host_index]

    def python(self, host_index: int) -> str:
        return sys.executable

    def launch(self, request: LaunchRequest, hooks: LaunchHooks) -> Launched | None:
        self.calls.append(f"launch {request.attempt} on {list(request.hosts)}")
        config = request.config
        reports = preflight(config, self, request.job_id, request.hosts, hooks.host_answered)
        ports = {h: r.ports for h, r in reports.items()}
        plan = plan_on_hosts(config, ports, {}, request.hosts)
        specs = hooks.planned(plan)
        agents = start_agents(self, plan, specs, config.supervision.stop_grace, hooks.started)
        return Launched(plan, agents)

    def stop_agents(self, agents: Sequence[AgentRef], grace: float) -> HostResults[int, None]:
        self.calls.append(f"stop {sorted(a.task_index for a in agents)}")
        return stop_agent_groups(self, agents, grace)

    def adopt(self, job: JobRecord, layout: JobLayout) -> None:
        self.calls.append("adopt")

    def sweep(self, job: JobRecord, grace: float) -> Sweep:
        self.calls.append("sweep")
        results = each(
            range(self.host_count()), lambda h: self.transport(h).stop_job(job.id, grace)
        )
        left = {self.transport(h).host_label: p for h, p in results.succeeded.items() if p}
        return Sweep({}, left, frozenset(h for h, p in results.succeeded.items() if p))

    def end_standbys(self, job_id: str) -> None:
        self.calls.append("end_standbys")

    def finish(self, layout: JobLayout, succeeded: bool) -> None:
        self.calls.append(f"finish succeeded={succeeded}")

    def lasting_call(self, host_index: int, op: str, args: dict[str, Any], timeout: float) -> Any:
        return self.transport(host_index).worker_call(op, args, timeout=timeout)

    def close(self) -> None:
        self.calls.append("close")
