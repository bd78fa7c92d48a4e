"""The trainer in a real container image (podman from Debian's packages, an image built from the
package registries by tests/images/tf_image.py): the bundled example trains in it with two
tasks, a stop and a killed agent leave no container of the job, and the trainer's environment
is passed by name."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.backends.agents import agent_pid
from tests.conftest import (
    IN_CI,
    REPO,
    CliResult,
    as_nobody,
    containers_of,
    job_processes,
    job_view,
    launch_detached,
    signal_job_process,
    signal_supervisor,
    status_json,
    wait_for,
    wait_for_end,
)

pytestmark = pytest.mark.timeout(900)


def image_config(tmp_path: Path, image: str, args: list[str], restart: str = "") -> Path:
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[job]\nname = "img"\nshared_dir = "{shared}"\n'
        f'[entrypoint]\nmodule = "worker.examples.digits"\nargs = {json.dumps(args)}\n'
        'env = { TF_CPP_MIN_LOG_LEVEL = "2", SECRET_TOKEN = "not-on-a-command-line" }\n'
        '[backend]\ntype = "local"\nworkers = 2\n'
        "[supervision]\nheartbeat_interval = 0.5\nstop_grace = 5.0\n"
        f"[restart]\nbackoff = 0.2\n{restart}\n"
        f'[container]\nimage = "{image}"\n'
    )
    return path


def test_the_example_trains_in_the_image_through_a_killed_supervisor_and_leaves_no_container(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int], tf_image: str
) -> None:
    path = image_config(tmp_path, tf_image, ["--epochs", "8"])
    job_id = launch_detached(cli, path, reap_pids)
    wait_for(lambda: len(containers_of(job_id)) == 2, 120)
    # Each task's container is named for its attempt (a busy machine may have restarted it).
    tasks = status_json(cli, job_id)["jobs"][0]["tasks"]
    assert [t["container"] for t in tasks] == [
        f"orchestrate-{job_id}-{t['index']}-{t['attempt']}" for t in tasks
    ]
    # The supervisor SIGKILLed: training goes on in the containers, and `attach` finishes it.
    supervisor = job_view(cli, job_id)["supervisor"]["pid"]
    signal_supervisor(supervisor, job_id, signal.SIGKILL)
    attach = subprocess.run([sys.executable, "-m", "orchestrator", "attach", job_id],
                            capture_output=True, text=True, timeout=600, cwd=REPO)  # fmt: skip
    assert attach.returncode == 0, attach.stdout[-2000:] + attach.stderr
    assert f"attached to job {job_id}" in attach.stdout
    job = job_view(cli, job_id)
    assert job["state"] == "succeeded", job["last_cause"]
    for i in range(2):
        log = (tmp_path / "shared" / job_id / "logs" / f"worker-{i}.log").read_text()
        assert f"the trainer runs in {tf_image} (podman: orchestrate-{job_id}-{i}-0)" in log
        assert "Epoch 8/8" in log
    # The image's interpreter ran it (Debian's, not this machine's), and no value of the
    # environment was on a command line.
    trainer = json.loads((tmp_path / "shared" / job_id / "tasks" / "0" / "status.json").read_text())
    assert trainer["state"] == "succeeded"
    wait_for(lambda: containers_of(job_id) == [], 60)
    assert job_processes(job_id) == []


def test_a_warm_restart_in_the_image_then_a_stop_and_a_killed_agent_leave_nothing(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int], tf_image: str
) -> None:
    path = image_config(tmp_path, tf_image, ["--epochs", "400"], "standby_delay = 0")
    job_id = launch_detached(cli, path, reap_pids)
    logs = [tmp_path / "shared" / job_id / "logs" / f"worker-{i}.log" for i in range(2)]

    def training() -> dict | None:
        job = status_json(cli, job_id)["jobs"][0]
        return job if all(t["step"] > 0 for t in job["tasks"]) else None

    def restarted(before: int) -> dict | None:
        job = training()
        return job if job and all(t["attempt"] > before for t in job["tasks"]) else None

    job = wait_for(training, 300, interval=0.5)
    # Each task's trainer, as status shows it, is the image's interpreter running on this host
    # (the host's PID namespace), not the runtime's client; it carries the job's id, by which a
    # stop finds every process of the job.
    for task in job["tasks"]:  # type: ignore[index]
        assert os.readlink(f"/proc/{task['pid']}/exe") == "/usr/bin/python3.11"
        with open(f"/proc/{task['pid']}/environ", "rb") as fh:
            assert f"ORCHESTRATE_JOB_ID={job_id}".encode() in fh.read().split(b"\0")
    # The secret is passed by name: no process of the job shows its value in its argv.
    for pid in job_processes(job_id):
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            assert b"not-on-a-command-line" not in fh.read()
    pid, name = job["tasks"][0]["pid"], job["tasks"][0]["container"]  # type: ignore[index]
    assert another_user_reaches_nothing(pid, name, tmp_path / "shared" / job_id) == {
        "signal": False, "environ": False, "job files": False, "exec": False, "listed": False
    }  # fmt: skip
    # Each task's keeper holds a standby in the image (its own container), ready once it has
    # imported the image's TensorFlow; a killed trainer restarts the group in the standbys.
    wait_for(lambda: all("warm standby ready" in p.read_text() for p in logs), 300)
    assert any(n == f"orchestrate-{job_id}-1-standby" for n in names_of(job_id))
    signal_job_process(job["tasks"][1]["pid"], job_id, signal.SIGKILL)  # type: ignore[index]
    wait_for(lambda: any("warm start: the standby" in p.read_text() for p in logs), 240)
    job = wait_for(lambda: restarted(0), 300, interval=0.5)
    # A warm trainer is the image's interpreter too, in its keeper's container, which is named
    # for the attempt it serves, as status says.
    warm = job["tasks"]  # type: ignore[index]
    for task in warm:
        assert os.readlink(f"/proc/{task['pid']}/exe") == "/usr/bin/python3.11"
    wait_for(lambda: {t["container"] for t in warm} <= set(names_of(job_id)), 60)
    # Nor can another user reach a warm trainer, in its keeper's container.
    pid, name = warm[1]["pid"], warm[1]["container"]
    assert not any(another_user_reaches_nothing(pid, name, tmp_path / "shared" / job_id).values())
    # A killed agent: its trainer (in a container the runtime's monitor runs, or its keeper's)
    # ends with it, and the group restarts.
    before = max(t["attempt"] for t in job["tasks"])  # type: ignore[index]
    agent = agent_pid(job["tasks"][1]["agent"])  # type: ignore[index]
    assert agent is not None
    signal_job_process(agent, job_id, signal.SIGKILL)
    wait_for(lambda: restarted(before), 300, interval=0.5)
    assert cli("stop", job_id).code == 0
    job = wait_for_end(cli, job_id)
    assert job["state"] == "stopped"
    wait_for(lambda: containers_of(job_id) == [], 60)
    assert job_processes(job_id) == []
    assert keepers_of(job_id) == []


def keepers_of(job_id: str) -> list[int]:
    """This job's standby keepers (their arguments name the job), in an image or not."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"keeper.py") for a in argv) and job_id.encode() in argv:
                found.append(int(entry))
    return found


def names_of(job_id: str, runtime: str = "podman") -> list[str]:
    """The names of the job's containers, running or not (by the job's label)."""
    out = subprocess.run(
        [runtime, "ps", "--all", "--format", "{{.Names}}", "--filter",
         f"label=orchestrate.job={job_id}"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return out.stdout.split()


def test_an_image_missing_on_the_host_is_one_line_exit_3_and_nothing_starts(
    tmp_path: Path, cli: Callable[..., CliResult], tf_image: str
) -> None:
    path = image_config(tmp_path, "localhost/orchestrate-no-such-image:1", ["--epochs", "1"])
    result = cli("launch", str(path))
    assert result.code == 3, result
    [line] = result.err.strip().splitlines()  # one line
    assert "local: image localhost/orchestrate-no-such-image:1 is not on this host" in line
    [job] = status_json(cli)["jobs"]
    assert job["state"] == "failed"
    assert containers_of(job["id"]) == [] and job_processes(job["id"]) == []


def test_an_image_missing_on_the_host_is_pulled_from_a_registry_and_said_with_its_size(
    tmp_path: Path, cli: Callable[..., CliResult], tf_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("docker-registry") is None:
        why = "no image registry to pull from (apt-get install docker-registry)"
        if IN_CI:
            pytest.fail(f"container tests under CI: {why}")
        pytest.skip(why)
    from tests.images.registry import image_registry

    with image_registry(tmp_path) as (address, env):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        image = f"{address}/orchestrate-tf:pulled"
        podman("push", "--quiet", tf_image, image)
        assert subprocess.run(["podman", "image", "exists", image], timeout=60).returncode == 1
        try:
            path = image_config(tmp_path, image, ["--epochs", "1"])
            checked = cli("check", str(path))
            assert checked.code == 0, checked
            said = re.search(
                rf"local: pulled image {re.escape(image)} \((\d+\.\d\d) GB\) in \d+ s", checked.err
            )
            assert said is not None, checked.err
            size = int(podman("image", "inspect", "--format", "{{.Size}}", image))
            assert said.group(1) == f"{size / 1e9:.2f}"
            # Not in the registry: one line naming the image and the registry's reason, exit 3.
            absent = image_config(tmp_path, f"{address}/orchestrate-tf:absent", ["--epochs", "1"])
            refused = cli("launch", str(absent))
            assert refused.code == 3, refused
            [line] = refused.err.strip().splitlines()
            assert (
                f"image {address}/orchestrate-tf:absent is not on this host and could not be pulled"
                in line
            )
            assert "manifest unknown" in line
            [job] = [j for j in status_json(cli)["jobs"] if j["state"] == "failed"]
            assert containers_of(job["id"]) == [] and job_processes(job["id"]) == []
        finally:
            subprocess.run(["podman", "rmi", "--ignore", image], capture_output=True, timeout=120)


def podman(*args: str) -> str:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, check=True, timeout=300
    ).stdout.strip()


NOBODY_PROBE = """
import json, os, subprocess, sys
pid, name, job_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def works(f):
    try:
        f()
        return True
    except OSError:
        return False
def run(*argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", str(exc))
ps = run("podman", "ps", "--all", "--format", "{{.Names}}")
print(json.dumps({
    "signal": works(lambda: os.kill(pid, 0)),
    "environ": works(lambda: open(f"/proc/{pid}/environ", "rb").read()),
    "job files": works(lambda: os.listdir(job_dir)),
    "exec": run("podman", "exec", name, "true").returncode == 0,
    "listed": name in ps.stdout,
}))
"""


def another_user_reaches_nothing(pid: int, name: str, job_dir: Path) -> dict[str, bool]:
    """What a second Unix user (nobody) can do to a job's trainer in its container: signal it,
    read its environment (TF_CONFIG, secrets), list its job's files, enter or list its
    container with its own podman."""
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "XDG_RUNTIME_DIR": "/nonexistent"}
    probe = as_nobody([sys.executable, "-c", NOBODY_PROBE, str(pid), name, str(job_dir)], env)
    out, _ = probe.communicate(timeout=120)
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_docker_trains_restarts_warm_in_the_image_and_a_stop_leaves_nothing(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int], docker_image: str
) -> None:
    """The same with Debian's Docker daemon (docker.io) as the runtime."""
    path = image_config(tmp_path, docker_image, ["--epochs", "400"], "standby_delay = 0")
    path.write_text(path.read_text().replace("[container]\n", '[container]\nruntime = "docker"\n'))
    job_id = launch_detached(cli, path, reap_pids)
    logs = [tmp_path / "shared" / job_id / "logs" / f"worker-{i}.log" for i in range(2)]

    def training(before: int) -> dict | None:
        job = status_json(cli, job_id)["jobs"][0]
        ok = all(t["step"] > 0 and t["attempt"] > before for t in job["tasks"])
        return job if ok else None

    job = wait_for(lambda: training(-1), 300, interval=0.5)
    assert "(docker: orchestrate-" in logs[0].read_text()
    wait_for(lambda: all("warm standby ready" in p.read_text() for p in logs), 300)
    signal_job_process(job["tasks"][1]["pid"], job_id, signal.SIGKILL)  # type: ignore[index]
    job = wait_for(lambda: training(0), 300, interval=0.5)
    assert any("warm start: the standby" in p.read_text() for p in logs)
    for task in job["tasks"]:  # type: ignore[index]
        assert os.readlink(f"/proc/{task['pid']}/exe") == "/usr/bin/python3.11"
    warm = {t["container"] for t in job["tasks"]}  # type: ignore[index]
    wait_for(lambda: warm <= set(names_of(job_id, "docker")), 60)
    assert cli("stop", job_id).code == 0
    assert wait_for_end(cli, job_id)["state"] == "stopped"
    wait_for(lambda: names_of(job_id, "docker") == [], 60)
    assert job_processes(job_id) == [] and keepers_of(job_id) == []
