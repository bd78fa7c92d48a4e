"""Where the coordinator keeps its own files (not the shared directory: see worker.spec.JobLayout).

$ORCHESTRATE_HOME/state.db                    the store
$ORCHESTRATE_HOME/jobs/JOB/logs/worker-N.log  streamed copies of every task's output
$ORCHESTRATE_HOME/jobs/JOB/supervisor.log     a detached supervisor's own output
$ORCHESTRATE_HOME/jobs/JOB/collected/         logs, model, metrics, TensorBoard at the end
$ORCHESTRATE_HOME/jobs/JOB/report.json, .png  the run report
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_HOME = "ORCHESTRATE_HOME"


def orchestrate_home() -> Path:
    env = os.environ.get(ENV_HOME)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_state_dir  # imported lazily: only when no env is set

    return Path(user_state_dir("orchestrate"))


def state_db() -> Path:
    return orchestrate_home() / "state.db"


def job_home(job_id: str) -> Path:
    """The coordinator's own directory for a job."""
    return orchestrate_home() / "jobs" / job_id


def log_copies_dir(job_id: str) -> Path:
    return job_home(job_id) / "logs"


def supervisor_log(job_id: str) -> Path:
    return job_home(job_id) / "supervisor.log"


def collected_dir(job_id: str) -> Path:
    return job_home(job_id) / "collected"


def report_json(job_id: str) -> Path:
    return job_home(job_id) / "report.json"


def report_png(job_id: str) -> Path:
    return job_home(job_id) / "report.png"
