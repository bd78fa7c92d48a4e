"""The command line's own texts: every argument's help shows in its command's --help (Typer's
argument help was once lost under a newer Click), and --version."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from importlib.metadata import version
from typing import get_type_hints

import pytest
from typer.models import ArgumentInfo
from typer.testing import CliRunner

from orchestrator.commands.cli import app


def _argument_helps() -> list[tuple[str, str, str]]:
    """(command, argument, the help declared for it) for every command's arguments."""
    found = []
    for command in app.registered_commands:
        callback = command.callback
        assert callback is not None
        name = command.name or callback.__name__.replace("_", "-")
        hints = get_type_hints(callback, include_extras=True)
        for param in inspect.signature(callback).parameters:
            for meta in getattr(hints.get(param), "__metadata__", ()):
                if isinstance(meta, ArgumentInfo) and meta.help:
                    found.append((name, param, meta.help))
    return found


HELPS = _argument_helps()


def test_the_commands_declare_argument_help_to_check() -> None:
    assert {"launch", "status", "logs", "stop"} <= {command for command, _, _ in HELPS}


@pytest.mark.parametrize(("command", "argument", "text"), HELPS, ids=lambda v: str(v)[:20])
def test_each_argument_help_shows_in_its_commands_help(
    command: str, argument: str, text: str
) -> None:
    out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert out.exit_code == 0, out.output
    shown = re.sub(r"\s+", " ", out.output)
    assert text in shown, f"{command} --help lacks the help of {argument}: {out.output}"


def test_version_prints_the_installed_version_and_exits_0() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"orchestrate {version('orchestrate')}\n"
