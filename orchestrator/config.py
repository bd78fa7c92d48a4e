"""cluster.toml: pydantic models (unknown keys refused) and `load_config`.

Every error becomes one `ConfigError` line naming the file and the TOML key path, e.g.
``cluster.toml: backend.workers: must be >= 1 (got 0)``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    model_validator,
)

from orchestrator.errors import ConfigError

DEFAULT_SSH_PORT = 22
MAX_PORT = 65535
# cluster.toml is small: anything bigger is not one (and is never read whole).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# A config nests 6 deep at most (backend.hosts[i].setup[j][k]); refused well beyond that.
MAX_NESTING = 16
# Any duration: far beyond any sensible timeout, and well inside what sleeps and waits accept.
MAX_SECONDS = 30 * 24 * 3600
MAX_RESTARTS = 1000
# Linux: one argv or environment string, with its NUL, must fit in MAX_ARG_STRLEN (32 pages).
MAX_ARG_STRLEN = 128 * 1024
# The env and args orchestrate adds must leave room under ARG_MAX (usually 2 MiB, shared with
# the host's own environment and TF_CONFIG): 8 bytes a pointer besides each string.
EXEC_BUDGET = 1024 * 1024


class _Model(BaseModel):
    # strict: no silent coercion ("2" or true is not an int; ints are still fine as floats);
    # inf and nan are refused in every float.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# Paths come from TOML as strings.
ConfigPath = Annotated[Path, Strict(False)]
Seconds = Annotated[float, Field(le=MAX_SECONDS)]

_HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,127}")
_PORT = re.compile(r"[0-9]{1,5}")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.-]+")


def _show(value: object, limit: int = 60) -> str:
    """A value for a one-line message: repr (control characters escaped), cut to `limit`."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _printable(text: str) -> str:
    """Text for a one-line message: as is when printable, else its repr."""
    return text if text.isprintable() else repr(text)


def _is_ip(address: str) -> bool:
    if "%" in address:  # no IPv6 zone ids: the zone is not an address other hosts can reach
        return False
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _is_hostname(address: str) -> bool:
    """RFC 1123 labels ('_' allowed too: ssh_config Host aliases often have one)."""
    name = address.removesuffix(".")
    if not name or len(name) > 253 or re.fullmatch(r"[0-9.]+", name):
        return False  # all digits and dots: an IPv4 address or nothing
    return all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


def normalized_address(address: str) -> str:
    """The same host spelled the same way: hostnames ignore case, IPs in canonical form."""
    if _is_ip(address):
        return str(ipaddress.ip_address(address))
    return address.lower().removesuffix(".")


def _check_address(address: str) -> str:
    if _is_ip(address) or _is_hostname(address):
        return address
    raise ValueError(_address_problem(address))


def _address_problem(address: str) -> str:
    user, at, rest = address.rpartition("@")
    host, port = rest, None
    bracketed = re.fullmatch(r"\[([^\]]*)\](?::(.*))?", rest)
    if bracketed:
        host, port = bracketed.group(1), bracketed.group(2)
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    clean = (
        (not at or _USER.fullmatch(user))
        and (port is None or (_PORT.fullmatch(port) and 1 <= int(port) <= MAX_PORT))
        and (_is_ip(host) or _is_hostname(host))
    )
    if clean and (at or port is not None):
        held = [w for w, there in (("a user", at), ("a port", port is not None)) if there]
        keys = [f'user = "{user}"'] if at else []
        keys += [f"port = {int(port)}"] if port is not None else []
        return (
            f'{_show(address)} holds {" and ".join(held)}: write address = "{host}" '
            f"with {' and '.join(keys)} (this host's `user` and `port` keys)"
        )
    if clean and bracketed:
        return f'{_show(address)}: write an IPv6 address without brackets: address = "{host}"'
    bad = [c for c in address if not (c.isascii() and (c.isalnum() or c in "._:-"))]
    if address.startswith("-"):
        why = "starts with '-'"
    elif bad and (bad[0].isspace() or not bad[0].isprintable()):
        why = "holds whitespace or a control character"
    elif bad:
        why = f"holds {bad[0]!r}"
    else:
        why = "is neither a hostname nor an IP address"
    hint = " (a user and a port go in this host's `user` and `port` keys)" if at or port else ""
    return (
        f"not a host address: {_show(address)} {why}; give a hostname (letters, digits, '-', "
        f"'_', dots) or an IPv4/IPv6 address{hint}"
    )


def _check_user(user: str) -> str:
    if _USER.fullmatch(user):
        return user
    raise ValueError(
        f"not a user name: {_show(user)} (letters, digits, '_', '.', '-', '@'; "
        "not starting with '-' or '.')"
    )


def _check_label(label: str) -> str:
    if label.isprintable():
        return label
    raise ValueError(f"must be printable, without control characters: {_show(label)}")


HostAddress = Annotated[str, Field(min_length=1), AfterValidator(_check_address)]
UserName = Annotated[str, AfterValidator(_check_user)]
Label = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_check_label)]


class JobSection(_Model):
    name: Annotated[
        str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    ]
    # Checkpoints, per-task logs and job files live here; the same path on every host.
    # A relative path is taken from the directory of cluster.toml.
    shared_dir: ConfigPath


class EntrypointSection(_Model):
    """What each task trains: `python -m MODULE ARGS` or `python SCRIPT ARGS`."""

    module: str | None = None
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


class LocalBackend(_Model):
    """Every task is a local process on loopback: the same code path as remote hosts."""

    type: Literal["local"]
    workers: Annotated[int, Field(ge=1, le=64)]
    # Interpreter that runs the agent and trainer; default: the coordinator's own.
    python: str | None = None


class SshHost(_Model):
    # A hostname (or ~/.ssh/config Host alias) or an IP address; never user@host:port.
    address: HostAddress
    # A label shown in logs and status; defaults to the address.
    name: Label | None = None
    user: UserName | None = None
    port: Annotated[int, Field(ge=1, le=MAX_PORT)] | None = None
    identity_file: ConfigPath | None = None
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
    user: UserName | None = None
    port: Annotated[int, Field(ge=1, le=MAX_PORT)] | None = None
    identity_file: ConfigPath | None = None
    python: str = "python3"
    # Host keys are checked strictly against this file (default: ~/.ssh/known_hosts).
    known_hosts: ConfigPath | None = None
    # Opt-in: accept and record the key of a host not yet in known_hosts. A changed key is
    # always refused.
    trust_unknown_hosts: bool = False
    connect_timeout: Annotated[Seconds, Field(gt=0)] = 10.0
    command_timeout: Annotated[Seconds, Field(gt=0)] = 60.0


Backend = Annotated[LocalBackend | SshBackend, Field(discriminator="type")]


class PortsSection(_Model):
    # 0: probe a free port on each host just before launch (the safe default). Otherwise task
    # ports on a host are base, base+1, ...
    base: Annotated[int, Field(ge=0, le=MAX_PORT)] = 0


class SupervisionSection(_Model):
    heartbeat_interval: Annotated[float, Field(gt=0, le=60)] = 1.0
    # A task whose heartbeat is older than this is considered lost.
    heartbeat_timeout: Annotated[Seconds, Field(gt=0)] = 30.0
    # The whole group must reach its first training step within this many seconds.
    startup_deadline: Annotated[Seconds, Field(gt=0)] = 300.0
    # SIGTERM, then this many seconds, then SIGKILL.
    stop_grace: Annotated[Seconds, Field(ge=0)] = 10.0
    poll_interval: Annotated[float, Field(gt=0, le=10)] = 0.2
    # Watchdog: a task whose training step does not advance for this long is hung (0: off).
    progress_timeout: Annotated[Seconds, Field(ge=0)] = 600.0
    # What a missed startup deadline does: fail the job, or restart the group (per policy).
    on_startup_timeout: Literal["fail", "restart"] = "fail"


class RestartSection(_Model):
    """Whole-group restarts: MWMS cannot go on without a peer, and a task restarted alone can
    deadlock, so any failure stops every task and starts them all again from the checkpoint."""

    max_restarts: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = 3
    # Seconds before the first restart, doubling each time up to backoff_max.
    backoff: Annotated[Seconds, Field(ge=0)] = 1.0
    backoff_max: Annotated[Seconds, Field(ge=0)] = 30.0
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
    source = _printable(str(path))
    raw = _read_toml(path, source)
    config = parse_config(raw, source=source)
    config = _resolve_paths(config, path.resolve().parent, source)
    _check_semantics(config, source)
    return config


def parse_config(raw: dict[str, Any], source: str = "cluster.toml") -> ClusterConfig:
    """Validate an already parsed TOML document (pure)."""
    _check_raw(raw, (), source)
    try:
        return ClusterConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None


def _read_toml(path: Path, source: str) -> dict[str, Any]:
    # Only a regular file, judged before it is opened: a FIFO would block the open, and
    # /dev/zero would never end.
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{source}: cannot read: {_oneline(exc)}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{source}: is a directory, not a cluster.toml file")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{source}: not a regular file (a cluster.toml must be one)")
    try:
        # O_NONBLOCK: should the path have become a FIFO since, the open must not block.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{source}: not a regular file (a cluster.toml must be one)")
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {_oneline(exc)}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: larger than {MAX_CONFIG_BYTES} bytes: not a cluster.toml")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: cannot read: {_oneline(exc)}") from None
    if not text.strip():
        raise ConfigError(f"{source}: file is empty")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {_oneline(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid TOML: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ConfigError(f"{source}: invalid TOML: {_oneline(exc)}") from None


def _oneline(what: BaseException | str) -> str:
    """A message on one line: whitespace runs (newlines too) made one space, the rest escaped."""
    return _printable(" ".join(str(what).split()))


def _check_raw(value: object, loc: tuple[int | str, ...], source: str) -> None:
    """Before the models see it: no nesting deeper than any config has, and no NUL byte in any
    key or string (no exec, path or environment can hold one)."""
    if len(loc) > MAX_NESTING:
        raise ConfigError(
            f"{source}: {_key_path(loc)}: nested too deeply (more than {MAX_NESTING} levels)"
        )
    if isinstance(value, str):
        if "\0" in value:
            raise ConfigError(f"{source}: {_key_path(loc)}: contains a NUL byte")
    elif isinstance(value, dict):
        for key, item in value.items():
            if "\0" in key:
                raise ConfigError(f"{source}: {_key_path((*loc, key))}: key contains a NUL byte")
            _check_raw(item, (*loc, key), source)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_raw(item, (*loc, i), source)


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
        text = f"{_short_bound(first['msg'])} (got {_show(first['input'])})"
    elif kind == "union_tag_invalid":
        tag = first["input"].get("type")
        text = f"unknown backend type {_show(tag)} (expected 'local' or 'ssh')"
    elif kind == "union_tag_not_found":
        text = "missing 'type' (expected 'local' or 'ssh')"
    else:
        text = _oneline(first["msg"].removeprefix("Value error, "))
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
            # A key of control characters or spaces is shown quoted and escaped.
            name = item if _PLAIN_KEY.fullmatch(item) else _show(item)
            parts.append(("." if parts else "") + name)
    return "".join(parts)


def _expand(p: Path, key: str, source: str) -> Path:
    try:
        return p.expanduser()
    except RuntimeError:  # ~user with no such user (or no home directory)
        raise ConfigError(
            f"{source}: {key}: cannot expand {_printable(str(p))}: "
            "no such user or home directory here"
        ) from None


def _resolve_paths(config: ClusterConfig, base: Path, source: str) -> ClusterConfig:
    def resolve(p: Path | None, key: str) -> Path | None:
        if p is None:
            return None
        p = _expand(p, key, source)
        return p if p.is_absolute() else (base / p).resolve()

    entry = config.entrypoint
    job = config.job.model_copy(
        update={"shared_dir": resolve(config.job.shared_dir, "job.shared_dir")}
    )
    entry = entry.model_copy(
        update={
            "script": resolve(entry.script, "entrypoint.script"),
            "workdir": resolve(entry.workdir, "entrypoint.workdir") or base,
        }
    )
    backend = config.backend
    if isinstance(backend, SshBackend):  # expanded where they are used: only checked here
        for key, p in [
            ("backend.identity_file", backend.identity_file),
            ("backend.known_hosts", backend.known_hosts),
            *[
                (f"backend.hosts[{i}].identity_file", h.identity_file)
                for i, h in enumerate(backend.hosts)
            ],
        ]:
            if p is not None:
                _expand(p, key, source)
    return config.model_copy(update={"job": job, "entrypoint": entry})


def _check_semantics(config: ClusterConfig, source: str) -> None:
    """Rules pydantic cannot express alone; each error still names its key."""
    backend = config.backend
    if isinstance(backend, SshBackend):
        _check_hosts(backend, config.ports.base, source)
    if isinstance(backend, LocalBackend):
        script = config.entrypoint.script
        if script is not None and not script.is_file():
            raise ConfigError(
                f"{source}: entrypoint.script: no such file: {_printable(str(script))}"
            )
        workdir = config.entrypoint.workdir
        if workdir is not None and not workdir.is_dir():
            raise ConfigError(
                f"{source}: entrypoint.workdir: no such directory: {_printable(str(workdir))}"
            )
        _check_local_shared_dir(config.job.shared_dir, source)
    per_host = (
        backend.workers
        if isinstance(backend, LocalBackend)
        else max(h.slots for h in backend.hosts)
    )
    base = config.ports.base
    if base and base + per_host - 1 > MAX_PORT:
        raise ConfigError(
            f"{source}: ports.base: {base} + {per_host} task(s) on a host needs ports up to "
            f"{base + per_host - 1} (> {MAX_PORT})"
        )
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
    _check_exec_size(config.entrypoint, source)


def _check_hosts(backend: SshBackend, base_port: int, source: str) -> None:
    """One entry per host: the same address (hostnames ignore case, IPs in any spelling) and SSH
    port twice is one host; with fixed ports, the same address twice would share task ports."""
    seen: dict[tuple[str, int], int] = {}
    by_address: dict[str, int] = {}
    for i, host in enumerate(backend.hosts):
        address = normalized_address(host.address)
        port = host.port or backend.port or DEFAULT_SSH_PORT
        if (address, port) in seen:
            j = seen[(address, port)]
            other = backend.hosts[j].address
            shown = f"[{host.address}]" if ":" in host.address else host.address
            same = "" if other == host.address else f" {other!r}: the same host"
            raise ConfigError(
                f"{source}: backend.hosts[{i}].address: duplicate host {shown}:{port} "
                f"(same as backend.hosts[{j}]{same})"
            )
        seen[(address, port)] = i
        if base_port and address in by_address:
            j = by_address[address]
            raise ConfigError(
                f"{source}: backend.hosts[{i}].address: {host.address} is also "
                f"backend.hosts[{j}]'s address: with fixed ports (ports.base = {base_port}) "
                "their tasks would share ports; use one entry with more slots, or ports.base = 0"
            )
        by_address.setdefault(address, i)


def _check_local_shared_dir(shared: Path, source: str) -> None:
    """The local backend creates shared_dir here: it, or its nearest existing parent, must be a
    directory (the preflight would only say it does not exist)."""
    try:
        existing = shared
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if existing.is_dir():
            return
    except OSError:
        return  # unreadable here: the preflight will say what is wrong
    raise ConfigError(f"{source}: job.shared_dir: not a directory: {_printable(str(existing))}")


def _check_exec_size(entry: EntrypointSection, source: str) -> None:
    """Every arg and variable must fit in one exec string, and all of them in the exec budget:
    otherwise the trainer's exec fails on the host (E2BIG)."""
    total = 0
    for i, arg in enumerate(entry.args):
        size = len(arg.encode()) + 1
        if size > MAX_ARG_STRLEN:
            raise ConfigError(
                f"{source}: entrypoint.args[{i}]: {size} bytes; one argument must fit in "
                f"{MAX_ARG_STRLEN} bytes (the kernel's MAX_ARG_STRLEN)"
            )
        total += size + 8
    for name, value in entry.env.items():
        if not name or "=" in name or not name.isprintable():
            raise ConfigError(f"{source}: entrypoint.env: invalid variable name {_show(name)}")
        size = len(name.encode()) + 1 + len(value.encode()) + 1
        if size > MAX_ARG_STRLEN:
            raise ConfigError(
                f"{source}: {_key_path(('entrypoint', 'env', name))}: {size} bytes as "
                f"NAME=value; one variable must fit in {MAX_ARG_STRLEN} bytes "
                "(the kernel's MAX_ARG_STRLEN)"
            )
        total += size + 8
    if total > EXEC_BUDGET:
        raise ConfigError(
            f"{source}: entrypoint.env: with entrypoint.args, {total} bytes; together they must "
            f"stay under {EXEC_BUDGET} bytes (the exec size limit, shared with the host's own "
            "environment)"
        )
