"""How a backend names a running task to the rest of orchestrate."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskHandle:
    """A running task as its backend names it: `ref` is the backend's own (opaque to everything
    outside it, stored as it is, e.g. an agent's process on its host), so that nothing else
    depends on how a backend finds, observes or stops a task."""

    task_index: int
    host_index: int
    ref: str
