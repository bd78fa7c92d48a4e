"""The `orchestrate` command line. Thin: parse, call the core, render, map errors to exit codes.

Heavy modules (pydantic models, the supervisor, SSH) are imported inside the commands that need
them, so `orchestrate status` starts fast. TensorFlow is never imported here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.errors import OrchestrateError, UsageError, exit_code_for
from orchestrator.jobs import (
    fail_job,
    failing_job_on_error,
    launch_config,
    needs_stop,
    stop_without_supervisor,
    stored_config,
    supervisor_alive,
)
from orchestrator.paths import (
    collected_dir,
    job_home,
    log_copies_dir,
    make_files_private,
    report_json,
    supervisor_log,
)
from orchestrator.states import JobState, TaskState
from orchestrator.store import JobRecord, Store
from orchestrator.views import job_view, render_report, render_status

app = typer.Typer(
    name="orchestrate",
    help="Train one TensorFlow model on many hosts with MultiWorkerMirroredStrategy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)

ConfigArg = Annotated[Path, typer.Argument(help="Path to cluster.toml.", show_default=False)]
JobArg = Annotated[str, typer.Argument(help="Job id (or a unique prefix of it, or a job name).")]


def _echo(text: str = "") -> None:
    sys.stdout.write(text + "\n")


@app.command()
def validate(config: ConfigArg) -> None:
    """Check a cluster.toml without starting anything."""
    from orchestrator.config import load_config
    from orchestrator.plan import dry_run_plan

    cfg = load_config(config)
    plan = dry_run_plan(cfg)
    hosts = len({t.host_index for t in plan.tasks})
    _echo(
        f"{config}: ok: job {cfg.job.name!r}, {cfg.backend.type} backend, "
        f"{len(plan.tasks)} task(s) on {hosts} host(s)"
    )


@app.command()
def launch(
    config: ConfigArg,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Return once running; supervise in background.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and each TF_CONFIG; start nothing.")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show TensorFlow's C++ notices too.")
    ] = False,
) -> None:
    """Validate, preflight every host, start one agent per task, and supervise the job."""
    from orchestrator.config import load_config

    cfg = load_config(config)
    if dry_run:
        _print_dry_run(cfg)
        return
    from orchestrator.jobs import register_job

    store = Store()
    job = register_job(store, cfg, str(config))
    if detach:
        _launch_detached(store, job)
        return
    from orchestrator.logstream import LineSink
    from orchestrator.supervisor import Supervisor

    sink = LineSink(log_copies_dir(job.id), sys.stdout, verbose)
    with failing_job_on_error(store, job.id):
        supervisor = Supervisor(store, job, cfg, sink)
    supervisor.install_signal_handlers()
    state = supervisor.run()
    if state != JobState.SUCCEEDED:
        raise typer.Exit(1)


def _print_dry_run(cfg: Any) -> None:
    from orchestrator.launcher import trainer_argv
    from orchestrator.plan import dry_run_plan

    plan = dry_run_plan(cfg)
    _echo(
        f"job {cfg.job.name}: {len(plan.tasks)} task(s), {cfg.backend.type} backend, "
        f"shared_dir {cfg.job.shared_dir}"
    )
    through = " (through orchestrate's bootstrap)" if cfg.entrypoint.instrument else ""
    _echo(f"trainer: {' '.join(trainer_argv(cfg, '<python>'))}{through}")
    for task in plan.tasks:
        _echo(
            f"worker-{task.index} on {task.host_label} ({task.endpoint})"
            f"{' chief' if task.is_chief else ''}"
        )
        _echo(f"  TF_CONFIG={plan.tf_config_json(task.index)}")
    if any(t.port is None for t in plan.tasks):
        _echo("(auto ports are probed free on each host at launch)")


def _launch_detached(store: Store, job: JobRecord) -> None:
    from orchestrator.transport.local import LocalTransport
    from worker.proctl import is_same

    log = supervisor_log(job.id)
    supervisor = LocalTransport().start_detached(
        [sys.executable, "-m", "orchestrator", "supervise", job.id], log_path=str(log)
    )
    store.update_job(
        job.id,
        supervisor_pid=supervisor.pid,
        supervisor_ident=supervisor.ident,
        supervisor_host=socket.gethostname(),
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        current = store.get_job(job.id)
        if current.state == JobState.RUNNING or current.state.is_terminal():
            break
        if not is_same(supervisor.pid, supervisor.ident):  # it died before the job ran
            current = store.get_job(job.id)  # it may have ended the job just before exiting
            if not current.state.is_terminal():
                tail = _last_line(log) or "no output"
                fail_job(store, job.id, f"the supervisor exited during launch: {tail}")
                current = store.get_job(job.id)
            break
        time.sleep(0.1)
    if current.state in (JobState.FAILED, JobState.STOPPED):
        raise OrchestrateError(f"job {job.id} {current.state.value}: {current.last_cause}")
    _echo(f"job {job.id} {current.state.value} (supervisor pid {supervisor.pid})")
    _echo(f"  orchestrate status {job.id}   orchestrate logs {job.id} --follow")


def _last_line(path: Path) -> str:
    try:
        lines = path.read_bytes().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


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
    import socket as _socket

    store = Store()
    job = store.get_job(job_ref)
    logdir = Path(job.job_dir) / "tensorboard"
    if not logdir.is_dir():  # the shared directory is not mounted here: use collected copies
        logdir = collected_dir(job.id) / "tensorboard"
    if not logdir.is_dir():
        raise UsageError(
            f"job {job.id} has no TensorBoard logs here (tried {job.job_dir}/tensorboard)"
        )
    if port == 0:
        with _socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
    _echo(f"TensorBoard for job {job.id}: http://{host}:{port}/  (logdir {logdir}; Ctrl-C stops)")
    sys.stdout.flush()
    argv = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
            "--host", host, "--port", str(port)]  # fmt: skip
    # Become TensorBoard: a signal to this process (Ctrl-C, a stop) then reaches it directly,
    # and no child is left behind.
    os.execv(sys.executable, argv)


@app.command(hidden=True)
def supervise(job_ref: JobArg) -> None:
    """Supervise a registered job (the background half of `launch --detach`)."""
    from orchestrator.logstream import LineSink
    from orchestrator.supervisor import Supervisor

    store = Store()
    job = store.get_job(job_ref)
    with failing_job_on_error(store, job.id):
        cfg = launch_config(job)
        sink = LineSink(log_copies_dir(job.id), console=sys.stdout)
        supervisor = Supervisor(store, job, cfg, sink)
    supervisor.install_signal_handlers()
    state = supervisor.run()
    if state != JobState.SUCCEEDED:
        raise typer.Exit(1)


@app.command()
def attach(
    job_ref: JobArg,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show TensorFlow's C++ notices too.")
    ] = False,
) -> None:
    """Adopt a running job whose supervisor is gone, and supervise it to the end."""
    from orchestrator.logstream import LineSink
    from orchestrator.supervisor import Supervisor

    store = Store()
    job = store.get_job(job_ref)
    if needs_stop(store, job) and (
        job.state.is_terminal()
        or any(t.state == TaskState.UNREACHABLE for t in store.tasks(job.id))
    ):  # a stop that could not reach every host: finish it
        _finish_stop(store, job)
        return
    if job.state.is_terminal():
        raise UsageError(f"job {job.id} already {job.state.value}: nothing to attach to")
    alive = supervisor_alive(job)
    if alive:
        raise UsageError(f"job {job.id} is supervised by pid {job.supervisor_pid}; it is not lost")
    if alive is None:
        raise UsageError(
            f"job {job.id} is supervised from host {job.supervisor_host}: attach there"
        )
    cfg = launch_config(job)
    sink = LineSink(log_copies_dir(job.id), sys.stdout, verbose)
    with failing_job_on_error(store, job.id):
        supervisor = Supervisor(store, job, cfg, sink)
    supervisor.install_signal_handlers()
    if supervisor.adopt() != JobState.SUCCEEDED:
        raise typer.Exit(1)


@app.command()
def status(
    job_ref: Annotated[str | None, typer.Argument(help="A job; default: recent jobs.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    limit: Annotated[int, typer.Option(help="How many recent jobs to show.")] = 10,
) -> None:
    """Jobs, each task's state, progress, heartbeat and restarts; from any terminal."""
    store = Store()
    jobs = [store.get_job(job_ref)] if job_ref is not None else store.list_jobs(limit)
    tasks = store.tasks_for([j.id for j in jobs])
    now = time.time()
    views = [job_view(j, tasks[j.id], now) for j in jobs]
    if job_ref:
        views[0]["events"] = [
            {"ts": e.ts, "kind": e.kind, "task": e.task, "message": e.message}
            for e in store.events(jobs[0].id)
        ]
    if as_json:
        _echo(json.dumps({"jobs": views}, indent=2))
        return
    render_status(views, detailed=job_ref is not None or len(jobs) == 1)
    if job_ref is not None and views[0]["events"]:
        _echo()
        for event in views[0]["events"][-8:]:
            when = time.strftime("%H:%M:%S", time.localtime(event["ts"]))
            _echo(f"{when}  {event['kind']:<10} {event['message']}")


@app.command()
def logs(
    job_ref: JobArg,
    task: Annotated[int | None, typer.Option("--task", "-t", help="Only this task.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing.")] = False,
) -> None:
    """Print a job's task logs (the coordinator's durable copies), prefixed by task."""

    store = Store()
    job = store.get_job(job_ref)
    tasks = store.tasks(job.id)
    if task is not None and task not in {t.idx for t in tasks}:
        raise UsageError(f"job {job.id} has no task {task} (tasks: 0..{len(tasks) - 1})")
    from orchestrator.logstream import LogTailer
    from orchestrator.transport.local import LocalTransport

    chosen = [t for t in tasks if task is None or t.idx == task]
    log_dir = log_copies_dir(job.id)
    local = LocalTransport()
    tailers = {t.idx: LogTailer(local, str(log_dir / f"worker-{t.idx}.log")) for t in chosen}
    while True:
        last = not follow or store.get_job(job.id).state.is_terminal()
        for t in chosen:
            tailer = tailers[t.idx]
            lines = tailer.flush() if last else tailer.poll()  # the end: a last partial line too
            prefix = "" if task is not None else f"[worker-{t.idx} {t.host}] "
            if lines:
                sys.stdout.write(
                    "".join(prefix + ln.decode(errors="replace") + "\n" for ln in lines)
                )
        sys.stdout.flush()
        if last:
            break
        time.sleep(0.3)


@app.command()
def stop(job_ref: JobArg) -> None:
    """Stop a job: every task on every host (SIGTERM, grace, SIGKILL)."""
    store = Store()
    job = store.get_job(job_ref)
    if not needs_stop(store, job):
        _echo(f"job {job.id} already {job.state.value}")
        return
    cfg = stored_config(job)
    grace = cfg.supervision.stop_grace
    if not job.state.is_terminal() and supervisor_alive(job) and job.supervisor_pid is not None:
        os.kill(job.supervisor_pid, signal.SIGTERM)  # identity checked just above
        deadline = time.monotonic() + grace + 60
        while (
            time.monotonic() < deadline
            and not store.get_job(job.id).state.is_terminal()
            and supervisor_alive(job)  # it may end with the stop unconfirmed: not terminal
        ):
            time.sleep(0.1)
    _finish_stop(store, store.get_job(job.id))


def _finish_stop(store: Store, job: JobRecord) -> None:
    """Sweep every host for the job's processes (found by the job id, so those whose pids
    never reached the store too) and stop them; say what could not be confirmed."""
    report = stop_without_supervisor(store, job, stored_config(job))
    if not report.confirmed:
        raise OrchestrateError(
            f"job {job.id}: stop not confirmed: {report.describe()}; "
            f"run `orchestrate stop {job.id}` again once the host is back"
        )
    _echo(f"job {job.id} {store.get_job(job.id).state.value}")


@app.command()
def collect(
    job_ref: JobArg,
    dest: Annotated[
        Path | None, typer.Option("--dest", help="Where to put them (default: ./JOB_ID).")
    ] = None,
) -> None:
    """Copy a job's per-task logs, final model and metrics to this machine."""
    from orchestrator.backends import open_backend
    from orchestrator.jobs import collect_job

    store = Store()
    job = store.get_job(job_ref)
    cfg = stored_config(job)
    target = dest or Path(job.id)
    _check_destination(target)
    backend = open_backend(cfg)
    try:
        count = collect_job(backend, job.job_dir, target)
    finally:
        backend.close()
    _echo(f"collected {count} file(s) of job {job.id} into {target}")


def _check_destination(target: Path) -> None:
    """collect writes into target: say so in one line when it cannot, before any copy."""
    if target.exists() and not target.is_dir():
        raise UsageError(f"--dest {target} is not a directory")
    existing = target if target.exists() else next(p for p in target.parents if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--dest {target}: {existing} is not writable")
    probe = existing / f".orchestrate-write-test-{os.getpid()}"
    try:  # root passes os.access on a read-only file system: try a write
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--dest {target}: cannot write in {existing}: {exc.strerror}") from None


def main() -> None:
    """Entry point: one-line errors, exit codes from errors.exit_code_for, never a traceback."""
    make_files_private()
    try:
        # standalone_mode=False: click returns typer.Exit's code instead of exiting itself.
        code = app(standalone_mode=False)
    except OrchestrateError as exc:
        sys.stderr.write(f"error: {exc}\n")
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
