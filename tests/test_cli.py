"""The real CLI in a subprocess: bad input, dry runs, and whole jobs with a stand-in trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.backends.agents import agent_pid
from tests.conftest import REPO, CliResult, fake_job, status_json, wait_for
from worker.proctl import is_alive


def test_importing_the_cli_and_running_status_never_imports_tensorflow(home: Path) -> None:
    probe = "import sys, orchestrator.commands.cli; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "orchestrator", "status"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    imported = {line.split("|")[-1].strip() for line in trace.stderr.splitlines()}
    assert "orchestrator.commands.cli" in imported
    assert not {m for m in imported if m.startswith(("tensorflow", "keras", "paramiko"))}


BAD_INPUTS = {
    "missing file": (None, "no such file"),
    "a directory": ("DIR", "is a directory"),
    "invalid TOML": ("[job\nname = 1\n", "invalid TOML"),
    "empty file": ("  \n", "file is empty"),
    "unknown key": ("EXTRA", "job.colour: unknown key"),
    "wrong type": ("workers = 'two'", "backend.workers: Input should be a valid integer"),
    "zero workers": ("workers = 0", "backend.workers: must be >= 1 (got 0)"),
    "duplicate host": ("DUP", "backend.hosts[1].address: duplicate host 10.77.0.1:22"),
    "missing entrypoint": ("NOENTRY", "entrypoint: required key is missing"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
@pytest.mark.parametrize("command", ["launch", "validate"])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(
    case: str, command: str, tmp_path: Path, home: Path, cli: Callable[..., CliResult]
) -> None:
    edit, expected = BAD_INPUTS[case]
    good = fake_job(tmp_path, ["--mode", "ok"])
    path = tmp_path / "cluster.toml"
    if edit is None:
        pass  # not written
    elif edit == "DIR":
        path = tmp_path / "shared"
    elif edit == "EXTRA":
        path.write_text(good.replace('name = "fake"', 'name = "fake"\ncolour = "red"'))
    elif edit == "DUP":
        path.write_text(
            good.replace(
                'type = "local"\nworkers = 2',
                'type = "ssh"\n'
                '[[backend.hosts]]\naddress = "10.77.0.1"\n'
                '[[backend.hosts]]\naddress = "10.77.0.1"\n',
            )
        )
    elif edit == "NOENTRY":
        start = good.index("[entrypoint]")
        path.write_text(good[:start] + good[good.index("[backend]") :])
    elif edit.startswith("workers"):
        path.write_text(good.replace("workers = 2", edit))
    else:
        path.write_text(edit)
    result = cli(command, str(path))
    assert result.code == 2, result
    assert result.err.count("\n") == 1 and result.err.startswith("error: "), result.err
    assert expected in result.err
    assert "Traceback" not in result.err + result.out
    assert status_json(cli)["jobs"] == []  # nothing recorded
    assert list((tmp_path / "shared").iterdir()) == []  # nothing started or written


def test_unknown_job_and_usage_errors_exit_2(cli: Callable[..., CliResult]) -> None:
    for args in (["status", "nope"], ["stop", "nope"], ["logs", "nope"], ["launch"]):
        result = cli(*args)
        assert result.code == 2, (args, result)
        assert "Traceback" not in result.err


def test_validate_and_dry_run_print_every_tf_config(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, [], workers=3, extra="[ports]\nbase = 23000\n"))
    assert cli("validate", str(path)).out.startswith(
        f"{path}: ok: job 'fake', local backend, 3 task(s)"
    )
    result = cli("launch", "--dry-run", str(path))
    assert result.code == 0, result.err
    configs = [
        json.loads(line.split("TF_CONFIG=", 1)[1])
        for line in result.out.splitlines()
        if "TF_CONFIG=" in line
    ]
    cluster = {"worker": ["127.0.0.1:23000", "127.0.0.1:23001", "127.0.0.1:23002"]}
    assert configs == [
        {"cluster": cluster, "task": {"type": "worker", "index": i}} for i in range(3)
    ]
    assert status_json(cli)["jobs"] == []
    assert list((tmp_path / "shared").iterdir()) == []


def _job_pids(job: dict, shared: Path) -> list[int]:
    """Every agent and trainer pid of every attempt (the stand-in trainer records them)."""
    pids = {agent_pid(t["agent"]) for t in job["tasks"] if agent_pid(t["agent"])}
    for pidfile in shared.glob(f"{job['id']}/tasks/*/trainer.pids"):
        pids.update(int(p) for p in pidfile.read_text().split())
    return sorted(pids)


def test_a_failing_task_stops_the_group_and_fails_the_job(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        fake_job(
            tmp_path,
            ["--mode", "sleep", "--task-1", "fail:3"],
            extra="[restart]\nmax_restarts = 2\nbackoff = 0.1\n",
        )
    )
    result = cli("launch", str(path), timeout=60)
    assert result.code == 1, result
    [job] = status_json(cli)["jobs"]
    pids = _job_pids(job, tmp_path / "shared")
    reap_pids.extend(pids)
    assert job["state"] == "failed"
    assert job["restarts"] == 2 and job["tasks"][0]["attempt"] == 2
    assert job["last_cause"] == "worker-1 exited with code 3 (max_restarts (2) reached)"
    states = {t["index"]: (t["state"], t["exit_code"]) for t in job["tasks"]}
    assert states[1] == ("failed", 3)
    assert states[0][0] == "stopped"
    assert len(pids) == 12 and not [p for p in pids if is_alive(p)]  # 3 attempts x 2 x 2
    kinds = [e["kind"] for e in status_json(cli, job["id"])["jobs"][0]["events"]]
    assert kinds.count("restart") == 2 and kinds.count("launched") == 3
    assert "[worker-1 local] task 1 mode fail:3" in result.out
    assert "[worker-0 local] task 0 mode sleep" in result.out


def test_a_non_retryable_exit_code_fails_without_restart(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        fake_job(
            tmp_path,
            ["--mode", "sleep", "--task-0", "fail:2"],
            extra="[restart]\nretryable_exit_codes = [137, 143]\n",
        )
    )
    result = cli("launch", str(path), timeout=60)
    [job] = status_json(cli)["jobs"]
    reap_pids.extend(_job_pids(job, tmp_path / "shared"))
    assert result.code == 1
    assert job["restarts"] == 0
    assert job["last_cause"] == "worker-0 exited with code 2"
    assert not [p for p in _job_pids(job, tmp_path / "shared") if is_alive(p)]


def test_successful_job_streams_whole_prefixed_lines_with_args_byte_for_byte(
    tmp_path: Path, cli: Callable[..., CliResult], home: Path
) -> None:
    nasty = ["; echo pwned", "$(id)", "it's", 'a "b"', "c\\d", "e f"]
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, ["--mode", "ok", *nasty]))
    result = cli("launch", str(path), timeout=60)
    assert result.code == 0, result
    for i in (0, 1):
        assert (
            f"[worker-{i} local] task {i} mode ok argv={['--mode', 'ok', *nasty]!r}" in result.out
        )
        assert f"[worker-{i} local] partial line without newline... completed" in result.out
    assert "env=" + json.dumps("; $(x) ' \" \\ and spaces") in result.out
    [job] = status_json(cli)["jobs"]
    assert job["state"] == "succeeded" and job["last_cause"] == "chief exited 0"
    assert [t["step"] for t in job["tasks"]] == [5, 5]
    logs = cli("logs", job["id"], "--task", "1")
    assert logs.code == 0 and "task 1 mode ok" in logs.out and "task 0 mode" not in logs.out
    # The coordinator keeps durable copies of every task's log, with when each line arrived.
    copies = sorted(p.name for p in (home / "jobs" / job["id"] / "logs").iterdir())
    assert copies == [f"worker-{i}.{kind}" for i in (0, 1) for kind in ("attempts", "log", "times")]


def test_the_script_runs_through_the_bootstrap_unless_instrument_is_false(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, ["--mode", "ok"]))
    result = cli("launch", str(path), timeout=60)
    assert result.code == 0, result
    assert result.out.count(" via=bootstrap") == 2 and "instrument = false" not in result.out
    path.write_text(
        fake_job(tmp_path, ["--mode", "ok"]).replace("[backend]", "instrument = false\n\n[backend]")
    )
    result = cli("launch", str(path), timeout=60)
    assert result.code == 0, result
    assert result.out.count(" via=direct") == 2
    assert result.out.count("entrypoint.instrument = false: progress, the watchdog") == 1


def test_detach_then_stop_leaves_no_process(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, ["--mode", "ignore-term"]))
    result = cli("launch", "--detach", str(path))
    assert result.code == 0, result
    job = status_json(cli)["jobs"][0]
    reap_pids.append(job["supervisor"]["pid"])
    wait_for(lambda: len(list((tmp_path / "shared").glob("*/tasks/*/trainer.pid"))) == 2, 30)
    job = status_json(cli)["jobs"][0]
    assert job["state"] == "running" and job["supervisor"]["alive"] is True
    pids = _job_pids(job, tmp_path / "shared")
    reap_pids.extend(pids)
    assert len(pids) == 4 and all(is_alive(p) for p in pids)
    stopped = cli("stop", job["id"])
    assert stopped.code == 0, stopped
    assert not [p for p in pids if is_alive(p)]
    job = status_json(cli)["jobs"][0]
    assert job["state"] == "stopped"
    assert {t["state"] for t in job["tasks"]} == {"stopped"}
    wait_for(lambda: not is_alive(job["supervisor"]["pid"]), 10)


def test_schema_validates_the_example_and_rejects_a_typo(cli: Callable[..., CliResult]) -> None:
    import tomllib

    import jsonschema

    result = cli("schema")
    assert result.code == 0, result.err
    schema = json.loads(result.out)
    example = tomllib.loads((REPO / "cluster.example.toml").read_text())
    jsonschema.validate(example, schema)  # raises if the example does not validate
    example["backend"]["wokers"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(example, schema)


def test_shell_completion_lists_the_commands(tmp_path: Path) -> None:
    env = {**os.environ, "_ORCHESTRATE_COMPLETE": "complete_bash", "COMP_WORDS": "orchestrate st",
           "COMP_CWORD": "1"}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", "from orchestrator.commands.cli import app; app(prog_name='orchestrate')"],
                         capture_output=True, text=True, env=env, cwd=REPO)  # fmt: skip
    assert {"status", "stop"} <= set(out.stdout.split()), out.stdout + out.stderr


def test_resume_continues_a_failed_job_with_its_id_its_next_attempt_and_a_fresh_budget(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    path = tmp_path / "c.toml"
    # The chief fails on attempts 0, 1 and 2; one restart is allowed. Attempts 0 and 1 spend the
    # budget; the resume's attempt 2 fails too, and only a fresh budget restarts it (attempt 3).
    args = ["--mode", "ok", "--task-0", "fail-before:3:3"]
    path.write_text(fake_job(tmp_path, args, extra="[restart]\nmax_restarts = 1\nbackoff = 0.1\n"))
    first = cli("launch", str(path), timeout=60)
    assert first.code == 1, first
    [failed] = status_json(cli)["jobs"]
    reap_pids.extend(_job_pids(failed, tmp_path / "shared"))
    assert failed["state"] == "failed" and "max_restarts (1)" in failed["last_cause"], failed
    assert failed["attempt"] == 1 and failed["restarts"] == 1

    resumed = cli("resume", failed["id"], timeout=60)

    assert resumed.code == 0, resumed
    [job] = status_json(cli)["jobs"]  # the same job, not a new one
    reap_pids.extend(_job_pids(job, tmp_path / "shared"))
    assert job["id"] == failed["id"] and job["state"] == "succeeded"
    assert job["attempt"] == 3 and {t["attempt"] for t in job["tasks"]} == {3}
    assert job["ended"] is not None and job["ended"] > failed["ended"]
    kinds = [e["kind"] for e in status_json(cli, job["id"])["jobs"][0]["events"]]
    assert kinds.index("resumed") > kinds.index("failed") and kinds[-1] == "succeeded"
    assert kinds[kinds.index("resumed") :].count("restart") == 1  # the fresh budget, spent

    again = cli("resume", job["id"])
    assert again.code == 2 and again.err.strip() == (
        f"error: job {job['id']} already succeeded: nothing to resume"
    )


def test_a_resumed_job_logs_each_line_of_its_earlier_attempts_once(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    # The resume's supervisor reads each task's log on from what the durable copy holds, as an
    # attach does: not from the start of the file, which every attempt appends to.
    path = tmp_path / "c.toml"
    args = ["--mode", "ok", "--task-0", "fail-before:1:3"]
    path.write_text(fake_job(tmp_path, args, extra="[restart]\nmax_restarts = 0\n"))
    assert cli("launch", str(path), timeout=60).code == 1
    [failed] = status_json(cli)["jobs"]
    reap_pids.extend(_job_pids(failed, tmp_path / "shared"))

    assert cli("resume", failed["id"], timeout=60).code == 0
    reap_pids.extend(_job_pids(status_json(cli)["jobs"][0], tmp_path / "shared"))

    logs = cli("logs", failed["id"]).out
    for task in (0, 1):  # one line per attempt (0 and 1), each once
        assert logs.count(f"task {task} mode ") == 2, logs
