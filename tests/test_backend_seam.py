"""The backend seam: a backend the rest of the code has never heard of (tests/backends/
loopback.py, three hosts on 127.0.0.2-4) is named by cluster.toml's `[backend] type`, opened
through the registry like the built-in ones, and runs a whole job through the supervisor
unchanged: launch, a failure, a whole-group restart, success; a requested stop. Installed as a
distribution with an `orchestrate.backends` entry point, every command of the CLI finds it in
its own process: validate, launch, status, attach, stop, resume, check and standbys."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import tests.backends.loopback  # noqa: F401 (its import registers the backend, in this process)
from orchestrator.config import load_config
from orchestrator.logs.logstream import LineSink
from orchestrator.state.job_records import register_job
from orchestrator.state.states import JobState, TaskState
from orchestrator.state.store import Store
from orchestrator.supervision.supervisor import Supervisor
from tests.backends.loopback import LoopbackHosts
from tests.conftest import (
    FAKE,
    REPO,
    CliResult,
    Reaped,
    job_processes,
    job_view,
    signal_supervisor,
    status_json,
    wait_for,
    wait_for_end,
)

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def loopback_job(tmp_path: Path, args: list[str], record: Path | None = None) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[job]\nname = "seam"\nshared_dir = "{shared}"\n'
        f'[entrypoint]\nscript = "{FAKE}"\nargs = {json.dumps(args)}\n'
        "[supervision]\nheartbeat_interval = 0.2\nstop_grace = 2.0\npoll_interval = 0.1\n"
        "[restart]\nmax_restarts = 2\nbackoff = 0.1\n"
        f'[backend]\ntype = "loopback"\naddresses = {json.dumps(list(ADDRESSES))}\n'
        + (f'record = "{record}"\n' if record else "")
    )
    return path


def supervisor_of(tmp_path: Path, path: Path) -> tuple[Store, Supervisor]:
    config = load_config(path)
    store = Store(tmp_path / "state.db")
    job = register_job(store, config, str(path))
    return store, Supervisor(store, job, config, LineSink(tmp_path / "c", io.StringIO()))


def test_a_backend_written_against_the_protocol_alone_runs_restarts_and_ends_a_job(
    tmp_path: Path,
) -> None:
    # Task 2 fails on the first attempt, well before the chief would succeed.
    path = loopback_job(tmp_path, ["--mode", "ok-after:4", "--task-2", "fail-first:3"])
    store, supervisor = supervisor_of(tmp_path, path)
    backend = supervisor.backend
    assert isinstance(backend, LoopbackHosts)  # opened by cluster.toml's type, nothing else
    job = supervisor.job
    state = supervisor.run()

    assert state == JobState.SUCCEEDED, store.get_job(job.id).last_cause
    done = store.get_job(job.id)
    assert done.attempt >= 1 and done.restarts >= 1
    first = next(e.message for e in store.events(job.id) if e.kind == "failure")
    assert "worker-2" in first
    tasks = store.tasks(job.id)
    assert [t.address.rpartition(":")[0] for t in tasks] == list(ADDRESSES)  # its TF_CONFIG
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED}
    launches = [c for c in backend.calls if c.startswith("launch")]
    assert launches[:2] == ["launch 0 on [0, 1, 2]", "launch 1 on [0, 1, 2]"]
    assert backend.calls[-2:] == ["finish succeeded=True", "close"]
    assert job_processes(job.id) == []


def test_a_requested_stop_goes_through_the_seam_and_leaves_nothing(tmp_path: Path) -> None:
    path = loopback_job(tmp_path, ["--mode", "sleep"])
    store, supervisor = supervisor_of(tmp_path, path)
    job = supervisor.job
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        wait_for(lambda: store.get_job(job.id).state == JobState.RUNNING, 60)
        wait_for(lambda: len(job_processes(job.id)) >= 6, 30)  # 3 agents, 3 trainers
    finally:
        supervisor.stop_requested.set()
        runner.join(60)
    assert store.get_job(job.id).state == JobState.STOPPED
    assert "stop [0, 1, 2]" in supervisor.backend.calls  # type: ignore[attr-defined]
    assert job_processes(job.id) == []


@pytest.fixture
def installed_plugin(tmp_path: Path) -> dict[str, str]:
    """The loopback backend installed as a distribution would be: its metadata and its entry
    point on the path of every process the test starts."""
    site = tmp_path / "site"
    info = site / "orchestrate_loopback-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: orchestrate-loopback\n"
                                   "Version: 1.0\n")  # fmt: skip
    (info / "entry_points.txt").write_text(
        "[orchestrate.backends]\nloopback = tests.backends.loopback\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def test_every_command_reaches_a_plugin_backend_in_its_own_process(
    tmp_path: Path,
    cli: Callable[..., CliResult],
    installed_plugin: dict[str, str],
    reap_pids: Reaped,
) -> None:
    env = installed_plugin
    record = tmp_path / "calls.log"
    path = loopback_job(tmp_path, ["--mode", "sleep"], record)

    def calls() -> list[str]:
        return record.read_text().splitlines() if record.exists() else []

    assert cli("validate", str(path), env=env).code == 0
    dry = cli("launch", "--dry-run", str(path), env=env)
    assert dry.code == 0 and "127.0.0.3" in dry.out, dry

    checked = cli("check", "--json", str(path), env=env)
    assert checked.code == 0, checked.out + checked.err
    assert "lasting_call listen" in calls()

    listed = cli("standbys", "--json", str(path), env=env)
    assert listed.code == 0, listed
    assert "standbys clear=False" in calls()

    launched = cli("launch", "--detach", str(path), env=env)
    assert launched.code == 0, launched
    job = status_json(cli)["jobs"][0]
    job_id, first_supervisor = job["id"], job["supervisor"]["pid"]
    reap_pids.append(first_supervisor)
    wait_for(lambda: job_view(cli, job_id)["state"] == "running", 90)
    assert calls().count("launch 0 on [0, 1, 2]") == 1

    # The supervisor is lost; `attach` opens the backend in a new process and adopts the job.
    signal_supervisor(first_supervisor, job_id, 9)
    attach = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "attach", "--plain", job_id],
        env={**os.environ, **env}, cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    reap_pids.append(attach.pid)
    try:
        wait_for(lambda: "adopt" in calls(), 60)
        stopped = cli("stop", job_id, env=env)
        assert stopped.code == 0, stopped
        assert attach.wait(60) is not None
    finally:
        if attach.poll() is None:
            attach.kill()
            attach.wait()
    assert job_view(cli, job_id)["state"] == "stopped"
    assert "stop [0, 1, 2]" in calls()
    assert job_processes(job_id) == []

    resumed = cli("resume", "--detach", job_id, env=env)
    assert resumed.code == 0, resumed
    reap_pids.append(job_view(cli, job_id)["supervisor"]["pid"])
    wait_for(lambda: job_view(cli, job_id)["state"] == "running", 90)
    assert any(c.startswith("launch ") and not c.startswith("launch 0") for c in calls())
    assert cli("stop", job_id, env=env).code == 0
    assert wait_for_end(cli, job_id)["state"] == "stopped"
    assert job_processes(job_id) == []
