"""Bring your own script: training scripts that import nothing of orchestrate (tests/fixtures/
plain_*.py) get the whole supervision through the bootstrap: progress in `status`, a startup
deadline shorter than the run that they outlive, the watchdog, the startup deadline naming a
task that never starts, and a checkpoint on preemption. Real TensorFlow MWMS on the CPU."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.backends.agents import agent_pid
from tests.conftest import (
    REPO,
    CliResult,
    job_processes,
    job_view,
    launch_detached,
    signal_job_process,
    status_json,
    two_worker_config,
    wait_for,
    wait_for_end,
)
from worker.agent import BOOTSTRAP

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).parent / "fixtures"
PLAIN_FIT = FIXTURES / "plain_fit.py"
PLAIN_LOOP = FIXTURES / "plain_custom_loop.py"
OWN_CLUSTER = FIXTURES / "own_cluster_fit.py"
# The agent takes stacks with py-spy where it is on PATH (a dev dependency), else through the
# trainer's own handler: each test chooses.
VENV_BIN = str(Path(sys.executable).parent)
WITHOUT_PY_SPY = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != VENV_BIN)
WITH_PY_SPY = os.pathsep.join([VENV_BIN, WITHOUT_PY_SPY])


def _line_of(path: Path, text: str, after: str = "") -> int:
    """The number of the first line holding `text` (past the first holding `after`)."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    return next(i for i, line in enumerate(lines) if i >= start and text in line) + 1


def plain_config(
    tmp_path: Path, script: Path, args: list[str], *, env: str = "", supervision: str = "",
    restart: str = "",
) -> Path:  # fmt: skip
    entrypoint = (
        f'script = "{script}"\nargs = {json.dumps(args)}\n'
        f'env = {{ TF_CPP_MIN_LOG_LEVEL = "2" {env} }}'
    )
    return two_worker_config(
        tmp_path, "plain", entrypoint, supervision=supervision, restart=restart
    )


def wait_while_running(
    cli: Callable[..., CliResult],
    job_id: str,
    reap: list[int],
    ready: Callable[[dict], bool],
    interval: float = 0.5,
    states: tuple[str, ...] = ("launching", "running"),
) -> dict:
    def check() -> dict | None:
        job = job_view(cli, job_id)
        reap.extend(p for t in job["tasks"] for p in (agent_pid(t["agent"]), t["pid"]) if p)
        assert job["state"] in states, job["last_cause"]
        return job if ready(job) else None

    return wait_for(check, 180, interval=interval)  # type: ignore[return-value]


def _deadline_failures(job: dict) -> list[str]:
    """Failures the startup deadline caused (a healthy script must have none; a busy machine
    may still cause a restart of another kind)."""
    return [e["message"] for e in job["events"]
            if e["kind"] == "failure" and "startup deadline" in e["message"]]  # fmt: skip


def test_a_plain_fit_script_reports_progress_outlives_the_deadline_and_checkpoints_on_preemption(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    backup = tmp_path / "shared" / "backup"
    path = plain_config(
        tmp_path, PLAIN_FIT, ["--epochs", "30", "--backup-dir", str(backup), "--step-delay", "0.03"],
        supervision="startup_deadline = 25.0", restart="preemption_exit_code = 43",
    )  # fmt: skip
    job_id = launch_detached(cli, path, reap_pids)

    def training(job: dict) -> bool:
        return all(t["step"] > 0 and t["loss"] is not None for t in job["tasks"])

    job = wait_while_running(cli, job_id, reap_pids, training)
    for task in job["tasks"]:
        assert task["phase"] == "training" and task["step_signal"] == "keras"
        assert task["steps_observed"] and task["epoch"] >= 1
        assert (task["total_epochs"], task["steps_per_epoch"]) == (30, 28)
    wait_for(lambda: job_view(cli, job_id)["tasks"][0]["eta_seconds"] is not None, 30)
    # Past the startup deadline, still running: a healthy plain script is not stopped.
    job = wait_while_running(cli, job_id, reap_pids, lambda j: j["wall_seconds"] > 27)
    assert not _deadline_failures(job), job["events"]

    # Preemption: SIGTERM to one trainer; it checkpoints at the epoch's end, every worker exits
    # with the configured code (not 42), and the group restarts uncounted, resuming.
    signal_job_process(job["tasks"][1]["pid"], job_id, signal.SIGTERM)
    job = wait_for_end(cli, job_id, timeout=300)
    assert job["state"] == "succeeded", job["last_cause"]
    assert (job["restarts"], job["preemptions"]) == (1, 1)
    restart = next(e["message"] for e in job["events"] if e["kind"] == "restart")
    assert "preempted: restart not counted" in restart and "exited with code 43" in restart
    assert all(t["initial_epoch"] > 0 for t in job["tasks"])  # the script's own checkpoint
    # One step count across the resume: the chief ran every step of 30 epochs of 28, the
    # epochs before the preemption counted from its checkpoint (not only this attempt's).
    chief = job["tasks"][0]
    assert chief["step"] == 30 * 28, chief
    assert chief["phase"] == "finished"
    log = (tmp_path / "shared" / job_id / "logs" / "worker-1.log").read_text()
    assert re.search(r"preempted: checkpointed epoch \d+, exiting with 43", log)
    # Worker 1 either finishes, or (when the chief exits first and its last collective finds
    # no peer, as MWMS allows) is stopped as a straggler after the chief succeeded.
    last_attempt = log[log.rindex("[orchestrate] attempt") :]
    assert "task 1 done" in last_attempt or "exited with code 143 (stopped)" in last_attempt
    # Both tasks train at the same pace on their own: neither is named a straggler.
    assert not [e["message"] for e in job["events"] if e["kind"] == "straggler"]
    wait_for(lambda: not job_processes(job_id), 10)


def test_a_plain_custom_loop_reports_steps_and_outlives_the_deadline(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    # The script checkpoints a step variable of its own, not its optimizer, as TensorFlow's
    # custom-loop tutorial does: a resumed attempt's optimizer counts from 0 again.
    path = plain_config(
        tmp_path, PLAIN_LOOP,
        ["--steps", "1000", "--checkpoint-dir", str(tmp_path / "shared" / "ckpt"),
         "--step-delay", "0.02", "--leave-optimizer-out"],
        supervision="startup_deadline = 20.0",
    )  # fmt: skip
    job_id = launch_detached(cli, path, reap_pids)
    job = wait_while_running(
        cli, job_id, reap_pids, lambda j: all(t["step"] > 0 for t in j["tasks"])
    )
    for task in job["tasks"]:
        assert task["phase"] == "training" and task["step_signal"] == "optimizer"
    # A custom loop's all-reduce is timed too: its waits for peers are in its samples.
    wait_while_running(
        cli, job_id, reap_pids,
        lambda j: all(t["resources"] and t["resources"]["collective_percent"] is not None
                      for t in j["tasks"]),
    )  # fmt: skip
    # Past the deadline, with a checkpoint written: a trainer killed, the group resumes.
    job = wait_while_running(cli, job_id, reap_pids, lambda j: j["wall_seconds"] > 20)
    log = tmp_path / "shared" / job_id / "logs" / "worker-0.log"

    def checkpointed() -> list[int]:  # the chief prints each step it has checkpointed
        return [int(n) for n in re.findall(r"task 0 step (\d+)", log.read_text())]

    wait_for(checkpointed, 60)
    saved = max(checkpointed())
    # Killed once every task is past that checkpoint (each has marked it).
    job = wait_while_running(
        cli, job_id, reap_pids, lambda j: min(t["step"] for t in j["tasks"]) > saved
    )
    signal_job_process(job["tasks"][1]["pid"], job_id, signal.SIGKILL)

    def resumed(j: dict) -> bool:
        return j["attempt"] > 0 and all(
            t["attempt"] == j["attempt"] and t["phase"] == "training" for t in j["tasks"]
        )

    job = wait_while_running(
        cli,
        job_id,
        reap_pids,
        resumed,
        interval=0.2,
        states=("stopping", "restarting", "launching", "running"),  # the restart on its way
    )
    # STEP goes on from the checkpoint's whole step, not from the new optimizer's 0.
    assert all(t["step"] >= saved for t in job["tasks"]), (saved, job["tasks"])
    job = wait_for_end(cli, job_id, timeout=300)
    assert job["state"] == "succeeded", job["last_cause"]
    # 1,000 steps of at least 20 ms, after TensorFlow's import: longer than the deadline.
    assert not _deadline_failures(job) and job["wall_seconds"] > 20  # it outlived the deadline
    # The last count is read at the end: both workers ran 1,000 steps in lockstep, counted
    # across the resume; the loop reported no epoch (shown '-'), and it is over.
    assert [(t["step"], t["epoch"], t["phase"]) for t in job["tasks"]] == [
        (1000, 0, "finished"),
        (1000, 0, "finished"),
    ], job["tasks"]
    text = cli("status", job_id).out.splitlines()
    column = next(ln for ln in text if ln.startswith("TASK")).index("EPOCH")
    epochs = [ln[column:].split()[0] for ln in text if ln.startswith("worker-")]
    assert epochs == ["-", "-"], text
    # The last seconds (the chief saving, then gone) are not evidence of a straggler.
    assert not [e for e in job["events"] if e["kind"] == "straggler"], job["events"]
    assert all(t["straggler"] is None for t in job["tasks"])
    wait_for(lambda: not job_processes(job_id), 10)


def test_a_plain_script_that_hangs_mid_training_is_caught_by_the_watchdog(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    path = plain_config(
        tmp_path, PLAIN_FIT, ["--epochs", "6", "--backup-dir", str(tmp_path / "shared" / "b")],
        env=', HANG_AT_STEP = "1:40"', supervision="progress_timeout = 8.0",
        restart="max_restarts = 0",
    )  # fmt: skip
    result = cli("launch", str(path), timeout=240, env={"PATH": WITHOUT_PY_SPY})
    assert result.code == 1, result.out[-3000:]
    job = status_json(cli, status_json(cli)["jobs"][0]["id"])["jobs"][0]
    assert job["state"] == "failed"
    # Both stop: worker-1 hangs, worker-0 then waits in the next collective. The cause names
    # the task(s) whose steps stopped first, and the signal that went still.
    # Before the stop, every task's stacks were taken: the cause names where each named
    # task's own code was (worker-1 in the callback that hangs).
    own = r"worker-[01] in plain_fit\.py:\d+ \S+"
    assert re.fullmatch(
        rf"no training progress for 8s from worker-[01](, worker-1)? \(Keras fit steps\); "
        rf"{own}(, {own})?( \(max_restarts \(0\) reached\))?",
        job["last_cause"],
    ), job["last_cause"]
    hang = _line_of(PLAIN_FIT, "time.sleep(3600)", after='environ.get("HANG_AT_STEP"')
    if "worker-1 in" in job["last_cause"]:
        assert f"worker-1 in plain_fit.py:{hang} on_train_batch_end" in job["last_cause"]
    assert "task 1 hangs after step 40" in result.out
    stacks = (tmp_path / "shared" / job["id"] / "tasks" / "1" / "stacks-attempt-0.txt").read_text()
    assert "thread 0x" in stacks and "(most recent call first)" in stacks  # every Python thread
    assert f'plain_fit.py", line {hang} in on_train_batch_end' in stacks
    said = [e["message"] for e in job["events"] if e["kind"] == "stacks"]
    assert sorted(m.split(":")[0] for m in said) == ["worker-0", "worker-1"], job["events"]
    logged = cli("logs", job["id"], "--grep", "Python stacks of every thread").out
    assert "stacks-attempt-0.txt" in logged and logged.count("\n") == 2, logged
    report = cli("report", job["id"]).out
    assert report.count("stacks: worker-") == 2, report
    assert not job_processes(job["id"])


def test_a_custom_loop_stuck_in_a_collective_has_its_stacks_taken_before_the_stop(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    path = plain_config(
        tmp_path, PLAIN_LOOP,
        ["--steps", "100000", "--checkpoint-dir", str(tmp_path / "shared" / "ckpt"),
         "--step-delay", "0.02"],
        supervision="progress_timeout = 3.0", restart="max_restarts = 0",
    )  # fmt: skip
    job_id = launch_detached(cli, path, reap_pids, env={"PATH": WITH_PY_SPY})
    job = wait_while_running(
        cli, job_id, reap_pids, lambda j: all(t["step"] > 10 for t in j["tasks"])
    )
    # worker-1 stopped: worker-0 waits for it (3 s: before MWMS's own heartbeat gives up on it)
    trainer = job["tasks"][1]["pid"]
    assert trainer in job_processes(job_id)  # this job's trainer
    signal_job_process(trainer, job_id, signal.SIGSTOP)
    job = wait_for_end(cli, job_id)
    assert job["state"] == "failed"
    # worker-0 waits in the all-reduce of its loop's step; the stopped worker-1 cannot answer
    # (its dump stays empty): the cause says where worker-0 was, and that worker-1 gave none.
    loop = _line_of(PLAIN_LOOP, "while int(counter.numpy())")
    lines = "|".join(str(n) for n in range(loop, loop + 4))  # the loop's own lines
    assert re.fullmatch(
        r"no training progress for 3s from (worker-0, )?worker-1 \(optimizer iterations\); "
        rf"worker-0 in plain_custom_loop\.py:({lines}) <module>; no stacks from worker-1"
        r"( \(max_restarts \(0\) reached\))?",
        job["last_cause"],
    ), job["last_cause"]
    # py-spy's dump, native frames (the collective's wait) included.
    stacks = (tmp_path / "shared" / job_id / "tasks" / "0" / "stacks-attempt-0.txt").read_text()
    assert stacks.startswith("Process ") and "\nThread " in stacks, stacks  # py-spy's dump
    said = sorted(e["message"] for e in job_view(cli, job_id)["events"] if e["kind"] == "stacks")
    assert [m.split(":")[0] for m in said] == ["worker-0", "worker-1"], said
    assert "(py-spy)" in said[0], said
    # The event is in our words, from what the dump holds (the stopped task's stays empty).
    dump = tmp_path / "shared" / job_id / "tasks" / "1" / "stacks-attempt-0.txt"
    empty = not dump.exists() or not dump.read_bytes().strip()
    expected = "no Python stacks (the task's log says why)" if empty else "Python stacks of"
    assert said[1].startswith(f"worker-1: {expected}"), said
    assert not job_processes(job_id)


def test_a_plain_script_task_that_never_starts_is_named_by_the_startup_deadline(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    path = plain_config(
        tmp_path, PLAIN_FIT, ["--epochs", "3", "--backup-dir", str(tmp_path / "shared" / "b")],
        env=', NEVER_START = "1"', supervision="startup_deadline = 25.0",
    )  # fmt: skip
    result = cli("launch", str(path), timeout=180)
    assert result.code == 1, result.out[-3000:]
    job = status_json(cli, status_json(cli)["jobs"][0]["id"])["jobs"][0]
    # worker-1's interpreter is up (the bootstrap said so) but it never imports TensorFlow;
    # worker-0 is still loading, or past the import and waiting for its peer. Their stacks,
    # taken before the stop, say where each was.
    never = _line_of(PLAIN_FIT, "time.sleep(3600)")  # NEVER_START's sleep
    assert re.fullmatch(
        r"startup deadline of 25s passed; starting: (worker-0, )?worker-1"
        r"(; (before the rendezvous|waiting for peers): worker-0)?"
        rf"; (worker-0 in [^,;]+, )?worker-1 in plain_fit\.py:{never} <module>"
        r"(, worker-0 in [^,;]+)?",
        job["last_cause"],
    ), job["last_cause"]
    assert not job_processes(job["id"])


KERAS_CHECK = """
import gc, json, sys
import numpy as np
import tensorflow as tf
import keras  # Keras 3, beside tf.keras (tf-keras under orchestrate)
from worker import runtime

x, y = np.zeros((64, 4), "float32"), np.zeros((64,), "int64")
found = {}

def model_of(k):
    m = k.Sequential([k.layers.Input(shape=(4,)), k.layers.Dense(2)])
    m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return m

class Count(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        found["tf.keras"] = sum(getattr(type(o), "orchestrate_progress", False)
                                for o in gc.get_objects() if isinstance(o, tf.keras.callbacks.Callback))

ctx = runtime.task_context()
model_of(tf.keras).fit(x, y, epochs=2, callbacks=[*runtime.callbacks(ctx), Count()], verbose=0)
progress = json.loads(open(sys.argv[1]).read())
found["tf.keras progress"] = [progress["step_signal"], progress["epochs"], progress["step"]]
model_of(keras).fit(x, y, epochs=3, batch_size=16, verbose=0)
progress = json.loads(open(sys.argv[1]).read())
found["keras 3 progress"] = [progress["step_signal"], progress["epochs"], progress["step"]]
print(json.dumps(found))
"""


def test_fit_is_instrumented_once_for_runtime_scripts_and_also_under_keras_3(
    tmp_path: Path,
) -> None:
    script = tmp_path / "check.py"
    script.write_text(KERAS_CHECK)
    progress = tmp_path / "progress.json"
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
           "ORCHESTRATE_PROGRESS_FILE": str(progress), "ORCHESTRATE_JOB_DIR": str(tmp_path)}  # fmt: skip
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, BOOTSTRAP, str(script), str(progress)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["tf.keras"] == 1  # runtime.callbacks' reporter, and not a second one of ours
    assert found["tf.keras progress"] == ["keras", 2, 4]
    assert found["keras 3 progress"] == ["keras", 3, 12]


def test_a_task_with_a_slow_input_pipeline_is_named_the_straggler_with_its_reason(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """worker-1's input pipeline sleeps 0.1 s a batch (the script does it, by environment):
    worker-1 is named the straggler, input-bound, and the job goes on. The script imports
    nothing of ours; its resources are in `status --json` all the same. (Looked at every 2 s:
    each look starts a CLI process, a load on this machine's two CPUs.)"""
    path = plain_config(
        tmp_path, PLAIN_FIT, ["--epochs", "400", "--backup-dir", str(tmp_path / "backup")],
        env=', SLOW_INPUT = "1:0.1"',
    )  # fmt: skip
    job_id = launch_detached(cli, path, reap_pids)

    def timed(job: dict) -> bool:
        return all(
            t["resources"] and t["resources"]["collective_percent"] is not None
            for t in job["tasks"]
        )

    job = wait_while_running(cli, job_id, reap_pids, timed, interval=2.0)
    for task in job["tasks"]:
        sample = task["resources"]
        assert sample["cpu_percent"] > 5 and sample["rss_bytes"] > 200 << 20
        assert 0 < sample["host_mem_available"] < sample["host_mem_total"]
        assert sample["cpu_wait_percent"] is not None and sample["input_percent"] is not None
        assert sample["host_cpu_percent"] is not None and sample["gpus"] == []
    job = wait_while_running(
        cli, job_id, reap_pids, lambda j: any(t["straggler"] for t in j["tasks"]), 2.0
    )
    assert job["tasks"][0]["straggler"] is None
    assert job["tasks"][1]["straggler"].startswith("input-bound (")
    assert job["tasks"][1]["resources"]["input_percent"] > 30
    assert job["tasks"][0]["resources"]["input_percent"] < 15
    row = next(r for r in cli("status", job_id).out.splitlines() if r.startswith("worker-1"))
    assert row.endswith("input-bound")
    assert cli("stop", job_id, timeout=120).code == 0
    job = job_view(cli, job_id)
    assert job["state"] == "stopped"  # a straggler is a warning, never a failure:
    assert not [e for e in job["events"] if e["kind"] == "failure" and "straggler" in e["message"]]
    [named] = [e for e in job["events"] if e["kind"] == "straggler"]
    assert named["task"] == 1
    assert named["message"].startswith("worker-1 is a straggler: its own part of each step is ")
    assert "likely reason: input-bound (" in named["message"]
    report = json.loads(cli("report", job_id, "--json").out)
    assert report["stragglers"] == [named["message"]]
    assert "% waiting for input" in report["resource_chart"]["panels"]
    wait_for(lambda: not job_processes(job_id), 10)


def test_a_script_that_builds_its_own_cluster_shows_where_it_really_listens(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """Its own resolver puts the workers on ports of its own: `status` shows those, marked,
    and says that TF_CONFIG's address is not the one it uses."""
    ports = []
    for _ in range(2):  # two free ports of the script's own choosing
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    own = [f"127.0.0.1:{p}" for p in ports]
    path = plain_config(tmp_path, OWN_CLUSTER, [], env=f', OWN_CLUSTER = "{",".join(own)}"')
    job_id = launch_detached(cli, path, reap_pids)
    job = wait_for_end(cli, job_id, timeout=240)
    assert job["state"] == "succeeded", job["last_cause"]
    assert [t["listening"] for t in job["tasks"]] == own
    assert all(t["address"] not in own for t in job["tasks"])  # TF_CONFIG's, unused
    text = cli("status", job_id).out
    assert f"{own[0]}*" in text and f"{own[1]}*" in text, text
    assert "* worker-0, worker-1: where the script's own cluster resolver put it" in text
