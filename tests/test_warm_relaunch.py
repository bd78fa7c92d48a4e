"""Warm relaunches: when a job ends, each task's ready standby is kept for this user's next job
with the same Python and environment ([restart] keep_standbys), and the next launch starts in
it. Real TensorFlow MWMS on the CPU, with a script that imports nothing of ours
(tests/fixtures/plain_fit.py); `orchestrate standbys` shows and ends what is kept."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    CliResult,
    as_nobody,
    job_processes,
    job_view,
    launch_detached,
    two_worker_config,
    wait_for,
    wait_for_end,
)
from worker.proctl import is_alive, is_job_process

pytestmark = pytest.mark.slow
PLAIN_FIT = REPO / "tests" / "fixtures" / "plain_fit.py"
WARM = re.compile(r"warm start: the standby \(pid (\d+)\) runs the entrypoint")


def _config(
    tmp_path: Path, restart: str = "", env: str = "", args: str = '"--epochs", "3"'
) -> Path:
    backup = tmp_path / "shared" / "backup"
    entry = (
        f'script = "{PLAIN_FIT}"\n'
        f'args = [{args}, "--backup-dir", "{backup}"]\n'
        f'env = {{ TF_CPP_MIN_LOG_LEVEL = "2", SHOW_STARTUP = "1"{env} }}'
    )
    return two_worker_config(tmp_path, "relaunch", entry, restart=restart)


def _log(tmp_path: Path, job_id: str, task: int) -> str:
    return (tmp_path / "shared" / job_id / "logs" / f"worker-{task}.log").read_text()


def _startups(log: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"^startup (\{.*\})$", log, re.M)]


def _kept(cli: Callable[..., CliResult], config: Path) -> list[dict]:
    result = cli("standbys", str(config), "--json")
    assert result.code == 0, result
    (host,) = json.loads(result.out)["hosts"]
    assert host["error"] is None, host
    return [k for k in host["keepers"] if k["state"] == "kept"]


def _run(cli: Callable[..., CliResult], config: Path, reap: list[int]) -> str:
    job_id = launch_detached(cli, config, reap)
    job = wait_for_end(cli, job_id, timeout=300)
    assert job["state"] == "succeeded", job["last_cause"]
    return job_id


def test_a_relaunch_starts_in_the_standbys_the_last_job_kept(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    config = _config(tmp_path)
    first = _run(cli, config, reap_pids)
    kept = _kept(cli, config)
    assert len(kept) == 2 and all(k["job"] == "" and k["standby"] for k in kept), kept
    reap_pids.extend(p for k in kept for p in (k["pid"], k["standby"]))
    standbys = {k["standby"] for k in kept}
    # Another user reaches none of them: not the kept sockets, not even their directory.
    probe = (
        "import os, socket, sys\n"
        "for path in sys.argv[1:]:\n"
        "    for reach in (lambda: os.listdir(os.path.dirname(path)),\n"
        "                  lambda: socket.socket(socket.AF_UNIX).connect(path)):\n"
        "        try: reach(); print('reached', path)\n"
        "        except PermissionError: print('refused')\n"
    )
    other = as_nobody([sys.executable, "-c", probe, *(k["socket"] for k in kept)], {})
    out, _ = other.communicate(timeout=30)
    assert out.split() == ["refused"] * 4, out
    text = cli("standbys", str(config)).out
    assert text.count("kept, standby") == 2 and "MB" in text and "s left" in text, text

    second = _run(cli, config, reap_pids)
    used = set()
    for i in (0, 1):
        log = _log(tmp_path, second, i)
        warm = WARM.search(log)
        assert warm, log
        used.add(int(warm[1]))
        (startup,) = _startups(log)
        # The script ran once, in an interpreter that had imported TensorFlow, and saw this
        # job's TF_CONFIG and directory, not the first job's.
        assert startup["tf_imported"] and startup["attempt"] == "0" and startup["runs"] == 1
        assert json.loads(startup["tf_config"])["task"] == {"type": "worker", "index": i}
        assert "warm start" not in _log(tmp_path, first, i)  # the first launch was cold
    assert used == standbys
    # The keepers the second job adopted keep the standbys they made for it in turn.
    again = _kept(cli, config)
    assert len(again) == 2 and not {k["standby"] for k in again} & standbys, again
    reap_pids.extend(p for k in again for p in (k["pid"], k["standby"]))

    result = cli("standbys", str(config), "--clear")
    assert result.code == 0 and "nothing kept" in result.out, result
    assert not any(is_alive(p) for k in again for p in (k["pid"], k["standby"]))


@pytest.mark.parametrize(
    ("restart", "why"),
    [
        ("keep_standbys = 0", "off"),
        ("keep_standbys_mb = 100", "not kept: "),  # a standby holds about 560 MB
    ],
)
def test_nothing_is_kept_when_keeping_is_off_or_past_its_memory_budget(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int], restart: str, why: str
) -> None:
    config = _config(tmp_path, restart=restart)
    job_id = _run(cli, config, reap_pids)
    assert _kept(cli, config) == []
    standby_logs = [tmp_path / "shared" / job_id / "tasks" / str(i) / "standby.log" for i in (0, 1)]
    if why == "off":  # a job that succeeded, with nothing to keep for: no standby was made
        assert not any(log.exists() for log in standby_logs)
    else:
        standby_log = "".join(log.read_text() for log in standby_logs)
        assert "would pass the budget (100 MB)" in standby_log, standby_log


def test_a_kept_standby_ends_when_its_time_is_up(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    config = _config(tmp_path, restart="keep_standbys = 6")
    _run(cli, config, reap_pids)
    kept = _kept(cli, config)
    assert len(kept) == 2 and all(k["kept_left"] <= 6 for k in kept), kept
    pids = [p for k in kept for p in (k["pid"], k["standby"])]
    reap_pids.extend(pids)
    wait_for(lambda: not any(is_alive(p) for p in pids), 15)
    assert _kept(cli, config) == []


def test_a_relaunched_script_that_sets_import_time_variables_itself_starts_over_cold(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """The warm first start of a relaunch: the script sets TF_ENABLE_ONEDNN_OPTS before it
    imports TensorFlow, which the kept standby had imported without it: it starts over cold in
    the same process and trains. It imports it by importlib.import_module, not by an import
    statement (test_warm_restart's script has the statement)."""
    config = _config(
        tmp_path, env=', SET_BEFORE_IMPORT = "TF_ENABLE_ONEDNN_OPTS=0", IMPORT_WITH_IMPORTLIB = "1"'
    )
    _run(cli, config, reap_pids)
    kept = _kept(cli, config)
    assert len(kept) == 2, kept
    reap_pids.extend(p for k in kept for p in (k["pid"], k["standby"]))
    second = _run(cli, config, reap_pids)
    for i in (0, 1):
        log = _log(tmp_path, second, i)
        assert WARM.search(log), log
        runs = [(s["attempt"], s["tf_imported"]) for s in _startups(log)]
        assert runs[:2] == [("0", True), ("0", False)], runs  # warm, then over cold: 1 process
        assert not any(s["mark"] for s in _startups(log))  # the script sees a cold start's env
        assert "TF_ENABLE_ONEDNN_OPTS before importing TensorFlow" in log


def test_a_resumed_job_starts_warm_in_its_kept_standbys_and_its_keepers_serve_it(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """Stopped, then resumed: the same job's next attempt finds its keepers kept (not on its
    tasks' names any more), starts in them, and they serve it again: its sweep and stacks find
    the warm trainers, and `standbys --clear` leaves them alone (it ends only what is kept)."""
    config = _config(
        tmp_path, restart="standby_delay = 0", args='"--epochs", "40", "--step-delay", "0.03"'
    )
    job_id = launch_detached(cli, config, reap_pids)
    ready = re.compile(r"warm standby ready for a restart")
    wait_for(lambda: all(ready.search(_log(tmp_path, job_id, i)) for i in (0, 1)), 240)
    assert cli("stop", job_id).code == 0
    kept = _kept(cli, config)
    assert len(kept) == 2, kept
    reap_pids.extend(p for k in kept for p in (k["pid"], k["standby"]))

    assert cli("resume", job_id, "--detach").code == 0
    job = wait_for(
        lambda: (
            (j := job_view(cli, job_id))["state"] == "running"
            and all(t["attempt"] == 1 and t["state"] == "running" and t["pid"] for t in j["tasks"])
            and j
        ),
        240,
    )
    assert isinstance(job, dict)
    trainers = {t["pid"] for t in job["tasks"]}
    reap_pids.extend(trainers)
    for i in (0, 1):
        assert WARM.search(_log(tmp_path, job_id, i).split("attempt 1:")[-1])
    result = cli("standbys", str(config), "--json", "--clear")
    (host,) = json.loads(result.out)["hosts"]
    serving = [k for k in host["keepers"] if k["job"] == job_id]
    assert {k["trainer"] for k in serving} == trainers, host
    assert all(k["state"] == "serving" and k["pid"] in {c["pid"] for c in kept} for k in serving)
    assert all(is_job_process(pid, job_id) for pid in trainers)  # the sweep finds them
    assert job_view(cli, job_id)["state"] == "running"
    assert cli("stop", job_id).code == 0
    wait_for(lambda: not job_processes(job_id), 30)
