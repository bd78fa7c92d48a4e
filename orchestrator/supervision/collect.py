"""Collecting a job's results: per-task logs, the final model, TensorBoard runs and metrics,
from the shared directory to this machine."""

from __future__ import annotations

import os
import posixpath
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from orchestrator.backends import Backend
from orchestrator.errors import UsageError
from orchestrator.state.paths import report_png


def collect_job(backend: Backend, job_root: object, dest: Path) -> int:
    """Pull per-task logs, the final model and metrics from the shared directory."""
    transport = backend.transport(0)
    root = str(job_root)
    count = transport.get_tree(f"{root}/logs", dest / "logs")
    count += transport.get_tree(f"{root}/model", dest / "model")
    count += transport.get_tree(f"{root}/tensorboard", dest / "tensorboard")
    metrics = transport.read_file(f"{root}/metrics.json")
    if metrics is not None:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "metrics.json").write_bytes(metrics)
        count += 1
    return count


def collect_checkpoint(backend: Backend, prefix: str, dest: Path) -> int:
    """The directory holding a checkpoint (its index, its data shards, its `checkpoint` file:
    what TensorFlow restores from), into dest/checkpoint/; how many files were copied."""
    return backend.transport(0).get_tree(posixpath.dirname(prefix), dest / "checkpoint")


def check_destination(target: Path) -> None:
    """collect writes into target: say so in one line when it cannot, before any copy."""
    if target.exists() and not target.is_dir():
        raise UsageError(f"--dest {target} is not a directory")
    existing = target if target.exists() else next(p for p in target.parents if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--dest {target}: {existing} is not writable")
    probe = existing / f".orchestrate-write-test-{os.getpid()}"
    try:  # root passes os.access on a read-only file system: try a write
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--dest {target}: cannot write in {existing}: {exc.strerror}") from None


def draw_report(job_id: str, say: Callable[[str], None], event: Callable[[str, str], None]) -> None:
    """The run report of an ended job. It draws with matplotlib: in a process of its own, so
    the supervisor (resident for the whole job) never carries matplotlib's memory."""
    report = subprocess.run(
        [sys.executable, "-m", "orchestrator", "report", job_id, "--json"],
        capture_output=True,
        timeout=300,
        check=False,
    )
    if report.returncode == 0:  # no chart where matplotlib is not installed: the JSON
        png = report_png(job_id)
        say(f"run report: {png if png.exists() else png.with_name('report.json')}")
    else:
        event("report_failed", report.stderr.decode(errors="replace").strip()[-300:])
