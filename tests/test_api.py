"""orchestrator.api from a plain Python process, as a notebook or a sweep script uses it:
three jobs one after another, their results compared with what the CLI says of them; stop and
resume; the CLI's errors; ORCHESTRATE_HOME honoured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult, fake_job, status_json

SWEEP = """
import json, sys, tomllib
from pathlib import Path
from orchestrator.api import Job, JobFailed, jobs, launch, validate
from orchestrator.errors import ConfigError, JobNotFoundError, OrchestrateError

root = Path(sys.argv[1])
out = {"runs": []}
for n, mode in enumerate(["count:3", "fail:3", "count:5"]):
    path = root / f"sweep-{n}.toml"
    path.write_text((root / "base.toml").read_text().replace("MODE", mode))
    assert validate(path)["tasks"] == 2
    if n < 2:
        job = launch(path, name=f"sweep-{n % 2}")  # back once its tasks run
    else:  # the sections as a dict, a relative path among them, and metadata kept with the job
        given = tomllib.loads(path.read_text())
        given["job"]["shared_dir"] = "shared"  # from the current directory
        job = launch(given, name="sweep-0", metadata={"n": n, "mode": mode})
        out["metadata"] = job.metadata
    following = job.logs(task="1", grep="^line ", follow=True) if n else job.follow(task="1", grep="^line ")
    followed = [r.text for r in following]  # until it ends
    try:
        state, cause = job.wait(timeout=120), None
    except JobFailed as exc:
        state, cause = exc.state, exc.cause
    status = job.status()
    out["runs"].append({"id": job.id, "state": state, "cause": cause, "status": status,
                        "logs": [r.text for r in job.logs()], "followed": followed,
                        "numbered": [r.text for r in job.logs(task="1", grep="^line ")],
                        "report": job.report()["state"]})
out["listed"] = [j.id for j in jobs()]
out["by_name"] = [j.id for j in jobs(name="sweep-0")]
out["failed"] = [j.id for j in jobs(state="failed")]
out["collected"] = sorted(p.name for p in job.collect(root / "here").iterdir())

slow = root / "slow.toml"
slow.write_text((root / "base.toml").read_text().replace("MODE", "sleep"))
job = launch(slow)
out["running"] = job.state
out["stopped"] = job.stop()
out["resumed"] = job.resume().state
out["attempt"] = job.status()["attempt"]
out["stopped_again"] = job.stop()
try:
    job.wait(timeout=60)
except JobFailed as exc:
    out["final"] = (exc.state, exc.exit_code)

bad = root / "bad.toml"
bad.write_text((root / "base.toml").read_text().replace("workers = 2", "workers = 0\\nbogus = 1"))
try:
    launch(bad)
except ConfigError as exc:
    out["config_error"] = str(exc)
for bad_dict, bad_metadata in (({"job": {"name": "x"}}, None), (path, {"lr": float("nan")})):
    try:
        launch(bad_dict, metadata=bad_metadata)
    except ConfigError as exc:
        out.setdefault("refused", []).append(str(exc))
try:
    Job("no-such-job").status()
except JobNotFoundError as exc:
    out["not_found"] = str(exc)
try:
    Job("x").wait(timeout=0.01)
except OrchestrateError as exc:
    out["wait_unknown"] = type(exc).__name__
print(json.dumps(out))
"""


def test_a_sweep_of_three_jobs_driven_from_python_agrees_with_the_cli(
    tmp_path: Path, home: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    (tmp_path / "base.toml").write_text(fake_job(tmp_path, ["--mode", "MODE"], workers=2))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", SWEEP, str(tmp_path)],
        capture_output=True, text=True, timeout=600, env={**env, "ORCHESTRATE_HOME": str(home)},
        cwd=tmp_path,  # a plain process elsewhere: the installed package, not the checkout
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    runs = out["runs"]
    assert [r["state"] for r in runs] == ["succeeded", "failed", "succeeded"]
    assert (
        runs[1]["cause"] == runs[1]["status"]["last_cause"]
        and "exited with code 3" in runs[1]["cause"]
    )
    assert runs[0]["followed"] == runs[0]["numbered"] and runs[2]["followed"] == runs[2]["numbered"]
    assert [r["report"] for r in runs] == [r["state"] for r in runs]
    assert out["by_name"] == [runs[2]["id"], runs[0]["id"]] and out["failed"] == [runs[1]["id"]]
    assert "logs" in out["collected"] and "metrics.json" not in out["collected"]
    # The same job as the CLI sees it, in the same state directory.
    for run in runs:
        cli_view = status_json(cli, run["id"])["jobs"][0]
        assert run["status"]["id"] == cli_view["id"] and run["status"]["state"] == run["state"]
        assert set(run["status"]) == set(cli_view)
        moving = {"heartbeat_age"}  # read at another moment
        assert [
            {k: v for k, v in t.items() if k not in moving} for t in run["status"]["tasks"]
        ] == [{k: v for k, v in t.items() if k not in moving} for t in cli_view["tasks"]]
        cli_lines = [r["text"] for r in json.loads(cli("logs", run["id"], "--json").out)["lines"]]
        assert run["logs"] == cli_lines
    assert runs[0]["numbered"] == [f"line {n:05d} " + "x" * n for n in range(3)]
    assert runs[2]["numbered"] == [f"line {n:05d} " + "x" * n for n in range(5)]
    assert runs[1]["status"]["last_cause"].startswith("worker-")
    assert out["listed"][:3] == [r["id"] for r in reversed(runs)]  # newest first
    assert (out["running"], out["stopped"], out["resumed"]) == ("running", "stopped", "running")
    assert out["attempt"] == 1 and out["stopped_again"] == "stopped"
    assert out["final"] == ["stopped", 4]
    bad = tmp_path / "bad.toml"
    refused = cli("validate", str(bad))
    assert out["config_error"].splitlines() == [
        ln.removeprefix("error: ") for ln in refused.err.splitlines()
    ]
    assert len(out["config_error"].splitlines()) == 2
    assert "no-such-job" in out["not_found"]
    assert out["wait_unknown"] == "JobNotFoundError"
    # A dict is a configuration as a file is; metadata stays with the job, as the CLI shows it.
    assert out["metadata"] == {"n": 2, "mode": "count:5"} == runs[2]["status"]["metadata"]
    assert status_json(cli, runs[2]["id"])["jobs"][0]["metadata"] == out["metadata"]
    assert runs[2]["status"]["job_dir"].startswith(str(tmp_path / "shared"))
    assert (
        out["refused"][0].startswith("the configuration given: ")
        and "entrypoint" in out["refused"][0]
    )
    assert out["refused"][1].startswith("metadata: not JSON")
    assert len(status_json(cli)["jobs"]) == 4  # three runs and the slow one: no refused one
    for job in status_json(cli)["jobs"]:
        reap_pids.append(job["supervisor"]["pid"] or 0)


@pytest.mark.parametrize("timeout", [float("nan"), -1.0, "5"])
def test_wait_refuses_a_timeout_that_is_no_number_of_seconds(timeout: object) -> None:
    from orchestrator.api import Job

    with pytest.raises(ValueError, match="timeout must be"):
        Job("any").wait(timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interval must be"):
        Job("any").wait(timeout=1.0, interval=float("nan"))
