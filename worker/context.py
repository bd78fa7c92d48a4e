"""Who a training process is in the cluster (from TF_CONFIG and the agent's environment) and
where its files go. No TensorFlow: worker.runtime re-exports all of it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from worker import progress as _progress
from worker.spec import ENV_JOB_DIR, ENV_PROGRESS_FILE, ENV_TASK_DIR, Phase


@dataclass(frozen=True)
class TaskContext:
    """Who this process is in the cluster and where its files go."""

    task_type: str
    task_index: int
    num_workers: int
    job_dir: Path
    task_dir: Path
    progress_file: Path | None

    @property
    def is_chief(self) -> bool:
        # With no `chief` job in the cluster, worker 0 is chief (MWMS convention).
        return self.task_type == "chief" or (self.task_type == "worker" and self.task_index == 0)

    @property
    def backup_dir(self) -> Path:
        return self.job_dir / "checkpoints" / "backup"

    @property
    def model_dir(self) -> Path:
        return self.job_dir / "model"


def task_context(default_dir: str | os.PathLike[str] = "orchestrate-run") -> TaskContext:
    """Read TF_CONFIG and the agent's environment; outside orchestrate, a single local task."""
    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    cluster = tf_config.get("cluster", {})
    task = tf_config.get("task", {})
    num_workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
    job_dir = Path(os.environ.get(ENV_JOB_DIR, default_dir))
    task_index = int(task.get("index", 0))
    task_dir = Path(os.environ.get(ENV_TASK_DIR, job_dir / "tasks" / str(task_index)))
    progress = os.environ.get(ENV_PROGRESS_FILE)
    ctx = TaskContext(
        task_type=task.get("type", "worker"),
        task_index=task_index,
        num_workers=max(num_workers, 1),
        job_dir=job_dir,
        task_dir=task_dir,
        progress_file=Path(progress) if progress else None,
    )  # STARTING was reported when this module was imported
    return ctx


def report_phase(ctx: TaskContext, phase: Phase) -> None:
    """Tell the agent how far this task got (outside model.fit, where the callback reports)."""
    _progress.shared().phase(phase)
