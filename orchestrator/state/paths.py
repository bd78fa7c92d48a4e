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

_user_umask = -1  # the umask this process was started with, once make_files_private ran


def make_files_private() -> None:
    """What the coordinator writes (the store, log copies, reports) is the user's alone: umask
    077 for this process. Processes started for the user (agents, trainers, a detached
    supervisor) get the user's own umask back (user_umask)."""
    global _user_umask
    previous = os.umask(0o077)
    if _user_umask == -1:
        _user_umask = previous


def user_umask() -> int:
    """The umask for processes we start for the user (-1: leave it as it is)."""
    return _user_umask


def ensure_home() -> Path:
    """ORCHESTRATE_HOME, made private (0700). An existing directory is made private only when
    it is ours and not a shared one such as /tmp (sticky): there the job directories and the
    store are private themselves."""
    home = orchestrate_home()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = home.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o077 and not info.st_mode & 0o1000:
        home.chmod(0o700)
    (home / "jobs").mkdir(mode=0o700, exist_ok=True)
    return home


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


def given_configs_dir() -> Path:
    """Configurations given as dicts (api.launch), each written as a cluster.toml of its own."""
    return orchestrate_home() / "configs"


def overrides_path(job_id: str) -> Path:
    """The launch's `--set`/`--env` overrides, for its later supervisors (private: secrets)."""
    return job_home(job_id) / "overrides.json"


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
