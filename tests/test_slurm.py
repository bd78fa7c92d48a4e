"""The Slurm backend against a real Slurm: slurmctld on this machine and one slurmd per network
namespace (tests/beds/slurm.py), real srun steps, real TensorFlow MWMS training of a plain `fit`
script that imports nothing of orchestrate. Needs root, slurm-wlm and munge: skipped with the
reason where they are missing, failed under CI=true."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.beds import slurm as slurmbed
from tests.conftest import (
    IN_CI,
    REPO,
    CliResult,
    containers_of,
    job_processes,
    job_view,
    launch_detached,
    python_without_orchestrate,
    signal_job_process,
    signal_supervisor,
    status_json,
    wait_for,
    wait_for_end,
)
from worker.warm import registry

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PLAIN_FIT = Path(__file__).parent / "fixtures" / "plain_fit.py"


@pytest.fixture(scope="module")
def bed() -> Iterator[slurmbed.SlurmBed]:
    reason = slurmbed.missing_requirements()
    if reason:
        if IN_CI:
            pytest.fail(f"Slurm test bed unavailable under CI: {reason}")
        pytest.skip(f"Slurm test bed unavailable: {reason}")
    # Not under pytest's private tmp (0700): munged runs as the munge user and must reach its
    # key and socket.
    root = Path(tempfile.mkdtemp(prefix="orchestrate-slurmbed-", dir="/tmp"))
    try:
        yield slurmbed.up(3, root)
    finally:
        slurmbed.down(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def slurm(bed: slurmbed.SlurmBed, monkeypatch: pytest.MonkeyPatch) -> Iterator[slurmbed.SlurmBed]:
    """The bed's slurm.conf for this test's Slurm commands and orchestrate's."""
    monkeypatch.setenv("SLURM_CONF", bed.slurm_conf)
    yield bed
    # Whatever a failed test left in the queue goes: the next test needs the nodes.
    leftover = squeue_jobs()
    if leftover:
        subprocess.run(["scancel", *leftover], capture_output=True)
        wait_for(lambda: not squeue_jobs(), 30)


def squeue_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
    return out.stdout.split()


def slurm_state(slurm_job: str) -> str:
    """The job's state: squeue while Slurm holds it, else the job completion log."""
    out = subprocess.run(
        ["squeue", "-h", "-j", slurm_job, "-o", "%T"], capture_output=True, text=True
    )
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    out = subprocess.run(
        ["sacct", "-c", "-n", "-P", "-j", slurm_job, "-o", "JobID,State"],
        capture_output=True, text=True,
    )  # fmt: skip
    states = [line.split("|")[1] for line in out.stdout.splitlines() if line.startswith(slurm_job)]
    return states[-1] if states else "GONE"


def slurm_toml(
    tmp_path: Path, *, epochs: int, backend: str = "", extra: str = "", python: str = sys.executable
) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    path = tmp_path / "cluster.toml"
    path.write_text(
        f"""
[job]
name = "slurmjob"
shared_dir = "{shared}"

[entrypoint]
script = "{PLAIN_FIT}"
args = ["--epochs", "{epochs}", "--backup-dir", "{shared / "backup"}", "--step-delay", "0.02"]
env = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}
workdir = "{REPO}"

[backend]
type = "slurm"
partition = "debug"
nodes = 3
python = "{python}"
{backend}

[supervision]
heartbeat_interval = 0.5
stop_grace = 10.0

[restart]
backoff = 0.2
{extra}
"""
    )
    return path


def tasks_at_epoch(cli: Callable[..., CliResult], job_id: str, epoch: int) -> dict | None:
    job = job_view(cli, job_id)
    trained = [t for t in job["tasks"] if t["state"] == "running" and t["epoch"] >= epoch]
    return job if len(trained) == 3 else None


def events(cli: Callable[..., CliResult], job_id: str) -> str:
    return cli("status", job_id).out


def no_leftovers(job_id: str) -> None:
    wait_for(lambda: not job_processes(job_id), 20)
    # Each keeper removed its socket as it ended: one killed instead leaves it behind, in every
    # node's /tmp, for every job.
    left = [n for n in os.listdir(registry.directory()) if n.startswith(f"{job_id}-")]
    assert not left, left


def test_a_three_node_job_trains_to_the_end_and_its_allocation_completes(
    slurm: slurmbed.SlurmBed, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    # The nodes' interpreter has TensorFlow and tf-keras, not orchestrate: the coordinator
    # puts its worker package in the shared directory, and the step runs from that copy.
    bare = python_without_orchestrate(tmp_path)
    path = slurm_toml(tmp_path, epochs=3, python=str(bare))
    path.write_text(path.read_text().replace(f'workdir = "{REPO}"', f'workdir = "{tmp_path}"'))
    result = cli("launch", str(path), timeout=240)
    assert result.code == 0, result.out[-3000:] + result.err[-2000:]
    assert re.search(r"submitted Slurm job \d+", result.out)
    [copy] = (tmp_path / "shared" / ".orchestrate").iterdir()
    assert (copy / "worker" / "slurm_task.py").is_file() and copy.name.startswith("worker-")
    job = status_json(cli)["jobs"][0]
    assert job["state"] == "succeeded"
    assert sorted(t["host"] for t in job["tasks"]) == ["n0", "n1", "n2"]  # Slurm's names
    assert all(t["epoch"] == 3 and t["state"] == "succeeded" for t in job["tasks"])
    # TF_CONFIG was built from what each node reported: its hostname and a port it picked.
    assert all(re.fullmatch(r"n\d:\d+", t["address"]) for t in job["tasks"])
    assert "[worker-2 n2] Epoch 3/3" in result.out
    # The allocation ended as a job that succeeded does (the hold script saw the release).
    assert slurm_state(job["allocation"]) == "COMPLETED"
    assert job["allocation"] not in squeue_jobs()
    no_leftovers(job["id"])


def test_a_killed_trainer_restarts_warm_in_a_new_step_and_a_preemption_of_those_checkpoints(
    slurm: slurmbed.SlurmBed, cli: Callable[..., CliResult], tmp_path: Path, reap_pids: list[int]
) -> None:
    path = slurm_toml(tmp_path, epochs=16, extra="standby_delay = 0")
    job_id = launch_detached(cli, path, reap_pids)
    running: Any = wait_for(lambda: tasks_at_epoch(cli, job_id, 2), 120, interval=0.3)
    slurm_job = running["allocation"]
    logs = [tmp_path / "shared" / job_id / "logs" / f"worker-{i}.log" for i in range(3)]
    # Each task's keeper, in the job's keeper step, readies a standby while attempt 0 trains
    # (standby_delay = 0: as training begins).
    wait_for(lambda: all("warm standby ready" in log.read_text() for log in logs), 120)
    running = job_view(cli, job_id)
    victim = next(t for t in running["tasks"] if t["index"] == 1)
    signal_job_process(victim["pid"], job_id, 9)  # a trainer slurmd started for this job

    def training_again() -> dict | None:
        job = job_view(cli, job_id)
        on = [t for t in job["tasks"] if t["state"] == "running" and t["attempt"] >= 1
              and t["epoch"] > t["initial_epoch"] >= 1]  # fmt: skip
        return job if len(on) == 3 else None

    restarted: Any = wait_for(training_again, 180, interval=0.3)
    step = json.loads((tmp_path / "shared" / job_id / "slurm" / "step.json").read_text())
    # The second attempt's srun step (the keeper step, started with the first, is another),
    # in the same allocation: no requeue.
    assert step["attempt"] == restarted["attempt"] >= 1 and step["step"] != "0", step
    so_far = events(cli, job_id)
    assert restarted["allocation"] == slurm_job and "requeued" not in so_far, so_far
    assert "exited with code 137" in so_far  # the kill
    # The new step's agents ran the entrypoint in the standbys: no interpreter start, no import.
    for log in logs:
        attempt_1 = log.read_text().split("attempt 1:")[1]
        assert "warm start: the standby" in attempt_1, attempt_1[:2000]

    # Then a job in the higher-priority partition wants every node: Slurm preempts ours
    # (SIGTERM to every step, GraceTime, requeue; PreemptMode=REQUEUE on the test bed). The
    # trainers are the standbys, in the keeper step: they too checkpoint before they go.
    urgent = subprocess.run(
        ["sbatch", "--parsable", "-p", slurmbed.URGENT, "-N3", "--exclusive",
         f"--output={tmp_path}/urgent-%j.out", "--wrap", "sleep 1"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    job = wait_for_end(cli, job_id, timeout=240)
    text = events(cli, job_id)
    assert job["state"] == "succeeded", text
    assert job["allocation"] == slurm_job
    # The preemption is counted as one, never against the restart budget.
    assert job["preemptions"] == 1 and job["restarts"] >= 2, text
    # The coordinator requeued at once rather than start a step in an allocation going away.
    assert f"Slurm job {slurm_job} requeued: is being preempted" in text
    assert slurm_state(urgent) == "COMPLETED"
    assert all(t["initial_epoch"] >= 2 for t in job["tasks"]), job["tasks"]
    assert slurm_state(slurm_job) == "COMPLETED"
    no_leftovers(job_id)


def test_stop_cancels_the_allocation_and_leaves_nothing_on_any_node(
    slurm: slurmbed.SlurmBed, cli: Callable[..., CliResult], tmp_path: Path, reap_pids: list[int]
) -> None:
    path = slurm_toml(tmp_path, epochs=50)
    job_id = launch_detached(cli, path, reap_pids)
    running: Any = wait_for(lambda: tasks_at_epoch(cli, job_id, 1), 120, interval=0.3)
    assert job_processes(job_id)
    result = cli("stop", job_id)
    assert result.code == 0, result
    job = job_view(cli, job_id)
    assert job["state"] == "stopped"
    assert all(t["state"] == "stopped" for t in job["tasks"]), job["tasks"]
    assert slurm_state(running["allocation"]) == "CANCELLED"
    assert not job_processes(job_id)  # nothing of the job on any node (one PID namespace here)
    no_leftovers(job_id)


def test_stop_without_a_supervisor_is_scancel(
    slurm: slurmbed.SlurmBed, cli: Callable[..., CliResult], tmp_path: Path, reap_pids: list[int]
) -> None:
    path = slurm_toml(tmp_path, epochs=50)
    job_id = launch_detached(cli, path, reap_pids)
    running: Any = wait_for(lambda: tasks_at_epoch(cli, job_id, 1), 120, interval=0.3)
    signal_supervisor(running["supervisor"]["pid"], job_id, 9)
    wait_for(lambda: job_view(cli, job_id)["supervisor"]["alive"] is False, 10)
    assert job_processes(job_id)  # the tasks train on without it
    result = cli("stop", job_id)
    assert result.code == 0, result
    assert job_view(cli, job_id)["state"] == "stopped"
    assert slurm_state(running["allocation"]) == "CANCELLED"
    wait_for(lambda: not job_processes(job_id), 15)


def test_the_end_of_the_time_limit_checkpoints_then_requeues_and_resumes(
    slurm: slurmbed.SlurmBed, cli: Callable[..., CliResult], tmp_path: Path, reap_pids: list[int]
) -> None:
    path = slurm_toml(tmp_path, epochs=8, backend='time = "10"\nsignal_before_end = 60')
    job_id = launch_detached(cli, path, reap_pids)
    running: Any = wait_for(lambda: tasks_at_epoch(cli, job_id, 2), 120, interval=0.3)
    slurm_job = running["allocation"]
    # The time limit comes near: under signal_before_end left, and the tasks get Slurm's
    # --signal (sent here at once; Slurm's own timer has a resolution of up to 60 s).
    subprocess.run(["scontrol", "update", f"JobId={slurm_job}", "TimeLimit=1"], check=True)
    subprocess.run(["scancel", "--signal=TERM", slurm_job], check=True)

    def requeued() -> bool:
        return "requeued" in events(cli, job_id)

    wait_for(requeued, 60, interval=0.3)
    wait_for(lambda: slurm_state(slurm_job) == "PENDING", 30)  # past COMPLETING: requeued
    # The test shortened the limit; the job's next run gets its time back. Slurm holds a
    # requeued job for cred_expire (10 s on the test bed) before it starts again.
    subprocess.run(["scontrol", "update", f"JobId={slurm_job}", "TimeLimit=10"], check=True)
    job = wait_for_end(cli, job_id, timeout=240)
    text = events(cli, job_id)
    assert job["state"] == "succeeded", text
    assert job["allocation"] == slurm_job
    assert job["preemptions"] == 1 and job["restarts"] >= 1, text  # one preemption
    assert re.search(r"Slurm job \d+ requeued: \d+s left of its time limit", text)
    # Every task checkpointed at the epoch boundary on the signal and resumed after it.
    assert all(t["initial_epoch"] >= 2 for t in job["tasks"]), job["tasks"]
    assert slurm_state(slurm_job) == "COMPLETED"
    no_leftovers(job_id)


def test_a_partition_that_does_not_exist_is_one_line_and_nothing_is_submitted(
    slurm: slurmbed.SlurmBed, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    path = slurm_toml(tmp_path, epochs=1)
    path.write_text(path.read_text().replace('partition = "debug"', 'partition = "nope"'))
    before = subprocess.run(
        ["sacct", "-c", "-n", "-P", "-o", "JobID"], capture_output=True, text=True
    ).stdout
    result = cli("launch", str(path))
    assert result.code == 2, result
    assert result.out == ""
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert "backend.partition" in result.err and "invalid partition specified: nope" in result.err
    assert "Traceback" not in result.err
    assert not squeue_jobs()
    after = subprocess.run(
        ["sacct", "-c", "-n", "-P", "-o", "JobID"], capture_output=True, text=True
    ).stdout
    assert after == before  # nothing submitted, so nothing ended either
    assert status_json(cli)["jobs"] == []  # and nothing registered


def test_status_names_the_allocation_while_it_waits_in_the_queue(
    slurm: slurmbed.SlurmBed, cli: Callable[..., CliResult], tmp_path: Path, reap_pids: list[int]
) -> None:
    # Every node busy with someone else's job: ours waits (PENDING, Resources).
    hold = subprocess.run(
        ["sbatch", "--parsable", "-N3", "--exclusive", f"--output={tmp_path}/hold-%j.out",
         "--wrap", "sleep 120"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        wait_for(lambda: slurm_state(hold) == "RUNNING", 20)
        path = slurm_toml(tmp_path, epochs=1)
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "launch", str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
        reap_pids.append(proc.pid)

        def pending() -> dict | None:
            jobs = status_json(cli)["jobs"]
            return jobs[0] if jobs and "PENDING" in jobs[0]["last_cause"] else None

        job: Any = wait_for(pending, 30)
        assert job["state"] == "launching" and job["allocation"]
        assert re.search(r"Slurm job \d+: PENDING \((Resources|Priority)\)", job["last_cause"])
        subprocess.run(["scancel", hold], check=True)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out[-3000:]
        assert "PENDING (Resources)" in out or "PENDING (Priority)" in out
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", hold], capture_output=True)


def test_each_task_of_a_step_trains_in_a_podman_image_and_leaves_no_container(
    slurm: slurmbed.SlurmBed, cli: Callable[..., CliResult], tmp_path: Path, tf_image: str
) -> None:
    """`[container]` with podman on the Slurm backend: each task of the step (our agent, on
    its node) starts its trainer in the image, on the node's network."""
    path = slurm_toml(tmp_path, epochs=2, extra=f'[container]\nimage = "{tf_image}"\n')
    result = cli("launch", str(path), timeout=300)
    assert result.code == 0, result.out[-3000:] + result.err[-2000:]
    job = status_json(cli)["jobs"][0]
    assert job["state"] == "succeeded"
    assert all(t["epoch"] == 2 for t in job["tasks"])
    for i in range(3):
        log = (tmp_path / "shared" / job["id"] / "logs" / f"worker-{i}.log").read_text()
        assert f"the trainer runs in {tf_image} (podman: orchestrate-{job['id']}-{i}-0)" in log
    # Its restarts would be cold, and status says why: the keeper step is not in the image.
    why = "this backend's standbys run on the node's own Python, not in the image"
    assert status_json(cli, job["id"])["jobs"][0]["cold_restarts"] == why
    assert f"restarts are cold: {why}" in cli("status", job["id"]).out
    assert containers_of(job["id"]) == []
    no_leftovers(job["id"])
