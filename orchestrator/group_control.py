"""Starting and stopping one attempt's group of agents, for the supervisor: preflight, setup,
plan, start (each agent recorded the moment it starts), log tailers, and a stop that records each
task's final state and keeps the agents it could not confirm stopped, to stop them again.

The supervisor decides when; this module does it. It never writes the job's state."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from orchestrator.backends import Backend
from orchestrator.backends.slurm import Hello, SlurmHosts
from orchestrator.config import ClusterConfig
from orchestrator.errors import OrchestrateError, PreflightError
from orchestrator.fanout import each
from orchestrator.gpus import summary
from orchestrator.jobs import launched_with_force
from orchestrator.launcher import (
    AgentRef,
    HostReport,
    host_labels,
    make_specs,
    plan_launch,
    preflight,
    run_setup,
    shared_dir_trouble,
    start_agents,
    stop_agents,
    warm_restarts,
)
from orchestrator.logstream import LineSink, LogTailer
from orchestrator.observations import Decision
from orchestrator.plan import LaunchPlan, StepTask, TaskPlan, step_plan
from orchestrator.states import TaskState
from orchestrator.store import Store, TaskRecord
from orchestrator.tick import Group, Tick, Watch
from worker.spec import HOST_PROTOCOL, WorkerSpec

# A group that failed is broken (MWMS collectives cannot complete): no checkpoint can be taken,
# and a trainer blocked in a collective ignores SIGTERM anyway. So its tasks get only a moment
# between SIGTERM and SIGKILL, and the restart starts sooner.
BROKEN_GROUP_GRACE = 0.2

UNINSTRUMENTED_NOTICE = (
    "entrypoint.instrument = false: progress, the watchdog and the first-step deadline see only "
    "the phases and steps the script reports through worker.runtime (none for a plain script, "
    "which then meets the startup deadline by running)"
)


class GroupControl:
    def __init__(
        self,
        store: Store,
        job_id: str,
        config: ClusterConfig,
        backend: Backend,
        tick: Tick,
        sink: LineSink,
        stop_requested: threading.Event | None = None,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.config = config
        self.backend = backend
        self.tick = tick
        self.sink = sink
        self.live: Group | None = None  # the group started and not yet stopped
        self.watch = Watch(started=0.0)  # the live attempt's bookkeeping (set by the watcher)
        self._leftovers: list[AgentRef] = []  # agents of earlier attempts we could not stop
        self._starting: list[AgentRef] = []  # agents started by a launch still under way
        self._record_lock = threading.Lock()
        self.stop_requested = stop_requested or threading.Event()
        # `launch --force`: GPUs busy with other programs are used anyway (recorded with the
        # job, so restarts and a detached or attaching supervisor honour it too).
        self.force = launched_with_force(store, job_id)
        self.gpu_counts: dict[int, int] = {}  # GPUs each host had at its latest preflight

    # --- starting -----------------------------------------------------------------------
    def launch(self, attempt: int, hosts: Sequence[int]) -> Group | None:
        """Preflight the hosts, plan (ports probed afresh: TF_CONFIG rebuilt) and start one
        agent per task on them. Raises HostsUnreachable when a host cannot be reached, and
        OrchestrateError when a host is not fit or an agent fails. None: a stop was requested
        while waiting (for a Slurm allocation)."""
        job_id, config = self.job_id, self.config
        if isinstance(self.backend, SlurmHosts):
            return self._launch_step(self.backend, attempt)
        self.sink.info(f"attempt {attempt}: preflight on {len(hosts)} host(s)")
        reports = preflight(
            config, self.backend, job_id, hosts, self._host_answered, force=self.force
        )
        self.stop_leftovers(hosts)
        if attempt == 0:
            run_setup(config, self.backend)
            if not config.entrypoint.instrument:
                self.store.add_event(job_id, "notice", UNINSTRUMENTED_NOTICE)
                self.sink.info(UNINSTRUMENTED_NOTICE)
        plan = plan_launch(config, reports, hosts)
        self._report_gpus(reports, plan)
        specs = self._specs(config, plan, job_id, attempt)
        self.store.replace_tasks(job_id, _task_records(job_id, plan, attempt))
        self._starting = []
        agents = start_agents(
            self.backend, plan, specs, config.supervision.stop_grace, self._record_agent
        )
        group = self.live = Group(attempt, plan, agents)
        self._starting = []
        self._tail(plan)
        return group

    def _report_gpus(self, reports: Mapping[int, HostReport], plan: LaunchPlan) -> None:
        """One line per host whose tasks get GPUs: its GPUs, driver and CUDA (and the busy ones
        it takes anyway under --force)."""
        for h, report in sorted(reports.items()):
            if report.gpu is None:
                continue
            self.gpu_counts[h] = len(report.gpu.gpus)
            used = sum(len(t.gpus) for t in plan.tasks if t.host_index == h)
            self.sink.info(summary(report.host_label, report.gpu, used))

    def _host_answered(self, report: HostReport, seconds: float) -> None:
        detail = f"Python {report.python}, TensorFlow {report.tensorflow}"
        self.sink.host_answered(report.host_label, seconds, detail)

    def _launch_step(self, slurm: SlurmHosts, attempt: int) -> Group | None:
        """Slurm: the allocation running (submitted, or requeued when its time is nearly up),
        one srun step whose tasks pick their ports and say hello, their versions checked as a
        preflight would, then each task's spec (TF_CONFIG from the hellos). None: a stop was
        requested while the allocation waited."""
        job_id, config, layout = self.job_id, self.config, self.tick.layout

        cause = self.store.get_job(job_id).last_cause  # what the queue's state stands in for

        def say(text: str) -> None:
            self.store.update_job(job_id, last_cause=text)
            self.store.add_event(job_id, "slurm", text)
            self.sink.info(text)

        def submitted(slurm_job: str) -> None:
            self.store.update_job(job_id, scheduler_job=slurm_job)

        running = slurm.ensure_running(
            config, job_id, layout, attempt, say, submitted, self.stop_requested
        )
        if not running or slurm.allocation is None:
            return None
        self.store.update_job(job_id, last_cause=cause)
        self.sink.info(f"attempt {attempt}: starting a step in Slurm job {slurm.allocation.id}")
        hellos = slurm.start_step(config, job_id, layout, attempt)
        problems = step_problems(hellos)
        if problems:
            slurm.stop_step(0.0)
            raise PreflightError(f"preflight failed in the Slurm step: {problems}")
        plan = step_plan(config.job.name, [StepTask(h.node, h.address, h.port) for h in hellos])
        specs = self._specs(config, plan, job_id, attempt)
        self.store.replace_tasks(job_id, _task_records(job_id, plan, attempt))
        agents = [AgentRef(h.procid, plan.tasks[h.procid].host_index, h.pid) for h in hellos]
        for agent in agents:
            self._record_agent(agent)
        for spec in specs:  # each task is waiting for its own: the trainers start now
            slurm.transport(0).put_file(
                str(layout.spec_path(spec.task_index)), spec.to_json().encode()
            )
        group = self.live = Group(attempt, plan, agents)
        self._starting = []
        self._tail(plan)
        return group

    def adopted(self, attempt: int, log_copies: Path) -> Group:
        """The group recorded in the store, whose supervisor is gone: its agents, and tailers
        that go on from what the coordinator's log copies already hold."""
        tasks = self.store.tasks(self.job_id)
        if isinstance(self.backend, SlurmHosts):
            self.backend.adopt(self.store.get_job(self.job_id).scheduler_job, self.tick.layout)
        plan = LaunchPlan(self.store.get_job(self.job_id).name, tuple(map(_task_plan, tasks)))
        agents = [
            AgentRef(t.idx, t.host_index, t.agent_pid, t.agent_ident) for t in tasks if t.agent_pid
        ]
        self.tick.tailers = {
            t.index: LogTailer(
                self.backend.transport(t.host_index),
                str(self.tick.layout.log_path(t.index)),
                offset=_size(log_copies / f"worker-{t.index}.log"),
            )
            for t in plan.tasks
        }
        return Group(attempt, plan, agents)

    def _specs(
        self, config: ClusterConfig, plan: LaunchPlan, job_id: str, attempt: int
    ) -> list[WorkerSpec]:
        """Each task's spec, with the seconds since the job's launch by our clock (a host's
        clock is never compared with ours)."""
        since_launch = time.time() - self.store.get_job(job_id).created
        return make_specs(config, plan, job_id, attempt, self.backend, since_launch)

    def _tail(self, plan: LaunchPlan) -> None:
        if not self.tick.tailers:
            self.tick.tailers = {
                t.index: LogTailer(
                    self.backend.transport(t.host_index), str(self.tick.layout.log_path(t.index))
                )
                for t in plan.tasks
            }
        else:  # same files, same offsets: a restart appends to each task's log
            for t in plan.tasks:
                self.tick.tailers[t.index].transport = self.backend.transport(t.host_index)

    def _record_agent(self, agent: AgentRef) -> None:
        """An agent just started (on a launch thread): into the store at once, so that no
        agent runs unrecorded whatever becomes of this process."""
        with self._record_lock:
            self._starting.append(agent)
            self.store.update_tasks(
                self.job_id,
                {
                    agent.task_index: {
                        "agent_pid": agent.pid,
                        "agent_ident": agent.ident,
                        "state": TaskState.STARTING,
                    }
                },
            )

    # --- stopping -----------------------------------------------------------------------
    def stop(self, group: Group, grace: float, lost: Collection[int] = ()) -> list[AgentRef]:
        """Stop every agent's process group; record final states; flush the logs. Agents on
        `lost` hosts are not waited on. Returns the agents whose stop was not confirmed (lost,
        or their host did not answer): recorded UNREACHABLE, and kept to stop again once their
        host is back."""
        running_before = {t.idx for t in self.store.tasks(self.job_id) if not t.state.is_terminal()}
        reachable = [a for a in group.agents if a.host_index not in lost]
        results = stop_agents(self.backend, reachable, grace)
        self.live = None
        self.tick.observe(group, self.watch, skip=lost)
        for agent in reachable:
            task = group.plan.tasks[agent.task_index]
            with contextlib.suppress(OrchestrateError):  # an unreachable host's last lines
                self.sink.task_lines(
                    agent.task_index, task.host_label, self.tick.tailers[agent.task_index].flush()
                )
        stuck = [a for a in group.agents if a.host_index in lost or a.task_index in results.failed]
        if stuck:
            self._leftovers.extend(stuck)
            names = ", ".join(f"worker-{a.task_index}" for a in stuck)
            self.store.add_event(self.job_id, "stop_failed", f"could not stop {names} (yet)")
        # We stopped them: whatever they reported while going down (lost, or the preemption
        # exit code of a trainer that checkpointed on our SIGTERM), they are stopped; those
        # whose host did not answer are not known to be. A task whose agent reported FAILED
        # with its own exit code ended on its own before the stop reached it (an agent that
        # was asked to stop reports STOPPED): that end is its own, and it stays failed.
        unconfirmed = {a.task_index for a in stuck}
        preempted = self.config.restart.preemption_exit_code

        def ended_on_its_own(t: TaskRecord) -> bool:
            return t.state == TaskState.FAILED and t.exit_code not in (None, preempted)

        self.store.update_tasks(
            self.job_id,
            {
                t.idx: {
                    "state": TaskState.UNREACHABLE if t.idx in unconfirmed else TaskState.STOPPED
                }
                for t in self.store.tasks(self.job_id)
                if t.idx in running_before
                and t.state != TaskState.SUCCEEDED
                and not ended_on_its_own(t)
            },
        )
        return stuck

    def stop_leftovers(self, hosts: Collection[int] | None = None) -> None:
        """Stop agents of earlier attempts whose stop was never confirmed, on these hosts
        (default: all) now that they answer; those still unreachable stay on the list."""
        chosen = [a for a in self._leftovers if hosts is None or a.host_index in hosts]
        if not chosen:
            return
        stopped = stop_agents(self.backend, chosen, BROKEN_GROUP_GRACE)
        done = {a.task_index for a in chosen if a.task_index not in stopped.failed}
        gone = [a for a in chosen if a.task_index in done]
        self._leftovers = [a for a in self._leftovers if a not in gone]
        if gone:
            names = ", ".join(f"worker-{a.task_index} (agent pid {a.pid})" for a in gone)
            self.store.add_event(self.job_id, "cleaned_up", f"stopped leftover {names}")

    def end_standbys(self) -> None:
        """At the job's end: the warm standbys' keepers (worker/standby.py) would wait for a
        next attempt that will not come; sweep each host of the job's processes now. A host
        that does not answer keeps its keeper until the keeper's own linger runs out."""
        if not warm_restarts(self.config):
            return
        hosts = range(len(host_labels(self.config)))
        each(hosts, lambda h: self.backend.transport(h).stop_job(self.job_id, 2.0))

    @property
    def leftovers(self) -> list[AgentRef]:
        return list(self._leftovers)

    def stop_everything(self) -> bool:
        """After an error: stop whatever was started (the live group, or the agents of a launch
        that failed half way), quickly, never raising. True: the stop was confirmed."""
        try:
            if self.live is not None:
                return not self.stop(self.live, BROKEN_GROUP_GRACE)
            if self._starting:
                stop_agents(self.backend, self._starting, BROKEN_GROUP_GRACE)
        except Exception:
            return False
        return True

    def name_shared_dir_trouble(self, group: Group, decision: Decision) -> Decision:
        """A failed or silent task whose host's shared directory is full or unwritable: say so
        in the cause (the trainer's own error, or a missing heartbeat, does not)."""
        hosts = [
            group.plan.tasks[i].host_index
            for i in decision.tasks
            if group.plan.tasks[i].host_index not in self.watch.host_error  # not answering now
        ]
        if not hosts:
            return decision
        try:
            trouble = shared_dir_trouble(self.config, self.backend, hosts)
        except OrchestrateError:
            return decision
        if not trouble:
            return decision
        return dataclasses.replace(decision, cause=f"{decision.cause}; {'; '.join(trouble)}")


def step_problems(hellos: Sequence[Hello]) -> str:
    """What a step's tasks said is wrong with their nodes (the preflight's checks), by node."""
    by_node: dict[str, list[str]] = {}
    for h in hellos:
        problems = list(h.problems)
        if h.protocol != HOST_PROTOCOL:
            problems.append(
                f"its orchestrate worker package is another version (protocol {h.protocol}, "
                f"here {HOST_PROTOCOL}): install the same orchestrate"
            )
        if not h.tensorflow:
            problems.append(f"TensorFlow is not installed for the node's python ({h.python})")
        by_node.setdefault(h.node, [])
        by_node[h.node] += [p for p in problems if p not in by_node[h.node]]
    versions = {h.tensorflow for h in hellos if h.tensorflow}
    trouble = [f"{node}: {', '.join(p)}" for node, p in by_node.items() if p]
    if len(versions) > 1:
        seen = {h.node: h.tensorflow for h in hellos}
        trouble.append("TensorFlow differs: " + ", ".join(f"{n}={v}" for n, v in seen.items()))
    return "; ".join(trouble)


def _task_records(job_id: str, plan: LaunchPlan, attempt: int) -> list[TaskRecord]:
    return [
        TaskRecord(
            job_id=job_id,
            idx=t.index,
            type=t.type,
            host_index=t.host_index,
            host=t.host_label,
            address=t.endpoint,
            state=TaskState.PENDING,
            attempt=attempt,
        )
        for t in plan.tasks
    ]


def _task_plan(task: TaskRecord) -> TaskPlan:
    host, _, port = task.address.rpartition(":")
    return TaskPlan(
        index=task.idx,
        host_index=task.host_index,
        host_label=task.host,
        address=host.strip("[]"),
        port=int(port) if port.isdigit() else None,
        type=task.type,
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
