"""The Slurm backend: the job's tasks run in one Slurm allocation (sbatch), each attempt as one
srun step in it (worker.slurm_task on every task; the allocation itself: slurm_allocation.py).
Slurm places, starts, signals and ends the
processes; orchestrate keeps TF_CONFIG, supervision, whole-group restarts and the logs.

The coordinator reads the tasks' status and log files on the shared directory, which it sees
as the nodes do, and takes liveness from the step itself (its srun is our child; an adopted
step is looked up in squeue). Slurm's commands run here, as local processes: the coordinator
runs where a user would type sbatch (a login node)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.slurm_allocation import (
    RELEASE_WAIT,
    Allocation,
    AllocationEnded,
    one_line,
    run_slurm,
    submit,
)
from orchestrator.backends.slurm_commands import SlurmState, literal_for_pattern, srun_argv
from orchestrator.config import ClusterConfig, SlurmBackend
from orchestrator.errors import LaunchError, OrchestrateError, TransportError
from orchestrator.plan import slurm_node_label
from orchestrator.transport.base import Observation, ProcessRef, Watching
from orchestrator.transport.local import LocalTransport, watch_here
from worker.spec import ENV_JOB_ID, JobLayout

HELLO_TIMEOUT = 120.0  # seconds for every task of a step to introduce itself
STEP_LOOKUP_INTERVAL = 1.0  # squeue at most this often for an adopted step
# squeue while the allocation waits: every 0.2 s for the first 10 s (a free cluster allocates
# within its scheduler's interval), then less often, up to every 5 s (a queue can take hours;
# each poll is an RPC to slurmctld).
QUEUE_POLL = (0.2, 5.0)
QUEUE_POLL_EAGER = 10.0


@dataclass(frozen=True)
class Hello:
    """What one task of a step said about itself (worker.slurm_task)."""

    procid: int
    node: str
    address: str
    port: int
    pid: int
    step: str  # SLURM_STEP_ID
    python: str
    tensorflow: str | None
    protocol: int
    problems: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> Hello | None:
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        return cls(
            int(data["procid"]), str(data["node"]), str(data["address"]), int(data["port"]),
            int(data["pid"]), str(data.get("step", "")), str(data.get("python", "")),
            data.get("tensorflow"), int(data.get("protocol", 0)),
            tuple(data.get("problems", [])),
        )  # fmt: skip


class Step:
    """One attempt's srun step: started here (srun is our child), or adopted by id."""

    def __init__(
        self, allocation: Allocation, proc: subprocess.Popen[bytes] | None, step_id: str = ""
    ) -> None:
        self.allocation = allocation
        self.proc = proc
        self.step_id = step_id
        self._seen_at = float("-inf")
        self._seen = True

    @property
    def name(self) -> str:
        return f"{self.allocation.id}.{self.step_id}"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        now = time.monotonic()
        if now - self._seen_at >= STEP_LOOKUP_INTERVAL:
            with contextlib.suppress(OrchestrateError):
                self._seen = self.name in self.allocation.steps()
            self._seen_at = now
        return self._seen

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self, grace: float) -> bool:
        """SIGTERM to every task (they checkpoint or stop), up to `grace`, then scancel the
        step (SIGKILL); True once the step is gone."""
        if not self.alive():
            return True
        if self.step_id:
            run_slurm(["scancel", "--signal=TERM", self.name])
        elif self.proc is not None:
            self.proc.terminate()  # srun forwards SIGTERM to every task
        if self.wait(grace):
            return True
        if self.step_id:
            run_slurm(["scancel", self.name])
        if self.wait(10.0):
            return True
        if self.proc is not None:  # srun itself stuck: Slurm still ends the step without it
            self.proc.kill()
            self.proc.wait()
        self._seen_at = float("-inf")
        self.proc = None
        return not self.alive()


class SlurmNodeTransport(LocalTransport):
    """A node of the allocation as the coordinator sees it: its files on the shared directory
    (read here), and its tasks alive while the step runs."""

    def __init__(self, label: str, python: str, step_alive: Callable[[], bool]) -> None:
        super().__init__(label, python)
        self._step_alive = step_alive

    def alive_pids(self, procs: Sequence[ProcessRef]) -> set[int]:
        return self.alive_pids_of([p.pid for p in procs])

    def observe(
        self,
        procs: Sequence[ProcessRef] | None,
        files: Sequence[tuple[str, int]],
        timeout: float | None = None,
        contact: Sequence[int] = (),
        watching: Watching | None = None,
    ) -> Observation:
        return watch_here(procs, files, watching, lambda pids, _: self.alive_pids_of(pids))

    def alive_pids_of(self, pids: list[int]) -> set[int]:
        return set(pids) if self._step_alive() else set()

    def stop_process_group(self, leader: ProcessRef, grace: float) -> bool:
        raise TransportError(f"{self.host_label}: Slurm tasks are stopped by their step")

    def stop_job(self, job_id: str, grace: float) -> list[int]:
        raise TransportError(f"{self.host_label}: Slurm jobs are stopped with scancel")


class SlurmHosts:
    """The Slurm backend: `nodes` hosts, named once the allocation runs."""

    kind = "slurm"

    def __init__(self, config: SlurmBackend) -> None:
        self.config = config
        self.allocation: Allocation | None = None
        self.step: Step | None = None
        self.owns_allocation = False  # a supervisor's: released when it closes
        self.fresh_run = True  # no step yet since the allocation (re)started: run setup
        self._transports = [
            SlurmNodeTransport(slurm_node_label(n), config.python, self.step_alive)
            for n in range(config.nodes)
        ]

    def host_count(self) -> int:
        return self.config.nodes

    def transport(self, host_index: int) -> SlurmNodeTransport:
        return self._transports[host_index]

    def python(self, host_index: int) -> str:
        return self.config.python

    def step_alive(self) -> bool:
        return self.step is not None and self.step.alive()

    def stop_step(self, grace: float) -> bool:
        return self.step is None or self.step.stop(grace)

    def close(self) -> None:
        pass

    def release(self, layout: JobLayout, succeeded: bool) -> None:
        """At the job's end: stop any step and end the allocation, never raising. A job that
        succeeded lets its batch script end (Slurm records COMPLETED); any other is
        cancelled (CANCELLED)."""
        if self.allocation is None or not self.owns_allocation:
            return
        with contextlib.suppress(OrchestrateError):
            self.stop_step(0.0)
            if succeeded:
                self.allocation.release(Path(layout.root) / "slurm" / "release")
            else:
                self.allocation.cancel(wait=RELEASE_WAIT)
        self.owns_allocation = False

    # --- an attempt ---------------------------------------------------------------------
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
            if stop_requested.wait(pause):
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
        argv = srun_argv(
            config, self.allocation.id, attempt, str(step_dir),
            literal_for_pattern(str(Path(layout.root) / "tasks")) + "/%t/agent.log", backend.python,
        )  # fmt: skip
        with open(step_dir / "srun.log", "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, ENV_JOB_ID: job_id}, start_new_session=True,
            )  # fmt: skip
        self.step = Step(self.allocation, proc)
        self.fresh_run = False
        deadline = time.monotonic() + HELLO_TIMEOUT
        paths = [step_dir / "hello" / f"{i}.json" for i in range(tasks)]
        while True:
            hellos = [Hello.read(p) for p in paths]
            if all(h is not None for h in hellos):
                done = [h for h in hellos if h is not None]
                self.step.step_id = done[0].step
                (Path(layout.root) / "slurm" / "step.json").write_text(
                    json.dumps({"attempt": attempt, "step": done[0].step})
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

    def adopt(self, slurm_job: str, layout: JobLayout) -> None:
        """A supervisor taking over: the job's allocation and its last step."""
        self.allocation = Allocation(slurm_job)
        self.owns_allocation = True
        with contextlib.suppress(OSError, ValueError, KeyError):
            step = json.loads((Path(layout.root) / "slurm" / "step.json").read_text())["step"]
            self.step = Step(self.allocation, None, str(step))
