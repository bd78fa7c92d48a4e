"""The contract between coordinator and agent: the task spec, the job directory layout and the
status an agent writes. Versioned; standard library only (the agent imports nothing else)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any, TypeVar

from worker.atomic import write_bytes_atomic, write_json_atomic

__all__ = ["write_bytes_atomic", "write_json_atomic"]  # re-exported: part of the contract

SPEC_VERSION = 5
# The host helper's request set and the spec it starts agents with. The coordinator refuses a
# host whose worker package answers with another (an older orchestrate installed there): bump
# it when a helper operation or the spec changes. 3: the spec gained `instrument`. 4: processes
# are named by pid and identity (start returns both; alive, observe and stop check it), stop_job.
# 6: listen, unlisten, connect, route (`orchestrate check`); probe's `gpu` (GPU hosts). 7: observe
# became watch (a long poll). 8: sample_resources, launched_at; statuses carry resources.
# 9: launched_at became since_launch (no clock compared across hosts). 10: checkpoints.
HOST_PROTOCOL = 10
_D = TypeVar("_D")
_E = TypeVar("_E", bound=StrEnum)

# Environment a trainer sees, besides TF_CONFIG and the user's env.
ENV_JOB_DIR = "ORCHESTRATE_JOB_DIR"
ENV_TASK_DIR = "ORCHESTRATE_TASK_DIR"
ENV_PROGRESS_FILE = "ORCHESTRATE_PROGRESS_FILE"
ENV_JOB_ID = "ORCHESTRATE_JOB_ID"
ENV_ATTEMPT = "ORCHESTRATE_ATTEMPT"
ENV_STRATEGY = "ORCHESTRATE_STRATEGY"  # cluster.toml's [strategy] as JSON
ENV_PROFILE_STEPS = "ORCHESTRATE_PROFILE_STEPS"  # "first,last" training steps to profile
ENV_PREEMPTION_EXIT_CODE = "ORCHESTRATE_PREEMPTION_EXIT_CODE"  # restart.preemption_exit_code
ENV_TIME_WAITS = "ORCHESTRATE_TIME_WAITS"  # "0": do not time collectives and input (wait_clock)


class JobLayout:
    """Where a job's files live on the shared directory (POSIX paths: they may be remote)."""

    def __init__(self, shared_dir: str | PurePosixPath, job_id: str) -> None:
        self.root = PurePosixPath(shared_dir) / job_id

    def task_dir(self, index: int) -> PurePosixPath:
        return self.root / "tasks" / str(index)

    def spec_path(self, index: int) -> PurePosixPath:
        return self.task_dir(index) / "spec.json"

    def status_path(self, index: int) -> PurePosixPath:
        return self.task_dir(index) / "status.json"

    def progress_path(self, index: int) -> PurePosixPath:
        return self.task_dir(index) / "progress.json"

    def log_path(self, index: int) -> PurePosixPath:
        return self.root / "logs" / f"worker-{index}.log"

    def tensorboard_dir(self, index: int) -> PurePosixPath:
        """The task's TensorBoard runs: train/ (worker.runtime), resources/ (the agent)."""
        return self.root / "tensorboard" / f"worker-{index}"

    @property
    def backup_dir(self) -> PurePosixPath:
        return self.root / "checkpoints" / "backup"

    @property
    def model_dir(self) -> PurePosixPath:
        return self.root / "model"

    @property
    def tmp_dir(self) -> PurePosixPath:
        return self.root / "tmp"


# --- what a trainer or a host writes is not trusted: typed and bounded on the way in --------

MAX_COUNT = 2**53  # a step, epoch or byte count: exact in JSON and in SQLite's INTEGER
MAX_TEXT = 2000  # characters of a message kept
MAX_METRICS = 64
MAX_GPUS = 64


def _count(value: object, default: int | None = 0, high: int = MAX_COUNT) -> int | None:
    """A non-negative integer within bounds, or `default` (not a string, NaN or a boolean)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    if isinstance(value, float) and not math.isfinite(value):
        return default
    number = int(value)
    return number if 0 <= number <= high else default


def _real(value: object, low: float = -1e300, high: float = 1e300) -> float | None:
    """A finite float within bounds, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and low <= number <= high else None


def _text(value: object, limit: int = MAX_TEXT) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _is_code(value: object) -> bool:
    """An exit status: an int (not a bool) in a C int's range."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**31) <= value < 2**31


def _enum(kind: type[_E], value: object) -> _E:
    try:
        return kind(value if isinstance(value, str) else "")
    except ValueError:
        return kind("")


def _from_mapping(cls: type[_D], raw: str | bytes, what: str) -> _D:
    """Build a dataclass from JSON, refusing unknown keys and missing required ones."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a JSON object")
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{what}: unknown keys {sorted(unknown)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"{what}: {exc}") from None


@dataclass(frozen=True)
class WorkerSpec:
    """Everything an agent needs to run one task. Written by the coordinator, mode 0600.

    A plain dataclass, not pydantic: the agent is started once per task and stays resident, so
    it imports the standard library only (start-up time and memory)."""

    job_id: str
    task_index: int
    host_label: str
    tf_config: dict[str, Any]
    argv: list[str]
    workdir: str
    shared_dir: str
    attempt: int = 0
    task_type: str = "worker"
    env: dict[str, str] = field(default_factory=dict)
    heartbeat_interval: float = 1.0
    stop_grace: float = 10.0
    preemption_exit_code: int = 42
    # Start the entrypoint through worker.bootstrap (progress, phases, preemption for any script).
    instrument: bool = True
    # Stop the trainer when neither the coordinator nor a peer reaches it (worker.contact).
    orphan_timeout: float = 0.0
    # Keep a standby interpreter with TensorFlow imported for the next attempt (worker.warm),
    warm_restart: bool = False
    warm_imports: bool = False  # and have it import what the last trainer did, too
    standby_delay: float = 0.0  # seconds of training before the next standby is prepared
    standby_linger: float = 60.0  # how long the keeper waits for the next attempt's agent
    # After the job: how long a ready standby is kept for this user's next job (same Python
    # and environment), and the most memory this user's kept standbys on a host may hold.
    keep_standbys: float = 0.0
    keep_standbys_bytes: int = 0
    # Sample the trainer's resources at every heartbeat (worker.resources) and time its waits.
    sample_resources: bool = True
    # Seconds from the job's launch to this spec, by the coordinator's clock: the agent adds its
    # own monotonic time to it (TensorBoard's step), so no host's clock is compared with ours.
    since_launch: float = 0.0
    container: dict[str, Any] | None = None  # the trainer's image (worker.container); None: host
    version: int = SPEC_VERSION

    @property
    def layout(self) -> JobLayout:
        return JobLayout(self.shared_dir, self.job_id)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerSpec:
        spec = _from_mapping(cls, raw, "worker spec")
        if spec.version != SPEC_VERSION:
            raise ValueError(
                f"worker spec version {spec.version}, this agent speaks {SPEC_VERSION}: "
                "install the same orchestrate version on every host"
            )
        return spec


class AgentState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    def is_terminal(self) -> bool:
        return self in (AgentState.SUCCEEDED, AgentState.FAILED, AgentState.STOPPED)


class Phase(StrEnum):
    """How far a trainer got, as the bootstrap (or worker.runtime) reports it."""

    NONE = ""  # nothing reported (not started, or not instrumented)
    STARTING = "starting"  # the interpreter is up; TensorFlow not imported yet
    IMPORTED = "imported"  # TensorFlow is imported; no multi-worker strategy yet
    JOINING = "joining"  # creating the strategy: waiting for every peer to connect
    JOINED = "joined"  # the strategy exists: every peer connected
    TRAINING = "training"  # steps are being taken (model.fit, or an optimizer's iterations)
    FINISHED = "finished"  # model.fit returned (evaluation, saving)

    def past_rendezvous(self) -> bool:
        return self in (Phase.JOINED, Phase.TRAINING, Phase.FINISHED)


class StepSignal(StrEnum):
    """Where a task's step count comes from: what the watchdog and first-step deadline see."""

    NONE = ""  # steps are not observed (no Keras fit, no optimizer found)
    KERAS = "keras"  # a Keras fit callback: every batch, with loss, epochs and totals
    OPTIMIZER = "optimizer"  # an optimizer's iterations, read off the training thread

    def describe(self) -> str:
        return {
            StepSignal.NONE: "steps not observed",
            StepSignal.KERAS: "Keras fit steps",
            StepSignal.OPTIMIZER: "optimizer iterations",
        }[self]


@dataclass(frozen=True)
class Progress:
    """Training progress, written by the runtime and relayed by the agent."""

    phase: Phase = Phase.NONE
    epoch: int = 0  # epochs started, 1-based; 0 before the first
    step: int = 0  # optimizer steps done in this attempt
    loss: float | None = None
    steps_per_sec: float | None = None
    initial_epoch: int = 0  # first epoch of this attempt (> 0 after a resume)
    metrics: dict[str, float] = field(default_factory=dict)
    step_signal: StepSignal = StepSignal.NONE
    epochs: int = 0  # total epochs of model.fit; 0: unknown
    steps_per_epoch: int = 0  # 0: unknown
    epoch_step: int = 0  # batches done in the current epoch
    # worker.wait_clock: seconds this trainer's steps spent in collectives (waiting for its
    # peers) and waiting for input, so far, at `clock` (time.time()); 0.0 clock: not timed.
    collective_seconds: float = 0.0
    input_seconds: float = 0.0
    clock: float = 0.0
    listening: str = ""  # host:port its strategy's own resolver gave it, if not TF_CONFIG's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> Progress:
        """From what a trainer wrote: every field typed and bounded, garbage dropped (keys of
        newer runtimes too)."""
        if not isinstance(data, dict):
            return cls()
        metrics = data.get("metrics")
        kept: dict[str, float] = {}
        if isinstance(metrics, dict):
            for name, value in list(metrics.items())[:MAX_METRICS]:
                number = _real(value)
                if isinstance(name, str) and number is not None:
                    kept[name[:100]] = number
        return cls(
            phase=_enum(Phase, data.get("phase", "")),
            epoch=_count(data.get("epoch")) or 0,
            step=_count(data.get("step")) or 0,
            loss=_real(data.get("loss")),
            steps_per_sec=_real(data.get("steps_per_sec"), 0.0, 1e12),
            initial_epoch=_count(data.get("initial_epoch")) or 0,
            metrics=kept,
            step_signal=_enum(StepSignal, data.get("step_signal", "")),
            epochs=_count(data.get("epochs")) or 0,
            steps_per_epoch=_count(data.get("steps_per_epoch")) or 0,
            epoch_step=_count(data.get("epoch_step")) or 0,
            collective_seconds=_real(data.get("collective_seconds"), 0.0) or 0.0,
            input_seconds=_real(data.get("input_seconds"), 0.0) or 0.0,
            clock=_real(data.get("clock"), 0.0) or 0.0,
            listening="".join(c for c in _text(data.get("listening"), 256) if c.isprintable()),
        )


def remaining_steps(epoch: int, epochs: int, steps_per_epoch: int, epoch_step: int) -> int | None:
    """Steps left in a model.fit that told its totals (epoch is 1-based); None: unknown."""
    if not epochs or not steps_per_epoch or not epoch:
        return None
    return max((epochs - epoch) * steps_per_epoch + steps_per_epoch - epoch_step, 0)


@dataclass(frozen=True)
class GpuSample:
    index: int  # nvidia-smi's
    utilization: float | None = None  # percent of the last sample period a kernel ran
    memory_used: int | None = None  # MiB
    memory_total: int | None = None  # MiB


@dataclass(frozen=True)
class Resources:
    """What a task's machine was doing, sampled by its agent at a heartbeat (worker.resources).
    CPU percentages are over the interval since the previous sample, the shares of waiting
    over the last SHARE_WINDOW seconds; None: not measured."""

    at: float = 0.0  # time.time() of the sample
    cpu_percent: float | None = None  # the trainer's CPU time, percent of one core
    cpu_wait_percent: float | None = None  # of the time its threads wanted a CPU, % waiting
    rss_bytes: int | None = None  # the trainer's resident memory
    host_cpu_percent: float | None = None  # all the host's CPUs, percent busy
    host_mem_available: int | None = None  # bytes (MemAvailable)
    host_mem_total: int | None = None
    gpus: tuple[GpuSample, ...] = ()  # the task's GPUs (all the host's when it has none set)
    # Of the trainer's wall time over the last window (worker.wait_clock), percent spent in
    # collectives (waiting for peers) and waiting for input; None: not timed.
    collective_percent: float | None = None
    input_percent: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> Resources:
        """From a status file: typed and bounded, as Progress.from_dict."""
        if not isinstance(data, dict):
            return cls()
        gpus = data.get("gpus")
        samples = []
        for g in gpus[:MAX_GPUS] if isinstance(gpus, list | tuple) else ():
            index = _count(g.get("index"), None, 4096) if isinstance(g, dict) else None
            if index is not None:
                samples.append(
                    GpuSample(
                        index,
                        _real(g.get("utilization"), 0.0, 100.0),
                        _count(g.get("memory_used"), None),
                        _count(g.get("memory_total"), None),
                    )
                )
        return cls(
            at=_real(data.get("at")) or 0.0,
            cpu_percent=_real(data.get("cpu_percent"), 0.0, 1e6),
            cpu_wait_percent=_real(data.get("cpu_wait_percent"), 0.0, 100.0),
            rss_bytes=_count(data.get("rss_bytes"), None),
            host_cpu_percent=_real(data.get("host_cpu_percent"), 0.0, 100.0),
            host_mem_available=_count(data.get("host_mem_available"), None),
            host_mem_total=_count(data.get("host_mem_total"), None),
            gpus=tuple(samples),
            collective_percent=_real(data.get("collective_percent"), 0.0, 100.0),
            input_percent=_real(data.get("input_percent"), 0.0, 100.0),
        )


@dataclass(frozen=True)
class TaskStatus:
    """What an agent reports: rewritten atomically every heartbeat."""

    state: AgentState
    seq: int  # grows with every heartbeat: the coordinator watches it with its own clock
    agent_pid: int
    attempt: int = 0
    trainer_pid: int | None = None
    exit_code: int | None = None
    progress: Progress = field(default_factory=Progress)
    message: str = ""
    resources: Resources | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: str | bytes) -> TaskStatus:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("task status: expected a JSON object")
        seq, agent_pid = _count(data.get("seq"), None), _count(data.get("agent_pid"), None)
        if seq is None or agent_pid is None:
            raise ValueError("task status: seq and agent_pid must be counts")
        exit_code = data.get("exit_code")
        if not _is_code(exit_code):
            exit_code = None
        return cls(
            state=AgentState(str(data.get("state"))),  # ValueError: not a state
            seq=seq,
            agent_pid=agent_pid,
            attempt=_count(data.get("attempt")) or 0,
            trainer_pid=_count(data.get("trainer_pid"), None, 2**31 - 1),
            exit_code=exit_code,
            progress=Progress.from_dict(data.get("progress")),
            message=_text(data.get("message", "")),
            resources=Resources.from_dict(data["resources"]) if data.get("resources") else None,
        )
