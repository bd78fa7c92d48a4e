"""The supervisor: launch a job, watch it to the end, restart the whole group on failure, and
record everything in the store.

It runs in the foreground (`orchestrate launch`), as a detached background process
(`orchestrate launch --detach`, i.e. `python -m orchestrator supervise JOB`), or adopts a
running job whose supervisor died (`orchestrate attach JOB`). The rules live in monitor.py; this
module does the I/O: status files, log streaming, store updates, stopping, relaunching.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from orchestrator.backends import Backend, open_backend
from orchestrator.config import ClusterConfig
from orchestrator.errors import OrchestrateError
from orchestrator.job_state import JobStateMachine
from orchestrator.jobs import collect_job
from orchestrator.launcher import (
    AGENT_STOP_MARGIN,
    AgentRef,
    job_layout,
    make_specs,
    plan_launch,
    preflight,
    run_setup,
    shared_dir_trouble,
    start_agents,
    stop_agents,
)
from orchestrator.logstream import LineSink, LogTailer
from orchestrator.monitor import decide
from orchestrator.observations import Decision, FailureKind, Verdict, failure
from orchestrator.paths import collected_dir, report_png
from orchestrator.plan import LaunchPlan, TaskPlan
from orchestrator.restart_policy import plan_restart
from orchestrator.states import JobState, TaskState
from orchestrator.store import JobRecord, Store, TaskRecord
from orchestrator.tick import Group, Tick, Watch
from worker.proctl import identity

# A group that failed is broken (MWMS collectives cannot complete): no checkpoint can be taken,
# and a trainer blocked in a collective ignores SIGTERM anyway. So its tasks get only a moment
# between SIGTERM and SIGKILL, and the restart starts sooner.
BROKEN_GROUP_GRACE = 0.2

UNINSTRUMENTED_NOTICE = (
    "entrypoint.instrument = false: progress, the watchdog and the first-step deadline see only "
    "the phases and steps the script reports through worker.runtime (none for a plain script, "
    "which then meets the startup deadline by running)"
)


class Supervisor:
    def __init__(
        self,
        store: Store,
        job: JobRecord,
        config: ClusterConfig,
        sink: LineSink,
        backend: Backend | None = None,
    ) -> None:
        self.store = store
        self.job = job
        self.config = config
        self.sink = sink
        self.backend = backend or open_backend(config)
        self.stop_requested = threading.Event()
        self.layout = job_layout(config, job.id)
        self.attempt = job.attempt
        self.tick = Tick(
            store, job.id, self.backend, self.layout, sink, config.entrypoint.instrument
        )
        self._leftovers: list[AgentRef] = []  # agents of earlier attempts we could not stop
        self._watch_state = Watch(started=time.monotonic())
        self.job_state = JobStateMachine(store, job.id)  # the only writer of the job's state
        self._live: Group | None = None  # the group started and not yet stopped
        self._starting: list[AgentRef] = []  # agents started by a launch still under way
        self._record_lock = threading.Lock()

    def install_signal_handlers(self) -> None:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop_requested.set()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, on_signal)

    # --- entry points -------------------------------------------------------------------
    def run(self) -> JobState:
        """Launch a registered job and supervise it to a terminal state."""
        return self._main(adopted=None)

    def adopt(self) -> JobState:
        """Supervise a job whose agents are running but whose supervisor is gone."""
        tasks = self.store.tasks(self.job.id)
        plan = LaunchPlan(self.job.name, tuple(_task_plan(t) for t in tasks))
        agents = [
            AgentRef(t.idx, t.host_index, t.agent_pid, t.agent_ident) for t in tasks if t.agent_pid
        ]
        log_copies = self.sink.copy_dir
        self.tick.tailers = {
            t.index: LogTailer(
                self.backend.transport(t.host_index),
                str(self.layout.log_path(t.index)),
                offset=_size(log_copies / f"worker-{t.index}.log"),
            )
            for t in plan.tasks
        }
        self.store.add_event(self.job.id, "attached", f"supervisor {os.getpid()} adopted the job")
        self.sink.info(f"attached to job {self.job.id} (attempt {self.job.attempt})")
        group = Group(self.job.attempt, plan, agents)
        if len(agents) < len(plan.tasks):  # died mid-launch: the group is incomplete
            return self._main(
                adopted=group, first=failure(FailureKind.LOST, "launch was interrupted")
            )
        return self._main(adopted=group)

    # --- the restart loop ---------------------------------------------------------------
    def _main(self, adopted: Group | None, first: Decision | None = None) -> JobState:
        self.job_state.to(
            JobState.RUNNING if adopted else JobState.LAUNCHING,
            supervisor_pid=os.getpid(),
            supervisor_ident=identity(os.getpid()) or "",
            supervisor_host=socket.gethostname(),
        )
        try:
            return self._loop(adopted, first)
        except OrchestrateError as exc:
            self._fail_on_error(str(exc))
            raise
        except Exception as exc:  # a bug of ours: still nothing left running, and a true state
            self._fail_on_error(f"internal error: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.sink.close()
            self.tick.close()
            self.backend.close()

    def _attempt(self, group: Group | None) -> tuple[Group | None, Decision | None]:
        """Launch (unless adopted) and watch one attempt; a None decision: stop requested."""
        if group is None:
            try:
                group = self._launch(self.attempt)
            except OrchestrateError as exc:
                if self.attempt == 0:
                    raise  # the first launch fails fast: fix the hosts, then relaunch
                return None, failure(FailureKind.LAUNCH, f"relaunch failed: {exc}")
        self._live = group
        return group, self._watch(group)

    def _name_shared_dir_trouble(self, group: Group, decision: Decision) -> Decision:
        """A failed or silent task whose host's shared directory is full or unwritable: say so
        in the cause (the trainer's own error, or a missing heartbeat, does not)."""
        hosts = [group.plan.tasks[i].host_index for i in decision.tasks]
        try:
            trouble = shared_dir_trouble(self.config, self.backend, hosts)
        except OrchestrateError:
            return decision
        if not trouble:
            return decision
        return dataclasses.replace(decision, cause=f"{decision.cause}; {'; '.join(trouble)}")

    def _record_agent(self, agent: AgentRef) -> None:
        """An agent just started (on a launch thread): into the store at once, so that no
        agent runs unrecorded whatever becomes of this process."""
        with self._record_lock:
            self._starting.append(agent)
            self.store.update_tasks(
                self.job.id,
                {
                    agent.task_index: {
                        "agent_pid": agent.pid,
                        "agent_ident": agent.ident,
                        "state": TaskState.STARTING,
                    }
                },
            )

    def _fail_on_error(self, cause: str) -> None:
        """An error ends the job FAILED with its cause, after stopping whatever it started."""
        if self._live is not None:
            with contextlib.suppress(Exception):
                self._stop_group(self._live, BROKEN_GROUP_GRACE)
        elif self._starting:  # it failed in the middle of starting agents
            with contextlib.suppress(Exception):
                stop_agents(self.backend, self._starting, BROKEN_GROUP_GRACE)
        if not self.job_state.state.is_terminal():
            self._finish(JobState.FAILED, cause)

    def _loop(self, group: Group | None, pending: Decision | None) -> JobState:
        job = self.store.get_job(self.job.id)
        restarts, preemptions = job.restarts, job.preemptions
        while True:
            if pending is not None:
                decision = pending
            else:
                group, outcome = self._attempt(group)
                if outcome is None:
                    assert group is not None
                    return self._stop_on_request(group)
                if outcome.verdict == Verdict.SUCCEEDED:
                    assert group is not None
                    return self._succeed(group, outcome)
                decision = outcome
            if group is not None and decision.tasks:
                decision = self._name_shared_dir_trouble(group, decision)
            self.job_state.to(JobState.STOPPING, last_cause=decision.cause)
            self.store.add_event(self.job.id, "failure", decision.cause, *decision.tasks[:1])
            self.sink.info(f"{decision.cause}: stopping every task")
            if group is not None:
                preempted = decision.exit_code == self.config.restart.preemption_exit_code
                grace = self.config.supervision.stop_grace if preempted else BROKEN_GROUP_GRACE
                self._stop_group(group, grace)
            restart = plan_restart(
                decision,
                self.config.restart,
                restarts - preemptions,
                self.config.supervision.on_startup_timeout == "restart",
            )
            if not restart.restart:
                self._collect()
                cause = decision.cause
                if restarts:
                    cause += f" ({restart.reason})"
                self._finish(JobState.FAILED, cause)
                return JobState.FAILED
            restarts += 1
            preemptions += 0 if restart.counts else 1
            self.job_state.to(JobState.RESTARTING, restarts=restarts, preemptions=preemptions)
            message = f"{restart.reason}, in {restart.delay:g}s, after: {decision.cause}"
            self.store.add_event(self.job.id, "restart", message)
            self.sink.info(message)
            if self.stop_requested.wait(restart.delay):
                self._finish(JobState.STOPPED, "stopped on request")
                return JobState.STOPPED
            self.attempt += 1
            group, pending = None, None

    def _launch(self, attempt: int) -> Group:
        job_id, config = self.job.id, self.config
        if self._leftovers:  # an earlier attempt's agents on a host that was unreachable
            stopped = stop_agents(self.backend, self._leftovers, BROKEN_GROUP_GRACE)
            self._leftovers = [a for a in self._leftovers if a.task_index in stopped.failed]
        self.sink.info(f"attempt {attempt}: preflight on {self.backend.host_count()} host(s)")
        reports = preflight(config, self.backend, job_id)
        if attempt == 0:
            run_setup(config, self.backend)
            if not config.entrypoint.instrument:
                self.store.add_event(job_id, "notice", UNINSTRUMENTED_NOTICE)
                self.sink.info(UNINSTRUMENTED_NOTICE)
        plan = plan_launch(config, reports)  # ports probed afresh: TF_CONFIG rebuilt
        specs = make_specs(config, plan, job_id, attempt, self.backend)
        self.store.replace_tasks(job_id, self._task_records(plan, attempt))
        self._starting = []
        agents = start_agents(
            self.backend, plan, specs, config.supervision.stop_grace, self._record_agent
        )
        group = self._live = Group(attempt, plan, agents)
        self._starting = []
        self.job_state.to(JobState.RUNNING, attempt=attempt)
        self.store.add_event(
            job_id, "launched", f"attempt {attempt}: {len(agents)} task(s) started"
        )
        self.sink.info(
            f"job {job_id}: {len(agents)} task(s) running; "
            + ", ".join(f"worker-{t.index}={t.endpoint}" for t in plan.tasks)
        )
        if not self.tick.tailers:
            self.tick.tailers = {
                t.index: LogTailer(
                    self.backend.transport(t.host_index), str(self.layout.log_path(t.index))
                )
                for t in plan.tasks
            }
        else:  # same files, same offsets: a restart appends to each task's log
            for t in plan.tasks:
                self.tick.tailers[t.index].transport = self.backend.transport(t.host_index)
        return group

    def _task_records(self, plan: LaunchPlan, attempt: int) -> list[TaskRecord]:
        return [
            TaskRecord(
                job_id=self.job.id,
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

    # --- watching ---------------------------------------------------------------------
    def _watch(self, group: Group) -> Decision | None:
        """Poll until the group needs a decision; None when a stop was requested."""
        sup = self.config.supervision
        watch = Watch(started=time.monotonic())
        for t in self.store.tasks(self.job.id):  # adopted tasks may be past their first step
            if t.first_step_at is not None and t.attempt == group.attempt:
                watch.first_step.add(t.idx)
        self._watch_state = watch
        while not self.stop_requested.is_set():
            observations = self.tick.observe(group, watch)
            elapsed = time.monotonic() - watch.started
            decision = decide(
                observations,
                elapsed=elapsed,
                startup_deadline=float("inf") if watch.startup_passed else sup.startup_deadline,
                heartbeat_timeout=sup.heartbeat_timeout,
                progress_timeout=sup.progress_timeout,
            )
            if decision.verdict != Verdict.CONTINUE:
                return decision
            watch.startup_passed = elapsed > sup.startup_deadline
            self.stop_requested.wait(sup.poll_interval)
        return None

    # --- ending -----------------------------------------------------------------------
    def _succeed(self, group: Group, outcome: Decision) -> JobState:
        # The chief succeeded: the others are normally exiting too; give them a moment.
        deadline = time.monotonic() + self.config.supervision.stop_grace
        while time.monotonic() < deadline and not self.stop_requested.is_set():
            if not self.tick.alive_agents(group.agents):
                break
            time.sleep(self.config.supervision.poll_interval)
        self._stop_group(group, self.config.supervision.stop_grace + AGENT_STOP_MARGIN)
        self._collect()
        self._finish(JobState.SUCCEEDED, outcome.cause)
        return JobState.SUCCEEDED

    def _stop_on_request(self, group: Group) -> JobState:
        self.job_state.to(JobState.STOPPING)
        self.sink.info("stop requested: stopping every task")
        stuck = self._stop_group(group, self.config.supervision.stop_grace + AGENT_STOP_MARGIN)
        if stuck:  # not confirmed: the job stays STOPPING, and says what a later stop must do
            hosts = sorted({group.plan.tasks[a.task_index].host_label for a in stuck})
            cause = (
                f"stop not confirmed: {', '.join(hosts)} unreachable; "
                f"run `orchestrate stop {self.job.id}` again once it is back"
            )
            self.store.update_job(self.job.id, last_cause=cause)
            self.store.add_event(self.job.id, "stop_unconfirmed", cause)
            self.sink.info(cause)
            return JobState.STOPPING
        self._finish(JobState.STOPPED, "stopped on request")
        return JobState.STOPPED

    def _stop_group(self, group: Group, grace: float) -> list[AgentRef]:
        """Stop every agent's process group; record final states; flush the logs. Returns the
        agents whose stop was not confirmed (their host did not answer): recorded UNREACHABLE,
        and kept to stop again before the next launch."""
        running_before = {t.idx for t in self.store.tasks(self.job.id) if not t.state.is_terminal()}
        results = stop_agents(self.backend, group.agents, grace)
        self._live = None
        self.tick.recheck_liveness()
        self.tick.observe(group, self._watch_state)
        for agent in group.agents:
            task = group.plan.tasks[agent.task_index]
            with contextlib.suppress(OrchestrateError):  # an unreachable host's last lines
                self.sink.task_lines(
                    agent.task_index, task.host_label, self.tick.tailers[agent.task_index].flush()
                )
        stuck = [a for a in group.agents if a.task_index in results.failed]
        if stuck:
            self._leftovers.extend(stuck)
            names = ", ".join(f"worker-{a.task_index}" for a in stuck)
            self.store.add_event(self.job.id, "stop_failed", f"could not stop {names} (yet)")
        # We stopped them: whatever they reported while going down (lost, or the preemption
        # exit code of a trainer that checkpointed on our SIGTERM), they are stopped; those
        # whose host did not answer are not known to be.
        unconfirmed = {a.task_index for a in stuck}
        self.store.update_tasks(
            self.job.id,
            {
                t.idx: {
                    "state": TaskState.UNREACHABLE if t.idx in unconfirmed else TaskState.STOPPED
                }
                for t in self.store.tasks(self.job.id)
                if t.idx in running_before and t.state != TaskState.SUCCEEDED
            },
        )
        return stuck

    def _collect(self) -> None:
        try:
            collect_job(self.backend, self.layout.root, collected_dir(self.job.id))
        except (OSError, OrchestrateError) as exc:
            self.store.add_event(self.job.id, "collect_failed", str(exc))

    def _finish(self, state: JobState, cause: str) -> None:
        self.job_state.to(state, last_cause=cause)
        self.store.add_event(self.job.id, state.value, cause)
        self.sink.info(f"job {self.job.id} {state.value}: {cause}")
        # The run report draws with matplotlib: in a process of its own, so the supervisor
        # (resident for the whole job) never carries matplotlib's memory.
        report = subprocess.run(
            [sys.executable, "-m", "orchestrator", "report", self.job.id, "--json"],
            capture_output=True,
            timeout=300,
            check=False,
        )
        if report.returncode == 0:
            self.sink.info(f"run report: {report_png(self.job.id)}")
        else:
            detail = report.stderr.decode(errors="replace").strip()[-300:]
            self.store.add_event(self.job.id, "report_failed", detail)


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
