"""What `status` shows (pure: records in, text and JSON out; no process is asked)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.commands.views import status_text
from orchestrator.state.states import JobState, TaskState
from orchestrator.state.store import JobRecord, Store, TaskRecord
from orchestrator.supervision.job_document import job_view
from worker.spec import Phase, Resources


def job(state: JobState, **fields: object) -> JobRecord:
    base = JobRecord("v-1", "v", state, "ssh", "c", "{}", "/shared/v-1", 100.0, 100.0)
    return JobRecord(**{**base.__dict__, **fields})  # type: ignore[arg-type]


def task(idx: int, state: TaskState, **fields: object) -> TaskRecord:
    base = TaskRecord("v-1", idx, "worker", idx, f"h{idx}", f"10.0.0.{idx}:7", state)
    return TaskRecord(**{**base.__dict__, **fields})  # type: ignore[arg-type]


def test_a_running_task_shows_its_progress_eta_heartbeat_and_sample() -> None:
    running = task(
        0, TaskState.RUNNING, epoch=2, total_epochs=4, steps_per_epoch=100, epoch_step=50,
        steps_per_sec=10.0, heartbeat_at=118.0, phase=Phase.TRAINING,
        resources=Resources(at=1.0, cpu_percent=150.0),
    )  # fmt: skip
    view = job_view(job(JobState.SUCCEEDED, ended=130.0), [running], now=120.0)
    [t] = view["tasks"]
    assert view["wall_seconds"] == 30.0  # to its end, not to now
    assert t["heartbeat_age"] == 2.0
    assert t["eta_seconds"] == 25.0  # 50 of epoch 2, then 2 x 100 more, at 10 steps/s
    assert t["resources"]["cpu_percent"] == 150.0
    assert t["unsupervised"] is None  # an ended job asks nothing of its supervisor


def test_an_ended_task_shows_no_eta_and_no_sample() -> None:
    done = task(0, TaskState.SUCCEEDED, steps_per_sec=10.0, resources=Resources(at=1.0))
    [t] = job_view(job(JobState.SUCCEEDED, ended=130.0), [done], now=140.0)["tasks"]
    assert (t["eta_seconds"], t["resources"]) == (None, None)


def test_status_text_and_json_show_the_same_job_with_its_events(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    failed = job(JobState.FAILED, ended=150.0, restarts=2, last_cause="worker-1 exited 3")
    store.create_job(failed, [task(0, TaskState.STOPPED), task(1, TaskState.FAILED, exit_code=3)])
    store.add_event(failed.id, "failure", "worker-1 exited 3", 1)
    document = json.loads(status_text(store, [failed], as_json=True, one_job=True))
    [view] = document["jobs"]
    assert (view["state"], view["restarts"], view["last_cause"]) == (
        "failed",
        2,
        "worker-1 exited 3",
    )
    assert [t["state"] for t in view["tasks"]] == ["stopped", "failed"]
    assert [e["kind"] for e in view["events"]] == ["failure"]
    text = status_text(store, [failed], as_json=False, one_job=True)
    assert "v-1" in text and "failed" in text and "worker-1 exited 3" in text
    assert "h1" in text


def test_no_jobs_says_how_to_start_one(tmp_path: Path) -> None:
    assert "orchestrate launch" in status_text(Store(tmp_path / "s.db"), [], False, False)
