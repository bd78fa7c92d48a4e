"""TensorFlow's own Keras multi-worker tutorial (tests/fixtures/keras_tutorial: tensorflow/docs'
`main.py` and `mnist_setup.py`, only MNIST's download replaced) on three SSH hosts of the test
bed (tests/beds/ssh.py), each trainer in the test image (podman; tests/images/tf_image.py): a
killed trainer restarts the group warm in the image, a host's link lost for 30 s is waited for,
the job succeeds, and nothing of it is left."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.beds import ssh as tb
from tests.conftest import (
    REPO,
    CliResult,
    containers_of,
    job_processes,
    signal_job_process,
    ssh_testbed,
    status_json,
    wait_for,
)
from tests.test_containers import keepers_of

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(900)]

TUTORIAL = Path(__file__).parent / "fixtures" / "keras_tutorial"


@pytest.fixture(scope="module")
def bed(tf_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tb.Testbed]:
    """Three hosts whose sessions have this machine's podman settings (tf_image's)."""
    with ssh_testbed(tmp_path_factory, 3, 3, name="image-bed") as made:
        yield made


def tutorial_toml(bed: tb.Testbed, tmp_path: Path, image: str) -> Path:
    tutorial = tmp_path / "tutorial"
    shutil.copytree(TUTORIAL, tutorial)
    backend = Path(bed.cluster_toml).read_text().split("[backend]\n", 1)[1]
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[job]\nname = "tutorial"\nshared_dir = "{tmp_path / "shared"}"\n'
        f'[entrypoint]\nscript = "{tutorial / "main.py"}"\nworkdir = "{tutorial}"\n'
        'env = { TF_CPP_MIN_LOG_LEVEL = "2" }\n'
        "[supervision]\nstop_grace = 2.0\n"
        "[restart]\nbackoff = 0.2\nmax_restarts = 6\nstandby_delay = 0\n"
        f'[container]\nimage = "{image}"\n'
        "[backend]\n" + backend.replace("connect_timeout = 5.0", "connect_timeout = 2.0")
    )
    (tmp_path / "shared").mkdir()
    return path


def test_the_official_keras_tutorial_trains_in_the_image_on_three_hosts_through_faults(
    bed: tb.Testbed, tmp_path: Path, cli: Callable[..., CliResult], tf_image: str
) -> None:
    path = tutorial_toml(bed, tmp_path, tf_image)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", str(path)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    victim = bed.hosts[2]
    try:

        def training(after: int) -> dict | None:
            jobs = status_json(cli)["jobs"]
            if not jobs or jobs[0]["state"] != "running":
                return None
            tasks = jobs[0]["tasks"]
            ok = all(t["step"] > 0 and t["attempt"] > after for t in tasks)
            return jobs[0] if ok else None

        job = wait_for(lambda: training(-1), 300, interval=0.5)
        job_id = job["id"]  # type: ignore[index]
        logs = [tmp_path / "shared" / job_id / "logs" / f"worker-{i}.log" for i in range(3)]
        # A killed trainer (on h1): the group restarts, in the standbys its keepers hold in the
        # image (one still importing is waited for).
        signal_job_process(job["tasks"][1]["pid"], job_id, signal.SIGKILL)  # type: ignore[index]
        job = wait_for(lambda: training(0), 300, interval=0.5)
        assert any("warm start: the standby" in p.read_text() for p in logs)
        # h2's link lost for 15 s (three times what noticing it takes): the group stops, waits
        # for h2, and trains again.
        subprocess.run(["ip", "link", "set", victim.veth, "down"], check=True)
        try:
            time.sleep(15)
        finally:
            subprocess.run(["ip", "link", "set", victim.veth, "up"], check=True)
        out, err = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    job = status_json(cli, job_id)["jobs"][0]
    assert job["state"] == "succeeded"
    events = "\n".join(e["message"] for e in job["events"])
    assert "h2 unreachable for" in events, events
    for p in logs:
        assert "Epoch 3/3" in p.read_text()
    wait_for(lambda: containers_of(job_id) == [], 60)
    assert job_processes(job_id) == [] and keepers_of(job_id) == []
