"""Overrides without editing cluster.toml (a sweep, a CI pipeline): `--set KEY.PATH=VALUE`
onto the parsed file, `--env K=V` and `--env-file FILE` (dotenv) into `[entrypoint] env`.
Pure but for reading the env file; the result is validated as the file is, so a bad value is
one line naming its key path.

A value is read as a TOML value (`4`, `2.5`, `true`, `"text"`, `["a", "b"]`), else taken as a
string as typed (`--set job.name=sweep-3`)."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.values import oneline, printable
from orchestrator.errors import ConfigError

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Overrides:
    """What a launch changes of its cluster.toml: key paths set, and environment variables."""

    sets: tuple[tuple[str, str], ...] = ()  # (key path, value as typed)
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # values may be secrets

    def __bool__(self) -> bool:
        return bool(self.sets or self.env)

    def to_json(self) -> str:
        return json.dumps({"sets": self.sets, "env": self.env})

    @classmethod
    def from_json(cls, text: str) -> Overrides:
        data = json.loads(text)
        return cls(tuple(map(tuple, data["sets"])), tuple(map(tuple, data["env"])))

    def described(self) -> str:
        """What the job's record says of them: env values never shown."""
        said = [f"--set {path}={value}" for path, value in self.sets]
        said += [f"--env {name}=<redacted>" for name, _ in self.env]
        return ", ".join(said)


def parse(sets: list[str], env: list[str], env_file: Path | None) -> Overrides:
    """The command line's overrides; ConfigError (one line) naming the one that is wrong."""
    parsed_sets = []
    for text in sets:
        path, sep, value = text.partition("=")
        keys = path.split(".")
        if not sep or not all(KEY.fullmatch(k) for k in keys):
            raise ConfigError(
                f"--set {printable(text)}: expected KEY.PATH=VALUE (e.g. backend.workers=4)"
            )
        parsed_sets.append((path, value))
    pairs = read_env_file(env_file) if env_file is not None else []
    for text in env:
        name, sep, value = text.partition("=")
        if not sep or not ENV_NAME.fullmatch(name):
            raise ConfigError(f"--env {printable(text)}: expected NAME=VALUE")
        pairs.append((name, value))
    return Overrides(tuple(parsed_sets), tuple(pairs))


def read_env_file(path: Path) -> list[tuple[str, str]]:
    """A dotenv file: `NAME=VALUE` lines (`export ` allowed, `#` comments, blank lines, the
    value optionally in single or double quotes)."""
    source = printable(str(path))
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--env-file {source}: cannot read: {oneline(exc)}") from None
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").lstrip()
        name, sep, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not ENV_NAME.fullmatch(name):
            raise ConfigError(f"--env-file {source}:{number}: expected NAME=VALUE")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        pairs.append((name, value))
    return pairs


def apply(raw: dict[str, Any], overrides: Overrides) -> dict[str, Any]:
    """The parsed cluster.toml with the overrides applied (a copy; the input is untouched)."""
    out = copy.deepcopy(raw)
    for path, value in overrides.sets:
        keys = path.split(".")
        table = out
        for depth, key in enumerate(keys[:-1]):
            nested = table.setdefault(key, {})
            if not isinstance(nested, dict):
                where = ".".join(keys[: depth + 1])
                raise ConfigError(f"--set {printable(path)}: {where} is a value, not a table")
            table = nested
        table[keys[-1]] = _value(value)
    if overrides.env:
        entrypoint = out.setdefault("entrypoint", {})
        if not isinstance(entrypoint, dict):
            raise ConfigError("--env: entrypoint is a value, not a table")
        env = entrypoint.setdefault("env", {})
        if not isinstance(env, dict):
            raise ConfigError("--env: entrypoint.env is a value, not a table")
        env.update(dict(overrides.env))
    return out


def _value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def queue_sets(wait: bool, timeout: str | None) -> list[str]:
    """`launch --wait-for-resources [--queue-timeout S]` as the `--set`s they stand for."""
    sets = ["scheduling.wait_for_resources=true"] if wait else []
    if timeout is not None:
        sets.append(f"scheduling.queue_timeout={timeout}")
    return sets
