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

from orchestrator.backends.agents import agent_pid
from tests.conftest import REPO, CliResult, job_processes, status_json, wait_for
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


def _cmdline_has(proc: Path, text: str) -> bool:
    try:
        return text.encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False


def _pids(job: dict) -> list[int]:
    return [p for t in job["tasks"] for p in (agent_pid(t["agent"]), t["pid"]) if p]


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

    # The run report: a chart with one line per task, per-task throughput, the final metrics.
    job_home = tmp_path / "home" / "jobs" / job["id"]
    assert (job_home / "report.png").stat().st_size > 10_000
    report = cli("report", job["id"], "--json")
    assert report.code == 0, report.err
    data = json.loads(report.out)
    assert data["chart"]["lines"] == ["worker-0", "worker-1"]
    assert data["resource_chart"]["panels"][:3] == [
        "trainer CPU %", "% waiting for a CPU", "trainer RSS MiB"
    ]  # fmt: skip
    assert (job_home / "report-resources.png").stat().st_size > 10_000
    assert all(t["max_rss_bytes"] > 100 << 20 for t in data["tasks"].values())
    assert all(t["median_steps_per_sec"] > 0 and t["epoch"] == 6 for t in data["tasks"].values())
    assert data["metrics"]["test_accuracy"] >= 0.9

    # Collected to this machine: the logs, and the model (loaded below).
    collected = tmp_path / "home" / "jobs" / job["id"] / "collected"
    assert (collected / "logs" / "worker-1.log").is_file()
    # Every task wrote TensorBoard scalars to its own run (one epoch_loss value per epoch).
    for i in (0, 1):
        events = list(
            (job_dir / "tensorboard" / f"worker-{i}" / "train").glob("events.out.tfevents.*")
        )
        assert events, f"no TensorBoard events for worker-{i}"
    # ... and its agent the resources it sampled, to a run beside it; and the collected model
    # loads and predicts. Read in one fresh process (TensorFlow imported once, not three times).
    check = (
        "import os, sys, json; os.environ['TF_USE_LEGACY_KERAS'] = '1';"
        "import numpy as np, tensorflow as tf; from sklearn.datasets import load_digits;"
        "args = json.loads(sys.argv[1]);"
        "counts = [[sum(1 for f in files for e in tf.compat.v1.train.summary_iterator(f) "
        "for v in e.summary.value if v.tag == tag) for tag in ('epoch_loss', 'resources/rss_mib')]"
        " for files in args['workers']];"
        "x, y = load_digits(return_X_y=True); m = tf.keras.models.load_model(args['model']);"
        "p = np.argmax(m.predict((x / 16.0).astype('float32'), verbose=0), axis=1);"
        "print(json.dumps({'counts': counts, 'accuracy': float(np.mean(p == y))}))"
    )
    workers = [
        [
            str(p)
            for run in ("train", "resources")
            for p in (job_dir / "tensorboard" / f"worker-{i}" / run).glob("events*")
        ]
        for i in (0, 1)
    ]
    args = json.dumps({"model": str(collected / "model"), "workers": workers})
    out = subprocess.run([sys.executable, "-c", check, args], capture_output=True, text=True,
                         timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    for epochs, samples in seen["counts"]:
        assert epochs == 6  # one epoch_loss value per epoch
        assert samples >= 5  # one per heartbeat while it trained
    assert seen["accuracy"] >= 0.9

    # `orchestrate tensorboard JOB` serves those logs.
    tensorboard = subprocess.Popen([sys.executable, "-m", "orchestrator", "tensorboard", job["id"]],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                   cwd=REPO)  # fmt: skip
    try:
        first = tensorboard.stdout.readline() if tensorboard.stdout else ""
        url = first.split()[first.split().index("job") + 2]
        assert url.startswith("http://127.0.0.1:")
        import urllib.request

        def serving() -> bool:
            try:
                with urllib.request.urlopen(url + "data/runs", timeout=2) as response:
                    return "worker-0/train" in response.read().decode()
            except OSError:
                return False

        wait_for(serving, 60, interval=0.5)
    finally:
        tensorboard.terminate()
        tensorboard.wait(timeout=20)
    # The CLI became TensorBoard (exec): stopping it left no TensorBoard process behind.
    assert not [
        p
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _cmdline_has(p, str(job_dir / "tensorboard"))
    ]


def test_mirrored_strategy_on_two_logical_cpus_trains_and_saves(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    path = example_config(tmp_path, epochs=3)
    text = path.read_text().replace("workers = 2", "workers = 1")
    path.write_text(
        text + '\n[strategy]\nkind = "mirrored"\nlogical_cpus = 2\nprofile_steps = [3, 5]\n'
    )
    result = cli("launch", str(path), timeout=240)
    assert result.code == 0, result.out[-3000:] + result.err
    assert "[worker-0 local] worker 0/1: 1408 of 1437 training images" in result.out
    assert "2 replica(s) in sync" in result.out
    [job] = status_json(cli)["jobs"]
    assert (Path(job["job_dir"]) / "model" / "saved_model.pb").is_file()
    # The profiler ran for the steps asked, into the task's TensorBoard run.
    profiles = Path(job["job_dir"]) / "tensorboard" / "worker-0" / "plugins" / "profile"
    assert any(profiles.rglob("*.xplane.pb")), sorted(Path(job["job_dir"]).rglob("*"))[:40]


def test_tpu_strategy_is_wired_resolver_connect_initialize(tmp_path: Path) -> None:
    """No TPU here: the TensorFlow calls are replaced by recorders, and their order checked."""
    code = """
import json, sys
from worker import runtime
tf = runtime.tf
calls = []
class Resolver:
    def __init__(self, tpu): calls.append(("resolver", tpu))
tf.distribute.cluster_resolver.TPUClusterResolver = Resolver
tf.config.experimental_connect_to_cluster = lambda r: calls.append(("connect", type(r).__name__))
tf.tpu.experimental.initialize_tpu_system = lambda r: calls.append(("initialize", type(r).__name__))
tf.distribute.TPUStrategy = lambda r: calls.append(("strategy", type(r).__name__)) or "tpu-strategy"
ctx = runtime.task_context()
print(json.dumps([runtime.make_strategy(ctx, {"kind": "tpu", "tpu": "grpc://10.9.9.9:8470"}), calls]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=REPO)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    strategy, calls = json.loads(out.stdout.strip().splitlines()[-1])
    assert strategy == "tpu-strategy"
    assert calls == [["resolver", "grpc://10.9.9.9:8470"], ["connect", "Resolver"],
                     ["initialize", "Resolver"], ["strategy", "Resolver"]]  # fmt: skip


def test_a_detached_job_reports_fresh_heartbeats_and_growing_steps_and_stop_ends_it(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """While it trains, `status` shows every task running with a fresher heartbeat and a larger
    step at each read; `stop` then ends it with no process of the job left."""
    assert cli("launch", "--detach", str(example_config(tmp_path, epochs=200))).code == 0
    job = status_json(cli)["jobs"][0]
    reap_pids.append(job["supervisor"]["pid"])

    def training() -> dict | None:
        current = status_json(cli, job["id"])["jobs"][0]
        reap_pids.extend(_pids(current))
        ok = all(t["state"] == "running" and t["step"] > 0 for t in current["tasks"])
        return current if ok else None

    first = wait_for(training, 120)
    read_first = time.monotonic()

    def every_step_grew() -> dict | None:
        current = status_json(cli, job["id"])["jobs"][0]
        grew = all(
            after["step"] > before["step"]
            for before, after in zip(first["tasks"], current["tasks"], strict=True)
        )
        return current if grew else None

    running = wait_for(every_step_grew, 60)
    between = time.monotonic() - read_first
    assert running["state"] == "running"
    for before, after in zip(first["tasks"], running["tasks"], strict=True):
        assert after["state"] == "running"
        # A newer heartbeat arrived between the two reads: the one seen first would be older by
        # the whole time between them.
        assert after["heartbeat_age"] < before["heartbeat_age"] + between  # order: newer
        assert after["address"].startswith("127.0.0.1:")

    pids = _pids(running)
    supervisor = running["supervisor"]["pid"]
    assert len(pids) == 4 and all(is_alive(p) for p in [*pids, supervisor])
    assert job_processes(job["id"])  # the finder sees the job: agents, trainers, keepers
    result = cli("stop", job["id"])
    assert result.code == 0, result
    assert not [p for p in pids if is_alive(p)]
    # Nothing of the job either: standby keepers and their standbys included.
    assert job_processes(job["id"]) == []
    wait_for(lambda: not is_alive(supervisor), 10)
    assert status_json(cli, job["id"])["jobs"][0]["state"] == "stopped"
