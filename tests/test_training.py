"""Real TensorFlow: 2-worker MultiWorkerMirroredStrategy training through `orchestrate launch`
on the local backend, with the example model on scikit-learn's bundled digits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, CliResult, status_json, wait_for
from worker.proctl import is_alive

pytestmark = pytest.mark.slow


def example_config(tmp_path: Path, epochs: int) -> Path:
    shared = tmp_path / "shared"  # not made here: the local backend creates it, as for a new user
    text = (REPO / "cluster.example.toml").read_text()
    text = text.replace('shared_dir = "runs"', f'shared_dir = "{shared}"')
    text = text.replace('args = ["--epochs", "15"]', f'args = ["--epochs", "{epochs}"]')
    assert str(shared) in text and f'"{epochs}"' in text
    # The config lives in tmp_path: run the trainer from the repository, as the example does.
    path = tmp_path / "cluster.toml"
    path.write_text(text.replace("[backend]", f'workdir = "{REPO}"\n\n[backend]'))
    return path


def _pids(job: dict) -> list[int]:
    return [p for t in job["tasks"] for p in (t["agent_pid"], t["pid"]) if p]


def test_example_trains_on_disjoint_shards_and_the_chief_saves_once(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    result = cli("launch", str(example_config(tmp_path, epochs=6)), timeout=240)
    [job] = status_json(cli)["jobs"]
    reap_pids.extend(_pids(job))
    assert result.code == 0, result.out[-3000:] + result.err
    assert job["state"] == "succeeded"
    for i in (0, 1):
        assert f"[worker-{i} local] Epoch 6/6" in result.out
        assert f"[worker-{i} local] final held-out accuracy:" in result.out
    job_dir = Path(job["job_dir"])

    shards = [
        json.loads((job_dir / f"tasks/{i}/shard.json").read_text())["indices"] for i in (0, 1)
    ]
    assert len(shards[0]) == len(shards[1]) > 600  # equal shards: same step count per worker
    assert not set(shards[0]) & set(shards[1])  # disjoint

    # Saved once, by the chief: one SavedModel in the job directory, none left by worker 1.
    assert sorted(p.relative_to(job_dir) for p in job_dir.rglob("saved_model.pb")) == [
        Path("model/saved_model.pb")
    ]
    assert "saved final model" in result.out.split("[worker-0 local] final held-out")[1]
    assert "[worker-1 local] saved final model" not in result.out
    metrics = json.loads((job_dir / "metrics.json").read_text())
    assert metrics["test_accuracy"] >= 0.9

    # The collected model loads and predicts in a fresh process.
    collected = tmp_path / "home" / "jobs" / job["id"] / "collected"
    assert (collected / "logs" / "worker-1.log").is_file()
    load = (
        "import os; os.environ['TF_USE_LEGACY_KERAS']='1'; import sys, numpy as np, tensorflow as tf;"
        "from sklearn.datasets import load_digits; x, y = load_digits(return_X_y=True);"
        "m = tf.keras.models.load_model(sys.argv[1]);"
        "p = np.argmax(m.predict((x / 16.0).astype('float32'), verbose=0), axis=1);"
        "print(float(np.mean(p == y)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", load, str(collected / "model")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) >= 0.9


def test_detached_job_reports_fresh_heartbeats_and_growing_steps(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    result = cli("launch", "--detach", str(example_config(tmp_path, epochs=25)))
    assert result.code == 0, result
    job_id = status_json(cli)["jobs"][0]["id"]
    reap_pids.append(status_json(cli)["jobs"][0]["supervisor"]["pid"])

    def both_training() -> dict | None:
        job = status_json(cli, job_id)["jobs"][0]
        reap_pids.extend(_pids(job))
        ok = all(t["state"] == "running" and t["step"] > 0 for t in job["tasks"])
        return job if ok else None

    first = wait_for(both_training, 120)
    time.sleep(1.5)
    second = status_json(cli, job_id)["jobs"][0]
    assert second["state"] == "running"
    for before, after in zip(first["tasks"], second["tasks"], strict=True):
        assert after["state"] == "running"
        assert after["step"] > before["step"]
        assert after["heartbeat_age"] < 3.0
        assert after["address"].startswith("127.0.0.1:")
    final = wait_for(
        lambda: (
            (j := status_json(cli, job_id)["jobs"][0])["state"] in ("succeeded", "failed") and j
        ),
        180,
    )
    assert final["state"] == "succeeded", final
    assert all(t["epoch"] == 25 for t in final["tasks"])
    assert not [p for p in _pids(final) if is_alive(p)]


def test_stop_ends_real_training_with_no_process_left(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    assert cli("launch", "--detach", str(example_config(tmp_path, epochs=200))).code == 0
    job = status_json(cli)["jobs"][0]
    reap_pids.append(job["supervisor"]["pid"])

    def training() -> dict | None:
        current = status_json(cli, job["id"])["jobs"][0]
        reap_pids.extend(_pids(current))
        return current if all(t["step"] > 0 for t in current["tasks"]) else None

    running = wait_for(training, 120)
    pids = _pids(running)
    supervisor = running["supervisor"]["pid"]
    assert len(pids) == 4 and all(is_alive(p) for p in [*pids, supervisor])
    result = cli("stop", job["id"])
    assert result.code == 0, result
    assert not [p for p in pids if is_alive(p)]
    wait_for(lambda: not is_alive(supervisor), 10)
    assert status_json(cli, job["id"])["jobs"][0]["state"] == "stopped"
