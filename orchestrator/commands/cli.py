"""The `orchestrate` command line. Thin: parse, call the core, render, map errors to exit codes.

Heavy modules (pydantic models, the supervisor, SSH) are imported inside the commands that need
them, so `orchestrate status` starts fast. TensorFlow is never imported here.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.commands.cli_app import (
    ConfigArg,
    DetachOpt,
    EnvFileOpt,
    EnvOpt,
    JobArg,
    JsonOpt,
    PlainOpt,
    QueueTimeoutOpt,
    SetOpt,
    VerboseOpt,
    WaitForResourcesOpt,
    app,
    echo,
    error_lines,
    errors_as_json,
)
from orchestrator.commands.console import console_sink, detach_progress
from orchestrator.errors import OrchestrateError, UsageError, exit_code_for
from orchestrator.state.job_records import launch_config
from orchestrator.state.job_state import failing_job_on_error
from orchestrator.state.paths import (
    log_copies_dir,
    make_files_private,
)
from orchestrator.state.states import JobState
from orchestrator.state.store import JobRecord, Store

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig


def _print_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import version

        echo(f"orchestrate {version('orchestrate')}")
        raise typer.Exit()


VersionOpt = Annotated[
    bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version)
]


@app.callback()
def _everywhere(version: VersionOpt = False) -> None:
    """Train one TensorFlow model on many hosts with MultiWorkerMirroredStrategy."""


@app.command()
def validate(config: ConfigArg, as_json: JsonOpt = False) -> None:
    """Check a cluster.toml without starting anything; every problem, one line each."""
    from orchestrator import api
    from orchestrator.commands.json_views import dumps

    with errors_as_json(as_json):
        found = api.validate(config)
    if as_json:
        echo(dumps(found))
        return
    echo(f"{config}: ok: job {found['job']!r}, {found['backend']} backend, {found['summary']}")


@app.command()
def check(config: ConfigArg, as_json: JsonOpt = False) -> None:
    """Preflight every host and try every task port from every host; starts nothing. Prints a
    host-by-host grid, the failing pairs and each host's interface; exit 3 if a pair fails."""
    from orchestrator.commands.cluster_check import run_check
    from orchestrator.commands.json_views import dumps, port_check
    from orchestrator.config import load_config
    from orchestrator.errors import PreflightError
    from orchestrator.planning.port_check import render, summary

    with errors_as_json(as_json):
        result = run_check(load_config(config), lambda line: print(line, file=sys.stderr))
    echo(dumps(port_check(result)) if as_json else render(result))
    if not result.ok:
        sys.stdout.flush()  # the grid before the one-line summary on stderr
        raise PreflightError(summary(result))


@app.command()
def launch(
    config: ConfigArg,
    detach: DetachOpt = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and each TF_CONFIG; start nothing.")
    ] = False,
    verbose: VerboseOpt = False,
    plain: PlainOpt = False,
    force: Annotated[
        bool, typer.Option("--force", help="Use GPUs that other programs' processes hold.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --dry-run or --detach: the result as JSON.")
    ] = False,
    sets: SetOpt = None,
    env: EnvOpt = None,
    env_file: EnvFileOpt = None,
    wait_for_resources: WaitForResourcesOpt = False,
    queue_timeout: QueueTimeoutOpt = None,
) -> None:
    """Validate, preflight every host, start one agent per task, and supervise the job."""
    from orchestrator.commands.json_views import dry_run_plan_doc, dumps, job_state
    from orchestrator.config import load_config
    from orchestrator.config.overrides import parse, queue_sets

    with errors_as_json(as_json):
        sets = [*(sets or []), *queue_sets(wait_for_resources, queue_timeout)]
        overrides = parse(sets, env or [], env_file)

    if as_json and not (dry_run or detach):
        raise UsageError("--json goes with --dry-run or --detach (status --json follows a job)")
    if dry_run:
        from orchestrator.commands.views import render_dry_run

        with errors_as_json(as_json):
            cfg = load_config(config, overrides)
        if as_json:
            echo(dumps(dry_run_plan_doc(cfg)))
        else:
            render_dry_run(cfg)
        return
    from orchestrator import api

    if detach:
        with errors_as_json(as_json), detach_progress(Store(), plain or as_json) as panel:
            job, pid = api.launch_detached(
                config, force, panel.update if panel else _ignore, overrides
            )
        state = job.state
        if as_json:
            echo(dumps(job_state(job.id, state, supervisor_pid=pid)))
            return
        echo(f"job {job.id} {state} (supervisor pid {pid})")
        if state == "queued":
            echo(f"  {Store().get_job(job.id).last_cause}")
        echo(f"  orchestrate status {job.id}   orchestrate logs {job.id} --follow")
        return
    store, record, cfg = api.register(config, force, overrides)
    _supervise(store, record, lambda: cfg, verbose, plain=plain)


def _ignore(job: JobRecord) -> None:
    """No panel to tell of the job's progress (--plain, --json, or not a terminal)."""


def _supervise(
    store: Store,
    job: JobRecord,
    config: Callable[[], ClusterConfig],
    verbose: bool,
    adopt: bool = False,
    plain: bool = True,
    foreground: bool = True,
    as_json: bool = False,
) -> None:
    """Run (or adopt) a job's supervision in this process to the end; exit 1 unless it
    succeeded. Whatever fails before supervision starts ends the job FAILED with its cause.
    `foreground`: in a terminal, whose closing (SIGHUP) hands the job to a detached
    supervisor."""
    from orchestrator.supervision.supervisor import Supervisor

    with failing_job_on_error(store, job.id):
        cfg = config()
        sink = console_sink(log_copies_dir(job.id), store.path, job.id, verbose, plain, as_json)
        try:
            supervisor = Supervisor(store, job, cfg, sink)
        except BaseException:
            sink.close()  # the live panel too: the terminal is handed back as it was
            raise
    supervisor.install_signal_handlers(hand_over_on_hangup=foreground)
    state = supervisor.adopt() if adopt else supervisor.run()
    if as_json:  # the lines went to stderr: stdout holds the job's end, one document
        from orchestrator.commands.json_views import dumps, job_state

        ended = store.get_job(job.id)
        echo(dumps(job_state(job.id, ended.state.value, last_cause=ended.last_cause,
                             restarts=ended.restarts, handed_to=supervisor.handed_to)))  # fmt: skip
    if supervisor.handed_to is not None:
        return  # the job goes on, supervised by the detached successor
    if state == JobState.STOPPED and supervisor.stopped_by is not None:
        raise typer.Exit(128 + supervisor.stopped_by)  # as a shell reports it: 130 for Ctrl-C
    if state != JobState.SUCCEEDED:
        raise typer.Exit(1)


@app.command()
def resume(
    job_ref: JobArg,
    detach: DetachOpt = False,
    verbose: VerboseOpt = False,
    plain: PlainOpt = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --detach: the result as JSON.")
    ] = False,
) -> None:
    """Continue a failed or stopped job: same id, next attempt, same checkpoints, a fresh
    restart budget."""
    from orchestrator import api
    from orchestrator.commands.json_views import dumps, job_state

    if as_json and not detach:
        raise UsageError("--json goes with --detach (status --json follows a job)")
    if not detach:
        store, job, cfg, said = api.reopen(job_ref)  # refuses a cluster.toml changed since
        echo(said)
        _supervise(store, job, lambda: cfg, verbose, plain=plain)
        return
    with errors_as_json(as_json), detach_progress(Store(), plain or as_json) as panel:
        job, pid = api.resume(job_ref, panel.update if panel else _ignore)
    state = job.state.value
    said = next(
        (e.message for e in reversed(Store().events(job.id)) if e.kind == "resume_from"), ""
    )
    if as_json:
        echo(dumps(job_state(job.id, state, attempt=job.attempt, supervisor_pid=pid,
                             resumed_from=said)))  # fmt: skip
        return
    echo(said)
    echo(f"job {job.id} {state} (supervisor pid {pid})")


@app.command(hidden=True)
def supervise(
    job_ref: JobArg,
    after: Annotated[
        int | None, typer.Option("--after", help="Take the job over from this supervisor.")
    ] = None,
) -> None:
    """Supervise a registered job (the background half of `launch --detach`), or take a
    running one over from a foreground supervisor whose terminal closed (`--after PID`)."""
    store = Store()
    job = store.get_job(job_ref)
    if after is None:
        _supervise(store, job, lambda: launch_config(job), verbose=False, foreground=False)
        return
    from orchestrator.state.takeover import AttachPlan, attach_plan
    from orchestrator.supervision import handover, supervisor  # noqa: F401 - loaded before

    cfg = launch_config(job)
    ident = job.supervisor_ident if job.supervisor_pid == after else ""
    handover.say_ready(store, job.id, os.getpid())
    if not handover.wait_gone(after, ident):
        raise UsageError(f"supervisor {after} of job {job.id} did not hand the job over")
    job = store.get_job(job.id)
    if attach_plan(store, job) == AttachPlan.ADOPT:
        _supervise(store, job, lambda: cfg, verbose=False, adopt=True, foreground=False)


@app.command()
def attach(
    job_ref: JobArg,
    verbose: VerboseOpt = False,
    plain: PlainOpt = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="The lines on stderr; the job's end as JSON.")
    ] = False,
) -> None:
    """Adopt a running job whose supervisor is gone, and supervise it to the end."""
    from orchestrator.commands.json_views import dumps, job_state
    from orchestrator.commands.stopping import finish_stop
    from orchestrator.state.takeover import AttachPlan, attach_plan

    with errors_as_json(as_json):
        store = Store()
        job = store.get_job(job_ref)
        if attach_plan(store, job) == AttachPlan.FINISH_STOP:
            state = finish_stop(store, job).value
            echo(dumps(job_state(job.id, state)) if as_json else f"job {job.id} {state}")
            return
        cfg = launch_config(job)
    _supervise(store, job, lambda: cfg, verbose, adopt=True, plain=plain, as_json=as_json)


@app.command()
def stop(job_ref: JobArg, as_json: JsonOpt = False) -> None:
    """Stop a job: every task on every host (SIGTERM, grace, SIGKILL)."""
    from orchestrator import api
    from orchestrator.commands.json_views import dumps, job_state

    with errors_as_json(as_json):
        job_id = Store().get_job(job_ref).id
        state, already = api.stop(job_id)
    if as_json:
        echo(dumps(job_state(job_id, state, already=already)))
        return
    echo(f"job {job_id} already {state}" if already else f"job {job_id} {state}")


@app.command()
def delete(
    job_ref: JobArg,
    files: Annotated[
        bool, typer.Option("--files", help="Also its directory on the shared filesystem.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove an ended job's records (never a running job's); with --files, its checkpoints,
    model and logs on the shared filesystem too."""
    from orchestrator.commands.json_views import dumps
    from orchestrator.commands.removal import delete_job

    with errors_as_json(as_json):
        store = Store()
        removed = delete_job(store, store.get_job(job_ref), files)
    if as_json:
        echo(dumps({"deleted": [removed.job_id], "files": [removed.files] if files else []}))
        return
    echo(f"deleted job {removed.job_id}" + (f" and {removed.files}" if removed.files else ""))


@app.command()
def prune(
    older_than: Annotated[
        str, typer.Option("--older-than", help="Jobs that ended longer ago than this (30d, 12h).")
    ],
    files: Annotated[
        bool, typer.Option("--files", help="Also their directories on the shared filesystem.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would go; remove nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove every ended job older than --older-than (running jobs are never touched)."""
    from orchestrator.commands.json_views import dumps
    from orchestrator.commands.removal import prune as prune_jobs
    from orchestrator.logs.log_query import parse_age

    with errors_as_json(as_json):
        age = parse_age(older_than)
        if age is None:
            raise UsageError(f"--older-than {older_than!r}: give an age like 30d, 12h or 1h30m")
        removed = prune_jobs(Store(), age, files, dry_run)
    if as_json:
        echo(dumps({"deleted": [r.job_id for r in removed], "dry_run": dry_run,
                    "files": [r.files for r in removed if r.files]}))  # fmt: skip
        return
    verb = "would delete" if dry_run else "deleted"
    for r in removed:
        echo(f"{verb} job {r.job_id}" + (f" and {r.files}" if r.files else ""))
    said = "to delete" if dry_run else "deleted"
    echo(f"{len(removed)} job(s) {said}" if removed else "no job ended that long ago")


# The commands that look at jobs register after these (the order `--help` lists them in).
import orchestrator.commands.cli_inspect  # noqa: E402, F401


def main() -> None:
    """Entry point: one-line errors, exit codes from errors.exit_code_for, never a traceback."""
    make_files_private()
    try:
        # standalone_mode=False: click returns typer.Exit's code instead of exiting itself.
        code = app(standalone_mode=False)
    except OrchestrateError as exc:
        sys.stderr.write(error_lines(exc))
        sys.exit(exit_code_for(exc))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("aborted\n")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # click's usage errors and anything unforeseen: still one line
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, sqlite3.DatabaseError):  # the store damaged after it was opened
            from orchestrator.state.paths import state_db
            from orchestrator.state.store_schema import unreadable_store

            problem = unreadable_store(state_db(), exc)
            sys.stderr.write(error_lines(problem))
            sys.exit(exit_code_for(problem))
        sys.stderr.write(f"error: {type(exc).__name__}: {exc}\n")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
