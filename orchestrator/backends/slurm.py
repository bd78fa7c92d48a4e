"""The Slurm backend: the job's tasks run in one Slurm allocation (sbatch), each attempt as one
srun step in it (worker.slurm_task on every task; the allocation itself: slurm_allocation.py).
Slurm places, starts, signals and ends the processes; orchestrate keeps TF_CONFIG, supervision,
whole-group restarts and the logs.

The coordinator reads the tasks' status and log files on the shared directory, which it sees
as the nodes do, and takes liveness from the step itself (its srun is our child; an adopted
step is looked up in squeue) and from srun's word on a task that ended. Slurm's commands run
here, as local processes: the coordinator runs where a user would type sbatch (a login node)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.backends.base import Launched, LaunchHooks, LaunchRequest, Sweep, TaskHandle
from orchestrator.backends.capabilities import SLURM
from orchestrator.backends.preflight import step_problems
from orchestrator.backends.slurm_allocation import (
    RELEASE_WAIT,
    Allocation,
    AllocationEnded,
    batch_output,
    one_line,
    submit,
)
from orchestrator.backends.slurm_commands import (
    KEEPER_STEP_NAME,
    SlurmState,
    keeper_srun_argv,
    literal_for_pattern,
    slurm_task_argv,
    srun_argv,
    worker_copies,
)
from orchestrator.backends.slurm_step import Hello, Step
from orchestrator.config import ClusterConfig, SlurmBackend, slurm_node_label
from orchestrator.errors import LaunchError, OrchestrateError, PreflightError
from orchestrator.planning.plan import StepTask, step_plan
from orchestrator.state.store import JobRecord
from orchestrator.transport import worker_package
from orchestrator.transport.base import Observation, Watching
from orchestrator.transport.fanout import HostResults
from orchestrator.transport.local import LocalTransport
from worker import host_watch
from worker.host_watch import file_stamp
from worker.spec import ENV_JOB_ID, JobLayout, WorkerSpec

HELLO_TIMEOUT = 120.0  # seconds for every task of a step to introduce itself
KEEPERS_STOP_GRACE = 5.0  # seconds for the keepers to end their standbys and exit
# squeue while the allocation waits: every 0.2 s for the first 10 s (a free cluster allocates
# within its scheduler's interval), then less often, up to every 5 s (a queue can take hours;
# each poll is an RPC to slurmctld).
QUEUE_POLL = (0.2, 5.0)
QUEUE_POLL_EAGER = 10.0


class SlurmHosts:
    """The Slurm backend: `nodes` hosts, named once the allocation runs."""

    kind = "slurm"
    capabilities = SLURM

    def __init__(self, config: SlurmBackend) -> None:
        self.config = config
        self.allocation: Allocation | None = None
        self.step: Step | None = None
        self.keepers: Step | None = None  # the keeper step of this run of the allocation
        self.owns_allocation = False  # a supervisor's: released when it closes
        self.fresh_run = True  # no step yet since the allocation (re)started: run setup
        # A node's files as the coordinator sees them: on the shared directory, read here.
        self._transports = [
            LocalTransport(slurm_node_label(n), config.python) for n in range(config.nodes)
        ]

    def host_count(self) -> int:
        return self.config.nodes

    def transport(self, host_index: int) -> LocalTransport:
        return self._transports[host_index]

    def python(self, host_index: int) -> str:
        return self.config.python

    def step_alive(self) -> bool:
        return self.step is not None and self.step.alive()

    def _alive(self, indices: Sequence[int]) -> set[int]:
        return set() if self.step is None else self.step.living(indices)

    def stop_step(self, grace: float) -> bool:
        return self.step is None or self.step.stop(grace)

    def close(self) -> None:
        pass

    def lasting_call(self, host_index: int, op: str, args: dict[str, Any], timeout: float) -> Any:
        return self.transport(host_index).worker_call(op, args, timeout=timeout)

    # --- watching the tasks: alive while their step runs --------------------------------------
    def observe(
        self,
        host_index: int,
        tasks: Sequence[TaskHandle] | None,
        files: Sequence[tuple[str, int]],
        timeout: float | None = None,
        watching: Watching | None = None,
    ) -> Observation:
        """The node's files read here (the shared directory); its tasks alive while the step
        runs (Slurm ends every task of a step with it)."""
        seen = host_watch.watch(
            None if tasks is None else [t.task_index for t in tasks],
            None,
            None
            if watching is None or watching.known_alive is None
            else sorted(watching.known_alive),
            list(files),
            [] if watching is None else list(watching.statuses),
            0.0 if watching is None else watching.wait,
            host_watch.STEP if watching is None else watching.step,
            alive_check=lambda indices, _: self._alive(indices),
        )
        return Observation(
            seen.alive, tuple(seen.logs), tuple(seen.statuses), tuple(seen.keys), seen.urgent
        )

    def alive_tasks(self, host_index: int, tasks: Sequence[TaskHandle]) -> set[int]:
        return self._alive([t.task_index for t in tasks])

    def ask_stacks(self, task: TaskHandle) -> bool:
        """A step's task is Slurm's process on its node: no agent of ours to signal there."""
        return False

    def stop_agents(self, agents: Sequence[TaskHandle], grace: float) -> HostResults[int, None]:
        """One step holds every task: scancel it, rather than kill each process."""
        tasks = tuple(a.task_index for a in agents)
        if not agents or self.stop_step(grace):
            return HostResults(tasks, dict.fromkeys(tasks), {})
        stuck = LaunchError(f"Slurm step still running after {grace:g}s")
        return HostResults(tasks, {}, dict.fromkeys(tasks, stuck))

    def sweep(self, job: JobRecord, grace: float) -> Sweep:
        """scancel the job's allocation (every step, every node) and wait until Slurm says it
        ended: all confirmed, or none."""
        unconfirmed = frozenset(range(self.host_count()))
        if not job.backend_state:  # never submitted: nothing runs
            return Sweep({}, {})
        name = f"Slurm job {job.backend_state}"
        try:
            ended = Allocation(job.backend_state).cancel(wait=grace)
        except OrchestrateError as exc:
            return Sweep({name: str(exc)}, {}, unconfirmed)
        if ended:
            return Sweep({}, {})
        return Sweep({name: f"still running {grace:g}s after scancel"}, {}, unconfirmed)

    def end_standbys(self, job_id: str) -> None:
        """End the keeper step: its keepers end their standbys (and nothing is kept)."""
        self.stop_keepers()

    def keep_spare_warm(self, host_index: int, specs: Sequence[WorkerSpec]) -> None:
        """Never asked: an allocation has no spare hosts (no elastic width)."""

    def start_keepers(self, config: ClusterConfig, job_id: str, layout: JobLayout) -> None:
        """The keeper step, unless it runs already in this run of the allocation: a keeper per
        task on the task's node, which the attempts' agents ask for standbys."""
        if self.allocation is None or (self.keepers is not None and self.keepers.alive()):
            return
        argv = keeper_srun_argv(
            config, self.allocation.id,
            literal_for_pattern(str(Path(layout.root) / "tasks")) + "/%t/standby.log",
            slurm_task_argv(config), str(layout.root),
        )  # fmt: skip
        with open(Path(layout.root) / "slurm" / "keepers.log", "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, ENV_JOB_ID: job_id}, start_new_session=True,
            )  # fmt: skip
        self.keepers = Step(self.allocation, proc)

    def stop_keepers(self) -> None:
        """SIGTERM to every keeper (scancel --signal=TERM of the step): each ends its standby,
        removes its socket, then exits. Not through srun: srun turns a SIGTERM of its own into
        SIGKILL for every task, which would leave the keepers' sockets behind."""
        if self.keepers is not None:
            if self.allocation is not None and not self.keepers.step_id:
                with contextlib.suppress(OrchestrateError):
                    self.keepers.step_id = self.allocation.step_named(KEEPER_STEP_NAME)
            self.keepers.stop(KEEPERS_STOP_GRACE)
            self.keepers = None

    def standbys(self, clear: bool) -> HostResults[int, list[dict[str, Any]]]:
        """None kept: a step's processes end with it."""
        return HostResults((), {}, {})

    def finish(self, layout: JobLayout, succeeded: bool) -> None:
        self.release(layout, succeeded)

    def release(self, layout: JobLayout, succeeded: bool) -> None:
        """At the job's end: stop any step and end the allocation, never raising. A job that
        succeeded lets its batch script end (Slurm records COMPLETED); any other is
        cancelled (CANCELLED)."""
        if self.allocation is None or not self.owns_allocation:
            return
        with contextlib.suppress(OrchestrateError):
            self.stop_step(0.0)
            self.stop_keepers()
            if succeeded:
                self.allocation.release(Path(layout.root) / "slurm" / "release")
            else:
                self.allocation.cancel(wait=RELEASE_WAIT)
        self.owns_allocation = False

    # --- an attempt ---------------------------------------------------------------------
    def launch(self, request: LaunchRequest, hooks: LaunchHooks) -> Launched | None:
        """The allocation running (submitted, or requeued when its time is nearly up), one srun
        step whose tasks pick their ports and say hello, their versions checked as a preflight
        would, then each task's spec (TF_CONFIG from the hellos). None: a stop was requested
        while the allocation waited."""
        config, layout, attempt = request.config, request.layout, request.attempt
        running = self.ensure_running(
            config, request.job_id, layout, attempt, hooks.queued, hooks.remember,
            hooks.stop_requested,
        )  # fmt: skip
        if not running or self.allocation is None:
            return None
        hooks.say(f"attempt {attempt}: starting a step in Slurm job {self.allocation.id}")
        hellos = self.start_step(config, request.job_id, layout, attempt)
        c = config.container
        problems = step_problems(hellos, c is not None and c.runtime != "pyxis")
        if problems:
            self.stop_step(0.0)
            raise PreflightError(f"preflight failed in the Slurm step: {problems}")
        plan = step_plan(config.job.name, [StepTask(h.node, h.address, h.port) for h in hellos])
        specs = hooks.planned(plan)
        # A step's task is named by where it runs: the step, not its pid, says whether it lives.
        agents = [
            TaskHandle(h.procid, plan.tasks[h.procid].host_index, f"{h.node}:{h.pid}")
            for h in hellos
        ]
        for agent in agents:
            hooks.started(agent)
        for spec in specs:  # each task is waiting for its own: the trainers start now
            self.transport(0).put_file(
                str(layout.spec_path(spec.task_index)), spec.to_json().encode()
            )
        if request.warm:  # after the attempt's step: not to delay its start
            self.start_keepers(config, request.job_id, layout)
        return Launched(plan, agents)

    def ensure_running(
        self,
        config: ClusterConfig,
        job_id: str,
        layout: JobLayout,
        attempt: int,
        say: Callable[[str], None],
        submitted: Callable[[str], None],
        stop_requested: threading.Event,
    ) -> bool:
        """Submit the allocation (first attempt) and wait until it runs, saying its state and
        Slurm's reason as they change. A restart with less than signal_before_end left of the
        time limit requeues the job first (a restart could not finish an epoch). False: a stop
        was requested while waiting."""
        if self.allocation is None:
            try:  # before anything is submitted: a shared_dir others may write is refused
                worker_package.copy_under(worker_copies(config))
            except (OSError, ValueError) as exc:
                raise PreflightError(
                    f"cannot install the worker package in shared_dir: {exc}"
                ) from None
            self.allocation = submit(config, job_id, layout)
            self.owns_allocation = True
            submitted(self.allocation.id)
            say(f"submitted Slurm job {self.allocation.id}")
        allocation, said = self.allocation, ""
        pause, waiting_since = QUEUE_POLL[0], time.monotonic()
        while True:
            view = allocation.view()
            left = view.time_left
            if view.state == SlurmState.RUNNING:
                ending = self._ending(allocation, attempt, left)
                if not ending:
                    return True
                if not self.config.requeue:
                    raise AllocationEnded(
                        f"Slurm job {allocation.id} {ending} and backend.requeue = false"
                    )
                # The tasks have checkpointed: back in the queue now, rather than start a step
                # that the time limit or the preemption would end.
                allocation.requeue()
                self.fresh_run = True
                say(f"Slurm job {allocation.id} requeued: {ending}")
                continue
            if view.state.is_terminal():
                raise AllocationEnded(f"Slurm job {allocation.id} ended: {view.state.value}")
            self.fresh_run = True
            text = f"Slurm job {allocation.id}: {view.describe()}"
            if text != said:
                say(text)
                said = text
            if _wait_or_start(stop_requested, pause, batch_output(layout, allocation.id)):
                return False
            if time.monotonic() - waiting_since > QUEUE_POLL_EAGER:
                pause = min(pause * 1.5, QUEUE_POLL[1])

    def _ending(self, allocation: Allocation, attempt: int, left: float | None) -> str:
        """Why a running allocation is no place for a restart ("": it is): less than
        signal_before_end left of its time limit, or Slurm preempting it."""
        if attempt == 0:
            return ""
        if left is not None and left <= self.config.signal_before_end:
            return f"{left:.0f}s left of its time limit"
        if allocation.preempting():
            return "is being preempted"
        return ""

    def start_step(
        self, config: ClusterConfig, job_id: str, layout: JobLayout, attempt: int
    ) -> list[Hello]:
        """Start the attempt's step and wait for every task's hello; raise LaunchError (the
        step stopped) when the step ends first or a task never says hello."""
        assert self.allocation is not None
        backend = self.config
        step_dir = Path(layout.root) / "slurm" / f"attempt-{attempt}"
        (step_dir / "hello").mkdir(parents=True, exist_ok=True)
        tasks = backend.nodes * backend.tasks_per_node
        for i in range(tasks):
            Path(layout.task_dir(i)).mkdir(parents=True, exist_ok=True)
        if self.fresh_run and backend.setup:
            (step_dir / "setup.json").write_text(json.dumps(backend.setup))
        try:  # every step: a copy pruned meanwhile comes back
            copy = worker_package.copy_under(worker_copies(config))
        except (OSError, ValueError) as exc:
            raise LaunchError(f"cannot install the worker package in shared_dir: {exc}") from None
        argv = srun_argv(
            config, self.allocation.id, attempt, str(step_dir),
            literal_for_pattern(str(Path(layout.root) / "tasks")) + "/%t/agent.log",
            slurm_task_argv(config, copy),
        )  # fmt: skip
        with open(step_dir / "srun.log", "ab") as log:
            said_from = log.tell()  # what srun says of this step, not of an earlier one
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, ENV_JOB_ID: job_id}, start_new_session=True,
            )  # fmt: skip
        self.step = Step(self.allocation, proc, log=(step_dir / "srun.log", said_from))
        self.fresh_run = False
        deadline = time.monotonic() + HELLO_TIMEOUT
        paths = [step_dir / "hello" / f"{i}.json" for i in range(tasks)]
        while True:
            hellos = [Hello.read(p) for p in paths]
            if all(h is not None for h in hellos):
                done = [h for h in hellos if h is not None]
                self.step.step_id = done[0].step
                (Path(layout.root) / "slurm" / "step.json").write_text(
                    json.dumps({"attempt": attempt, "step": done[0].step, "log_from": said_from})
                )
                return done
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop_step(0.0)
                tail = one_line((step_dir / "srun.log").read_text(errors="replace"))
                said = sum(h is not None for h in hellos)
                raise LaunchError(
                    f"step of Slurm job {self.allocation.id}: {said} of {tasks} task(s) "
                    f"started: {tail or 'srun ended'}"
                )
            time.sleep(0.05)

    def adopt(self, job: JobRecord, layout: JobLayout) -> None:
        """A supervisor taking over: the job's allocation and its last step."""
        self.allocation = Allocation(job.backend_state)
        self.owns_allocation = True
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            step = json.loads((Path(layout.root) / "slurm" / "step.json").read_text())
            log = Path(layout.root) / "slurm" / f"attempt-{int(step['attempt'])}" / "srun.log"
            said_from = int(step.get("log_from", 0))
            self.step = Step(self.allocation, None, str(step["step"]), (log, said_from))


def _wait_or_start(stop_requested: threading.Event, pause: float, output: Path) -> bool:
    """Wait `pause` seconds between two squeue, or less once the batch script has begun:
    Slurm creates its output file as the allocation starts (a file's stat every 50 ms costs
    nothing; squeue is an RPC to slurmctld). Only a hint: the next squeue decides (a requeued
    job's file is there already). True: a stop was requested."""
    before = file_stamp(str(output))
    deadline = time.monotonic() + pause
    while (left := deadline - time.monotonic()) > 0:
        if stop_requested.wait(min(left, 0.05)):
            return True
        if file_stamp(str(output)) != before:
            return False
    return False
