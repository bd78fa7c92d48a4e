"""Driving jobs from scripts and CI pipelines, with real processes (stand-in trainers): `wait`
and its exit codes, the same codes from `logs --follow` and `status --watch`, `--json`
documents with their schema_version, and overrides of cluster.toml from the command line."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult, fake_job, status_json

pytestmark = pytest.mark.timeout(300)


def job_file(tmp_path: Path, args: list[str], workers: int = 2) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(fake_job(tmp_path, args, workers, extra="[restart]\nmax_restarts = 0\n"))
    return path


def detached(cli: Callable[..., CliResult], path: Path, *more: str) -> str:
    result = cli("launch", "--detach", "--json", *more, str(path))
    assert result.code == 0, result
    document = json.loads(result.out)
    assert document["schema_version"] == 1
    return str(document["job"])


def test_wait_exits_with_the_job_s_end_and_so_do_logs_follow_and_status_watch(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    ok = detached(cli, job_file(tmp_path, ["--mode", "ok-after:1"]))
    done = cli("wait", ok, "--json")
    assert done.code == 0, done
    document = json.loads(done.out)
    assert (document["schema_version"], document["job"], document["state"]) == (1, ok, "succeeded")
    assert cli("logs", ok, "--follow").code == 0
    assert cli("status", ok, "--watch", "--interval", "0.2").code == 0

    failing = detached(cli, job_file(tmp_path, ["--mode", "sleep", "--task-1", "fail:3"]))
    failed = cli("wait", failing)
    assert failed.code == 1, failed
    assert failed.out.startswith(f"job {failing} failed: ") and "exited with code 3" in failed.out
    assert cli("logs", failing, "--follow").code == 1
    assert cli("status", failing, "--watch", "--interval", "0.2").code == 1

    sleeping = detached(cli, job_file(tmp_path, ["--mode", "sleep"]))
    timed_out = cli("wait", sleeping, "--timeout", "0.5", "--json")
    assert timed_out.code == 5, timed_out
    refusal = json.loads(timed_out.out)
    assert refusal["ok"] is False and "still running after 0.5s" in refusal["errors"][0]
    assert cli("stop", sleeping).code == 0
    stopped = cli("wait", sleeping)
    assert stopped.code == 4 and stopped.out.startswith(f"job {sleeping} stopped"), stopped
    assert cli("logs", sleeping, "--follow").code == 4


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["wait", "no-such-job"], "no job"),
        (["wait", "JOB", "--timeout", "-1"], "--timeout: must be seconds >= 0 (got -1)"),
        (["wait", "JOB", "--timeout", "nan"], "--timeout: must be seconds >= 0 (got nan)"),
        (["status", "no-such-job", "--json"], "no job"),
        (["report", "no-such-job", "--json"], "no job"),
    ],
)
def test_a_bad_wait_or_status_is_one_line_exit_2_and_json_gets_one_document(
    tmp_path: Path, cli: Callable[..., CliResult], args: list[str], said: str
) -> None:
    if "JOB" in args:
        job = detached(cli, job_file(tmp_path, ["--mode", "ok"]))
        args = [job if a == "JOB" else a for a in args]
    result = cli(*args)
    assert result.code == 2, result
    [line] = result.err.strip().splitlines()
    assert said in line, line
    if "--json" in args:
        document = json.loads(result.out)
        assert document["schema_version"] == 1 and document["ok"] is False


def test_overrides_set_keys_and_env_for_this_launch_only_and_keep_secrets_out_of_the_record(
    tmp_path: Path, cli: Callable[..., CliResult], home: Path
) -> None:
    path = job_file(tmp_path, ["--mode", "ok"])
    env_file = tmp_path / "run.env"
    env_file.write_text("# for this run\nexport NASTY='from the file'\nOTHER=1\n")
    job_id = detached(
        cli, path, "--set", "backend.workers=3", "--set", "job.name=sweep-7",
        "--env-file", str(env_file), "--env", "NASTY=s3cret-from-the-flag",
    )  # fmt: skip
    assert job_id.startswith("sweep-7-")
    assert cli("wait", job_id).code == 0
    job = status_json(cli, job_id)["jobs"][0]
    assert len(job["tasks"]) == 3
    logs = cli("logs", job_id).out
    assert logs.count('env="s3cret-from-the-flag"') == 3  # the flag after the file
    said = [e["message"] for e in job["events"] if e["kind"] == "overrides"]
    assert said == ["--set backend.workers=3, --set job.name=sweep-7, --env NASTY=<redacted>, "
                    "--env OTHER=<redacted>, --env NASTY=<redacted>"]  # fmt: skip
    store_bytes = b"".join(p.read_bytes() for p in home.rglob("*.db*"))
    assert b"s3cret-from-the-flag" not in store_bytes
    kept = home / "jobs" / job_id / "overrides.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert "workers = 2" in path.read_text()  # the file is untouched
    # A resume reads the file again with the same overrides: refused only if the file changed.
    assert cli("resume", job_id, "--detach").code == 2  # succeeded: nothing to resume


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--set", "backend.wrkers=3"], "backend.wrkers: unknown key"),
        (["--set", "backend.workers=three"], "backend.workers: "),
        (["--set", "backend.workers"], "--set backend.workers: expected KEY.PATH=VALUE"),
        (["--set", "job.name.first=x"], "--set job.name.first: job.name is a value, not a table"),
        (["--env", "1X=2"], "--env 1X=2: expected NAME=VALUE"),
        (["--env-file", "ENVFILE"], "--env-file ENVFILE:2: expected NAME=VALUE"),
        (["--env-file", "/nonexistent/run.env"], "--env-file /nonexistent/run.env: cannot read"),
    ],
)
def test_a_bad_override_is_one_line_exit_2_and_nothing_is_registered(
    tmp_path: Path, cli: Callable[..., CliResult], flags: list[str], said: str
) -> None:
    env_file = tmp_path / "bad.env"
    env_file.write_text("GOOD=1\nnot a pair\n")
    flags = [str(env_file) if f == "ENVFILE" else f for f in flags]
    said = said.replace("ENVFILE", str(env_file))
    for mode in ([], ["--dry-run"], ["--detach"]):
        result = cli("launch", *mode, *flags, str(job_file(tmp_path, ["--mode", "ok"])))
        assert result.code == 2, result
        [line] = result.err.strip().splitlines()
        assert said in line, line
    assert status_json(cli)["jobs"] == []
    assert not any(os.scandir(tmp_path / "shared"))


def test_delete_and_prune_remove_ended_jobs_only_and_their_files_when_asked(
    tmp_path: Path, cli: Callable[..., CliResult], home: Path
) -> None:
    done = detached(cli, job_file(tmp_path, ["--mode", "ok"]))
    assert cli("wait", done).code == 0
    kept = detached(cli, job_file(tmp_path, ["--mode", "ok"]))
    assert cli("wait", kept).code == 0
    running = detached(cli, job_file(tmp_path, ["--mode", "sleep"]))
    shared = tmp_path / "shared"
    assert (shared / done).is_dir() and (home / "jobs" / done).is_dir()

    refused = cli("delete", running, "--files")
    assert refused.code == 2, refused
    assert refused.err.strip() == (
        f"error: job {running} is running: stop it first (orchestrate stop {running})"
    )
    assert (shared / running).is_dir() and job_ids(cli) == {done, kept, running}

    deleted = cli("delete", done, "--files")
    assert deleted.code == 0, deleted
    assert deleted.out.strip() == f"deleted job {done} and {shared / done}"
    assert not (shared / done).exists() and not (home / "jobs" / done).exists()
    assert job_ids(cli) == {kept, running}
    assert cli("delete", done).code == 2  # gone: no such job

    bad = cli("prune", "--older-than", "a month")
    assert bad.code == 2 and "--older-than 'a month': give an age like 30d" in bad.err
    planned = cli("prune", "--older-than", "0s", "--dry-run", "--json")
    assert json.loads(planned.out)["deleted"] == [kept]  # never the running one
    assert job_ids(cli) == {kept, running}
    pruned = cli("prune", "--older-than", "0s")
    assert pruned.code == 0 and f"deleted job {kept}" in pruned.out
    assert (shared / kept).is_dir()  # without --files its directory stays
    assert job_ids(cli) == {running}
    assert cli("stop", running).code == 0


def job_ids(cli: Callable[..., CliResult]) -> set[str]:
    return {j["id"] for j in status_json(cli)["jobs"]}


# Every command, with its bad input: one line on stderr, exit 2 (the README's table), and
# under --json one document on stdout with its schema_version.
BAD_INPUT = [
    (["validate", "MISSING"], "no such file"),
    (["check", "MISSING"], "no such file"),
    (["launch", "MISSING"], "no such file"),
    (["launch", "--dry-run", "MISSING"], "no such file"),
    (["resume", "no-such-job"], "no job"),
    (["attach", "no-such-job"], "no job"),
    (["stop", "no-such-job"], "no job"),
    (["delete", "no-such-job"], "no job"),
    (["prune", "--older-than", "-1d"], "--older-than '-1d'"),
    (["status", "no-such-job"], "no job"),
    (["wait", "no-such-job"], "no job"),
    (["logs", "no-such-job"], "no job"),
    (["report", "no-such-job"], "no job"),
    (["tensorboard", "no-such-job"], "no job"),
    (["checkpoints", "no-such-job"], "no job"),
    (["collect", "no-such-job"], "no job"),
    (["standbys", "MISSING"], "no such file"),
]
JSON_COMMANDS = {"validate", "check", "stop", "delete", "prune", "status", "wait", "report",
                 "tensorboard", "checkpoints", "collect", "standbys", "attach", "logs"}  # fmt: skip


@pytest.mark.parametrize(("args", "said"), BAD_INPUT, ids=[" ".join(a[:2]) for a, _ in BAD_INPUT])
def test_every_command_s_bad_input_is_one_line_and_exit_2_and_one_json_document(
    tmp_path: Path, cli: Callable[..., CliResult], args: list[str], said: str
) -> None:
    args = [str(tmp_path / "missing.toml") if a == "MISSING" else a for a in args]
    result = cli(*args)
    assert result.code == 2, result
    [line] = result.err.strip().splitlines()
    assert line.startswith("error: ") and said in line, line
    if args[0] in JSON_COMMANDS:
        as_json = cli(*args, "--json")
        assert as_json.code == 2, as_json
        document = json.loads(as_json.out)  # one document, nothing else
        assert document["schema_version"] == 1 and document["ok"] is False
        assert said in document["errors"][0]
