"""The backend seam: a backend the rest of the code has never heard of (tests/backends/
loopback.py, three hosts on 127.0.0.2-4) runs a whole job through the supervisor unchanged:
launch, a failure, a whole-group restart, success; and a requested stop."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

from orchestrator.config import load_config
from orchestrator.job_records import register_job
from orchestrator.logstream import LineSink
from orchestrator.states import JobState, TaskState
from orchestrator.store import Store
from orchestrator.supervisor import Supervisor
from tests.backends.loopback import LoopbackHosts
from tests.conftest import FAKE, job_processes, wait_for

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def loopback_job(tmp_path: Path, args: list[str]) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    hosts = "".join(f'[[backend.hosts]]\naddress = "{a}"\nname = "lo-{a[-1]}"\n' for a in ADDRESSES)
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[job]\nname = "seam"\nshared_dir = "{shared}"\n'
        f'[entrypoint]\nscript = "{FAKE}"\nargs = {json.dumps(args)}\n'
        "[supervision]\nheartbeat_interval = 0.2\nstop_grace = 2.0\npoll_interval = 0.1\n"
        "[restart]\nmax_restarts = 2\nbackoff = 0.1\n"
        f'[backend]\ntype = "ssh"\n{hosts}'
    )
    return path


def test_a_backend_written_against_the_protocol_alone_runs_restarts_and_ends_a_job(
    tmp_path: Path,
) -> None:
    # Task 2 fails on the first attempt, well before the chief would succeed.
    path = loopback_job(tmp_path, ["--mode", "ok-after:4", "--task-2", "fail-first:3"])
    config = load_config(path)
    store = Store(tmp_path / "state.db")
    job = register_job(store, config, str(path))
    backend = LoopbackHosts(config.backend)  # type: ignore[arg-type]
    sink = LineSink(tmp_path / "copies", io.StringIO())
    state = Supervisor(store, job, config, sink, backend).run()

    assert state == JobState.SUCCEEDED, store.get_job(job.id).last_cause
    done = store.get_job(job.id)
    assert (done.attempt, done.restarts) == (1, 1)
    assert "worker-2" in next(e.message for e in store.events(job.id) if e.kind == "failure")
    tasks = store.tasks(job.id)
    assert [t.address.rpartition(":")[0] for t in tasks] == list(ADDRESSES)  # its TF_CONFIG
    assert {t.state for t in tasks} == {TaskState.SUCCEEDED}
    launches = [c for c in backend.calls if c.startswith("launch")]
    assert launches == ["launch 0 on [0, 1, 2]", "launch 1 on [0, 1, 2]"]
    assert backend.calls[-2:] == ["finish succeeded=True", "close"]
    assert job_processes(job.id) == []


def test_a_requested_stop_goes_through_the_seam_and_leaves_nothing(tmp_path: Path) -> None:
    path = loopback_job(tmp_path, ["--mode", "sleep"])
    config = load_config(path)
    store = Store(tmp_path / "state.db")
    job = register_job(store, config, str(path))
    backend = LoopbackHosts(config.backend)  # type: ignore[arg-type]
    supervisor = Supervisor(store, job, config, LineSink(tmp_path / "c", io.StringIO()), backend)
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        wait_for(lambda: store.get_job(job.id).state == JobState.RUNNING, 60)
        wait_for(lambda: len(job_processes(job.id)) >= 6, 30)  # 3 agents, 3 trainers
    finally:
        supervisor.stop_requested.set()
        runner.join(60)
    assert store.get_job(job.id).state == JobState.STOPPED
    assert "stop [0, 1, 2]" in backend.calls
    assert job_processes(job.id) == []
