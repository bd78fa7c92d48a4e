"""The lifecycle shared by backends whose agents we start ourselves, one per task, over each
host's transport (local, SSH): preflight, plan, specs, agents; stop each agent's process
group; sweep a host for the job's processes. A subclass names its hosts and may add a step
before the preflight (`prepare`) or before the first attempt's agents (`run_setup`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from orchestrator.backends.agents import AgentTasks, start_agents
from orchestrator.backends.base import Launched, LaunchHooks, LaunchRequest, Sweep
from orchestrator.backends.capabilities import Capabilities
from orchestrator.backends.preflight import HostReport, preflight
from orchestrator.config import ClusterConfig
from orchestrator.errors import TransportError
from orchestrator.planning.gpus import summary
from orchestrator.planning.plan import LaunchPlan, plan_on_hosts
from orchestrator.state.store import JobRecord
from orchestrator.transport.base import Transport
from orchestrator.transport.fanout import HostResults, each
from worker.container import job_runtime, sweep_argv
from worker.spec import ENV_JOB_ID, JobLayout, WorkerSpec

STANDBY_CALL_TIMEOUT = 30.0


class AgentHosts(AgentTasks):
    kind = ""
    capabilities = Capabilities()

    def __init__(self, transports: Sequence[Transport], pythons: Sequence[str]) -> None:
        self._transports = list(transports)
        self._pythons = list(pythons)
        self._runtime: str | None = None  # the job's container runtime, if it has one

    def host_count(self) -> int:
        return len(self._transports)

    def transport(self, host_index: int) -> Transport:
        return self._transports[host_index]

    def python(self, host_index: int) -> str:
        return self._pythons[host_index]

    def labels(self) -> list[str]:
        return [t.host_label for t in self._transports]

    # --- hooks for a subclass -------------------------------------------------------------
    def prepare(self, config: ClusterConfig) -> None:
        """Before each preflight."""

    def run_setup(self, config: ClusterConfig) -> None:
        """Once per job, after the first preflight and before any agent starts."""

    # --- an attempt ---------------------------------------------------------------------
    def launch(self, request: LaunchRequest, hooks: LaunchHooks) -> Launched | None:
        config, hosts = request.config, request.hosts
        self._runtime = config.container.runtime if config.container else None
        self.prepare(config)
        hooks.say(f"attempt {request.attempt}: preflight on {len(hosts)} host(s)")
        reports = preflight(
            config, self, request.job_id, hosts, hooks.host_answered, force=request.force
        )
        if request.attempt == 0:
            self.run_setup(config)
        gpu_counts = {h: len(r.gpu.gpus) for h, r in reports.items() if r.gpu is not None}
        plan = plan_on_hosts(config, {h: r.ports for h, r in reports.items()}, gpu_counts, hosts)
        for line in gpu_lines(reports, plan):
            hooks.say(line)
        specs = hooks.planned(plan)
        agents = start_agents(self, plan, specs, config.supervision.stop_grace, hooks.started)
        return Launched(plan, agents, gpu_counts)

    def adopt(self, job: JobRecord, layout: JobLayout) -> None:
        """Nothing of ours to find: the agents are in the store."""

    # --- the job's end --------------------------------------------------------------------
    def sweep(self, job: JobRecord, grace: float) -> Sweep:
        labels = self.labels()
        results = each(range(len(labels)), lambda h: self.transport(h).stop_job(job.id, grace))
        self.end_standbys(job.id)
        self._sweep_containers(job.id, job_runtime(job.config_json))
        return Sweep(
            unreachable={labels[h]: results.reason(h, labels[h]) for h in results.failed},
            left={labels[h]: pids for h, pids in results.succeeded.items() if pids},
            unconfirmed_hosts=frozenset(results.failed)
            | {h for h, pids in results.succeeded.items() if pids},
        )

    def end_standbys(self, job_id: str) -> None:
        """Each keeper of the job keeps its standby for the next job (within its budget) or
        ends; a host that does not answer leaves its keepers to decide when their linger ends."""
        each(
            range(self.host_count()),
            lambda h: self.transport(h).worker_call(
                "standbys", {"action": "release", "job_id": job_id}, timeout=STANDBY_CALL_TIMEOUT
            ),
        )

    def keep_spare_warm(self, host_index: int, specs: Sequence[WorkerSpec]) -> None:
        transport = self.transport(host_index)
        label = transport.host_label
        payload = json.dumps([asdict(replace(spec, host_label=label)) for spec in specs])
        result = transport.run(
            transport.worker_argv("warm.spare"),
            env={ENV_JOB_ID: specs[0].job_id},  # a sweep of the job finds it
            stdin=payload.encode(),
            timeout=STANDBY_CALL_TIMEOUT,
        )
        if not result.ok:
            raise TransportError(f"{label}: keeping standbys as a spare failed: {result.tail()}")

    def standbys(self, clear: bool) -> HostResults[int, list[dict[str, Any]]]:
        """What each host keeps (worker.warm.registry' entries); `clear`: end them first."""

        def one(h: int) -> list[dict[str, Any]]:
            if clear:
                self.transport(h).worker_call("standbys", {"action": "clear"})
            return self.transport(h).worker_call(
                "standbys", {"action": "list"}, timeout=STANDBY_CALL_TIMEOUT
            )

        return each(range(self.host_count()), one)

    def finish(self, layout: JobLayout, succeeded: bool) -> None:
        """Nothing held beyond the processes, and the containers their runtime may have left
        (a trainer killed with its agent)."""
        self._sweep_containers(layout.root.name, self._runtime)

    def _sweep_containers(self, job_id: str, runtime: str | None) -> None:
        argv = sweep_argv(runtime, job_id) if runtime else None
        if argv is not None:  # best effort: a host that does not answer keeps its own
            each(range(self.host_count()), lambda h: self.transport(h).run(argv, timeout=120))

    def lasting_call(self, host_index: int, op: str, args: dict[str, Any], timeout: float) -> Any:
        return self.transport(host_index).worker_call(op, args, timeout=timeout)

    def close(self) -> None:
        for transport in self._transports:
            transport.close()


def gpu_lines(reports: Mapping[int, HostReport], plan: LaunchPlan) -> list[str]:
    """One line per host whose tasks get GPUs: its GPUs, driver and CUDA (and the busy ones it
    takes anyway under --force)."""
    lines = []
    for h, report in sorted(reports.items()):
        if report.gpu is None:
            continue
        used = sum(len(t.gpus) for t in plan.tasks if t.host_index == h)
        lines.append(summary(report.host_label, report.gpu, used))
    return lines
