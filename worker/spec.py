"""The contract between coordinator and agent: the task spec, the job directory layout and the
status an agent writes. Versioned; pure pydantic, no TensorFlow."""

from __future__ import annotations

import json
import os
import tempfile
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict

SPEC_VERSION = 1

# Environment a trainer sees, besides TF_CONFIG and the user's env.
ENV_JOB_DIR = "ORCHESTRATE_JOB_DIR"
ENV_TASK_DIR = "ORCHESTRATE_TASK_DIR"
ENV_PROGRESS_FILE = "ORCHESTRATE_PROGRESS_FILE"
ENV_JOB_ID = "ORCHESTRATE_JOB_ID"
ENV_ATTEMPT = "ORCHESTRATE_ATTEMPT"


class JobLayout:
    """Where a job's files live on the shared directory (POSIX paths: they may be remote)."""

    def __init__(self, shared_dir: str | PurePosixPath, job_id: str) -> None:
        self.root = PurePosixPath(shared_dir) / job_id

    def task_dir(self, index: int) -> PurePosixPath:
        return self.root / "tasks" / str(index)

    def spec_path(self, index: int) -> PurePosixPath:
        return self.task_dir(index) / "spec.json"

    def status_path(self, index: int) -> PurePosixPath:
        return self.task_dir(index) / "status.json"

    def progress_path(self, index: int) -> PurePosixPath:
        return self.task_dir(index) / "progress.json"

    def log_path(self, index: int) -> PurePosixPath:
        return self.root / "logs" / f"worker-{index}.log"

    @property
    def backup_dir(self) -> PurePosixPath:
        return self.root / "checkpoints" / "backup"

    @property
    def model_dir(self) -> PurePosixPath:
        return self.root / "model"

    @property
    def tmp_dir(self) -> PurePosixPath:
        return self.root / "tmp"


class WorkerSpec(BaseModel):
    """Everything an agent needs to run one task. Written by the coordinator, mode 0600."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = SPEC_VERSION
    job_id: str
    attempt: int = 0
    task_index: int
    task_type: str = "worker"
    host_label: str
    tf_config: dict[str, Any]
    argv: list[str]
    env: dict[str, str] = {}
    workdir: str
    shared_dir: str
    heartbeat_interval: float = 1.0
    stop_grace: float = 10.0
    preemption_exit_code: int = 42

    @property
    def layout(self) -> JobLayout:
        return JobLayout(self.shared_dir, self.job_id)


class AgentState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    def is_terminal(self) -> bool:
        return self in (AgentState.SUCCEEDED, AgentState.FAILED, AgentState.STOPPED)


class Phase(StrEnum):
    """How far a trainer got, as the runtime reports it."""

    NONE = ""  # nothing reported (not started, or not using worker.runtime)
    STARTING = "starting"  # the runtime read TF_CONFIG
    JOINING = "joining"  # creating the strategy: waiting for every peer to connect
    JOINED = "joined"  # the strategy exists: every peer connected
    TRAINING = "training"  # inside model.fit
    FINISHED = "finished"  # model.fit returned (evaluation, saving)


class Progress(BaseModel):
    """Training progress, written by the runtime and relayed by the agent."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    phase: Phase = Phase.NONE
    epoch: int = 0  # epochs started, 1-based; 0 before the first
    step: int = 0  # optimizer steps done in this attempt
    loss: float | None = None
    steps_per_sec: float | None = None
    initial_epoch: int = 0  # first epoch of this attempt (> 0 after a resume)
    metrics: dict[str, float] = {}


class TaskStatus(BaseModel):
    """What an agent reports: rewritten atomically every heartbeat."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    state: AgentState
    seq: int  # grows with every heartbeat: the coordinator watches it with its own clock
    attempt: int = 0
    agent_pid: int
    trainer_pid: int | None = None
    exit_code: int | None = None
    progress: Progress = Progress()
    message: str = ""


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write a file so a reader never sees half of it (temp file in the same dir + rename)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any, mode: int = 0o644) -> None:
    write_bytes_atomic(path, json.dumps(data, separators=(",", ":")).encode(), mode)
