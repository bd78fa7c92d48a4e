"""Before a hung or late group is stopped, keep the evidence: every task's Python stacks (all
threads) in its task directory, an event per file, and the cause naming where each task's own
code was, the named tasks first (`...; worker-1 in train.py:57 wait_for_batch`), and which
named task gave none (stopped, or stuck outside Python)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from orchestrator.backends import Backend
from orchestrator.config import ClusterConfig
from orchestrator.errors import OrchestrateError
from orchestrator.supervision.attempt import Attempt
from orchestrator.supervision.observations import Decision, FailureKind, task_names
from worker.spec import JobLayout
from worker.stacks import done_path, stacks_path, where

WAIT = 8.0  # seconds the stop waits for the stacks at most
MAX_DUMP = 1 << 20  # bytes of a dump read back (a trainer may have thousands of threads)
WORTH_IT = (FailureKind.HUNG, FailureKind.STARTUP)


def script_roots(config: ClusterConfig) -> list[str]:
    """Where the user's own code lives: the script's directory; for a module, the working
    directory (where `python -m` finds it)."""
    entry = config.entrypoint
    if entry.script is not None:
        return [str(entry.script.parent)]
    return [str(entry.workdir)] if entry.workdir is not None else []


def take_stacks(
    backend: Backend,
    layout: JobLayout,
    config: ClusterConfig,
    attempt: Attempt,
    decision: Decision,
    event: Callable[[str, str], None],
) -> Decision:
    """Ask each agent for its trainer's stacks, wait for them (at most WAIT), record where they
    are, and return the decision with the named tasks' innermost frames in its cause."""
    if decision.kind not in WORTH_IT:
        return decision
    asked = []
    for agent in attempt.agents:
        try:
            if not backend.ask_stacks(agent):
                continue
        except OrchestrateError:
            continue
        asked.append(agent)
    dumps: dict[int, str] = {}
    deadline = time.monotonic() + WAIT
    while asked and time.monotonic() < deadline:
        time.sleep(0.2)
        for agent in list(asked):
            task_dir = layout.task_dir(agent.task_index)
            transport = backend.transport(agent.host_index)
            try:
                done = transport.read_file(str(done_path(task_dir, attempt.number)))
                if not done:
                    continue
                text = transport.read_file(str(stacks_path(task_dir, attempt.number))) or b""
            except OrchestrateError:
                continue
            asked.remove(agent)
            dumps[agent.task_index] = text[:MAX_DUMP].decode(errors="replace")
            path = stacks_path(task_dir, attempt.number)
            event("stacks", f"worker-{agent.task_index}: {_said(text, str(path))}")
    roots = script_roots(config)
    # What a trainer writes is not trusted: a dump's names are cut short and made printable.
    places = {i: _plain(p) if (p := where(text, roots)) else None for i, text in dumps.items()}
    order = [*decision.tasks, *sorted(i for i in places if i not in decision.tasks)]
    found = [f"worker-{i} in {p}" for i in order if (p := places.get(i)) is not None]
    silent = [i for i in decision.tasks if places.get(i) is None]  # stopped: no dump at all
    parts = ([", ".join(found)] if found else []) + (
        [f"no stacks from {task_names(silent)}"] if silent and found else []
    )
    if not parts:
        return decision
    return dataclasses.replace(decision, cause=f"{decision.cause}; {'; '.join(parts)}")


def _said(dump: bytes, path: str) -> str:
    """The stacks event, in our words: the done mark and the dump are in a directory the
    trainer may write, so neither's text is ever the message (the task's log has the agent's
    own line)."""
    if not dump.strip():
        return "no Python stacks (the task's log says why)"
    how = " (py-spy)" if dump.startswith(b"Process ") else ""  # py-spy's dump, not faulthandler's
    return f"Python stacks of every thread{how} before the stop: {path}"


def _plain(text: str, limit: int = 200) -> str:
    return "".join(c if c.isprintable() else "?" for c in text[:limit])
