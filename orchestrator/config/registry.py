"""Which `[backend]` sections cluster.toml may hold: the built-in ones, and those a plug-in
registers (`register_section`, called by `orchestrator.backends.register_backend`).

A plug-in installed as a package names its module under the entry-point group
`orchestrate.backends` (the name is its `type`); the first cluster.toml or stored job of that
type imports it, and the import registers it. The built-in sections are cluster.toml's own,
registered here."""

from __future__ import annotations

import threading
from importlib.metadata import entry_points
from typing import Annotated, Any, Union, get_args

from pydantic import Field
from pydantic.fields import FieldInfo

from orchestrator.config.base import BackendSection
from orchestrator.config.model import ClusterConfig, LocalBackend, SlurmBackend, SshBackend
from orchestrator.errors import ConfigError

ENTRY_POINT_GROUP = "orchestrate.backends"

_sections: dict[str, type[BackendSection]] = {}
_lock = threading.Lock()


def section_type(section: type[BackendSection]) -> str:
    """The `type` a section's model answers to (its `type: Literal[...]`)."""
    tags = get_args(section.model_fields["type"].annotation)
    if len(tags) != 1 or not isinstance(tags[0], str):
        raise TypeError(f"{section.__name__}.type must be Literal['<one name>']")
    return str(tags[0])


def register_section(section: type[BackendSection]) -> None:
    """cluster.toml's `[backend]` may from now on be this section (by its `type`)."""
    tag = section_type(section)
    with _lock:
        known = _sections.get(tag)
        if known is section:
            return
        if known is not None:
            raise ValueError(f"backend type {tag!r} is registered already ({known.__name__})")
        _sections[tag] = section
        # ClusterConfig.backend is a union tagged by `type` of every section registered.
        union: Any = Union[tuple(_sections.values())]  # noqa: UP007 (built from a tuple)
        tagged: Any = Annotated[union, Field(discriminator="type")]
        ClusterConfig.__pydantic_fields__["backend"] = FieldInfo.from_annotation(tagged)
        ClusterConfig.model_rebuild(force=True)


def section_types() -> tuple[str, ...]:
    return tuple(_sections)


def ensure_section(tag: object) -> None:
    """Make `tag` a known backend type if an installed plug-in provides it (else nothing: the
    validation then names the unknown type)."""
    if not isinstance(tag, str) or tag in _sections:
        return
    for entry in entry_points(group=ENTRY_POINT_GROUP, name=tag):
        try:
            entry.load()  # its import registers it
        except Exception as exc:  # a broken plug-in is the user's to fix: say which
            raise ConfigError(
                f"backend.type: the plug-in for {tag!r} ({entry.value}) failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if tag not in _sections:
            raise ConfigError(
                f"backend.type: the plug-in for {tag!r} ({entry.value}) registered no section"
            )
        return


for _builtin in (LocalBackend, SshBackend, SlurmBackend):
    register_section(_builtin)
