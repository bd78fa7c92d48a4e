"""Warm restarts: each task keeps a standby interpreter with TensorFlow imported (worker/warm/keeper.py)
and a restart runs the entrypoint in it. Real TensorFlow MWMS on the CPU, with a script that
imports nothing of ours (tests/fixtures/plain_fit.py)."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    CliResult,
    job_processes,
    job_view,
    launch_detached,
    signal_job_process,
    two_worker_config,
    wait_for,
)

pytestmark = pytest.mark.slow
PLAIN_FIT = REPO / "tests" / "fixtures" / "plain_fit.py"
READY = re.compile(r"warm standby ready for a restart: pid (\d+), RSS (\d+) MB")


def _config(tmp_path: Path) -> Path:
    backup = tmp_path / "shared" / "backup"
    entry = (
        f'script = "{PLAIN_FIT}"\n'
        f'args = ["--epochs", "40", "--backup-dir", "{backup}", "--step-delay", "0.03"]\n'
        'env = { TF_CPP_MIN_LOG_LEVEL = "2", SHOW_STARTUP = "1" }'
    )
    return two_worker_config(tmp_path, "warm", entry, restart="standby_delay = 0")


def _log(tmp_path: Path, job_id: str, task: int) -> str:
    path = tmp_path / "shared" / job_id / "logs" / f"worker-{task}.log"
    return path.read_text() if path.exists() else ""


def _standbys(tmp_path: Path, job_id: str) -> dict[int, list[int]]:
    """Each task's standby pids, in the order they became ready."""
    return {i: [int(m[0]) for m in READY.findall(_log(tmp_path, job_id, i))] for i in (0, 1)}


def _startups(log: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"^startup (\{.*\})$", log, re.M)]


def _trained_since_restart(cli: Callable[..., CliResult], job_id: str, restarts: int) -> dict:
    """The job once `restarts` restarts are behind it and every task of the attempt after
    them has trained an epoch past the one it resumed from; then stopped (the rest of its 40
    epochs would show nothing more)."""
    job = wait_for(
        lambda: (j := job_view(cli, job_id))["restarts"] >= restarts
        and all(t["state"] == "running" and t["epoch"] >= t["initial_epoch"] + 1 for t in j["tasks"])
        and j,
        240,
    )  # fmt: skip
    assert isinstance(job, dict)
    assert cli("stop", job_id).code == 0
    return job


def _kill_a_trainer_and_finish(
    tmp_path: Path, cli: Callable[..., CliResult], job_id: str, reap: list[int]
) -> dict:
    job = job_view(cli, job_id)
    reap.extend(t["pid"] for t in job["tasks"] if t["pid"])
    signal_job_process(job["tasks"][1]["pid"], job_id, signal.SIGKILL)
    job = _trained_since_restart(cli, job_id, 1)
    assert job["restarts"] >= 1  # the kill's; a busy machine may add one (it resumes too)
    assert all(t["initial_epoch"] > 0 for t in job["tasks"])  # resumed from the checkpoint
    assert job_view(cli, job_id)["state"] == "stopped"
    # Keepers too: those that keep their standby for the next job serve none (worker.warm.registry).
    wait_for(lambda: not job_processes(job_id), 15)
    return job


def test_a_restart_runs_in_the_standby_and_the_script_sees_a_fresh_start(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """Task 0's first standby is killed once ready, before the restart: it is replaced (the
    libraries imported ahead too), and the restart is warm in both tasks, task 0's in the
    replacement."""
    job_id = launch_detached(cli, _config(tmp_path), reap_pids)
    ready = wait_for(lambda: (s := _standbys(tmp_path, job_id)) and all(s.values()) and s, 240)
    assert isinstance(ready, dict)
    reap_pids.extend(pid for pids in ready.values() for pid in pids)
    first = ready[0][0]
    signal_job_process(first, job_id, signal.SIGKILL)
    assert wait_for(lambda: len(_standbys(tmp_path, job_id)[0]) >= 2, 240)
    replacement = _standbys(tmp_path, job_id)[0][1]
    assert replacement != first
    reap_pids.append(replacement)
    _kill_a_trainer_and_finish(tmp_path, cli, job_id, reap_pids)
    for i, standby in ((0, replacement), (1, ready[1][0])):
        log = _log(tmp_path, job_id, i)
        assert f"warm start: the standby (pid {standby}) runs the entrypoint" in log, log
        cold, warm = _startups(log)[:2]
        # The script sees what a cold start shows it: its own __main__ (nothing left from
        # an earlier run), its argv, this attempt's TF_CONFIG and environment, its directory.
        for seen in (cold, warm):
            assert seen["name"] == "__main__" and seen["runs"] == 1
            assert seen["argv"][0] == str(PLAIN_FIT) and seen["argv"][1:3] == ["--epochs", "40"]
            assert json.loads(seen["tf_config"])["task"] == {"type": "worker", "index": i}
            assert seen["cwd"] == cold["cwd"]
        assert (cold["attempt"], warm["attempt"]) == ("0", "1")
        assert not cold["tf_imported"] and warm["tf_imported"]  # the standby had imported it
        # And, ahead, the libraries the task's last trainer imported (worker.warm.imports_ahead).
        assert not cold["sklearn_imported"] and warm["sklearn_imported"]
        recorded = tmp_path / "shared" / job_id / "tasks" / str(i) / "warm-imports.json"
        assert "sklearn.datasets" in json.loads(recorded.read_text())["modules"]
        # Every attempt's own lines reach the durable log `orchestrate logs` reads: the failed
        # attempt's end and the standby's notes too, byte for byte the task's log.
        copy = tmp_path / "home" / "jobs" / job_id / "logs" / f"worker-{i}.log"
        assert copy.read_text() == log
        logs = cli("logs", job_id, "--task", str(i)).out
        assert "warm standby ready for a restart" in logs
        assert re.search(r"trainer exited with code -?\d+", logs[: logs.index("attempt 1:")])


def test_a_script_that_sets_import_time_variables_itself_is_started_over_cold(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """The script sets TF_CPP_MIN_LOG_LEVEL and TF_ENABLE_ONEDNN_OPTS before its own `import
    tensorflow`; a warm trainer had imported TensorFlow without them. At the script's import it
    starts over cold in the same process, says so, and the task's later attempts start cold:
    every run of the script that goes on to train imported TensorFlow after its variables."""
    config = _config(tmp_path)
    config.write_text(config.read_text().replace(
        'SHOW_STARTUP = "1" }',
        'SHOW_STARTUP = "1", SET_BEFORE_IMPORT = "TF_CPP_MIN_LOG_LEVEL=3,TF_ENABLE_ONEDNN_OPTS=0" }',
    ))  # fmt: skip
    job_id = launch_detached(cli, config, reap_pids)
    ready = wait_for(lambda: (s := _standbys(tmp_path, job_id)) and all(s.values()) and s, 240)
    assert isinstance(ready, dict)
    reap_pids.extend(pid for pids in ready.values() for pid in pids)
    first = job_view(cli, job_id)
    reap_pids.extend(t["pid"] for t in first["tasks"] if t["pid"])
    signal_job_process(first["tasks"][1]["pid"], job_id, signal.SIGKILL)
    # Attempt 1 trains (its trainers, started over cold, past an epoch), then a second kill.
    second = wait_for(
        lambda: (j := job_view(cli, job_id))["restarts"] >= 1
        and all(t["state"] == "running" and t["epoch"] >= t["initial_epoch"] + 1 for t in j["tasks"])
        and j,
        240,
    )  # fmt: skip
    assert isinstance(second, dict)
    reap_pids.extend(t["pid"] for t in second["tasks"] if t["pid"])
    signal_job_process(second["tasks"][0]["pid"], job_id, signal.SIGKILL)
    # The attempt after it trains too (started cold, as every later one).
    job = _trained_since_restart(cli, job_id, 2)
    assert job["restarts"] >= 2, job["last_cause"]
    for i in (0, 1):
        log = _log(tmp_path, job_id, i)
        runs = [(s["attempt"], s["tf_imported"]) for s in _startups(log)]
        # Cold; warm, then started over cold in the same process; cold again (and in any
        # restart a busy machine added).
        assert runs[:3] == [("0", False), ("1", True), ("1", False)], runs
        assert runs[3:] and all(not imported for _, imported in runs[3:]), runs
        assert not any(s["mark"] for s in _startups(log))  # each saw a cold start's env
        assert (
            "orchestrate: the script sets TF_CPP_MIN_LOG_LEVEL, TF_ENABLE_ONEDNN_OPTS before "
            "importing TensorFlow, which this warm trainer had imported already: starting over "
            "cold" in log
        )
        reason = "the script sets TF_CPP_MIN_LOG_LEVEL,TF_ENABLE_ONEDNN_OPTS before importing"
        assert f"no warm standby on this host: {reason}" in log
        assert f"cold start: {reason}" in log
        assert log.count("warm start: the standby") == 1
        # Nor did its standby import the script's libraries ahead: it set variables first.
        assert not any(s["sklearn_imported"] for s in _startups(log))
        recorded = tmp_path / "shared" / job_id / "tasks" / str(i) / "warm-imports.json"
        data = json.loads(recorded.read_text())
        assert data == {"modules": [], "not_recorded": "__main__ sets TF_CPP_MIN_LOG_LEVEL"}
    wait_for(lambda: not job_processes(job_id), 15)


def test_no_standby_imports_beside_the_first_steps_and_faults_back_to_back_restart_warm(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """[restart] standby_delay: nothing imports TensorFlow beside a job's first epochs. A
    trainer killed before the delay gets its standby as it exits (and the task stopped with it
    too: keep_standbys is on), and the restart waits for them and starts warm in both tasks.
    The restarted trainers' next standbys start as they train, not `standby_delay` later, so a
    second fault soon after restarts warm again."""
    from worker.warm.registry import entries

    backup = tmp_path / "shared" / "backup"
    entry = (
        f'script = "{PLAIN_FIT}"\n'
        f'args = ["--epochs", "40", "--backup-dir", "{backup}", "--step-delay", "0.03"]\n'
        'env = { TF_CPP_MIN_LOG_LEVEL = "2", SHOW_STARTUP = "1" }'
    )
    config = two_worker_config(tmp_path, "delay", entry, restart="standby_delay = 600")
    job_id = launch_detached(cli, config, reap_pids)
    running = wait_for(
        lambda: (j := job_view(cli, job_id))["state"] == "running"
        and all(t["state"] == "running" and t["epoch"] >= 2 for t in j["tasks"])
        and j,
        240,
    )  # fmt: skip
    assert isinstance(running, dict)
    reap_pids.extend(t["pid"] for t in running["tasks"] if t["pid"])
    # Two epochs trained: no keeper and no standby for this job, anywhere.
    assert not [e for e in entries() if e.job == job_id]
    assert not any((tmp_path / "shared" / job_id / "tasks" / str(i) / "standby.log").exists()
                   for i in (0, 1))  # fmt: skip
    signal_job_process(running["tasks"][1]["pid"], job_id, signal.SIGKILL)

    def next_standbys_ready() -> bool:
        """Each task runs in a standby, and a standby other than that one is ready since."""
        for i in (0, 1):
            log = _log(tmp_path, job_id, i)
            started = re.search(r"warm start: the standby \(pid (\d+)\)", log)
            later = log[started.end() :] if started else ""
            if not [pid for pid in READY.findall(later) if pid[0] != started[1]]:
                return False
        return True

    # Within standby_delay of the restart (600 s), the next standbys are ready all the same.
    assert wait_for(next_standbys_ready, 240)
    second = job_view(cli, job_id)
    reap_pids.extend(t["pid"] for t in second["tasks"] if t["pid"])
    signal_job_process(second["tasks"][0]["pid"], job_id, signal.SIGKILL)
    job = _trained_since_restart(cli, job_id, 2)
    assert job["restarts"] >= 2, job["last_cause"]
    for i in (0, 1):
        log = _log(tmp_path, job_id, i)
        assert "warm start: the standby" in log.split("attempt 1:")[1], log[-3000:]
        runs = [(s["attempt"], s["tf_imported"]) for s in _startups(log)]
        # Cold, then warm at every restart (a busy machine's extra one included).
        assert runs[0] == ("0", False) and len(runs) >= 3, runs
        assert all(imported for _, imported in runs[1:]), runs
    wait_for(lambda: not job_processes(job_id), 15)
