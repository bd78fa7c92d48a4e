"""What supervision decides on: each task's observation (from its agent's report and the
coordinator's own clock) and the group's decision. Plain values, shared by the rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.state.states import TaskState
from worker.spec import Phase, StepSignal


class Verdict(StrEnum):
    CONTINUE = "continue"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class FailureKind(StrEnum):
    EXITED = "exited"  # a trainer exited non-zero
    LOST = "lost"  # an agent vanished without a final status
    STOPPED = "stopped"  # a task was stopped by someone else
    SILENT = "silent"  # heartbeats stopped (agent hung, host unreachable)
    HUNG = "hung"  # heartbeats go on, training steps do not (watchdog)
    STARTUP = "startup"  # the group missed its startup deadline
    LAUNCH = "launch"  # a relaunch could not start (a host unfit, an agent that failed, ...)
    HOST_LOST = "host_lost"  # a host's reads failed for host_timeout
    HOST_WAIT = "host_wait"  # a lost host stayed away past host_wait, nothing could replace it
    ALLOCATION_ENDED = "allocation_ended"  # the Slurm allocation is over: nowhere to restart
    REGROW = "regrow"  # a dropped host is back: restart at full width (not a failure)


@dataclass(frozen=True)
class TaskObservation:
    index: int
    state: TaskState
    exit_code: int | None = None
    heartbeat_age: float | None = None  # seconds since the heartbeat last advanced
    progress_age: float | None = None  # seconds since the training step last advanced
    phase: Phase = Phase.NONE
    reached_first_step: bool = False
    is_chief: bool = False
    step_signal: StepSignal = StepSignal.NONE
    # The trainer runs under the bootstrap, so its phases are reported whatever the script.
    instrumented: bool = True


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    cause: str = ""
    tasks: tuple[int, ...] = ()
    kind: FailureKind | None = None
    exit_code: int | None = None
    hosts: tuple[int, ...] = ()  # HOST_LOST: the lost hosts; REGROW: those back


CONTINUE = Decision(Verdict.CONTINUE)


def failure(
    kind: FailureKind,
    cause: str,
    tasks: tuple[int, ...] = (),
    code: int | None = None,
    hosts: tuple[int, ...] = (),
) -> Decision:
    return Decision(Verdict.FAILED, cause, tasks, kind, code, hosts)


def task_names(indices: Sequence[int]) -> str:
    return ", ".join(f"worker-{i}" for i in indices)
