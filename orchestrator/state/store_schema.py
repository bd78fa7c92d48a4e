"""The store's SQLite schema, its migrations from older versions, and opening it safely."""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import UsageError

SCHEMA_VERSION = 10

# The first schema. A new store is made as a store of this schema upgraded by every migration
# below, so that the path an old store takes is the path every new store takes too.
FIRST_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    backend TEXT NOT NULL,
    config_path TEXT NOT NULL,
    config_json TEXT NOT NULL,
    job_dir TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    ended REAL,
    attempt INTEGER NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0,
    preemptions INTEGER NOT NULL DEFAULT 0,
    last_cause TEXT NOT NULL DEFAULT '',
    supervisor_pid INTEGER,
    supervisor_host TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS tasks (
    job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    type TEXT NOT NULL,
    host_index INTEGER NOT NULL,
    host TEXT NOT NULL,
    address TEXT NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    agent_pid INTEGER,
    trainer_pid INTEGER,
    exit_code INTEGER,
    epoch INTEGER NOT NULL DEFAULT 0,
    initial_epoch INTEGER NOT NULL DEFAULT 0,
    step INTEGER NOT NULL DEFAULT 0,
    loss REAL,
    steps_per_sec REAL,
    heartbeat_at REAL,
    first_step_at REAL,
    PRIMARY KEY (job_id, idx)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,
    task INTEGER,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job_id, id);
CREATE TABLE IF NOT EXISTS samples (
    job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    task INTEGER NOT NULL,
    ts REAL NOT NULL,
    attempt INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    step INTEGER NOT NULL,
    loss REAL,
    steps_per_sec REAL
);
CREATE INDEX IF NOT EXISTS samples_by_job ON samples(job_id, task, ts);
"""

RESOURCE_SAMPLES = """
CREATE TABLE IF NOT EXISTS resource_samples (
    job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    task INTEGER NOT NULL,
    ts REAL NOT NULL,
    attempt INTEGER NOT NULL,
    cpu_percent REAL,
    cpu_wait_percent REAL,
    rss_bytes INTEGER,
    host_mem_available INTEGER,
    gpu_utilization REAL,
    gpu_memory_used INTEGER,
    collective_percent REAL,
    input_percent REAL
);
CREATE INDEX IF NOT EXISTS resource_samples_by_job ON resource_samples(job_id, task, ts);
"""

# From each older schema to the next: a store keeps its jobs across upgrades.
MIGRATIONS = {
    # What a script launching the job tells about it (`api.launch(metadata=)`), as JSON.
    # And where a trainer that builds its own cluster (not TF_CONFIG's) listens.
    9: [
        "ALTER TABLE jobs ADD COLUMN metadata TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE tasks ADD COLUMN listening TEXT NOT NULL DEFAULT ''",
    ],
    # A task is named by its backend's handle (an agent's pid and identity, a Slurm step's
    # task), opaque here.
    8: [
        "ALTER TABLE tasks ADD COLUMN agent TEXT NOT NULL DEFAULT ''",
        "UPDATE tasks SET agent = agent_pid || '/' || agent_ident WHERE agent_pid IS NOT NULL",
        "ALTER TABLE tasks DROP COLUMN agent_pid",
        "ALTER TABLE tasks DROP COLUMN agent_ident",
    ],
    # What a backend keeps for a job is its own (Slurm: its job id), named for no backend.
    7: ["ALTER TABLE jobs RENAME COLUMN scheduler_job TO backend_state"],
    6: ["ALTER TABLE jobs ADD COLUMN forced INTEGER NOT NULL DEFAULT 0"],
    5: [
        "ALTER TABLE tasks ADD COLUMN resources TEXT",
        "ALTER TABLE tasks ADD COLUMN straggler TEXT NOT NULL DEFAULT ''",
        *(st for st in RESOURCE_SAMPLES.split(";") if st.strip()),
    ],
    4: ["ALTER TABLE jobs ADD COLUMN scheduler_job TEXT NOT NULL DEFAULT ''"],
    3: [
        "ALTER TABLE jobs ADD COLUMN hosts_json TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN budget_base INTEGER NOT NULL DEFAULT 0",
    ],
    2: [
        "ALTER TABLE jobs ADD COLUMN supervisor_ident TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE tasks ADD COLUMN agent_ident TEXT NOT NULL DEFAULT ''",
    ],
    1: [
        "ALTER TABLE tasks ADD COLUMN phase TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE tasks ADD COLUMN step_signal TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE tasks ADD COLUMN total_epochs INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE tasks ADD COLUMN steps_per_epoch INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE tasks ADD COLUMN epoch_step INTEGER NOT NULL DEFAULT 0",
    ],
}


def open_database(path: Path) -> sqlite3.Connection:
    """The store at `path`, created private or migrated to this schema, ready for use."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Private before SQLite opens it (its -wal and -shm files take the database's mode):
    # it holds every job's configuration. Created only where missing: closing any descriptor
    # of a file drops every POSIX lock this process holds on it, so an open-and-close of an
    # existing store under a live connection (a supervisor opening its panel's) let another
    # process take the store for unused, checkpoint it and delete the WAL the supervisor
    # still wrote to; from then on no other process saw its writes.
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    if path.stat().st_mode & 0o077 and path.stat().st_uid == os.getuid():
        path.chmod(0o600)
    # check_same_thread off: a supervisor records each agent from the thread that started it
    # (one at a time, under its own lock).
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    try:
        db.execute("PRAGMA foreign_keys=ON")
        _retry_locked(path, lambda: _initialise(db, path))
    except sqlite3.DatabaseError as exc:
        db.close()
        raise unreadable_store(path, exc) from None
    return db


def unreadable_store(path: Path, exc: sqlite3.DatabaseError) -> UsageError:
    """A store SQLite cannot read (a truncated copy, another program's file): what to do."""
    if isinstance(exc, sqlite3.OperationalError):  # locked, full disk, no permission
        return UsageError(f"{path}: {exc}")
    return UsageError(
        f"{path} is damaged ({exc}): move it away (mv {path} {path}.damaged) and orchestrate "
        "starts a new one; the jobs it recorded are then no longer listed"
    )


def _retry_locked(path: Path, action: Callable[[], None]) -> None:
    """Another process creating or migrating the store at the same moment holds its lock
    beyond the busy timeout of some statements (journal mode, schema): wait and retry."""
    deadline = time.monotonic() + 30
    while True:
        try:
            action()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise UsageError(f"{path} stays locked by another process") from None
            time.sleep(0.02 + random.random() * 0.05)


def _initialise(db: sqlite3.Connection, path: Path) -> None:
    """Schema and migrations under one exclusive transaction: of two processes creating a
    new store at once, one creates it and the other then sees it made."""
    if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    # A store already at this schema needs no lock: `status` must open it while a busy
    # supervisor writes (an exclusive lock here waited behind every one of its rounds).
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION and _has_schema(db):
        return
    db.execute("BEGIN EXCLUSIVE")
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if not _has_schema(db):
            for statement in FIRST_SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            version = 1
        while version in MIGRATIONS:
            for statement in MIGRATIONS[version]:
                db.execute(statement)
            version += 1
        if version != SCHEMA_VERSION:
            raise UsageError(
                f"{path} was written by another version of orchestrate (schema "
                f"{version}, this one needs {SCHEMA_VERSION}): move it away to start afresh"
            )
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _has_schema(db: sqlite3.Connection) -> bool:
    row = db.execute(
        "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='events'"
    ).fetchone()
    return bool(row[0])
