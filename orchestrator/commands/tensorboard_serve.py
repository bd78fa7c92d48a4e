"""`orchestrate tensorboard`: find a job's TensorBoard runs and become TensorBoard on them."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path
from typing import NoReturn

from orchestrator.errors import UsageError
from orchestrator.state.paths import collected_dir
from orchestrator.state.store import JobRecord


def logdir_of(job: JobRecord) -> Path:
    """The job's TensorBoard directory: on the shared directory, else its collected copy."""
    logdir = Path(job.job_dir) / "tensorboard"
    if not logdir.is_dir():  # the shared directory is not mounted here: use collected copies
        logdir = collected_dir(job.id) / "tensorboard"
    if not logdir.is_dir():
        raise UsageError(
            f"job {job.id} has no TensorBoard logs here (tried {job.job_dir}/tensorboard)"
        )
    return logdir


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def require_tensorboard() -> None:
    """A coordinator installed without the `tensorboard` extra says so, in one line."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UsageError(
            "TensorBoard is not installed for this Python: pip install 'orchestrate[tensorboard]'"
        )


def become_tensorboard(logdir: Path, host: str, port: int) -> NoReturn:
    """Become TensorBoard: a signal to this process (Ctrl-C, a stop) then reaches it directly,
    and no child is left behind."""
    sys.stdout.flush()
    argv = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
            "--host", host, "--port", str(port)]  # fmt: skip
    os.execv(sys.executable, argv)
