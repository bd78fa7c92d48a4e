"""One agent per task (worker.agent), started and stopped over each host's transport: the
common part of every backend whose tasks run as processes it starts itself."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.errors import LaunchError
from orchestrator.planning.plan import LaunchPlan
from orchestrator.transport.base import ProcessRef, Transport
from orchestrator.transport.fanout import HostResults, each
from worker.spec import ENV_JOB_ID, WorkerSpec

# Beyond an agent's own stop_grace: how long it may take to stop its trainer and say so.
AGENT_STOP_MARGIN = 2.0


class TransportHosts(Protocol):
    """Hosts reached by a transport each, with the interpreter that runs agents there."""

    def transport(self, host_index: int) -> Transport: ...

    def python(self, host_index: int) -> str: ...


@dataclass(frozen=True)
class AgentRef:
    task_index: int
    host_index: int
    pid: int
    ident: str = ""  # worker.proctl.identity of pid on its host ("": unknown)

    @property
    def process(self) -> ProcessRef:
        return ProcessRef(self.pid, self.ident)


def start_agents(
    hosts: TransportHosts,
    plan: LaunchPlan,
    specs: Sequence[WorkerSpec],
    stop_grace: float,
    on_started: Callable[[AgentRef], None] = lambda agent: None,
) -> list[AgentRef]:
    """Push every spec and start every agent in parallel; on any failure, stop those that did
    start and raise LaunchError with each task's outcome. `on_started` hears of each agent as
    soon as its start returns (on the thread that started it), so that a coordinator killed
    mid-launch has recorded every agent it started. Returns the agents in task order."""

    def start(i: int) -> AgentRef:
        task, spec = plan.tasks[i], specs[i]
        layout = spec.layout
        spec_path = str(layout.spec_path(i))
        transport = hosts.transport(task.host_index)
        process = transport.start_detached(
            transport.worker_argv("agent", spec_path),
            log_path=str(layout.task_dir(i) / "agent.log"),
            # Marks every process of the job (the trainer inherits it): a stop finds them by
            # it even where no pid was recorded.
            env={ENV_JOB_ID: spec.job_id},
            stdin_file=(spec_path, spec.to_json().encode()),
        )
        agent = AgentRef(i, task.host_index, process.pid, process.ident)
        on_started(agent)
        return agent

    results = each(range(len(plan.tasks)), start)
    if not results.ok:
        started = results.values()
        stop_agent_groups(hosts, started, stop_grace + AGENT_STOP_MARGIN)
        detail = "; ".join(
            f"worker-{i}@{plan.tasks[i].host_label}: "
            + (str(results.failed[i]) if i in results.failed else "started, then stopped")
            for i in results
        )
        raise LaunchError(f"could not start every task, none left running: {detail}")
    return results.values()


def stop_agent_groups(
    hosts: TransportHosts, agents: Sequence[AgentRef], grace: float
) -> HostResults[int, None]:
    """Stop each agent's whole process group in parallel (SIGTERM, grace, SIGKILL), keyed by
    task index: a task succeeds when nothing of it is left, and fails when its host could not be
    reached or something of it outlived the grace. For a graceful stop pass the agents' own
    stop_grace plus AGENT_STOP_MARGIN: each agent escalates to SIGKILL itself and writes a
    final status first."""
    by_task = {a.task_index: a for a in agents}

    def stop(i: int) -> None:
        agent = by_task[i]
        if not hosts.transport(agent.host_index).stop_process_group(agent.process, grace):
            raise LaunchError(f"agent {agent.pid} still running after {grace:g}s")

    return each(by_task, stop)
