"""Every `--json` a command offers, parsed as a script would: validate (ok, and every
problem), check, launch --dry-run and --detach, stop, resume --detach. (`status --json`,
`report --json` and `logs --json` have their own tests.) The fields are in
docs/commands-json.md."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.conftest import CliResult, fake_job, status_json, wait_for_end


def _config(tmp_path: Path, mode: str = "sleep") -> Path:
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, ["--mode", mode], workers=2))
    return path


def test_validate_json_says_ok_with_the_plan_or_lists_every_problem(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    good = cli("validate", "--json", str(_config(tmp_path)))
    assert good.code == 0, good
    assert json.loads(good.out) == {
        "schema_version": 1,
        "ok": True, "summary": "2 task(s) on 1 host(s)", "config": str(tmp_path / "c.toml"),
        "job": "fake", "backend": "local",
        "tasks": 2, "hosts": 1, "tasks_counted_at_launch": False,
    }  # fmt: skip
    bad = tmp_path / "bad.toml"
    bad.write_text(_config(tmp_path).read_text().replace("workers = 2", "workers = 0\nbogus = 1"))
    refused = cli("validate", "--json", str(bad))
    assert refused.code == 2, refused
    assert json.loads(refused.out) == {"schema_version": 1, "ok": False, "errors": [
        f"{bad}: backend.workers: must be >= 1 (got 0)", f"{bad}: backend.bogus: unknown key",
    ]}  # fmt: skip
    assert refused.err.count("\n") == 2  # the same problems, for a person


def test_launch_dry_run_json_holds_each_tasks_tf_config(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    out = cli("launch", "--dry-run", "--json", str(_config(tmp_path)))
    assert out.code == 0, out
    plan = json.loads(out.out)
    assert plan["job"] == "fake" and plan["backend"] == "local" and plan["instrumented"]
    assert [t["name"] for t in plan["tasks"]] == ["worker-0", "worker-1"]
    assert [t["chief"] for t in plan["tasks"]] == [True, False]
    for i, task in enumerate(plan["tasks"]):
        assert task["tf_config"]["task"] == {"type": "worker", "index": i}
        assert len(task["tf_config"]["cluster"]["worker"]) == 2
    assert not (tmp_path / "home" / "state.db").exists() or status_json(cli)["jobs"] == []
    alone = cli("launch", "--json", str(_config(tmp_path)))
    assert alone.code == 2 and "--json goes with --dry-run or --detach" in alone.err, alone


def test_check_json_lists_every_pair(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    out = cli("check", "--json", str(_config(tmp_path)), timeout=120)
    assert out.code == 0, out
    grid = json.loads(out.out)
    assert grid["ok"] is True and grid["hosts"] == ["local"]
    assert sorted(p["task"] for p in grid["pairs"]) == ["worker-0", "worker-1"]
    assert all(p["ok"] and p["error"] is None and p["from"] == "local" for p in grid["pairs"])


def test_detached_launch_stop_and_resume_answer_in_json(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    launched = cli("launch", "--detach", "--json", str(_config(tmp_path)))
    assert launched.code == 0, launched
    started = json.loads(launched.out)
    reap_pids.append(started["supervisor_pid"])
    assert started["state"] == "running" and started["job"].startswith("fake-")
    job = started["job"]
    stopped = cli("stop", "--json", job)
    assert stopped.code == 0, stopped
    assert json.loads(stopped.out) == {
        "schema_version": 1,
        "job": job,
        "state": "stopped",
        "already": False,
    }
    again = cli("stop", "--json", job)
    assert json.loads(again.out) == {
        "schema_version": 1,
        "job": job,
        "state": "stopped",
        "already": True,
    }
    resumed = cli("resume", "--detach", "--json", job)
    assert resumed.code == 0, resumed
    document = json.loads(resumed.out)
    reap_pids.append(document["supervisor_pid"])
    assert document["job"] == job and document["state"] == "running" and document["attempt"] == 1
    assert json.loads(cli("stop", "--json", job).out)["state"] == "stopped"
    assert wait_for_end(cli, job)["state"] == "stopped"
    missing = cli("stop", "--json", "no-such-job")
    assert missing.code == 2, missing
    assert json.loads(missing.out)["ok"] is False
    assert "no-such-job" in json.loads(missing.out)["errors"][0]
