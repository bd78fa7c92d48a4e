"""orchestrate from Python: a notebook, a sweep script or a pipeline step drives jobs as the
command line does, without shelling out. The commands call these functions, so the two cannot
drift; the errors are the command line's (`orchestrator.errors`: ConfigError, JobNotFoundError,
PreflightError, ...), and ORCHESTRATE_HOME chooses the state directory for both.

    from orchestrator.api import launch
    job = launch("cluster.toml")          # returns once its tasks run
    print(job.id, job.wait(timeout=600))  # "succeeded", else JobFailed (.state, .cause)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from orchestrator.errors import JobFailed
from orchestrator.logs.log_query import LogQuery, LogRecord, log_batches
from orchestrator.state.store import JobRecord, Store
from orchestrator.supervision.job_document import status_documents

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig
    from orchestrator.config.overrides import Overrides

__all__ = ["Job", "JobFailed", "LogRecord", "jobs", "launch", "validate"]


@dataclass(frozen=True)
class Job:
    """A job in the state store, by its id. Each call reads the store afresh."""

    id: str

    def status(self) -> dict[str, Any]:
        """The job as `orchestrate status JOB --json` shows it, its events included."""
        store = Store()
        return status_documents(store, [store.get_job(self.id)], with_events=True)[0]

    @property
    def state(self) -> str:
        return Store().get_job(self.id).state.value

    @property
    def metadata(self) -> dict[str, Any]:
        """What the launching script said of the job (`launch(metadata=...)`); {} if nothing."""
        text = Store().get_job(self.id).metadata
        return dict(json.loads(text)) if text else {}

    def wait(self, timeout: float | None = None, interval: float = 0.5) -> str:
        """Wait for the job to end: `succeeded`, or JobFailed (its `.state`, `failed` or
        `stopped`, and its `.cause`). TimeoutError past `timeout` seconds: the job goes on.
        ValueError for a timeout or an interval that is not a number of seconds (NaN,
        negative, infinite interval)."""
        state = self.wait_for_end(timeout, interval)
        if state != "succeeded":
            raise JobFailed(self.id, state, Store().get_job(self.id).last_cause)
        return state

    def wait_for_end(self, timeout: float | None = None, interval: float = 0.5) -> str:
        """Wait for the job to end; its final state (`succeeded`, `failed` or `stopped`), as
        `wait` without the error."""
        if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
            raise ValueError(f"timeout must be None or seconds >= 0, not {timeout!r}")
        if not (isinstance(interval, int | float) and 0 < interval < math.inf):
            raise ValueError(f"interval must be seconds > 0, not {interval!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        store = Store()
        while True:
            job = store.get_job(self.id)
            if job.state.is_terminal():
                return job.state.value
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} is still {job.state.value} after {timeout:g}s")
            time.sleep(interval)

    @overload
    def logs(self, task: str | None = None, attempt: int | None = None, since: str | None = None,
             grep: str | None = None, tail: int | None = None,
             follow: Literal[False] = False) -> list[LogRecord]: ...  # fmt: skip
    @overload
    def logs(self, task: str | None = None, attempt: int | None = None, since: str | None = None,
             grep: str | None = None, tail: int | None = None, *,
             follow: Literal[True]) -> Iterator[LogRecord]: ...  # fmt: skip

    def logs(
        self,
        task: str | None = None,
        attempt: int | None = None,
        since: str | None = None,
        grep: str | None = None,
        tail: int | None = None,
        follow: bool = False,
    ) -> list[LogRecord] | Iterator[LogRecord]:
        """The lines the tasks printed so far, in the order they arrived (as `orchestrate
        logs`, with the same choices). The copies are read in bounded batches (`tail`: from
        their end), so only the lines returned are held; a line over 64 KiB is cut there (its
        text ends `[... line cut at 64 KiB]`). `follow=True`: an iterator of the lines as they
        arrive, until the job ends (as `follow`)."""
        if follow:
            return self.follow(task, grep, tail)
        return list(self._lines(LogQuery(task=task, since=since, grep=grep, tail=tail,
                                          attempt=attempt)))  # fmt: skip

    def follow(
        self, task: str | None = None, grep: str | None = None, tail: int | None = None
    ) -> Iterator[LogRecord]:
        """The lines as they arrive (`orchestrate logs --follow`), until the job ends."""
        return self._lines(LogQuery(task=task, follow=True, grep=grep, tail=tail))

    def _lines(self, query: LogQuery) -> Iterator[LogRecord]:
        store = Store()
        for batch in log_batches(store, store.get_job(self.id), query):
            yield from batch

    def report(self) -> dict[str, Any]:
        """The run report (`orchestrate report JOB --json`): wall time, restarts and causes,
        per-task steps/s, final metrics; its charts are written beside it."""
        from orchestrator.commands.report import write_report
        from orchestrator.state.paths import job_home, report_json

        store = Store()
        write_report(store, store.get_job(self.id), job_home(self.id))
        return json.loads(report_json(self.id).read_text())

    def collect(self, dest: str | Path | None = None) -> Path:
        """Copy the job's logs, model, metrics and newest verified checkpoint here (`orchestrate
        collect`); where they are (default: ./JOB_ID)."""
        from orchestrator.commands.collecting import collect_here

        return collect_here(Store().get_job(self.id), Path(dest) if dest else None)[0]

    def stop(self) -> str:
        """Stop every task on every host; the job's state after (`stopped`). A host that cannot
        be reached raises OrchestrateError naming it (the CLI exits 1): stop again later."""
        return stop(self.id)[0]

    def resume(self) -> Job:
        """Continue a failed or stopped job: same id, next attempt, a fresh restart budget;
        returns once its tasks run."""
        resume(self.id)
        return self


def validate(config_path: str | Path) -> dict[str, Any]:
    """The checks of `orchestrate validate`: the document `validate --json` prints. Raises
    ConfigError listing every problem, one per line."""
    from orchestrator.commands.json_views import validated
    from orchestrator.config import load_config
    from orchestrator.planning.plan import dry_run_plan

    cfg = load_config(config_path)
    return validated(str(config_path), cfg, dry_run_plan(cfg))


def launch(
    config: str | Path | Mapping[str, Any],
    detach: bool = True,
    force: bool = False,
    overrides: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    name: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Job:
    """Validate, preflight every host and start the job under a background supervisor;
    returns once its tasks run (detach) or wait in the queue, or once it ended (detach=False:
    then see `job.state`). Nothing is started when it raises.

    `config`: a cluster.toml's path, or its sections as a dict (`{"job": {...}, "backend":
    {...}}`: validated as the file is, relative paths from the current directory).
    `overrides` sets keys of the file by their path (`{"backend.workers": 4}`), as `launch
    --set` does; `env` adds to `[entrypoint] env` (`--env`); `name` is `job.name`. A bad one
    raises ConfigError naming its key path. `metadata`: a JSON-able dict kept with the job
    (`Job.metadata`, `status --json`), e.g. a sweep's parameters."""
    from orchestrator.config.from_mapping import config_file_from
    from orchestrator.config.overrides import Overrides
    from orchestrator.state.paths import ensure_home, given_configs_dir

    sets = {**(overrides or {}), **({"job.name": name} if name is not None else {})}
    given = Overrides(
        tuple((path, _toml_value(value)) for path, value in sets.items()),
        tuple((env or {}).items()),
    )
    said = _metadata_json(metadata)
    if isinstance(config, Mapping):
        ensure_home()
        config = config_file_from(config, given_configs_dir())
    job, _ = launch_detached(config, force, overrides=given, metadata=said)
    if not detach:
        job.wait_for_end()
    return job


MAX_METADATA = 64 * 1024  # bytes of JSON: labels and parameters, not data


def _metadata_json(metadata: Mapping[str, Any] | None) -> str:
    """The metadata as the store keeps it; ConfigError (one line) when it is no JSON object of
    at most MAX_METADATA bytes."""
    from orchestrator.errors import ConfigError

    if metadata is None:
        return ""
    try:
        text = json.dumps(dict(metadata), allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"metadata: not JSON: {exc}") from None
    if len(text.encode()) > MAX_METADATA:
        raise ConfigError(f"metadata: {len(text.encode())} bytes of JSON, at most {MAX_METADATA}")
    return text


def _toml_value(value: Any) -> str:
    """A Python value as `--set` reads it: as TOML (JSON's numbers, booleans, lists and
    strings are TOML's), so that a string stays one ("4" is not 4)."""
    return json.dumps(str(value) if isinstance(value, Path) else value)


def jobs(limit: int = 10, name: str | None = None, state: str | None = None) -> list[Job]:
    """The most recent jobs, newest first; only those of this `name` and in this `state` when
    given (`running`, `failed`, ...)."""
    records = Store().list_jobs(limit if name is None and state is None else 1 << 30)
    chosen = [r for r in records if (name is None or r.name == name)
              and (state is None or r.state.value == state)]  # fmt: skip
    return [Job(record.id) for record in chosen[:limit]]


# --- what the command line shares with the functions above ------------------------------


def register(
    config_path: str | Path,
    force: bool = False,
    overrides: Overrides | None = None,
    metadata: str = "",
) -> tuple[Store, JobRecord, ClusterConfig]:
    """Validate and record a job (pending); the backend's own verdict first (Slurm:
    `sbatch --test-only`). Nothing is started."""
    from orchestrator.backends import check_before_register
    from orchestrator.config import load_config
    from orchestrator.state.job_records import register_job

    cfg = load_config(config_path, overrides)
    check_before_register(cfg, str(config_path))
    store = Store()
    return store, register_job(store, cfg, str(config_path), force, overrides, metadata), cfg


def launch_detached(
    config_path: str | Path,
    force: bool = False,
    on_update: Callable[[JobRecord], None] = lambda job: None,
    overrides: Overrides | None = None,
    metadata: str = "",
) -> tuple[Job, int]:
    """Register the job and start its background supervisor; the job and the supervisor's pid
    once the tasks run."""
    from orchestrator.commands.detached import start_detached_supervisor

    store, record, _ = register(config_path, force, overrides, metadata)
    _, pid = start_detached_supervisor(store, record, on_update)
    return Job(record.id), pid


def reopen(job_ref: str) -> tuple[Store, JobRecord, ClusterConfig, str]:
    """A failed or stopped job made pending again for its next attempt, with the configuration
    it runs with (refused if its cluster.toml changed since the launch), and which checkpoint
    the attempt starts from, said in one line (refused, naming it, if the newest is corrupt)."""
    from orchestrator.state.job_records import launch_config
    from orchestrator.state.job_state import refuse_resume, reopen_for_resume
    from orchestrator.supervision.checkpoints import resume_point

    store = Store()
    job = store.get_job(job_ref)
    cfg = launch_config(job)
    refuse_resume(store, job)
    said = resume_point(job)
    reopened = reopen_for_resume(store, job)
    store.add_event(job.id, "resume_from", said)
    return store, reopened, cfg, said


def resume(
    job_ref: str, on_update: Callable[[JobRecord], None] = lambda job: None
) -> tuple[JobRecord, int]:
    """Reopen the job and start its background supervisor; the job and the supervisor's pid
    once its tasks run."""
    from orchestrator.commands.detached import start_detached_supervisor

    store, record, _, _ = reopen(job_ref)
    return start_detached_supervisor(store, record, on_update)


def stop(job_ref: str) -> tuple[str, bool]:
    """Stop the job's tasks; (its state after, whether it had ended already)."""
    from orchestrator.commands.stopping import stop_job
    from orchestrator.state.job_records import needs_stop

    store = Store()
    job = store.get_job(job_ref)
    if not needs_stop(store, job):
        return job.state.value, True
    return stop_job(store, job).value, False
