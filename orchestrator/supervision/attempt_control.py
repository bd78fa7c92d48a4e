"""Starting, adopting and stopping a job's attempts, for the supervisor: the backend starts the
tasks (orchestrator.backends); this module records them the moment they start, makes each
`Attempt` (with its task's log tailers, which outlive it), stops it and records what the stop
confirmed, and keeps the agents it could not confirm stopped, to stop them again.

The supervisor decides when; this module does it."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from orchestrator.backends import LaunchRequest
from orchestrator.backends.base import TaskHandle
from orchestrator.backends.preflight import HostReport, shared_dir_trouble
from orchestrator.errors import OrchestrateError
from orchestrator.logs.logstream import LogTailer
from orchestrator.planning.plan import LaunchPlan, TaskPlan
from orchestrator.planning.task_specs import make_specs
from orchestrator.state.job_records import task_records
from orchestrator.state.states import TaskState
from orchestrator.state.store import TaskRecord
from orchestrator.supervision.attempt import Attempt, Watch
from orchestrator.supervision.observations import Decision
from orchestrator.supervision.stop_outcome import running, tasks_after_stop
from orchestrator.supervision.tick import Tick
from worker.spec import WorkerSpec

if TYPE_CHECKING:
    from orchestrator.supervision.context import SupervisionContext

# A group that failed is broken (MWMS collectives cannot complete): no checkpoint can be taken,
# and a trainer blocked in a collective ignores SIGTERM anyway. So its tasks get only a moment
# between SIGTERM and SIGKILL, and the restart starts sooner.
BROKEN_GROUP_GRACE = 0.2

UNINSTRUMENTED_NOTICE = (
    "entrypoint.instrument = false: progress, the watchdog and the first-step deadline see only "
    "the phases and steps the script reports through worker.runtime (none for a plain script, "
    "which then meets the startup deadline by running)"
)


class AttemptControl:
    def __init__(
        self, ctx: SupervisionContext, tick: Tick, stop_requested: threading.Event
    ) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.job_state = ctx.job_state
        self.job_id = ctx.job_id
        self.config = ctx.config
        self.backend = ctx.backend
        self.tick = tick
        self.sink = ctx.sink
        self.stop_requested = stop_requested
        self.layout = ctx.layout
        self._tailers: dict[int, LogTailer] = {}  # by task: every attempt appends to its log
        self._live: Attempt | None = None  # the attempt started and not yet stopped
        self._leftovers: list[TaskHandle] = []  # agents of earlier attempts we could not stop
        self._starting: list[TaskHandle] = []  # agents started by a launch still under way
        self._record_lock = threading.Lock()
        self.specs: list[WorkerSpec] = []  # the latest launch's, one per task

    # --- starting -----------------------------------------------------------------------
    def start(self, number: int, hosts: Sequence[int]) -> Attempt | None:
        """Start attempt `number` on these hosts: the backend preflights them, plans (ports
        probed afresh: TF_CONFIG rebuilt) and starts one agent per task, each recorded the
        moment it starts. Raises HostsUnreachable when a host cannot be reached, and
        OrchestrateError when a host is not fit or an agent fails. None: a stop was requested
        while waiting (for an allocation)."""
        self.stop_leftovers(hosts)  # before the preflight: they may hold its ports
        job = self.store.get_job(self.job_id)
        request = LaunchRequest(
            self.config, self.job_id, self.layout, number, tuple(hosts), force=job.forced,
            warm=self.ctx.warm,
        )  # fmt: skip
        hooks = _Hooks(self, number, since_launch=time.time() - job.created)
        self._starting = []
        try:
            launched = self.backend.launch(request, hooks)
        finally:
            if hooks.queued_said:  # the queue's state stood in for the cause: put it back
                self.job_state.note_cause(job.last_cause)
        if launched is None:
            return None
        attempt = Attempt(
            number, launched.plan, launched.agents, self._tail(launched.plan),
            gpu_counts=launched.gpu_counts,
        )  # fmt: skip
        for task in launched.plan.tasks:  # nothing of this attempt is copied yet
            self.sink.mark_attempt(task.index, number)
        self._live, self._starting = attempt, []
        return attempt

    def adopted(self, number: int) -> Attempt:
        """The attempt recorded in the store, whose supervisor is gone: its agents, and tailers
        that go on from what the coordinator's log copies already hold."""
        job = self.store.get_job(self.job_id)
        tasks = self.store.tasks(self.job_id)
        self.backend.adopt(job, self.layout)
        plan = LaunchPlan(job.name, tuple(map(_task_plan, tasks)))
        agents = [TaskHandle(t.idx, t.host_index, t.agent) for t in tasks if t.agent]
        self._tailers = {t.index: self._tailer(t.index, t.host_index) for t in plan.tasks}
        watch = Watch(started=time.monotonic())
        watch.first_step.update(  # adopted tasks may be past their first step
            t.idx for t in tasks if t.first_step_at is not None and t.attempt == number
        )
        self._live = Attempt(number, plan, agents, self._tailers, watch)
        return self._live

    def _tail(self, plan: LaunchPlan) -> dict[int, LogTailer]:
        """Each task's tailer: the same file at the same offset as the attempt before (a
        restart appends to each task's log), on the task's host of this attempt."""
        for t in plan.tasks:
            if t.index in self._tailers:
                self._tailers[t.index].read_through(self.backend.transport(t.host_index))
            else:
                self._tailers[t.index] = self._tailer(t.index, t.host_index)
        return self._tailers

    def _tailer(self, index: int, host: int) -> LogTailer:
        """A new tailer of a task's log, from what its durable copy already holds: a resumed or
        adopted job's earlier attempts were copied by the supervisor before this one."""
        return LogTailer.following(
            self.backend.transport(host),
            str(self.layout.log_path(index)),
            self.sink.copy_dir / f"worker-{index}.log",
        )

    def record_plan(self, plan: LaunchPlan, number: int, since_launch: float) -> list[WorkerSpec]:
        """The plan's tasks recorded (pending), and each task's spec, with the seconds since the
        job's launch by our clock (a host's clock is never compared with ours)."""
        self.store.replace_tasks(self.job_id, task_records(self.job_id, plan, number))
        if number == 0 and not self.config.entrypoint.instrument:
            self.store.add_event(self.job_id, "notice", UNINSTRUMENTED_NOTICE)
            self.sink.info(UNINSTRUMENTED_NOTICE)
        self.specs = make_specs(
            self.config, plan, self.job_id, number, self.backend, since_launch, warm=self.ctx.warm
        )
        return self.specs

    def record_agent(self, agent: TaskHandle) -> None:
        """An agent just started (on a launch thread): into the store at once, so that no
        agent runs unrecorded whatever becomes of this process."""
        with self._record_lock:
            self._starting.append(agent)
            self.store.update_tasks(
                self.job_id,
                {
                    agent.task_index: {
                        "agent": agent.ref,
                        "state": TaskState.STARTING,
                    }
                },
            )

    # --- stopping -----------------------------------------------------------------------
    def stop(self, attempt: Attempt, grace: float, lost: Collection[int] = ()) -> list[TaskHandle]:
        """Stop every agent's process group; record final states; flush the logs. Agents on
        `lost` hosts are not waited on. Returns the agents whose stop was not confirmed (lost,
        or their host did not answer): recorded UNREACHABLE, and kept to stop again once their
        host is back."""
        running_before = running(self.store.tasks(self.job_id))
        reachable = [a for a in attempt.agents if a.host_index not in lost]
        results = self.backend.stop_agents(reachable, grace)
        self._live = None
        self.tick.observe(attempt, skip=lost)
        for agent in reachable:
            task = attempt.plan.tasks[agent.task_index]
            try:  # an unreachable host's last lines
                lines = attempt.tailers[agent.task_index].flush()
            except OrchestrateError:
                continue
            self.sink.task_lines(agent.task_index, task.host_label, lines)
        stuck = [
            a for a in attempt.agents if a.host_index in lost or a.task_index in results.failed
        ]
        if stuck:
            self._leftovers.extend(stuck)
            names = ", ".join(f"worker-{a.task_index}" for a in stuck)
            self.store.add_event(self.job_id, "stop_failed", f"could not stop {names} (yet)")
        ends = tasks_after_stop(
            running_before,
            self.store.tasks(self.job_id),
            {a.task_index for a in stuck},
            self.config.restart.preemption_exit_code,
        )
        self.store.update_tasks(self.job_id, {i: {"state": s} for i, s in ends.items()})
        return stuck

    def stop_leftovers(self, hosts: Collection[int] | None = None) -> None:
        """Stop agents of earlier attempts whose stop was never confirmed, on these hosts
        (default: all) now that they answer; those still unreachable stay on the list."""
        chosen = [a for a in self._leftovers if hosts is None or a.host_index in hosts]
        if not chosen:
            return
        stopped = self.backend.stop_agents(chosen, BROKEN_GROUP_GRACE)
        gone = [a for a in chosen if a.task_index not in stopped.failed]
        self._leftovers = [a for a in self._leftovers if a not in gone]
        if gone:
            names = ", ".join(f"worker-{a.task_index}" for a in gone)
            self.store.add_event(self.job_id, "cleaned_up", f"stopped leftover {names}")

    def end_standbys(self) -> None:
        """At the job's end: the warm standbys' keepers (worker/warm/keeper.py) would wait for a
        next attempt that will not come."""
        if self.ctx.warm:
            self.backend.end_standbys(self.job_id)

    @property
    def leftovers(self) -> list[TaskHandle]:
        return list(self._leftovers)

    def stop_everything(self) -> bool:
        """After an error: stop whatever was started (the live attempt, or the agents of a
        launch that failed half way), quickly, never raising. True: the stop was confirmed."""
        try:
            if self._live is not None:
                return not self.stop(self._live, BROKEN_GROUP_GRACE)
            if self._starting:
                self.backend.stop_agents(self._starting, BROKEN_GROUP_GRACE)
        except Exception:
            return False
        return True

    def name_shared_dir_trouble(self, attempt: Attempt, decision: Decision) -> Decision:
        """A failed or silent task whose host's shared directory is full or unwritable: say so
        in the cause (the trainer's own error, or a missing heartbeat, does not)."""
        hosts = [
            attempt.plan.tasks[i].host_index
            for i in decision.tasks
            if not attempt.watch.failing(attempt.plan.tasks[i].host_index)  # not answering
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


class _Hooks:
    """What the backend tells us while it starts one attempt (orchestrator.backends.LaunchHooks)."""

    def __init__(self, control: AttemptControl, number: int, since_launch: float) -> None:
        self._control = control
        self._number = number
        self._since_launch = since_launch
        self.stop_requested = control.stop_requested
        self.queued_said = False

    def say(self, text: str) -> None:
        self._control.sink.info(text)

    def host_answered(self, report: HostReport, seconds: float) -> None:
        detail = f"Python {report.python}, TensorFlow {report.tensorflow}"
        self._control.sink.host_answered(report.host_label, seconds, detail)
        if report.image_pulled:
            said = f"{report.host_label}: {report.image_pulled}"
            self._control.store.add_event(self._control.job_id, "pulled", said)
            self._control.sink.info(said)

    def queued(self, text: str) -> None:
        self.queued_said = True
        self._control.job_state.note_cause(text)
        self._control.store.add_event(self._control.job_id, "queued", text)
        self._control.sink.info(text)

    def remember(self, backend_state: str) -> None:
        self._control.store.update_job(self._control.job_id, backend_state=backend_state)

    def planned(self, plan: LaunchPlan) -> list[WorkerSpec]:
        return self._control.record_plan(plan, self._number, self._since_launch)

    def started(self, agent: TaskHandle) -> None:
        self._control.record_agent(agent)


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
