"""The `orchestrate` command line. Thin: parse, call the core, render, map errors to exit codes.

Heavy modules (pydantic models, the supervisor, SSH) are imported inside the commands that need
them, so `orchestrate status` starts fast. TensorFlow is never imported here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.console import console_sink, detach_progress, watch_text
from orchestrator.errors import OrchestrateError, exit_code_for
from orchestrator.job_records import launch_config, stored_config
from orchestrator.job_state import failing_job_on_error
from orchestrator.paths import (
    job_home,
    log_copies_dir,
    make_files_private,
    report_json,
)
from orchestrator.states import JobState
from orchestrator.store import JobRecord, Store
from orchestrator.views import render_report, status_text

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig

app = typer.Typer(
    name="orchestrate",
    help="Train one TensorFlow model on many hosts with MultiWorkerMirroredStrategy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
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


def _echo(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _print_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import version

        _echo(f"orchestrate {version('orchestrate')}")
        raise typer.Exit()


VersionOpt = Annotated[
    bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version)
]


@app.callback()
def _everywhere(version: VersionOpt = False) -> None:
    """Train one TensorFlow model on many hosts with MultiWorkerMirroredStrategy."""


@app.command()
def validate(config: ConfigArg) -> None:
    """Check a cluster.toml without starting anything."""
    from orchestrator.config import load_config
    from orchestrator.plan import dry_run_plan
    from orchestrator.views import plan_size

    cfg = load_config(config)
    plan = dry_run_plan(cfg)
    _echo(f"{config}: ok: job {cfg.job.name!r}, {cfg.backend.type} backend, {plan_size(cfg, plan)}")


@app.command()
def check(config: ConfigArg) -> None:
    """Preflight every host and try every task port from every host; starts nothing. Prints a
    host-by-host grid, the failing pairs and each host's interface; exit 3 if a pair fails."""
    from orchestrator.cluster_check import run_check
    from orchestrator.config import load_config
    from orchestrator.errors import PreflightError
    from orchestrator.port_check import render, summary

    result = run_check(load_config(config))
    _echo(render(result))
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
) -> None:
    """Validate, preflight every host, start one agent per task, and supervise the job."""
    from orchestrator.config import load_config

    cfg = load_config(config)
    if dry_run:
        from orchestrator.views import render_dry_run

        render_dry_run(cfg)
        return
    from orchestrator.backends import check_before_register
    from orchestrator.job_records import register_job

    check_before_register(cfg, str(config))  # the backend's own verdict: nothing registered
    store = Store()
    job = register_job(store, cfg, str(config), force=force)
    if detach:
        current, pid = _start_detached(store, job, plain)
        _echo(f"job {job.id} {current.state.value} (supervisor pid {pid})")
        _echo(f"  orchestrate status {job.id}   orchestrate logs {job.id} --follow")
        return
    _supervise(store, job, lambda: cfg, verbose, plain=plain)


def _start_detached(store: Store, job: JobRecord, plain: bool) -> tuple[JobRecord, int]:
    from orchestrator.detached import start_detached_supervisor

    with detach_progress(store, plain) as panel:
        return start_detached_supervisor(store, job, panel.update if panel else lambda _: None)


def _supervise(
    store: Store,
    job: JobRecord,
    config: Callable[[], ClusterConfig],
    verbose: bool,
    adopt: bool = False,
    plain: bool = True,
) -> None:
    """Run (or adopt) a job's supervision in this process to the end; exit 1 unless it
    succeeded. Whatever fails before supervision starts ends the job FAILED with its cause."""
    from orchestrator.supervisor import Supervisor

    with failing_job_on_error(store, job.id):
        cfg = config()
        sink = console_sink(log_copies_dir(job.id), store.path, job.id, verbose, plain)
        try:
            supervisor = Supervisor(store, job, cfg, sink)
        except BaseException:
            sink.close()  # the live panel too: the terminal is handed back as it was
            raise
    supervisor.install_signal_handlers()
    state = supervisor.adopt() if adopt else supervisor.run()
    if state != JobState.SUCCEEDED:
        raise typer.Exit(1)


@app.command()
def report(
    job_ref: JobArg,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """A job's run report: wall time, restarts and causes, per-task steps/s, final metrics, and a
    chart of loss and throughput per task (PNG)."""
    from orchestrator.report import write_report

    store = Store()
    job = store.get_job(job_ref)
    write_report(store, job, job_home(job.id))
    data = json.loads(report_json(job.id).read_text())
    if as_json:
        _echo(json.dumps(data, indent=2))
        return
    render_report(data)


@app.command()
def schema() -> None:
    """Print the JSON Schema of cluster.toml (for editors: e.g. taplo, Even Better TOML)."""
    from orchestrator.config import ClusterConfig

    document = ClusterConfig.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "orchestrate cluster.toml"
    _echo(json.dumps(document, indent=2))


@app.command()
def tensorboard(
    job_ref: JobArg,
    port: Annotated[int, typer.Option(help="Port to serve on (0: a free one).")] = 0,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
) -> None:
    """Serve TensorBoard on a job's log directory (every task logs to its own run)."""
    from orchestrator.tensorboard_serve import become_tensorboard, free_port, logdir_of

    job = Store().get_job(job_ref)
    logdir = logdir_of(job)
    port = port or free_port(host)
    _echo(f"TensorBoard for job {job.id}: http://{host}:{port}/  (logdir {logdir}; Ctrl-C stops)")
    become_tensorboard(logdir, host, port)


@app.command()
def resume(
    job_ref: JobArg,
    detach: DetachOpt = False,
    verbose: VerboseOpt = False,
    plain: PlainOpt = False,
) -> None:
    """Continue a failed or stopped job: same id, next attempt, same checkpoints, a fresh
    restart budget."""
    from orchestrator.job_state import reopen_for_resume

    store = Store()
    job = store.get_job(job_ref)
    cfg = launch_config(job)  # refuses a cluster.toml changed since the launch
    job = reopen_for_resume(store, job)
    if detach:
        current, pid = _start_detached(store, job, plain)
        _echo(f"job {job.id} {current.state.value} (supervisor pid {pid})")
        return
    _supervise(store, job, lambda: cfg, verbose, plain=plain)


@app.command(hidden=True)
def supervise(job_ref: JobArg) -> None:
    """Supervise a registered job (the background half of `launch --detach`)."""
    store = Store()
    job = store.get_job(job_ref)
    _supervise(store, job, lambda: launch_config(job), verbose=False)


@app.command()
def attach(
    job_ref: JobArg,
    verbose: VerboseOpt = False,
    plain: PlainOpt = False,
) -> None:
    """Adopt a running job whose supervisor is gone, and supervise it to the end."""
    from orchestrator.stopping import finish_stop
    from orchestrator.takeover import AttachPlan, attach_plan

    store = Store()
    job = store.get_job(job_ref)
    if attach_plan(store, job) == AttachPlan.FINISH_STOP:
        _echo(f"job {job.id} {finish_stop(store, job).value}")
        return
    cfg = launch_config(job)
    _supervise(store, job, lambda: cfg, verbose, adopt=True, plain=plain)


@app.command()
def status(
    job_ref: Annotated[str | None, typer.Argument(help="A job; default: recent jobs.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    limit: Annotated[int, typer.Option(help="How many recent jobs to show.")] = 10,
    watch: Annotated[
        bool,
        typer.Option("--watch", "-w", help="Refresh in place (until the job ends, or Ctrl-C)."),
    ] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
) -> None:
    """Jobs, each task's state, progress, heartbeat and restarts; from any terminal."""
    store = Store()

    def snapshot() -> tuple[str, bool]:
        jobs = [store.get_job(job_ref)] if job_ref is not None else store.list_jobs(limit)
        text = status_text(store, jobs, as_json, job_ref is not None)
        return text, job_ref is not None and jobs[0].state.is_terminal()

    if not watch:
        sys.stdout.write(snapshot()[0])
        return
    watch_text(snapshot, sys.stdout, interval)


@app.command()
def logs(
    job_ref: JobArg,
    task: Annotated[
        str | None, typer.Option("--task", "-t", help="Only these tasks: 1, 0,2 or 1-3.")
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing.")] = False,
    timestamps: Annotated[
        bool, typer.Option("--timestamps", help="Prefix each line with when it arrived (UTC).")
    ] = False,
    since: Annotated[
        str | None, typer.Option(help="Only lines since an age (90s, 5m, 2h) or a time (11:40).")
    ] = None,
    grep: Annotated[
        str | None, typer.Option("--grep", help="Only lines matching this regular expression.")
    ] = None,
    tail: Annotated[
        int | None, typer.Option("--tail", "-n", help="Only the last N lines (then --follow).")
    ] = None,
    attempt: Annotated[
        int | None, typer.Option("--attempt", help="Only the lines of attempt K (0: the first).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per line: time, task, host, text.")
    ] = False,
) -> None:
    """Print a job's task logs (the coordinator's durable copies), prefixed by task, in the
    order they arrived."""
    from orchestrator.log_query import LogQuery, follow_logs

    store = Store()
    query = LogQuery(task, follow, timestamps, since, grep, tail, attempt, as_json)
    follow_logs(store, store.get_job(job_ref), query)


@app.command()
def stop(job_ref: JobArg) -> None:
    """Stop a job: every task on every host (SIGTERM, grace, SIGKILL)."""
    from orchestrator.job_records import needs_stop
    from orchestrator.stopping import stop_job

    store = Store()
    job = store.get_job(job_ref)
    if not needs_stop(store, job):
        _echo(f"job {job.id} already {job.state.value}")
        return
    _echo(f"job {job.id} {stop_job(store, job).value}")


@app.command()
def collect(
    job_ref: JobArg,
    dest: Annotated[
        Path | None, typer.Option("--dest", help="Where to put them (default: ./JOB_ID).")
    ] = None,
) -> None:
    """Copy a job's per-task logs, final model and metrics to this machine."""
    from orchestrator.backends import open_backend
    from orchestrator.collect import check_destination, collect_job

    store = Store()
    job = store.get_job(job_ref)
    cfg = stored_config(job)
    target = dest or Path(job.id)
    check_destination(target)
    backend = open_backend(cfg)
    try:
        count = collect_job(backend, job.job_dir, target)
    finally:
        backend.close()
    _echo(f"collected {count} file(s) of job {job.id} into {target}")


def main() -> None:
    """Entry point: one-line errors, exit codes from errors.exit_code_for, never a traceback."""
    make_files_private()
    try:
        # standalone_mode=False: click returns typer.Exit's code instead of exiting itself.
        code = app(standalone_mode=False)
    except OrchestrateError as exc:  # one line per problem (a config may have several)
        sys.stderr.write("".join(f"error: {line}\n" for line in str(exc).splitlines()))
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
        sys.stderr.write(f"error: {type(exc).__name__}: {exc}\n")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
