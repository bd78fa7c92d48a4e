"""An agent that is gone without a word (its status never says it ended) often said why on its
way out: a Python error while it started (a broken worker copy, an interpreter without the
standard library it needs), a traceback in its own log, `tasks/N/agent.log` on the host. The
cause of the failure names the error, so the user does not have to find the file."""

from __future__ import annotations

import dataclasses

from orchestrator.backends import Backend
from orchestrator.errors import OrchestrateError
from orchestrator.supervision.attempt import Attempt
from orchestrator.supervision.observations import Decision, FailureKind
from worker.host_watch import READ_LIMIT
from worker.spec import JobLayout

MAX_SHOWN = 200  # characters of the line in the cause


def last_words(log: bytes) -> str:
    """The error of the log's last Python traceback (its last line: `SyntaxError: ...`),
    printable and cut short; "" when the log holds none (an agent killed without a word says
    nothing). What a trainer may have written there is text to show, never to act on."""
    text = log.decode(errors="replace")
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return ""
    lines = [ln.strip() for ln in text[start:].splitlines()[1:] if ln.strip()]
    if not lines:
        return ""
    return "".join(c if c.isprintable() else "?" for c in lines[-1][:MAX_SHOWN])


def name_agent_errors(
    backend: Backend, layout: JobLayout, attempt: Attempt, decision: Decision
) -> Decision:
    """For tasks whose agent is gone: the cause with each one's last logged line."""
    if decision.kind != FailureKind.LOST:
        return decision
    said = []
    for index in decision.tasks:
        host = attempt.plan.tasks[index].host_index
        if attempt.watch.failing(host):  # not answering: nothing to read there
            continue
        path = str(layout.task_dir(index) / "agent.log")
        try:
            [log] = backend.observe(host, None, [(path, 0)], timeout=5.0).files
        except (OrchestrateError, ValueError):
            continue
        if not log or len(log) >= READ_LIMIT:  # none, or only its start could be read
            continue
        if words := last_words(log):
            said.append(f"worker-{index}'s agent said: {words}")
    if not said:
        return decision
    return dataclasses.replace(decision, cause=f"{decision.cause}; {'; '.join(said)}")
