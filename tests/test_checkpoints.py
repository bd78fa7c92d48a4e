"""A job's checkpoints with real TensorFlow: listed with their epoch and step, verified by
the host's TensorFlow, collected, and a truncated one named and never used: `resume` refuses
it in one line, and starts from the checkpoint it names once it is whole again."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, CliResult, job_view, launch_detached, two_worker_config, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_checkpoints_are_listed_verified_collected_and_a_truncated_one_is_refused_by_name(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    entry = (
        'module = "worker.examples.digits"\nargs = ["--epochs", "400"]\n'
        f'workdir = "{REPO}"\nenv = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}'
    )
    job_id = launch_detached(cli, two_worker_config(tmp_path, "ckpt", entry), reap_pids)
    wait_for(lambda: all(t["epoch"] >= 2 for t in job_view(cli, job_id)["tasks"]), 150)
    assert cli("stop", job_id).code == 0
    epoch = job_view(cli, job_id)["tasks"][0]["epoch"]

    listed = cli("checkpoints", job_id, "--json")
    assert listed.code == 0, listed
    [found] = json.loads(listed.out)["checkpoints"]
    assert found["verified"] is True and found["latest"] and found["problem"] is None
    assert found["epoch"] == epoch and found["step"] > 0 and found["bytes"] > 100_000
    prefix = Path(found["path"])
    assert prefix.parent == tmp_path / "shared" / job_id / "checkpoints" / "backup" / "chief"

    collected = cli("collect", job_id, "--dest", str(tmp_path / "here"))
    assert collected.code == 0 and f"newest verified checkpoint {prefix}" in collected.out
    copied = {p.name for p in (tmp_path / "here" / "checkpoint").iterdir()}
    assert {"checkpoint", f"{prefix.name}.index"} <= copied
    assert any(n.startswith(f"{prefix.name}.data-") for n in copied)

    [data] = prefix.parent.glob(f"{prefix.name}.data-*")
    whole = tmp_path / "whole"
    shutil.copy(data, whole)
    with open(data, "r+b") as f:  # a write cut short
        f.truncate(data.stat().st_size // 3)
    [bad] = json.loads(cli("checkpoints", job_id, "--json").out)["checkpoints"]
    assert bad["verified"] is False and bad["problem"].startswith("truncated: ")
    refused = cli("resume", job_id, "--detach")
    assert refused.code == 2, refused
    [line] = refused.err.strip().splitlines()
    assert f"its newest checkpoint {prefix} is truncated" in line
    job = job_view(cli, job_id)
    assert job["state"] == "stopped" and job["attempt"] == 0  # nothing changed

    shutil.copy(whole, data)
    resumed = cli("resume", job_id, "--detach")
    assert resumed.code == 0, resumed
    assert f"the next attempt starts from checkpoint {prefix} (epoch {epoch})" in resumed.out
    reap_pids.append(job_view(cli, job_id)["supervisor"]["pid"])
    wait_for(lambda: all(t["initial_epoch"] == epoch for t in job_view(cli, job_id)["tasks"]), 60)
    assert cli("stop", job_id).code == 0
