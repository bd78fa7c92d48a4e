"""The worker agent: `python -m worker.agent SPEC_PATH`.

Started detached (its own session: its pid is its process group id). It runs the entrypoint
with TF_CONFIG set (through worker/bootstrap.py unless not instrumented), sends the trainer's
output to the task's log on the shared directory, writes status + heartbeat atomically,
forwards SIGTERM once (grace, then SIGKILL; proctl.HURRY ends the grace early), and the
trainer never outlives it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from worker import container, ship, stacks
from worker.children import BOOTSTRAP, die_with_parent, exit_waiter
from worker.contact import cut_off, forget, peer_endpoints
from worker.proctl import HURRY, not_nested
from worker.resources import ResourceSampler, sampler_for, tensorboard_scalars
from worker.spec import (
    ENV_ATTEMPT,
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_PREEMPTION_EXIT_CODE,
    ENV_PROGRESS_FILE,
    ENV_TASK_DIR,
    ENV_TIME_WAITS,
    AgentState,
    Phase,
    Progress,
    Resources,
    TaskStatus,
    WorkerSpec,
    write_json_atomic,
)
from worker.tb_events import EventWriter
from worker.warm.activation import WarmTrainer
from worker.warm.imports_ahead import ENV_RECORD_IMPORTS
from worker.warm.next_standby import AgentStandby

FINAL_STATUS_PATIENCE = 30.0  # seconds to keep trying to write the final status
MAX_PROGRESS_BYTES = 64 << 10  # the progress file a trainer writes: well over what we write


def exit_code_of(returncode: int) -> int:
    """Popen's -N (killed by signal N) becomes the shell convention 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def trainer_env(spec: WorkerSpec) -> dict[str, str]:
    layout = spec.layout
    env = dict(os.environ)
    # tf.keras in TF 2.21 is Keras 3, whose fit() fails under MWMS: tf-keras by default; a
    # value the entrypoint's env gives (TF_USE_LEGACY_KERAS = "0": Keras 3) is the user's.
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.update(spec.env)
    env.update(
        {
            "TF_CONFIG": json.dumps(spec.tf_config, separators=(",", ":")),
            "PYTHONUNBUFFERED": "1",
            ENV_JOB_ID: spec.job_id,
            ENV_JOB_DIR: str(layout.root),
            ENV_TASK_DIR: str(layout.task_dir(spec.task_index)),
            ENV_PROGRESS_FILE: str(layout.progress_path(spec.task_index)),
            ENV_ATTEMPT: str(spec.attempt),
            ENV_PREEMPTION_EXIT_CODE: str(spec.preemption_exit_code),
        }
    )
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    copy = _package_parent()
    if not spec.instrument and os.path.basename(copy).startswith(ship.PREFIX):
        # No bootstrap to put the shipped package on the path: `-m worker.examples...` and
        # `from worker import runtime` find it as where orchestrate is installed.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), copy]))
    if not spec.sample_resources:
        env[ENV_TIME_WAITS] = "0"
    if spec.warm_restart and spec.warm_imports:
        env[ENV_RECORD_IMPORTS] = "1"
    return env


def _package_parent() -> str:
    """The directory this worker package is in (the shipped copy on a host)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def trainer_argv(spec: WorkerSpec) -> list[str]:
    """[python, -m MODULE | SCRIPT, ARG...], started through the bootstrap when instrumented:
    the script sees the same argv, __main__ and sys.path either way."""
    if not spec.instrument:
        return list(spec.argv)
    python, *target = spec.argv
    return [python, BOOTSTRAP, *target]


class Agent:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        layout = spec.layout
        self.status_path = Path(layout.status_path(spec.task_index))
        self.progress_path = Path(layout.progress_path(spec.task_index))
        self.log_path = Path(layout.log_path(spec.task_index))
        self._seq = 0
        self._stop_requested = threading.Event()
        self._stop_deadline: float | None = None
        self._trainer: subprocess.Popen[bytes] | WarmTrainer | None = None
        self._standby: AgentStandby | None = None
        self._image: container.Container | None = None  # the trainer's, when in one
        self._in_image: int | None = None  # the trainer's host pid there, once found
        self._started = time.monotonic()
        self._progress = Progress()
        self._progress_too_big = False
        self._log: BinaryIO | None = None
        self._write_failing = False
        self._peers = peer_endpoints(spec.tf_config, spec.task_type, spec.task_index)
        self._sampler: ResourceSampler | None = None
        self._tensorboard = EventWriter(Path(layout.tensorboard_dir(spec.task_index)) / "resources")
        if spec.sample_resources:
            self._sampler = sampler_for({**os.environ, **spec.env})

    def run(self) -> int:
        spec = self.spec
        self.status_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.progress_path.unlink(missing_ok=True)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, not_nested(self._on_stop_signal))
        signal.signal(HURRY, not_nested(self._on_hurry))
        self._write_status(AgentState.STARTING)

        with open(self.log_path, "ab", buffering=0) as log:
            _start_on_a_fresh_line(self.log_path, log)
            _note(
                log,
                f"attempt {spec.attempt}: {spec.task_type}-{spec.task_index} "
                f"on {spec.host_label} starting",
            )
            self._log = log
            note = functools.partial(_note, log)
            phase = self._trainer_phase
            standby = AgentStandby(spec, trainer_env(spec), note, self._stop_requested, phase)
            self._standby = standby
            self._trainer = standby.warm_start(str(self.log_path))
            argv, env, image = trainer_argv(spec), trainer_env(spec), None
            if spec.container and self._trainer is None:
                image, argv, env = container.for_task(spec, argv, env, _package_parent())
                self._image = image
                note(f"the trainer runs in {image.image} ({image.runtime}: {image.name})")
            if self._trainer is None:
                try:
                    self._trainer = subprocess.Popen(
                        argv,
                        cwd=spec.workdir,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        preexec_fn=die_with_parent,
                    )
                except OSError as exc:
                    _note(log, f"cannot start trainer: {exc}")
                    self._write_status(AgentState.FAILED, exit_code=127, message=str(exc))
                    return 127
            signal.signal(stacks.ASK_AGENT, not_nested(self._on_stacks_asked))
            if self._stop_requested.is_set():  # a stop arrived while we were starting
                self._forward_stop()
            code = self._supervise(self._trainer)
            if standby.due(exit_code=code):
                standby.prepare()
            state = self._final_state(code)
            _note(log, f"trainer exited with code {code} ({state})")
            if image is not None:  # its runtime client may have been killed before cleaning up
                container.remove(image)
            standby.close()
        # The final status is what tells the coordinator how the trainer ended: keep trying a
        # while if the shared directory refuses it (full, or gone read-only for a moment).
        deadline = time.monotonic() + FINAL_STATUS_PATIENCE
        while not self._write_status(state, exit_code=code) and time.monotonic() < deadline:
            time.sleep(min(1.0, self.spec.heartbeat_interval))
        forget(os.getpid())
        return code

    def _trainer_pid(self, trainer: subprocess.Popen[bytes] | WarmTrainer) -> int:
        """The trainer's host pid: in an image, the container's process (our child is only
        the runtime's client), looked up until the runtime names it; else our child."""
        if self._image is None:
            return trainer.pid
        if self._in_image is None:
            self._in_image = container.main_pid(self._image)
        return self._in_image or trainer.pid

    def _trainer_phase(self) -> Phase:
        return self._read_progress().phase

    def _final_state(self, code: int) -> AgentState:
        if code == 0:
            return AgentState.SUCCEEDED
        # A preempted trainer checkpointed and asks for a restart: that is a failure the
        # coordinator acts on, even though it followed a SIGTERM.
        if self._stop_requested.is_set() and code != self.spec.preemption_exit_code:
            return AgentState.STOPPED
        return AgentState.FAILED

    def _supervise(self, trainer: subprocess.Popen[bytes] | WarmTrainer) -> int:
        interval = self.spec.heartbeat_interval
        exited = exit_waiter(trainer)
        while True:
            self._write_status(AgentState.RUNNING)
            if self._standby is not None and self._standby.due():
                self._standby.prepare()
            if exited(interval):
                return exit_code_of(trainer.wait())
            if self._stop_deadline is not None and time.monotonic() >= self._stop_deadline:
                trainer.kill()
            if not self._stop_requested.is_set() and cut_off(
                os.getpid(), self._peers, self.spec.orphan_timeout
            ):  # partitioned: training on alone would only diverge from the restarted group
                _say(
                    "[orchestrate] the coordinator has not reached this host for "
                    f"{self.spec.orphan_timeout:g}s and no peer answers: stopping the trainer"
                )
                self._on_stop_signal(signal.SIGTERM, None)

    def _on_stacks_asked(self, signum: int, frame: FrameType | None) -> None:
        """Before a hung group is stopped: the trainer's stacks, on a thread, then logged."""
        if (trainer := self._trainer) is None:
            return
        task_dir = self.status_path.parent

        def take() -> None:
            path = stacks.stacks_path(task_dir, self.spec.attempt)
            line = stacks.take(self._trainer_pid(trainer), path, self.spec.job_id)
            _note(self._log, line)
            with contextlib.suppress(OSError):
                stacks.done_path(task_dir, self.spec.attempt).write_text(line + "\n")

        threading.Thread(target=take, name="stacks", daemon=True).start()

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        # Once: the trainer has it, and its grace runs. Another (Slurm signals every process
        # of a step, and may do so twice) neither shortens the grace nor reaches the trainer.
        if self._stop_requested.is_set():
            return
        self._stop_requested.set()
        self._stop_deadline = time.monotonic() + self.spec.stop_grace
        self._forward_stop()

    def _on_hurry(self, signum: int, frame: FrameType | None) -> None:
        """The grace is over (worker.proctl.stop_group, a Slurm step's stop): the trainer goes
        now, so that this agent can say how it ended before it is killed too."""
        self._stop_requested.set()
        self._stop_deadline = time.monotonic()  # a trainer still starting goes once it has
        if self._trainer is not None:
            self._trainer.kill()

    def _forward_stop(self) -> None:
        trainer = self._trainer
        if trainer is not None and trainer.poll() is None:
            trainer.send_signal(signal.SIGTERM)

    def _read_progress(self) -> Progress:
        """The trainer's progress file, read at most MAX_PROGRESS_BYTES of (a trainer writes
        what it likes: said once, then the last good progress stands)."""
        try:
            with open(self.progress_path, "rb") as fh:
                raw = fh.read(MAX_PROGRESS_BYTES + 1)
        except OSError:
            return self._progress
        if len(raw) > MAX_PROGRESS_BYTES:
            if not self._progress_too_big:
                _say(f"[orchestrate] {self.progress_path} is over {MAX_PROGRESS_BYTES} bytes: "
                     "ignored while it is")  # fmt: skip
            self._progress_too_big = True
            return self._progress
        self._progress_too_big = False
        # Half written, or not JSON: the last good one stands.
        with contextlib.suppress(ValueError, RecursionError):
            self._progress = Progress.from_dict(json.loads(raw))
        return self._progress

    def _write_status(
        self, state: AgentState, exit_code: int | None = None, message: str = ""
    ) -> bool:
        """Write the status file (a heartbeat). A write the shared directory refuses (full,
        read-only, gone) must not end the agent: that would orphan a training trainer. It is
        said on stderr once per run of failures and tried again at the next heartbeat; the
        coordinator sees the heartbeat stop and names the directory's state as the cause."""
        self._seq += 1
        trainer = self._trainer
        progress = self._read_progress()
        resources = None
        if state == AgentState.RUNNING and trainer is not None:
            resources = self._sample(self._trainer_pid(trainer), progress)
        status = TaskStatus(
            state=state,
            seq=self._seq,
            attempt=self.spec.attempt,
            agent_pid=os.getpid(),
            trainer_pid=self._trainer_pid(trainer) if trainer is not None else None,
            exit_code=exit_code,
            progress=progress,
            message=message,
            resources=resources,
        )
        try:
            write_json_atomic(self.status_path, status.to_dict())
        except OSError as exc:
            if not self._write_failing:
                _say(f"[orchestrate] cannot write {self.status_path}: {exc}")
            self._write_failing = True
            return False
        if self._write_failing:
            _say(f"[orchestrate] {self.status_path} writable again")
        self._write_failing = False
        return True

    def _sample(self, pid: int, progress: Progress) -> Resources | None:
        """This heartbeat's resource sample, also written to the task's TensorBoard run."""
        if self._sampler is None:
            return None
        try:
            resources = self._sampler.sample(pid, progress)
        except Exception as exc:  # sampling must never end the agent (and orphan the trainer)
            _say(f"[orchestrate] resource sampling stopped: {type(exc).__name__}: {exc}")
            self._sampler = None
            return None
        # Seconds since the job's launch: the coordinator's count to the spec, then our own
        # monotonic clock (this host's wall clock may be minutes off the coordinator's).
        step = int(self.spec.since_launch + time.monotonic() - self._started)
        with contextlib.suppress(OSError):  # a full shared directory must not end the agent
            self._tensorboard.scalars(step, tensorboard_scalars(resources), resources.at)
        return resources


def _say(text: str) -> None:
    """A line on stderr (agent.log, itself on the shared directory, which may be full)."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def _start_on_a_fresh_line(path: Path, log: BinaryIO) -> None:
    """An earlier attempt may have ended mid-line (killed mid-write, or a full disk cut a write
    short): this attempt's lines start on a line of their own."""
    with contextlib.suppress(OSError), open(path, "rb") as held:
        if held.seek(0, os.SEEK_END) and held.seek(-1, os.SEEK_END) >= 0 and held.read(1) != b"\n":
            log.write(b"\n")


def _note(log: BinaryIO | None, text: str) -> None:
    """A line of our own in the task's log; a full shared directory must not end the agent."""
    if log is None:
        return
    with contextlib.suppress(OSError, ValueError):
        log.write(f"[orchestrate] {text}\n".encode())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m worker.agent SPEC_PATH", file=sys.stderr)
        return 2
    spec = WorkerSpec.from_json(Path(args[0]).read_bytes())
    return Agent(spec).run()


if __name__ == "__main__":
    sys.exit(main())
