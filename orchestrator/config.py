"""cluster.toml: pydantic models (unknown keys refused) and `load_config`.

Every error becomes one `ConfigError` line naming the file and the TOML key path, e.g.
``cluster.toml: backend.workers: must be >= 1 (got 0)``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.errors import ConfigError

DEFAULT_SSH_PORT = 22


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobSection(_Model):
    name: Annotated[
        str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    ]
    # Checkpoints, per-task logs and job files live here; the same path on every host.
    # A relative path is taken from the directory of cluster.toml.
    shared_dir: Path


class EntrypointSection(_Model):
    """What each task trains: `python -m MODULE ARGS` or `python SCRIPT ARGS`."""

    module: str | None = None
    script: Path | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    # Working directory of the trainer; defaults to the directory of cluster.toml.
    workdir: Path | None = None
    # Start the script through orchestrate's bootstrap: progress, phases, the watchdog and
    # preemption for any script, unmodified. false: the script alone (then only what it
    # reports through worker.runtime is seen).
    instrument: bool = True

    @model_validator(mode="after")
    def _exactly_one_target(self) -> EntrypointSection:
        if (self.module is None) == (self.script is None):
            raise ValueError("give exactly one of 'module' or 'script'")
        return self


class LocalBackend(_Model):
    """Every task is a local process on loopback: the same code path as remote hosts."""

    type: Literal["local"]
    workers: Annotated[int, Field(ge=1, le=64)]
    # Interpreter that runs the agent and trainer; default: the coordinator's own.
    python: str | None = None


class SshHost(_Model):
    address: Annotated[str, Field(min_length=1)]
    # A label shown in logs and status; defaults to the address.
    name: str | None = None
    user: str | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    identity_file: Path | None = None
    python: str | None = None
    # Tasks on this host (one per device group); each gets its own port.
    slots: Annotated[int, Field(ge=1, le=64)] = 1
    # Commands (argv lists) run once on this host before its agents start.
    setup: list[list[str]] = []

    @property
    def label(self) -> str:
        return self.name or self.address


class SshBackend(_Model):
    type: Literal["ssh"]
    hosts: Annotated[list[SshHost], Field(min_length=1)]
    # Defaults for every host; a host's own value wins.
    # Unset user/port/identity: ~/.ssh/config decides, then the SSH defaults.
    user: str | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    identity_file: Path | None = None
    python: str = "python3"
    # Host keys are checked strictly against this file (default: ~/.ssh/known_hosts).
    known_hosts: Path | None = None
    # Opt-in: accept and record the key of a host not yet in known_hosts. A changed key is
    # always refused.
    trust_unknown_hosts: bool = False
    connect_timeout: Annotated[float, Field(gt=0)] = 10.0
    command_timeout: Annotated[float, Field(gt=0)] = 60.0


Backend = Annotated[LocalBackend | SshBackend, Field(discriminator="type")]


class PortsSection(_Model):
    # 0: probe a free port on each host just before launch (the safe default). Otherwise task
    # ports on a host are base, base+1, ...
    base: Annotated[int, Field(ge=0, le=65535)] = 0


class SupervisionSection(_Model):
    heartbeat_interval: Annotated[float, Field(gt=0, le=60)] = 1.0
    # A task whose heartbeat is older than this is considered lost.
    heartbeat_timeout: Annotated[float, Field(gt=0)] = 30.0
    # The whole group must reach its first training step within this many seconds.
    startup_deadline: Annotated[float, Field(gt=0)] = 300.0
    # SIGTERM, then this many seconds, then SIGKILL.
    stop_grace: Annotated[float, Field(ge=0)] = 10.0
    poll_interval: Annotated[float, Field(gt=0, le=10)] = 0.2
    # Watchdog: a task whose training step does not advance for this long is hung (0: off).
    progress_timeout: Annotated[float, Field(ge=0)] = 600.0
    # What a missed startup deadline does: fail the job, or restart the group (per policy).
    on_startup_timeout: Literal["fail", "restart"] = "fail"


class RestartSection(_Model):
    """Whole-group restarts: MWMS cannot go on without a peer, and a task restarted alone can
    deadlock, so any failure stops every task and starts them all again from the checkpoint."""

    max_restarts: Annotated[int, Field(ge=0)] = 3
    # Seconds before the first restart, doubling each time up to backoff_max.
    backoff: Annotated[float, Field(ge=0)] = 1.0
    backoff_max: Annotated[float, Field(ge=0)] = 30.0
    # Exit codes worth a restart; unset: every non-zero exit. Lost, silent or hung tasks and
    # unreachable hosts are always worth one.
    retryable_exit_codes: list[int] | None = None
    # A task preempted (SIGTERM) checkpoints and exits with this code; the restart that follows
    # does not count against max_restarts. 42 is TensorFlow's PreemptionCheckpointHandler's.
    preemption_exit_code: Annotated[int, Field(ge=1, le=255)] = 42


class StrategySection(_Model):
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


class ClusterConfig(_Model):
    job: JobSection
    entrypoint: EntrypointSection
    backend: Backend
    ports: PortsSection = PortsSection()
    supervision: SupervisionSection = SupervisionSection()
    restart: RestartSection = RestartSection()
    strategy: StrategySection = StrategySection()


def load_config(path: str | Path) -> ClusterConfig:
    """Read, parse and validate cluster.toml; relative paths are resolved against its directory."""
    path = Path(path)
    raw = _read_toml(path)
    config = parse_config(raw, source=str(path))
    config = _resolve_paths(config, path.resolve().parent)
    _check_semantics(config, str(path))
    return config


def parse_config(raw: dict[str, Any], source: str = "cluster.toml") -> ClusterConfig:
    """Validate an already parsed TOML document (pure)."""
    try:
        return ClusterConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a cluster.toml file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if not text.strip():
        raise ConfigError(f"{path}: file is empty")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _describe(exc: ValidationError) -> str:
    """One line for the first problem, naming its key path; a count of the others."""
    errors = exc.errors()
    first = errors[0]
    key = _key_path(first["loc"])
    kind = first["type"]
    if kind == "extra_forbidden":
        text = "unknown key"
    elif kind == "missing":
        text = "required key is missing"
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        text = f"{_short_bound(first['msg'])} (got {first['input']!r})"
    elif kind == "union_tag_invalid":
        text = f"unknown backend type {first['input'].get('type')!r} (expected 'local' or 'ssh')"
    elif kind == "union_tag_not_found":
        text = "missing 'type' (expected 'local' or 'ssh')"
    else:
        text = first["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{key}: {text}{more}" if key else f"{text}{more}"


def _short_bound(msg: str) -> str:
    return (
        msg.replace("Input should be ", "must be ")
        .replace("greater than or equal to", ">=")
        .replace("less than or equal to", "<=")
        .replace("greater than", ">")
        .replace("less than", "<")
    )


def _key_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for i, item in enumerate(loc):
        # A discriminated union puts the tag ('local'/'ssh') in the path: drop it.
        if i > 0 and loc[i - 1] == "backend" and item in ("local", "ssh"):
            continue
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _resolve_paths(config: ClusterConfig, base: Path) -> ClusterConfig:
    def resolve(p: Path | None) -> Path | None:
        if p is None:
            return None
        p = p.expanduser()
        return p if p.is_absolute() else (base / p).resolve()

    entry = config.entrypoint
    job = config.job.model_copy(update={"shared_dir": resolve(config.job.shared_dir)})
    entry = entry.model_copy(
        update={"script": resolve(entry.script), "workdir": resolve(entry.workdir) or base}
    )
    return config.model_copy(update={"job": job, "entrypoint": entry})


def _check_semantics(config: ClusterConfig, source: str) -> None:
    """Rules pydantic cannot express alone; each error still names its key."""
    backend = config.backend
    if isinstance(backend, SshBackend):
        seen: dict[tuple[str, int], int] = {}
        for i, host in enumerate(backend.hosts):
            key = (host.address, host.port or backend.port or DEFAULT_SSH_PORT)
            if key in seen:
                raise ConfigError(
                    f"{source}: backend.hosts[{i}].address: duplicate host {key[0]}:{key[1]} "
                    f"(same as backend.hosts[{seen[key]}])"
                )
            seen[key] = i
    if isinstance(backend, LocalBackend):
        script = config.entrypoint.script
        if script is not None and not script.is_file():
            raise ConfigError(f"{source}: entrypoint.script: no such file: {script}")
        workdir = config.entrypoint.workdir
        if workdir is not None and not workdir.is_dir():
            raise ConfigError(f"{source}: entrypoint.workdir: no such directory: {workdir}")
    if config.strategy.kind != "multi_worker_mirrored":
        tasks = (
            backend.workers
            if isinstance(backend, LocalBackend)
            else sum(h.slots for h in backend.hosts)
        )
        if tasks != 1:
            raise ConfigError(
                f"{source}: strategy.kind: {config.strategy.kind} runs as a single task, "
                f"but the backend plans {tasks}: use one worker (or multi_worker_mirrored)"
            )
    for name in config.entrypoint.env:
        if not name or "=" in name or "\0" in name:
            raise ConfigError(f"{source}: entrypoint.env: invalid variable name {name!r}")
