"""What every `orchestrate` command shares: the Typer app, the argument and option types, and
how output and `--json` errors are written."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.errors import OrchestrateError, exit_code_for

app = typer.Typer(
    name="orchestrate",
    help="Train one TensorFlow model on many hosts with MultiWorkerMirroredStrategy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    epilog="Exit codes: 0 succeeded, 1 the job failed, 2 bad input, 3 refused by the preflight, "
    "4 the job was stopped, 5 wait --timeout passed, 130 interrupted. A closed terminal "
    "(SIGHUP) hands a foreground job to a detached supervisor; Ctrl-C stops it.",
)

ConfigArg = Annotated[Path, typer.Argument(help="Path to cluster.toml.", show_default=False)]
JobArg = Annotated[str, typer.Argument(help="Job id (or a unique prefix of it, or a job name).")]
DetachOpt = Annotated[
    bool, typer.Option("--detach", "-d", help="Return once running; supervise in background.")
]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="Show TensorFlow's C++ notices too.")
]
PlainOpt = Annotated[
    bool,
    typer.Option("--plain", help="Prefixed lines only, no live panel (as off a terminal)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
# launch's overrides of its cluster.toml (orchestrator.config.overrides)
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a key of the file: KEY.PATH=VALUE (repeatable)."),
]
EnvOpt = Annotated[
    list[str] | None,
    typer.Option("--env", help="Add to [entrypoint] env: NAME=VALUE (repeatable)."),
]
EnvFileOpt = Annotated[
    Path | None, typer.Option("--env-file", help="Add to [entrypoint] env from a dotenv file.")
]
WaitForResourcesOpt = Annotated[
    bool,
    typer.Option(
        "--wait-for-resources",
        help="Queue while GPUs or slots are held by another job or program, or a host is "
        "unreachable ([scheduling] wait_for_resources).",
    ),
]
QueueTimeoutOpt = Annotated[
    str | None, typer.Option("--queue-timeout", help="Fail after this many seconds in the queue.")
]


def echo(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def error_lines(exc: BaseException) -> str:
    """One `error:` line per problem (a config may have several)."""
    return "".join(f"error: {line}\n" for line in str(exc).splitlines())


@contextlib.contextmanager
def errors_as_json(as_json: bool) -> Iterator[None]:
    """With --json, an error is also a JSON document on stdout ({"ok": false, "errors": [...]}),
    with the same exit code; the `error:` lines still go to stderr."""
    try:
        yield
    except OrchestrateError as exc:
        if not as_json:
            raise
        from orchestrator.commands.json_views import dumps, problems

        echo(dumps(problems(str(exc))))
        sys.stderr.write(error_lines(exc))
        raise typer.Exit(exit_code_for(exc)) from None
