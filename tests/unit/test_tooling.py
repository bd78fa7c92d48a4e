"""The code passes its own tools: ruff's lint and format, and mypy over the packages and the
test backends (pyproject.toml's [tool.mypy] packages)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REPO


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        if IN_CI:
            pytest.fail(f"{name} is missing: `uv sync` installs it (the dev group)")
        pytest.skip(f"{name} is not installed here (uv sync installs it)")
    return found


@pytest.mark.parametrize(
    "argv",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_the_tool_passes(argv: list[str]) -> None:
    result = subprocess.run(
        [tool(argv[0]), *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
