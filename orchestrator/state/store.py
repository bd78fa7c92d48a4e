"""Job, task and event state in SQLite (WAL), so any process can read it at any time: during a
run, from another terminal, and after the coordinator has exited.

The database lives in ORCHESTRATE_HOME (default: the user state directory).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from orchestrator.errors import JobNotFoundError
from orchestrator.state.job_refs import as_typed, encodable
from orchestrator.state.paths import ensure_home, state_db
from orchestrator.state.states import JobState, TaskState
from orchestrator.state.store_schema import open_database
from worker.spec import Phase, Resources, StepSignal


@dataclass(frozen=True)
class JobRecord:
    id: str
    name: str
    state: JobState
    backend: str
    config_path: str
    config_json: str
    job_dir: str
    created: float
    updated: float
    ended: float | None = None
    attempt: int = 0
    restarts: int = 0  # every whole-group restart
    preemptions: int = 0  # of which after a preemption (not counted against max_restarts)
    last_cause: str = ""
    supervisor_pid: int | None = None
    supervisor_host: str = ""
    supervisor_ident: str = ""  # worker.proctl.identity of supervisor_pid
    hosts_json: str = ""  # host_pool.HostPool: which hosts train, wait, stand by or rest
    budget_base: int = 0  # counted restarts before the last `resume`: a resume starts afresh
    # What the job's backend keeps for it across supervisors (opaque here; Slurm: its job id).
    backend_state: str = ""
    forced: bool = False  # `launch --force`: GPUs busy with other programs are used anyway
    metadata: str = ""  # JSON: what the launching script said of the job (api.launch)


@dataclass(frozen=True)
class TaskRecord:
    job_id: str
    idx: int
    type: str
    host_index: int
    host: str
    address: str
    state: TaskState
    attempt: int = 0
    trainer_pid: int | None = None
    exit_code: int | None = None
    epoch: int = 0
    initial_epoch: int = 0  # > 0: this attempt resumed from a checkpoint
    step: int = 0
    loss: float | None = None
    steps_per_sec: float | None = None
    heartbeat_at: float | None = None
    first_step_at: float | None = None
    phase: Phase = Phase.NONE  # how far the trainer got
    step_signal: StepSignal = StepSignal.NONE  # where its steps come from (NONE: unobserved)
    total_epochs: int = 0  # model.fit's epochs; 0: unknown
    steps_per_epoch: int = 0  # 0: unknown
    epoch_step: int = 0  # batches done in the current epoch
    agent: str = ""  # its backend's handle of the running task (TaskHandle.ref); "": none
    resources: Resources | None = None  # the agent's latest sample (worker.resources)
    straggler: str = ""  # why it holds the group back, while it does (supervision.stragglers)
    listening: str = ""  # where the trainer's own cluster puts it, if not at `address`


@dataclass(frozen=True)
class EventRecord:
    id: int
    job_id: str
    ts: float
    kind: str
    task: int | None
    message: str


@dataclass(frozen=True)
class Sample:
    task: int
    ts: float
    attempt: int
    epoch: int
    step: int
    loss: float | None
    steps_per_sec: float | None


@dataclass(frozen=True)
class ResourceSample:
    """A task's resources over time, for the run report's charts (orchestrator.commands.report)."""

    task: int
    ts: float
    attempt: int
    cpu_percent: float | None = None
    cpu_wait_percent: float | None = None
    rss_bytes: int | None = None
    host_mem_available: int | None = None
    gpu_utilization: float | None = None  # the mean over the task's GPUs
    gpu_memory_used: int | None = None  # MiB, summed over them
    collective_percent: float | None = None
    input_percent: float | None = None

    @classmethod
    def of(cls, task: int, attempt: int, r: Resources) -> ResourceSample:
        utils = [g.utilization for g in r.gpus if g.utilization is not None]
        used = [g.memory_used for g in r.gpus if g.memory_used is not None]
        return cls(task, r.at, attempt, r.cpu_percent, r.cpu_wait_percent, r.rss_bytes,
                   r.host_mem_available, sum(utils) / len(utils) if utils else None,
                   sum(used) if used else None, r.collective_percent,
                   r.input_percent)  # fmt: skip


_RESOURCE_COLUMNS = [f.name for f in fields(ResourceSample)]
_JOB_COLUMNS = [f.name for f in fields(JobRecord)]
_TASK_COLUMNS = [f.name for f in fields(TaskRecord)]
_TASK_UPDATABLE = frozenset(_TASK_COLUMNS) - {"job_id", "idx"}
_JOB_UPDATABLE = frozenset(_JOB_COLUMNS) - {"id"}


def _job(row: sqlite3.Row) -> JobRecord:
    data = dict(row)
    data["state"] = JobState(data["state"])
    data["forced"] = bool(data["forced"])
    return JobRecord(**data)


def _task(row: sqlite3.Row) -> TaskRecord:
    data = dict(row)
    data["state"] = TaskState(data["state"])
    data["phase"] = Phase(data["phase"])
    data["step_signal"] = StepSignal(data["step_signal"])
    raw = data["resources"]
    data["resources"] = Resources.from_dict(json.loads(raw)) if raw else None
    return TaskRecord(**data)


def _column(value: Any) -> Any:
    """A value as its column holds it."""
    if isinstance(value, Resources):
        return json.dumps(value.to_dict(), separators=(",", ":"))
    return value


MAX_REF = 1024  # characters of a job reference: names and ids are far shorter


class Store:
    def __init__(self, path: Path | None = None) -> None:
        if path is None:
            ensure_home()
        self.path = path or state_db()
        self._db = open_database(self.path)

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- jobs ---------------------------------------------------------------------------
    def create_job(self, job: JobRecord, tasks: list[TaskRecord]) -> None:
        with self._transaction() as db:
            db.execute(
                f"INSERT INTO jobs ({', '.join(_JOB_COLUMNS)}) "
                f"VALUES ({', '.join('?' for _ in _JOB_COLUMNS)})",
                [getattr(job, c) for c in _JOB_COLUMNS],
            )
            self._insert_tasks(db, tasks)

    def replace_tasks(self, job_id: str, tasks: list[TaskRecord]) -> None:
        """A new plan for the job (first launch or a restart: new ports, new pids)."""
        with self._transaction() as db:
            db.execute("DELETE FROM tasks WHERE job_id = ?", (job_id,))
            self._insert_tasks(db, tasks)

    @staticmethod
    def _insert_tasks(db: sqlite3.Connection, tasks: list[TaskRecord]) -> None:
        db.executemany(
            f"INSERT INTO tasks ({', '.join(_TASK_COLUMNS)}) "
            f"VALUES ({', '.join('?' for _ in _TASK_COLUMNS)})",
            [[_column(getattr(t, c)) for c in _TASK_COLUMNS] for t in tasks],
        )

    def update_job(self, job_id: str, **values: Any) -> None:
        unknown = set(values) - _JOB_UPDATABLE
        if unknown:
            raise ValueError(f"not job columns: {sorted(unknown)}")
        values["updated"] = time.time()
        state = values.get("state")
        if isinstance(state, JobState) and state.is_terminal() and "ended" not in values:
            values["ended"] = values["updated"]
        assignments = ", ".join(f"{k} = ?" for k in values)
        self._db.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", [*values.values(), job_id])

    def claim_job(
        self,
        job_id: str,
        state: JobState,
        new_state: JobState,
        supervisor: tuple[int, str, str],
        replacing: tuple[int | None, str],
    ) -> bool:
        """Make `supervisor` (pid, identity, host) the job's supervisor and move it from
        `state` to `new_state`, in one statement, only if nobody else got there first: the job
        is still in `state`, and its recorded supervisor is none, this one, or `replacing` (the
        dead one an `attach` checked). False: another process supervises it."""
        pid, ident, host = supervisor
        old_pid, old_ident = replacing
        now = time.time()
        cursor = self._db.execute(
            "UPDATE jobs SET state = ?, supervisor_pid = ?, supervisor_ident = ?, "
            "supervisor_host = ?, updated = ? WHERE id = ? AND state = ? AND ("
            "supervisor_pid IS NULL OR (supervisor_pid = ? AND supervisor_ident = ?) "
            "OR (supervisor_pid = ? AND supervisor_ident = ?))",
            (new_state, pid, ident, host, now, job_id, state, pid, ident, old_pid, old_ident),
        )
        return cursor.rowcount == 1

    def move_job(self, job_id: str, state: JobState, new_state: JobState, cause: str) -> bool:
        """Move the job from `state` to `new_state` only if it is still in `state`."""
        cursor = self._db.execute(
            "UPDATE jobs SET state = ?, last_cause = ?, updated = ? WHERE id = ? AND state = ?",
            (new_state, cause, time.time(), job_id, state),
        )
        return cursor.rowcount == 1

    def move_job_unless(
        self, job_id: str, state: JobState, new: JobState, blocked: Callable[[list[JobRecord]], str]
    ) -> str:
        """Under one write lock, what `blocked` says of every job not ended (in launch order):
        "" moves the job from `state` to `new` (if still there); a reason becomes its cause
        instead. Returns the reason ("": moved, or no longer in `state`)."""
        ended = [s.value for s in JobState if s.is_terminal()]
        sql = f"SELECT * FROM jobs WHERE state NOT IN ({', '.join('?' * len(ended))})"
        with self._transaction() as db:
            rows = db.execute(sql + " ORDER BY rowid", ended).fetchall()  # launch order
            reason = blocked([_job(r) for r in rows])
            column, value = ("last_cause", reason) if reason else ("last_cause = '', state", new)
            db.execute(f"UPDATE jobs SET {column} = ?, updated = ? WHERE id = ? AND state = ?",
                       (value, time.time(), job_id, state))  # fmt: skip
        return reason

    def get_job(self, ref: str) -> JobRecord:
        """A job by id, the newest job with that name, or a unique id prefix."""
        if not ref.strip():
            raise JobNotFoundError("an empty job name matches no job (see `orchestrate status`)")
        if len(ref) > MAX_REF or not encodable(ref):  # no job has such a name or id
            raise JobNotFoundError(f"no job {as_typed(ref)} (see `orchestrate status`)")
        row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (ref,)).fetchone()
        if row is None:
            row = self._db.execute(
                "SELECT * FROM jobs WHERE name = ? ORDER BY created DESC LIMIT 1", (ref,)
            ).fetchone()
        if row is None:
            rows = self._db.execute(  # a prefix, case and all (LIKE ignores case)
                "SELECT * FROM jobs WHERE substr(id, 1, ?) = ? ORDER BY created DESC",
                (len(ref), ref),
            ).fetchall()
            if len(rows) > 1:
                raise JobNotFoundError(f"job {ref!r} is ambiguous: {len(rows)} ids start with it")
            row = rows[0] if rows else None
        if row is None:
            raise JobNotFoundError(f"no job {ref!r} (see `orchestrate status`)")
        return _job(row)

    def delete_job(self, job_id: str) -> bool:
        """Remove an ended job with all its rows; False: it is not ended (now)."""
        ended = [s.value for s in JobState if s.is_terminal()]
        sql = f"DELETE FROM jobs WHERE id = ? AND state IN ({', '.join('?' * len(ended))})"
        return self._db.execute(sql, (job_id, *ended)).rowcount == 1

    def list_jobs(self, limit: int = 50) -> list[JobRecord]:
        rows = self._db.execute(
            "SELECT * FROM jobs ORDER BY created DESC LIMIT ?", (limit,)
        ).fetchall()
        return [_job(r) for r in rows]

    # --- tasks --------------------------------------------------------------------------
    def tasks(self, job_id: str) -> list[TaskRecord]:
        rows = self._db.execute(
            "SELECT * FROM tasks WHERE job_id = ? ORDER BY idx", (job_id,)
        ).fetchall()
        return [_task(r) for r in rows]

    def tasks_for(self, job_ids: list[str]) -> dict[str, list[TaskRecord]]:
        result: dict[str, list[TaskRecord]] = {j: [] for j in job_ids}
        if not job_ids:
            return result
        marks = ", ".join("?" for _ in job_ids)
        rows = self._db.execute(
            f"SELECT * FROM tasks WHERE job_id IN ({marks}) ORDER BY job_id, idx", job_ids
        ).fetchall()
        for row in rows:
            result[row["job_id"]].append(_task(row))
        return result

    def update_tasks(self, job_id: str, updates: dict[int, dict[str, Any]]) -> None:
        """Several tasks in one transaction (one fsync per supervisor tick, not one per task)."""
        self.record_round(job_id, updates, [])

    def record_round(
        self,
        job_id: str,
        updates: dict[int, dict[str, Any]],
        samples: list[Sample],
        resource_samples: Sequence[ResourceSample] = (),
    ) -> None:
        """One supervisor round: its task updates and samples in one transaction."""
        if not updates and not samples and not resource_samples:
            return
        with self._transaction() as db:
            for idx, values in updates.items():
                unknown = set(values) - _TASK_UPDATABLE
                if unknown:
                    raise ValueError(f"not task columns: {sorted(unknown)}")
                assignments = ", ".join(f"{k} = ?" for k in values)
                db.execute(
                    f"UPDATE tasks SET {assignments} WHERE job_id = ? AND idx = ?",
                    [*map(_column, values.values()), job_id, idx],
                )
            self._insert_samples(db, job_id, samples)
            if resource_samples:
                db.executemany(
                    f"INSERT INTO resource_samples (job_id, {', '.join(_RESOURCE_COLUMNS)}) "
                    f"VALUES (?, {', '.join('?' for _ in _RESOURCE_COLUMNS)})",
                    [[job_id, *(getattr(r, c) for c in _RESOURCE_COLUMNS)]
                     for r in resource_samples],
                )  # fmt: skip

    # --- events -------------------------------------------------------------------------
    def add_event(self, job_id: str, kind: str, message: str, task: int | None = None) -> None:
        self._db.execute(
            "INSERT INTO events (job_id, ts, kind, task, message) VALUES (?, ?, ?, ?, ?)",
            (job_id, time.time(), kind, task, message),
        )

    def add_samples(self, job_id: str, samples: list[Sample]) -> None:
        """Progress over time (one row per change a supervisor saw), for the run report."""
        if samples:
            with self._transaction() as db:
                self._insert_samples(db, job_id, samples)

    @staticmethod
    def _insert_samples(db: sqlite3.Connection, job_id: str, samples: list[Sample]) -> None:
        if samples:
            db.executemany(
                "INSERT INTO samples (job_id, task, ts, attempt, epoch, step, loss, steps_per_sec)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (job_id, s.task, s.ts, s.attempt, s.epoch, s.step, s.loss, s.steps_per_sec)
                    for s in samples
                ],
            )

    def samples(self, job_id: str) -> list[Sample]:
        rows = self._db.execute(
            "SELECT task, ts, attempt, epoch, step, loss, steps_per_sec FROM samples "
            "WHERE job_id = ? ORDER BY task, ts",
            (job_id,),
        ).fetchall()
        return [Sample(**dict(r)) for r in rows]

    def resource_samples(self, job_id: str) -> list[ResourceSample]:
        rows = self._db.execute(
            f"SELECT {', '.join(_RESOURCE_COLUMNS)} FROM resource_samples "
            "WHERE job_id = ? ORDER BY task, ts",
            (job_id,),
        ).fetchall()
        return [ResourceSample(**dict(r)) for r in rows]

    def events(self, job_id: str) -> list[EventRecord]:
        rows = self._db.execute(
            "SELECT * FROM events WHERE job_id = ? ORDER BY id", (job_id,)
        ).fetchall()
        return [EventRecord(**dict(r)) for r in rows]
