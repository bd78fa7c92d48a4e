"""The queue (`launch --wait-for-resources`): a job waits, `queued` with its reason, while a GPU
it asks for is busy with another program or held by another job, and launches once it is free;
jobs wanting the same GPU run one after the other, in launch order; `stop` takes a queued job
out; a queue timeout fails it. Whole launches on the local backend with the stand-in
`nvidia-smi` (tests/test_gpu.py) and the stand-in trainer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.conftest import CliResult, Reaped, job_view, status_json, wait_for_end
from tests.test_gpu import gpu_env, gpu_job


def _events(cli: Callable[..., CliResult], job_id: str) -> list[dict]:
    return status_json(cli, job_id)["jobs"][0]["events"]


def _first(events: list[dict], kind: str) -> float:
    return next(e["ts"] for e in events if e["kind"] == kind)


def test_a_busy_gpu_queues_the_job_until_another_program_lets_go_of_it(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: Reaped
) -> None:
    env = gpu_env(tmp_path, busy=[(1, 4242, 812)])
    path = gpu_job(tmp_path)
    queued = cli("launch", "--detach", "--wait-for-resources", str(path), env=env, timeout=60)
    assert queued.code == 0, queued
    job = status_json(cli)["jobs"][0]
    reap_pids.append(job["supervisor"]["pid"])
    assert queued.out.startswith(f"job {job['id']} queued (supervisor pid ")
    assert "waiting: preflight failed on 1 host(s): local: GPU 1 in use by pid 4242" in queued.out
    assert job["state"] == "queued" and "GPU 1 in use by pid 4242" in job["last_cause"]
    assert not (tmp_path / "shared" / job["id"] / "tasks").exists()  # nothing started
    table = cli("status")
    assert "queued" in table.out, table

    spec = tmp_path / "bin" / "spec.json"  # the other program ends: GPU 1 is free
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "busy": []}))
    ended = wait_for_end(cli, job["id"], timeout=120)
    assert ended["state"] == "succeeded", ended
    kinds = [e["kind"] for e in _events(cli, job["id"])]
    assert kinds.index("queued") < kinds.index("launched")


def test_jobs_wanting_the_same_gpu_run_one_after_the_other_and_stop_takes_one_out(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: Reaped
) -> None:
    env = gpu_env(tmp_path)
    ids = []
    for name, mode in (("first", "sleep"), ("second", "ok"), ("third", "ok")):
        path = gpu_job(tmp_path, workers="1", gpus_per_task=1)
        text = path.read_text().replace('"--mode", "ok"', f'"--mode", "{mode}"')
        path.write_text(text.replace('name = "fake"', f'name = "{name}"'))
        out = cli("launch", "--detach", "--wait-for-resources", str(path), env=env, timeout=60)
        assert out.code == 0, out
        job = status_json(cli)["jobs"][0]
        reap_pids.append(job["supervisor"]["pid"])
        ids.append(job["id"])
    first, second, third = ids
    for queued in (second, third):  # each names the job that holds GPU 0
        view = job_view(cli, queued)
        assert view["state"] == "queued", view
        assert view["last_cause"] == f"waiting for GPU 0 on local: held by job {first}"

    stopped = cli("stop", third)  # out of the queue: nothing of it ever starts
    assert stopped.code == 0, stopped
    assert job_view(cli, third)["state"] == "stopped"
    assert job_view(cli, second)["state"] == "queued"

    assert cli("stop", first).code == 0  # the first lets go of GPU 0: the second's turn
    ended = wait_for_end(cli, second, timeout=120)
    assert ended["state"] == "succeeded", ended
    # One after the other: the second launched only once the first had ended.
    assert _first(_events(cli, second), "launched") >= _first(_events(cli, first), "stopped")
    assert "launched" not in [e["kind"] for e in _events(cli, third)]
    assert not (tmp_path / "shared" / third / "tasks").exists()


def test_a_queue_timeout_fails_the_job_and_bad_values_are_one_line(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    env = gpu_env(tmp_path, busy=[(0, 4242, 812)])
    path = gpu_job(tmp_path)
    failed = cli("launch", "--wait-for-resources", "--queue-timeout", "1", str(path), env=env)
    assert failed.code != 0, failed
    job = status_json(cli)["jobs"][0]
    assert job["state"] == "failed", job
    assert job["last_cause"].startswith("waited ") and "in the queue" in job["last_cause"]

    for bad in ("-5", "soon"):
        refused = cli("launch", "--queue-timeout", bad, str(path), env=env)
        assert refused.code == 2, refused
        assert refused.err.count("\n") == 1 and "scheduling.queue_timeout" in refused.err
    assert len(status_json(cli)["jobs"]) == 1  # nothing recorded, nothing started
