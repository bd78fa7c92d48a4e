"""A configuration given as a dict (`api.launch({...})`) becomes a cluster.toml of its own, so
that the job's later supervisors read it again as they read any file (and refuse it changed).

It is validated first as the file would be, its relative paths resolved against the current
directory; what is written is the validated configuration, every path absolute, in a private
directory, named by its content."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.config.load import parse_config, resolve_paths
from orchestrator.config.rules import check_semantics
from orchestrator.errors import ConfigError

SOURCE = "the configuration given"


def config_file_from(raw: Mapping[str, Any], directory: Path) -> Path:
    """Validate `raw`, write it to `directory` as TOML (0600) and return the file's path.
    ConfigError, one line naming the key, when it does not validate."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{SOURCE}: expected a dict of sections, got {type(raw).__name__}")
    try:  # plain values, a copy: a path may be a Path
        plain = json.loads(json.dumps(raw, default=_plain))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{SOURCE}: {exc}") from None
    config = resolve_paths(parse_config(plain, source=SOURCE), Path.cwd(), SOURCE)
    check_semantics(config, SOURCE)
    dumped = config.model_dump(mode="json", exclude_none=True)
    text = "".join(
        f"[{_key(section)}]\n" + "".join(f"{_key(k)} = {_value(v)}\n" for k, v in body.items())
        for section, body in dumped.items()
    )
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.toml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def _plain(value: object) -> str:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"a {type(value).__name__} is not a TOML value")


def _key(key: str) -> str:
    return _string(key)


def _string(text: str) -> str:
    # JSON's escapes are TOML's; TOML also wants DEL escaped.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    items = ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items())
    return "{" + items + "}"
