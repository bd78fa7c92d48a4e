"""The sections of cluster.toml as frozen pydantic models (unknown keys refused)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, BeforeValidator, Field, Strict, model_validator

from orchestrator.config.base import LOOPBACK, BackendSection, ConfigModel, HostPlace
from orchestrator.config.container import ContainerSection
from orchestrator.config.values import (
    MAX_PORT,
    MAX_RESTARTS,
    MAX_SECONDS,
    Argv,
    HostAddress,
    Interpreter,
    Label,
    ModuleName,
    UserName,
    _check_path,
    check_url,
    show,
)

# Paths come from TOML as strings.
ConfigPath = Annotated[Path, Strict(False), AfterValidator(_check_path)]
Seconds = Annotated[float, Field(le=MAX_SECONDS)]
# An HTTP header's name (a token: no space, no colon), and an environment variable's name.
HeaderName = Annotated[str, Field(pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]

PER_GPU = "per_gpu"
MAX_TASKS_PER_HOST = 64


def _count_or_per_gpu(value: object) -> object:
    """A task count 1..64, or "per_gpu" (one task per GPU the host has, counted at launch);
    one message for every other value."""
    if value == PER_GPU:
        return value
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f'Input should be a valid integer or "{PER_GPU}" (got {show(value)})')
    if value < 1:
        raise ValueError(f"must be >= 1 (got {value})")
    if value > MAX_TASKS_PER_HOST:
        raise ValueError(f"must be <= {MAX_TASKS_PER_HOST} (got {value})")
    return value


# Tasks on a host: a count, or "per_gpu".
TaskCount = Annotated[int | Literal["per_gpu"], BeforeValidator(_count_or_per_gpu)]
# GPUs each task of a host gets (CUDA_VISIBLE_DEVICES); unset: GPUs are not assigned.
GpusPerTask = Annotated[int, Field(ge=1, le=64)]


class JobSection(ConfigModel):
    name: Annotated[
        str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    ]
    # Checkpoints, per-task logs and job files live here; the same path on every host.
    # A relative path is taken from the directory of cluster.toml.
    shared_dir: ConfigPath


class EntrypointSection(ConfigModel):
    """What each task trains: `python -m MODULE ARGS` or `python SCRIPT ARGS`."""

    module: ModuleName | None = None
    script: ConfigPath | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    # Working directory of the trainer; defaults to the directory of cluster.toml.
    workdir: ConfigPath | None = None
    # Start the script through orchestrate's bootstrap: progress, phases, the watchdog and
    # preemption for any script, unmodified. false: the script alone (then only what it
    # reports through worker.runtime is seen).
    instrument: bool = True

    @model_validator(mode="after")
    def _exactly_one_target(self) -> EntrypointSection:
        if (self.module is None) == (self.script is None):
            raise ValueError("give exactly one of 'module' or 'script'")
        return self


class LocalBackend(BackendSection):
    """Every task is a local process on loopback: the same code path as remote hosts."""

    type: Literal["local"]
    # Tasks on this machine, or "per_gpu": one per GPU (per gpus_per_task GPUs) found here.
    workers: TaskCount
    # Interpreter that runs the agent and trainer; default: the coordinator's own.
    python: Interpreter | None = None
    # GPUs per task: each task sees only its own (CUDA_VISIBLE_DEVICES); unset: not assigned.
    gpus_per_task: GpusPerTask | None = None

    def places(self) -> tuple[HostPlace, ...]:
        return (HostPlace("local", LOOPBACK),)

    def host_slots(self, host: int) -> int | None:
        return None if self.workers == PER_GPU else int(self.workers)

    def host_gpus_per_task(self, host: int) -> int:
        # "per_gpu" alone means one GPU a task.
        return self.gpus_per_task or (1 if self.workers == PER_GPU else 0)


class SshHost(ConfigModel):
    # A hostname (or ~/.ssh/config Host alias) or an IP address; never user@host:port.
    address: HostAddress
    # A label shown in logs and status; defaults to the address.
    name: Label | None = None
    user: UserName | None = None
    port: Annotated[int, Field(ge=1, le=MAX_PORT)] | None = None
    identity_file: ConfigPath | None = None
    python: Interpreter | None = None
    # Tasks on this host (one per device group); each gets its own port. "per_gpu": one per
    # GPU (per gpus_per_task GPUs) the host has, counted at launch.
    slots: TaskCount = 1
    # GPUs per task on this host (default: backend.gpus_per_task); unset: not assigned.
    gpus_per_task: GpusPerTask | None = None
    # Commands (argv lists) run once on this host before its agents start.
    setup: list[Argv] = []
    # A standby host: no task runs here until it replaces a lost or failing host.
    spare: bool = False

    @property
    def label(self) -> str:
        return self.name or self.address


class SshBackend(BackendSection):
    type: Literal["ssh"]
    hosts: Annotated[list[SshHost], Field(min_length=1)]
    # Defaults for every host; a host's own value wins.
    # Unset user/port/identity: ~/.ssh/config decides, then the SSH defaults.
    user: UserName | None = None
    port: Annotated[int, Field(ge=1, le=MAX_PORT)] | None = None
    identity_file: ConfigPath | None = None
    python: Interpreter = "python3"
    # Host keys are checked strictly against this file (default: ~/.ssh/known_hosts).
    known_hosts: ConfigPath | None = None
    # Opt-in: accept and record the key of a host not yet in known_hosts. A changed key is
    # always refused.
    trust_unknown_hosts: bool = False
    connect_timeout: Annotated[Seconds, Field(gt=0)] = 10.0
    command_timeout: Annotated[Seconds, Field(gt=0)] = 60.0
    # GPUs per task on every host without its own gpus_per_task; unset: not assigned.
    gpus_per_task: GpusPerTask | None = None

    def places(self) -> tuple[HostPlace, ...]:
        return tuple(HostPlace(h.label, h.address, h.spare) for h in self.hosts)

    def host_slots(self, host: int) -> int | None:
        slots = self.hosts[host].slots
        return None if slots == PER_GPU else int(slots)

    def host_gpus_per_task(self, host: int) -> int:
        entry = self.hosts[host]
        return entry.gpus_per_task or self.gpus_per_task or (1 if entry.slots == PER_GPU else 0)


# Slurm's own spellings, checked here so that a typo is a one-line error before anything is
# submitted.
def _slurm_check(pattern: str, what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not re.fullmatch(pattern, value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


SlurmName = Annotated[
    str,
    Field(max_length=64),
    _slurm_check(r"[A-Za-z0-9_.\-]+", "a Slurm name (letters, digits, '_', '.', '-')"),
]
SlurmTime = Annotated[
    str,
    _slurm_check(
        r"\d+-\d{1,2}(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE",
        'a Slurm time limit ("30" minutes, "1:00:00", "2-12:00:00", ...)',
    ),
]
SlurmGres = Annotated[
    str,
    _slurm_check(
        r"[A-Za-z0-9_]+(:[A-Za-z0-9_.\-]+)?(:\d+)?", 'a Slurm GRES ("gpu", "gpu:4", "gpu:a100:4")'
    ),
]


class SlurmBackend(BackendSection):
    """The job runs in one Slurm allocation (sbatch); every attempt is one srun step in it."""

    type: Literal["slurm"]
    # Unset: the cluster's default partition.
    partition: SlurmName | None = None
    nodes: Annotated[int, Field(ge=1, le=4096)]
    # Tasks (workers) per node; each picks its own free port.
    tasks_per_node: Annotated[int, Field(ge=1, le=64)] = 1
    # The allocation's time limit (sbatch --time); unset: the partition's default.
    time: SlurmTime | None = None
    account: SlurmName | None = None
    qos: SlurmName | None = None
    # Generic resources per node (sbatch --gres), e.g. "gpu:4".
    gres: SlurmGres | None = None
    exclusive: bool = False
    # Further sbatch options, as an argv list (e.g. ["--constraint=ib", "--mem=0"]).
    sbatch_args: list[str] = []
    # Commands (argv lists) run on every node, in order, before its tasks start: at the first
    # step of each allocation (again after a requeue, which may land on other nodes).
    setup: list[Argv] = []
    # Interpreter on the nodes that has the worker package and TensorFlow.
    python: Interpreter = "python3"
    # Seconds before the allocation ends (time limit) at which Slurm signals the tasks
    # (sbatch --signal=TERM@N): they checkpoint at the epoch boundary, then the job is requeued.
    signal_before_end: Annotated[int, Field(ge=10, le=3600)] = 120
    # Put the job back in the queue when its allocation ends early (time limit, preemption)
    # and resume from the checkpoint; false: the job fails, saying why.
    requeue: bool = True

    def places(self) -> tuple[HostPlace, ...]:
        # Nodes are Slurm's choice: named once the allocation runs.
        return tuple(HostPlace(slurm_node_label(n), "") for n in range(self.nodes))

    def host_slots(self, host: int) -> int | None:
        return self.tasks_per_node

    # host_gpus_per_task: none, as Slurm assigns GPUs itself (gres).


def slurm_node_label(n: int) -> str:
    """A Slurm node's label until the allocation names it."""
    return f"node{n}"


class PortsSection(ConfigModel):
    # 0: probe a free port on each host just before launch (the safe default). Otherwise task
    # ports on a host are base, base+1, ...
    base: Annotated[int, Field(ge=0, le=MAX_PORT)] = 0


class SupervisionSection(ConfigModel):
    heartbeat_interval: Annotated[float, Field(gt=0, le=60)] = 1.0
    # A task whose heartbeat is older than this is considered lost.
    heartbeat_timeout: Annotated[Seconds, Field(gt=0)] = 30.0
    # The whole group must reach its first training step within this many seconds.
    startup_deadline: Annotated[Seconds, Field(gt=0)] = 300.0
    # SIGTERM, then this many seconds, then SIGKILL.
    stop_grace: Annotated[Seconds, Field(ge=0)] = 10.0
    # How often the supervisor decides; a host reports a death or a new state at once.
    poll_interval: Annotated[float, Field(ge=0.01, le=10)] = 0.2
    # A host with nothing urgent to report answers after this many seconds, carrying log
    # lines, heartbeats and progress: a quiet host costs one round trip per keep-alive.
    keepalive: Annotated[float, Field(gt=0, le=60)] = 1.0
    # Watchdog: a task whose training step does not advance for this long is hung (0: off).
    progress_timeout: Annotated[Seconds, Field(ge=0)] = 600.0
    # What a missed startup deadline does: fail the job, or restart the group (per policy).
    on_startup_timeout: Literal["fail", "restart"] = "fail"
    # A host whose reads fail (or whose connection cannot be reopened) this long is lost: the
    # group stops at once, without waiting on it.
    host_timeout: Annotated[float, Field(gt=0, le=600)] = 5.0
    # A relaunch that cannot reach a host waits this long for it (re-probing with backoff)
    # before it replaces it with a spare, goes on without it (min_workers), or fails.
    host_wait: Annotated[Seconds, Field(ge=0)] = 600.0
    # Sample each task's resources at every heartbeat and time its waits for peers and input
    # (shown by `status`, the run report and TensorBoard; what names stragglers).
    sample_resources: bool = True
    # A task whose own part of each step (its step time less its wait for peers) is longer
    # than the other tasks' by more than this fraction, consistently, is named a straggler:
    # a warning, never a failure.
    straggler_threshold: Annotated[float, Field(gt=0, le=10)] = 0.15


class RestartSection(ConfigModel):
    """Whole-group restarts: MWMS cannot go on without a peer, and a task restarted alone can
    deadlock, so any failure stops every task and starts them all again from the checkpoint."""

    max_restarts: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = 3
    # Seconds before the first restart, doubling with each restart in a row up to backoff_max.
    backoff: Annotated[Seconds, Field(ge=0)] = 1.0
    backoff_max: Annotated[Seconds, Field(ge=0)] = 30.0
    # An attempt that ran this long ends the row: the next restart waits `backoff` again
    # (Kubernetes resets a crash loop's backoff after ten minutes). 0: never.
    backoff_reset: Annotated[Seconds, Field(ge=0)] = 600.0
    # Exit codes worth a restart; unset: every non-zero exit (lost, hung, unreachable: always).
    retryable_exit_codes: list[int] | None = None
    # A task preempted (SIGTERM) checkpoints and exits with this code; the restart that follows
    # does not count against max_restarts. 42 is TensorFlow's PreemptionCheckpointHandler's.
    preemption_exit_code: Annotated[int, Field(ge=1, le=255)] = 42
    # Elastic width: go on with at least this many workers when hosts stay lost beyond
    # supervision.host_wait and no spare is left (unset: every planned worker is required).
    min_workers: Annotated[int, Field(ge=1, le=4096)] | None = None
    # After shrinking, grow back to full width at the next epoch boundary once a host is back.
    regrow: bool = False
    # A host replaced by a spare rests this long before it may serve as a spare itself.
    quarantine: Annotated[Seconds, Field(ge=0)] = 300.0
    # Warm restarts: each task keeps a standby interpreter with TensorFlow imported, and a
    # restart runs the entrypoint in it (on Slurm, in a keeper step). Needs instrument = true.
    warm_restart: bool = True
    # A task's next standby starts once it has trained this long (or as its trainer exits):
    # its import would slow the first steps.
    standby_delay: Annotated[Seconds, Field(ge=0, le=86400)] = 30.0
    # A standby also imports, ahead, the library modules the task's last trainer imported
    # (site-packages, the standard library), unless its script changed the environment first.
    warm_imports: bool = True
    # Warm relaunches: each task's standby is kept this long for this user's next job with the
    # same Python and environment (the edit-run loop); 0: never kept. Not on Slurm.
    keep_standbys: Annotated[Seconds, Field(ge=0)] = 600.0
    # The most memory (MB) this user's kept standbys may hold on one host; past it, not kept.
    keep_standbys_mb: Annotated[int, Field(ge=0, le=1 << 20)] = 4096


class StrategySection(ConfigModel):
    """Which tf.distribute strategy the runtime builds (worker.runtime.make_strategy)."""

    # multi_worker_mirrored: every task, one replica per device (the default across hosts);
    # mirrored: one host, many devices; one_device: one device; tpu: a TPU via its resolver.
    kind: Literal["multi_worker_mirrored", "mirrored", "one_device", "tpu"] = (
        "multi_worker_mirrored"
    )
    # mirrored / one_device: e.g. ["/gpu:0", "/gpu:1"]; empty: every GPU, else the CPU.
    devices: list[str] = []
    # Split the CPU into this many logical devices first (to run mirrored without GPUs).
    logical_cpus: Annotated[int, Field(ge=0, le=64)] = 0
    # tpu: the TPU's address or name (e.g. "grpc://10.0.0.2:8470"); "" = the local TPU.
    tpu: str = ""
    # Profile these training steps into TensorBoard, e.g. [10, 20]; empty: no profiling.
    profile_steps: Annotated[list[int], Field(max_length=2)] = []
    # Tasks given GPUs (gpus_per_task, "per_gpu") get TF_FORCE_GPU_ALLOW_GROWTH=true: memory
    # taken as needed, not all of it at start. false: TensorFlow's default (all of it).
    gpu_memory_growth: bool = True


NotifyEvent = Literal[
    "failed", "restarted", "preempted", "host_lost", "straggler", "succeeded", "stopped"
]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = get_args(NotifyEvent)


class NotifySection(ConfigModel):
    """Hooks run on the coordinator when the job meets one of `events`: `command` gets the event
    and the job's status as one JSON document on stdin, `webhook` the same as an HTTP POST
    (retried with backoff). Neither ever blocks or breaks supervision."""

    events: list[NotifyEvent] = list(NOTIFY_EVENTS)
    command: Argv | None = None  # a program path holding a "/": from cluster.toml's directory
    webhook: Annotated[str, AfterValidator(check_url)] | None = None
    # The webhook's body: "json" (the event and the job's status) or "slack" ({"text": ...}:
    # Slack's, Mattermost's incoming webhooks).
    format: Literal["json", "slack"] = "json"
    # Extra headers, each read from the named environment variable of the coordinator, e.g.
    # { Authorization = "HOOK_AUTH" }: a token is never written here.
    headers: dict[HeaderName, EnvName] = {}
    timeout: Annotated[Seconds, Field(gt=0)] = 10.0  # per try of a command or a POST


class SchedulingSection(ConfigModel):
    """What a launch does when what it asks for is taken (`launch --wait-for-resources`)."""

    # Wait in the queue (state `queued`, its reason in `status`) while a GPU or task slot it
    # needs is held by another job, a GPU by another program, or a host cannot be reached; jobs
    # that want the same run one after the other, in launch order. false: such a launch fails.
    wait_for_resources: bool = False
    # The longest wait in the queue before the job fails; 0: no limit.
    queue_timeout: Annotated[Seconds, Field(ge=0)] = 0.0


class ClusterConfig(ConfigModel):
    job: JobSection
    entrypoint: EntrypointSection
    # Any registered backend's section, chosen by its `type` (orchestrator.config.registry).
    backend: BackendSection
    ports: PortsSection = PortsSection()
    supervision: SupervisionSection = SupervisionSection()
    restart: RestartSection = RestartSection()
    strategy: StrategySection = StrategySection()
    notify: NotifySection = NotifySection()
    scheduling: SchedulingSection = SchedulingSection()
    # The trainer runs inside this image (the agent stays on the host); absent: on the host.
    container: ContainerSection | None = None
