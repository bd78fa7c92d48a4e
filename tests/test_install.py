"""The coordinator installed alone (`pip install orchestrate`, no extras) into a fresh virtual
environment: no TensorFlow comes with it, the CLI works, and what needs an extra says which."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv with orchestrate and only its own dependencies (from uv's cache when warm)."""
    if shutil.which("uv") is None:
        if IN_CI:
            pytest.fail("uv is not on PATH under CI")
        pytest.skip("needs uv to make a virtual environment")
    venv = tmp_path_factory.mktemp("light") / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    subprocess.run(["uv", "pip", "install", "-q", str(REPO)], check=True, env=env, timeout=600)
    yield venv


def run(venv: Path, *args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "ORCHESTRATE_HOME": str(home)}
    return subprocess.run(
        [str(venv / "bin" / "orchestrate"), *args], capture_output=True, text=True, cwd=cwd,
        env={**os.environ, **env}, timeout=120,
    )  # fmt: skip


def test_the_coordinator_alone_brings_no_tensorflow_and_its_cli_works(
    light: Path, tmp_path: Path
) -> None:
    listed = subprocess.run(
        ["uv", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True,
        env={**os.environ, "VIRTUAL_ENV": str(light)},
    )  # fmt: skip
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"orchestrate", "paramiko", "fabric", "pydantic"} <= names
    assert not names & {"tensorflow", "tf-keras", "scikit-learn", "matplotlib", "tensorboard"}
    home = tmp_path / "home"
    version = run(light, "--version", cwd=tmp_path, home=home)
    assert version.returncode == 0 and version.stdout.startswith("orchestrate "), version
    shutil.copy(REPO / "cluster.example.toml", tmp_path / "cluster.toml")
    valid = run(light, "validate", "cluster.toml", cwd=tmp_path, home=home)
    assert valid.returncode == 0, valid.stderr
    dry = run(light, "launch", "--dry-run", "cluster.toml", cwd=tmp_path, home=home)
    assert dry.returncode == 0 and "TF_CONFIG" in dry.stdout, dry.stderr


def test_training_where_tensorflow_is_missing_is_refused_naming_it(
    light: Path, tmp_path: Path
) -> None:
    """The example on this light install's own Python: the preflight says what is missing,
    starts nothing, exits 3."""
    shutil.copy(REPO / "cluster.example.toml", tmp_path / "cluster.toml")
    home = tmp_path / "home"
    result = run(light, "launch", "cluster.toml", cwd=tmp_path, home=home)
    assert result.returncode == 3, result
    [line] = result.stderr.strip().splitlines()
    assert "TensorFlow is not installed for" in line and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    # What needs an extra says which, in one line; the report is written without its charts.
    [job] = json.loads(run(light, "status", "--json", cwd=tmp_path, home=home).stdout)["jobs"]
    board = run(light, "tensorboard", job["id"], cwd=tmp_path, home=home)
    assert board.returncode == 2 and board.stderr.strip() == (
        "error: TensorBoard is not installed for this Python: "
        "pip install 'orchestrate[tensorboard]'"
    ), board
    report = run(light, "report", job["id"], cwd=tmp_path, home=home)
    assert report.returncode == 0, report.stderr
    assert "chart: not drawn: matplotlib is not installed here: pip install 'orchestrate[report]'" \
        in report.stdout  # fmt: skip
