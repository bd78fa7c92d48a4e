from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.errors import JobNotFoundError
from orchestrator.state.states import JobState, TaskState
from orchestrator.state.store import JobRecord, Store, TaskRecord


def _job(job_id: str, name: str = "n", created: float | None = None) -> JobRecord:
    now = created or time.time()
    return JobRecord(
        id=job_id,
        name=name,
        state=JobState.PENDING,
        backend="local",
        config_path="c.toml",
        config_json="{}",
        job_dir="/x",
        created=now,
        updated=now,
    )


def _tasks(job_id: str, n: int) -> list[TaskRecord]:
    return [
        TaskRecord(
            job_id=job_id,
            idx=i,
            type="worker",
            host_index=0,
            host="local",
            address=f"127.0.0.1:{4000 + i}",
            state=TaskState.PENDING,
        )
        for i in range(n)
    ]


def test_roundtrip_lookup_and_updates(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.create_job(_job("alpha-1", "alpha", 1.0), _tasks("alpha-1", 2))
    store.create_job(_job("alpha-2", "alpha", 2.0), _tasks("alpha-2", 1))
    assert store.get_job("alpha-2").id == "alpha-2"
    assert store.get_job("alpha").id == "alpha-2"  # a name means its newest job
    with pytest.raises(JobNotFoundError, match="ambiguous"):
        store.get_job("alpha-")
    with pytest.raises(JobNotFoundError, match="no job 'zzz'"):
        store.get_job("zzz")
    store.update_tasks("alpha-1", {1: {"state": TaskState.RUNNING, "step": 7, "loss": 0.5}})
    t = store.tasks("alpha-1")[1]
    assert (t.state, t.step, t.loss) == (TaskState.RUNNING, 7, 0.5)
    store.update_job("alpha-1", state=JobState.SUCCEEDED, last_cause="chief exited 0")
    job = store.get_job("alpha-1")
    assert job.state == JobState.SUCCEEDED and job.ended is not None
    store.add_event("alpha-1", "succeeded", "chief exited 0")
    assert [e.kind for e in store.events("alpha-1")] == ["succeeded"]
    with pytest.raises(ValueError):
        store.update_tasks("alpha-1", {0: {"no_such_column": 1}})


def test_another_process_reads_while_this_one_holds_a_connection(tmp_path: Path) -> None:
    """WAL: a second process sees committed state at any time."""
    db = tmp_path / "s.db"
    store = Store(db)
    store.create_job(_job("j-1"), _tasks("j-1", 2))
    store.update_tasks("j-1", {0: {"step": 42}})
    code = (
        "import sys; from pathlib import Path; from orchestrator.state.store import Store; "
        f"print(Store(Path({str(db)!r})).tasks('j-1')[0].step)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "42"


def test_a_store_of_the_previous_schema_is_upgraded_in_place(tmp_path: Path) -> None:
    """A store of the first schema keeps its jobs through every migration (the same path a
    new store takes)."""
    import sqlite3

    from orchestrator.state import store_schema
    from worker.spec import Phase, StepSignal

    db = tmp_path / "s.db"
    old_schema = store_schema.FIRST_SCHEMA
    assert "phase" not in old_schema and "_ident" not in old_schema
    assert "hosts_json" not in old_schema
    assert "straggler" not in old_schema and "resource_samples" not in old_schema
    with sqlite3.connect(db) as raw:
        raw.executescript(old_schema)
        raw.execute("PRAGMA user_version = 1")
        raw.execute(
            "INSERT INTO jobs (id, name, state, backend, config_path, config_json, job_dir, "
            "created, updated) VALUES ('old-1', 'old', 'succeeded', 'local', 'c', '{}', '/x', 1, 2)"
        )
        raw.execute(
            "INSERT INTO tasks (job_id, idx, type, host_index, host, address, state, step, "
            "agent_pid) VALUES ('old-1', 0, 'worker', 0, 'local', '127.0.0.1:1', 'succeeded', 9, "
            "4242)"
        )
    store = Store(db)
    task = store.tasks("old-1")[0]
    assert (task.step, task.phase, task.step_signal) == (9, Phase.NONE, StepSignal.NONE)
    store.update_tasks("old-1", {0: {"phase": Phase.FINISHED, "total_epochs": 3}})
    assert store.tasks("old-1")[0].phase == Phase.FINISHED
    assert store.tasks("old-1")[0].agent == "4242/"  # schema 9 names it by its handle
    store.update_tasks("old-1", {0: {"agent": "4242/boot:123"}})
    store.update_job("old-1", supervisor_ident="boot:456")
    assert store.get_job("old-1").supervisor_ident == "boot:456"
    store.update_job("old-1", hosts_json="[]")  # and schema 4's
    assert store.get_job("old-1").hosts_json == "[]"
    store.update_job("old-1", backend_state="17")  # and schema 5's (renamed in 8)
    assert store.get_job("old-1").backend_state == "17"
    from orchestrator.state.store import ResourceSample
    from worker.spec import Resources

    store.record_round(  # and schema 6's
        "old-1",
        {0: {"resources": Resources(at=3.0, cpu_percent=99.0), "straggler": "input-bound"}},
        [],
        [ResourceSample(0, 3.0, 0, cpu_percent=99.0)],
    )
    upgraded = store.tasks("old-1")[0]
    assert upgraded.resources == Resources(at=3.0, cpu_percent=99.0)
    assert upgraded.straggler == "input-bound"
    assert store.resource_samples("old-1") == [ResourceSample(0, 3.0, 0, cpu_percent=99.0)]
    assert store.get_job("old-1").forced is False  # and schema 7's
    store.update_job("old-1", forced=True)
    assert store.get_job("old-1").forced is True
    assert Store(db).get_job("old").state == JobState.SUCCEEDED  # opens again, no migration


def test_a_second_connection_in_the_writer_keeps_its_writes_visible_to_other_processes(
    tmp_path: Path,
) -> None:
    """A supervisor opens a second connection (the live panel's) while its own is open; then
    other processes open and close the store (`status` from another terminal). Each of the
    supervisor's later writes must be visible to the next of them: opening the store must not
    close a descriptor of the live database, which drops the process's SQLite locks and lets a
    closing reader delete the WAL the supervisor goes on writing to."""
    path = tmp_path / "s.db"
    writer = Store(path)
    writer.create_job(_job("live-1"), _tasks("live-1", 1))
    panel = Store(path)  # the same process's second connection
    read = (
        "import sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1])\n"
        "print(db.execute('SELECT step FROM tasks WHERE job_id = \"live-1\"').fetchone()[0])\n"
        "db.close()\n"
    )
    for step in (1, 2, 3):
        writer.update_tasks("live-1", {0: {"step": step}})
        assert panel.tasks("live-1")[0].step == step
        seen = subprocess.run([sys.executable, "-c", read, str(path)], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
        assert int(seen) == step, f"another process saw step {seen.strip()} after {step}"
    panel.close()
    writer.close()


def test_job_refs_match_ids_case_and_all_and_odd_refs_find_no_job(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.create_job(_job("digits-20261206-1"), _tasks("digits-20261206-1", 1))
    assert store.get_job("digits-2026").id == "digits-20261206-1"
    for ref in ("DIGITS", "Digits-2026", "x" * 1_000_000, "bad-\udcff-bytes", "%", "_"):
        with pytest.raises(JobNotFoundError, match="no job"):
            store.get_job(ref)


def test_a_non_utf8_job_ref_on_the_command_line_is_bad_input(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "ORCHESTRATE_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "status", b"job-\xff"],
                          capture_output=True, env=env, check=False)  # fmt: skip
    assert done.returncode == 2, done
    assert done.stderr.startswith(b"error: no job 'job-\\xff'"), done.stderr
    assert done.stderr.count(b"\n") == 1, done.stderr


@pytest.mark.parametrize("content", [b"\x17garbage" * 700, b"SQLite format 3\x00" + b"\xff" * 5000])
def test_a_damaged_store_is_one_line_that_says_what_to_do(tmp_path: Path, content: bytes) -> None:
    import os

    home = tmp_path / "home"
    home.mkdir()
    (home / "state.db").write_bytes(content)
    env = {**os.environ, "ORCHESTRATE_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "status"], capture_output=True,
                          text=True, env=env, check=False)  # fmt: skip
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and "is damaged" in done.stderr, done.stderr
    assert f"mv {home}/state.db {home}/state.db.damaged" in done.stderr, done.stderr
