"""Reading cluster.toml: the file itself, the models, paths resolved, then the rules.

Every error becomes one `ConfigError` line naming the file and the TOML key path, e.g.
``cluster.toml: backend.workers: must be >= 1 (got 0)``.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from orchestrator.config.model import ClusterConfig, SshBackend
from orchestrator.config.overrides import Overrides
from orchestrator.config.overrides import apply as apply_overrides
from orchestrator.config.registry import ensure_section, section_types
from orchestrator.config.rules import check_semantics
from orchestrator.config.values import (
    MAX_CONFIG_BYTES,
    MAX_NESTING,
    key_path,
    oneline,
    printable,
    show,
)
from orchestrator.errors import ConfigError


def load_config(path: str | Path, overrides: Overrides | None = None) -> ClusterConfig:
    """Read, parse and validate cluster.toml, with the command line's `overrides` applied;
    relative paths are resolved against its directory."""
    path = Path(path)
    source = printable(str(path))
    raw = _read_toml(path, source)
    if overrides:
        raw = apply_overrides(raw, overrides)
        source += " with its overrides"
    config = parse_config(raw, source=source)
    config = resolve_paths(config, path.resolve().parent, source)
    check_semantics(config, source)
    return config


def parse_config(raw: dict[str, Any], source: str = "cluster.toml") -> ClusterConfig:
    """Validate an already parsed TOML document (pure)."""
    _check_raw(raw, (), source)
    backend = raw.get("backend")
    ensure_section(backend.get("type") if isinstance(backend, dict) else None)
    try:
        return ClusterConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(f"{source}: {line}" for line in _describe(exc))) from None


def parse_stored_config(text: str) -> ClusterConfig:
    """A job's config as its record holds it (validated when the job was registered)."""
    backend = json.loads(text).get("backend")
    ensure_section(backend.get("type") if isinstance(backend, dict) else None)
    return ClusterConfig.model_validate_json(text)


def _read_toml(path: Path, source: str) -> dict[str, Any]:
    # Only a regular file, judged before it is opened: a FIFO would block the open, and
    # /dev/zero would never end.
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{source}: cannot read: {oneline(exc)}") from None
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
        raise ConfigError(f"{source}: cannot read: {oneline(exc)}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: larger than {MAX_CONFIG_BYTES} bytes: not a cluster.toml")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: cannot read: {oneline(exc)}") from None
    if not text.strip():
        raise ConfigError(f"{source}: file is empty")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {oneline(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid TOML: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ConfigError(f"{source}: invalid TOML: {oneline(exc)}") from None


def _check_raw(value: object, loc: tuple[int | str, ...], source: str) -> None:
    """Before the models see it: no nesting deeper than any config has, and no NUL byte in any
    key or string (no exec, path or environment can hold one)."""
    if len(loc) > MAX_NESTING:
        raise ConfigError(
            f"{source}: {key_path(loc)}: nested too deeply (more than {MAX_NESTING} levels)"
        )
    if isinstance(value, str):
        if "\0" in value:
            raise ConfigError(f"{source}: {key_path(loc)}: contains a NUL byte")
    elif isinstance(value, dict):
        for key, item in value.items():
            if "\0" in key:
                raise ConfigError(f"{source}: {key_path((*loc, key))}: key contains a NUL byte")
            _check_raw(item, (*loc, key), source)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_raw(item, (*loc, i), source)


MAX_PROBLEMS = 20  # lines of problems shown for one file


def _describe(exc: ValidationError) -> list[str]:
    """One line per problem, each naming its key path (the first problem of each key)."""
    lines: dict[str, str] = {}
    for error in exc.errors():
        loc = error["loc"]
        if loc[:1] == ("backend",) and len(loc) > 1 and loc[1] in section_types():
            loc = loc[:1] + loc[2:]  # the union's tag ('local', 'ssh', ...) is not a key
        key = key_path(loc)
        if key not in lines:
            text = _problem(error)
            lines[key] = f"{key}: {text}" if key else text
    shown = list(lines.values())
    if len(shown) > MAX_PROBLEMS:  # a generated file can hold thousands: the first say enough
        rest = len(shown) - MAX_PROBLEMS
        shown = [*shown[:MAX_PROBLEMS], f"... and {rest} more problem(s) like these"]
    return shown


def _problem(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key" + _UNKNOWN_KEY_HINTS.get(tuple(error["loc"]), "")
    if kind == "missing":
        return "required key is missing"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return f"{_short_bound(error['msg'])} (got {show(error['input'])})"
    if kind == "union_tag_invalid":
        tag = error["input"].get("type")
        return f"unknown backend type {show(tag)} (expected {_one_of(section_types())})"
    if kind == "union_tag_not_found":
        return f"missing 'type' (expected {_one_of(section_types())})"
    return oneline(error["msg"].removeprefix("Value error, "))


def _one_of(names: tuple[str, ...]) -> str:
    quoted = [repr(n) for n in names]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else quoted[0]


# Keys a user may well expect where they are not: what to write instead.
_UNKNOWN_KEY_HINTS: dict[tuple[int | str, ...], str] = {
    ("backend", "slurm", "gpus_per_task"): (
        " on the Slurm backend: Slurm assigns GPUs itself; ask for them with backend.gres "
        '(e.g. "gpu:4") and backend.tasks_per_node'
    ),
}


def _short_bound(msg: str) -> str:
    return (
        msg.replace("Input should be ", "must be ")
        .replace("greater than or equal to", ">=")
        .replace("less than or equal to", "<=")
        .replace("greater than", ">")
        .replace("less than", "<")
    )


def _expand(p: Path, key: str, source: str) -> Path:
    try:
        return p.expanduser()
    except RuntimeError:  # ~user with no such user (or no home directory)
        raise ConfigError(
            f"{source}: {key}: cannot expand {printable(str(p))}: "
            "no such user or home directory here"
        ) from None


def resolve_paths(config: ClusterConfig, base: Path, source: str) -> ClusterConfig:
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
    notify = config.notify
    if notify.command and "/" in notify.command[0]:  # a bare name stays a PATH lookup
        # Joined, not resolved: a symlink's name may be what the program goes by (argv[0]).
        program = _expand(Path(notify.command[0]), "notify.command[0]", source)
        argv = [str(program if program.is_absolute() else base / program), *notify.command[1:]]
        notify = notify.model_copy(update={"command": argv})
    return config.model_copy(update={"job": job, "entrypoint": entry, "notify": notify})
