"""The TFRecord input pipeline (runtime.tfrecord_dataset_fn) with real tf.data, and the
TFRecord example end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, CliResult, status_json

pytestmark = pytest.mark.slow
CHECK = Path(__file__).parent / "fixtures" / "tfrecord_exactly_once.py"


def test_every_record_is_seen_exactly_once_per_epoch_across_workers() -> None:
    cases = [
        [8, 2, 12, 8],  # FILE sharding: 4 files per worker
        [6, 3, 10, 6],  # FILE sharding: 2 files per worker
        [2, 3, 30, 6],  # fewer files than workers: DATA sharding
    ]
    out = subprocess.run([sys.executable, str(CHECK), json.dumps(cases)], capture_output=True,
                         text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    for case in json.loads(out.stdout.strip().splitlines()[-1]):
        seen = [i for worker in case["seen"] for i in worker]
        assert sorted(seen) == list(range(case["total"])), case  # all, once each
        sizes = {len(worker) for worker in case["seen"]}
        assert len(sizes) == 1, case  # equal shares: the same number of steps everywhere


def test_tfrecord_example_trains_from_shards_on_the_shared_dir(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    data = tmp_path / "shared" / "data"
    made = subprocess.run([sys.executable, "-m", "scripts.make_tfrecords", str(data), "--shards",
                           "4"], capture_output=True, text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    assert len(list(data.glob("train-*.tfrecord"))) == 4
    path = tmp_path / "cluster.toml"
    path.write_text(f"""
[job]
name = "tfrecord"
shared_dir = "{tmp_path / "shared"}"

[entrypoint]
module = "worker.examples.digits_tfrecord"
args = ["--data-dir", "{data}", "--epochs", "8"]
env = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}
workdir = "{REPO}"

[backend]
type = "local"
workers = 2
""")
    result = cli("launch", str(path), timeout=300)
    assert result.code == 0, result.out[-3000:] + result.err
    for i in (0, 1):
        assert (
            f"[worker-{i} local] worker {i}/2: 4 shard files, 1436 records, 22 steps per epoch"
            in result.out
        )
    [job] = status_json(cli)["jobs"]
    metrics = json.loads((Path(job["job_dir"]) / "metrics.json").read_text())
    assert metrics["test_accuracy"] >= 0.9
