"""One agent per task (worker.agent), started and stopped over each host's transport: the
common part of every backend whose tasks run as processes it starts itself. Such a task's
handle names its agent's process on its host (pid and identity); only this module reads it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

from orchestrator.backends.task_handle import TaskHandle
from orchestrator.errors import LaunchError
from orchestrator.planning.plan import LaunchPlan
from orchestrator.transport.base import Observation, ProcessRef, Transport, Watching
from orchestrator.transport.fanout import HostResults, each
from worker.spec import ENV_JOB_ID, WorkerSpec

# Beyond an agent's own stop_grace: how long it may take to stop its trainer and say so.
AGENT_STOP_MARGIN = 2.0


class TransportHosts(Protocol):
    """Hosts reached by a transport each, with the interpreter that runs agents there."""

    def transport(self, host_index: int) -> Transport: ...

    def python(self, host_index: int) -> str: ...


def agent_handle(task_index: int, host_index: int, process: ProcessRef) -> TaskHandle:
    return TaskHandle(task_index, host_index, f"{process.pid}/{process.ident}")


def agent_process(task: TaskHandle) -> ProcessRef:
    """The agent's process a handle names (pid 0: a handle that names none, never signalled)."""
    pid, _, ident = task.ref.partition("/")
    return ProcessRef(int(pid) if pid.isdigit() else 0, ident)


def agent_pid(ref: str | None) -> int | None:
    """The pid of the agent a stored handle (status --json's `agent`) names; None: none."""
    pid = agent_process(TaskHandle(0, 0, ref)).pid if ref else 0
    return pid if pid > 1 else None


def agent_alive_here(ref: str) -> bool:
    """Whether the agent a handle names still runs, this machine being its host."""
    from worker.proctl import is_same

    process = agent_process(TaskHandle(0, 0, ref))
    return process.pid > 1 and is_same(process.pid, process.ident)


def start_agents(
    hosts: TransportHosts,
    plan: LaunchPlan,
    specs: Sequence[WorkerSpec],
    stop_grace: float,
    on_started: Callable[[TaskHandle], None] = lambda agent: None,
) -> list[TaskHandle]:
    """Push every spec and start every agent in parallel; on any failure, stop those that did
    start and raise LaunchError with each task's outcome. `on_started` hears of each agent as
    soon as its start returns (on the thread that started it), so that a coordinator killed
    mid-launch has recorded every agent it started. Returns the agents in task order."""

    def start(i: int) -> TaskHandle:
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
        agent = agent_handle(i, task.host_index, process)
        on_started(agent)
        return agent

    results = each(range(len(plan.tasks)), start)
    if not results.ok:
        started = results.values()
        stop_agent_groups(hosts.transport, started, stop_grace + AGENT_STOP_MARGIN)
        detail = "; ".join(
            f"worker-{i}@{plan.tasks[i].host_label}: "
            + (str(results.failed[i]) if i in results.failed else "started, then stopped")
            for i in results
        )
        raise LaunchError(f"could not start every task, none left running: {detail}")
    return results.values()


def stop_agent_groups(
    transport: Callable[[int], Transport], agents: Sequence[TaskHandle], grace: float
) -> HostResults[int, None]:
    """Stop each agent's whole process group in parallel (SIGTERM, grace, SIGKILL), keyed by
    task index: a task succeeds when nothing of it is left, and fails when its host could not be
    reached or something of it outlived the grace. For a graceful stop pass the agents' own
    stop_grace plus AGENT_STOP_MARGIN: each agent escalates to SIGKILL itself and writes a
    final status first."""
    by_task = {a.task_index: a for a in agents}

    def stop(i: int) -> None:
        agent = by_task[i]
        process = agent_process(agent)
        if process.pid <= 1:  # names no process: nothing of it to stop
            return
        if not transport(agent.host_index).stop_process_group(process, grace):
            raise LaunchError(f"agent {process.pid} still running after {grace:g}s")

    return each(by_task, stop)


class AgentTasks:
    """The Backend calls for tasks that are agents this backend starts itself over each host's
    transport: observed, checked, asked for stacks and stopped through their processes. A
    backend mixes it in and says how each host is reached (`transport`)."""

    def transport(self, host_index: int) -> Transport:
        raise NotImplementedError

    def observe(
        self,
        host_index: int,
        tasks: Sequence[TaskHandle] | None,
        files: Sequence[tuple[str, int]],
        timeout: float | None = None,
        watching: Watching | None = None,
    ) -> Observation:
        """Their processes' liveness (as task indices) and the files, in one round trip, each
        agent told that its coordinator still reaches it (worker.contact)."""
        transport = self.transport(host_index)
        if tasks is None:
            return transport.observe(None, files, timeout=timeout)
        procs = [agent_process(t) for t in tasks]
        task_of = {p.pid: t.task_index for p, t in zip(procs, tasks, strict=True)}
        if watching is not None and watching.known_alive is not None:
            known = frozenset(p.pid for p, t in zip(procs, tasks, strict=True)
                              if t.task_index in watching.known_alive)  # fmt: skip
            watching = dataclasses.replace(watching, known_alive=known)
        seen = transport.observe(procs, files, timeout, [p.pid for p in procs], watching)
        if seen.alive is None:
            return seen
        return dataclasses.replace(seen, alive={task_of[p] for p in seen.alive if p in task_of})

    def alive_tasks(self, host_index: int, tasks: Sequence[TaskHandle]) -> set[int]:
        procs = [agent_process(t) for t in tasks]
        alive = self.transport(host_index).alive_pids(procs)
        return {t.task_index for p, t in zip(procs, tasks, strict=True) if p.pid in alive}

    def ask_stacks(self, task: TaskHandle) -> bool:
        """The agent signals its trainer (checked by identity)."""
        return self.transport(task.host_index).ask_stacks(agent_process(task))

    def stop_agents(self, agents: Sequence[TaskHandle], grace: float) -> HostResults[int, None]:
        return stop_agent_groups(self.transport, agents, grace)
