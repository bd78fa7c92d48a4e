"""Typed job and task states. The same values are written by agents and read by the coordinator."""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    PENDING = "pending"  # planned, no agent yet
    STARTING = "starting"  # agent started, trainer not yet training
    RUNNING = "running"  # trainer alive
    SUCCEEDED = "succeeded"  # trainer exited 0
    FAILED = "failed"  # trainer exited non-zero
    STOPPED = "stopped"  # stopped on request (stop, or the group was stopped)
    LOST = "lost"  # agent vanished or went silent without a final status
    UNREACHABLE = "unreachable"  # a stop could not reach its host: not confirmed stopped

    def is_terminal(self) -> bool:
        return self in _TERMINAL_TASK

    def is_running(self) -> bool:
        return self in (TaskState.STARTING, TaskState.RUNNING)


_TERMINAL_TASK = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.LOST}
)


class JobState(StrEnum):
    PENDING = "pending"  # recorded, nothing started
    QUEUED = "queued"  # waiting for GPUs, slots or hosts that another job or program holds
    LAUNCHING = "launching"  # preflight / starting agents
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    def is_terminal(self) -> bool:
        return self in _TERMINAL_JOB


_TERMINAL_JOB = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})
