"""The commands that look at jobs: status, logs, report, tensorboard, schema, collect,
standbys.

Fast to start: what they need beyond the store is imported inside each command."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.commands.cli_app import ConfigArg, JobArg, JsonOpt, app, echo, errors_as_json
from orchestrator.commands.console import watch_text
from orchestrator.commands.json_views import dumps
from orchestrator.commands.views import render_report, status_text
from orchestrator.errors import ENDED_EXIT_CODES
from orchestrator.state.paths import job_home, report_json
from orchestrator.state.store import Store


@app.command()
def status(
    job_ref: Annotated[str | None, typer.Argument(help="A job; default: recent jobs.")] = None,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option(help="How many recent jobs to show.")] = 10,
    watch: Annotated[
        bool,
        typer.Option("--watch", "-w", help="Refresh in place (until the job ends, or Ctrl-C)."),
    ] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
) -> None:
    """Jobs, each task's state, progress, heartbeat and restarts; from any terminal."""
    store = Store()
    with errors_as_json(as_json):
        one = None if job_ref is None else store.get_job(job_ref).id
    ended: list[str] = []

    def snapshot() -> tuple[str, bool]:
        jobs = [store.get_job(one)] if one is not None else store.list_jobs(limit)
        text = status_text(store, jobs, as_json, one is not None)
        if one is not None and jobs[0].state.is_terminal():
            ended.append(jobs[0].state.value)
        return text, bool(ended)

    if not watch:
        sys.stdout.write(snapshot()[0])
        return
    watch_text(snapshot, sys.stdout, interval)
    if ended:  # the job's end, as `wait` says it
        raise typer.Exit(ENDED_EXIT_CODES[ended[-1]])


@app.command()
def wait(
    job_ref: JobArg,
    timeout: Annotated[
        float | None,
        typer.Option(help="Give up after this many seconds (exit 5); the job goes on."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait for a job to end. Exit 0 if it succeeded, 1 if it failed, 4 if it was stopped, 5 if
    --timeout passed first (for scripts and CI pipelines)."""
    from orchestrator.api import Job
    from orchestrator.errors import UsageError, WaitTimedOut

    with errors_as_json(as_json):
        if timeout is not None and not (0 <= timeout < float("inf")):
            raise UsageError(f"--timeout: must be seconds >= 0 (got {timeout:g})")
        job_id = Store().get_job(job_ref).id
        try:
            state = Job(job_id).wait_for_end(timeout)
        except TimeoutError as exc:
            raise WaitTimedOut(str(exc)) from None
    job = Store().get_job(job_id)
    if as_json:
        echo(dumps({"job": job_id, "state": state, "last_cause": job.last_cause}))
    else:
        echo(f"job {job_id} {state}" + (f": {job.last_cause}" if job.last_cause else ""))
    code = ENDED_EXIT_CODES[state]
    if code:
        raise typer.Exit(code)


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
        str | None,
        typer.Option(help="Only lines since an age (90s, 5m, 2h) or a UTC time (11:40)."),
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
        bool,
        typer.Option(
            "--json",
            help="One document, its lines: time, task, host, text (--follow: a line each).",
        ),
    ] = False,
) -> None:
    """Print a job's task logs (the coordinator's durable copies), prefixed by task, in the
    order they arrived."""
    from orchestrator.commands.json_document import SCHEMA_VERSION
    from orchestrator.logs.log_query import LogQuery, follow_logs

    with errors_as_json(as_json and not follow):
        store = Store()
        query = LogQuery(task, follow, timestamps, since, grep, tail, attempt, as_json)
        job = store.get_job(job_ref)
    head = {"schema_version": SCHEMA_VERSION, "job": job.id}
    frame = (json.dumps(head)[:-1].encode() + b', "lines": [\n', b"]}\n")
    follow_logs(store, job, query, frame if as_json and not follow else None)
    if follow:  # it followed the job to its end: exit as `wait` does
        raise typer.Exit(ENDED_EXIT_CODES.get(store.get_job(job.id).state.value, 0))


@app.command()
def report(
    job_ref: JobArg,
    as_json: JsonOpt = False,
) -> None:
    """A job's run report: wall time, restarts and causes, per-task steps/s, final metrics, and a
    chart of loss and throughput per task (PNG)."""
    from orchestrator.commands.report import write_report

    store = Store()
    with errors_as_json(as_json):
        job = store.get_job(job_ref)
    write_report(store, job, job_home(job.id))
    data = json.loads(report_json(job.id).read_text())
    if as_json:
        echo(dumps(data))
        return
    render_report(data)


@app.command()
def tensorboard(
    job_ref: JobArg,
    port: Annotated[int, typer.Option(help="Port to serve on (0: a free one).")] = 0,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    as_json: Annotated[
        bool, typer.Option("--json", help="Its URL as one JSON document, then serve.")
    ] = False,
) -> None:
    """Serve TensorBoard on a job's log directory (every task logs to its own run)."""
    from orchestrator.commands.tensorboard_serve import (
        become_tensorboard,
        free_port,
        logdir_of,
        require_tensorboard,
    )

    with errors_as_json(as_json):
        job = Store().get_job(job_ref)
        require_tensorboard()
        logdir = logdir_of(job)
        port = port or free_port(host)
    url = f"http://{host}:{port}/"
    if as_json:
        echo(dumps({"job": job.id, "url": url, "logdir": str(logdir)}))
    else:
        echo(f"TensorBoard for job {job.id}: {url}  (logdir {logdir}; Ctrl-C stops)")
    sys.stdout.flush()
    become_tensorboard(logdir, host, port)


@app.command()
def schema() -> None:
    """Print the JSON Schema of cluster.toml (for editors: e.g. taplo, Even Better TOML)."""
    from orchestrator.config import ClusterConfig

    document = ClusterConfig.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "orchestrate cluster.toml"
    echo(json.dumps(document, indent=2))


@app.command()
def checkpoints(job_ref: JobArg, as_json: JsonOpt = False) -> None:
    """Every checkpoint a job wrote (its directory on the shared filesystem and its working
    directory): path, epoch and step where known, age, size, and whether it is whole (read by
    TensorFlow on the job's first host, without building the model)."""
    from orchestrator.supervision.checkpoints import find_checkpoints, render

    with errors_as_json(as_json):
        job = Store().get_job(job_ref)
        found = find_checkpoints(job)
    if as_json:
        echo(dumps({"job": job.id, "checkpoints": [c.to_dict() for c in found]}))
        return
    echo(render(job.id, found))


@app.command()
def collect(
    job_ref: JobArg,
    dest: Annotated[
        Path | None, typer.Option("--dest", help="Where to put them (default: ./JOB_ID).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Copy a job's per-task logs, final model, metrics and newest verified checkpoint to
    this machine."""
    from orchestrator.commands.collecting import collect_here

    with errors_as_json(as_json):
        job = Store().get_job(job_ref)
        target, count, newest, rejected = collect_here(job, dest)
    if as_json:
        echo(dumps({"job": job.id, "dest": str(target), "files": count,
                    "checkpoint": newest.prefix if newest else None,
                    "not_collected": [c.to_dict() for c in rejected]}))  # fmt: skip
        return
    echo(f"collected {count} file(s) of job {job.id} into {target}")
    if newest is not None:
        echo(f"  with its newest verified checkpoint {newest.prefix}")
    for c in rejected:
        echo(f"  not collected: {c.prefix}: {c.problem}")


@app.command()
def standbys(
    config: ConfigArg,
    clear: Annotated[
        bool, typer.Option("--clear", help="End them, and the interpreters they hold.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The warm standbys this user keeps on the config's hosts between jobs ([restart]
    keep_standbys): each keeper, what it holds, and for how long."""
    from orchestrator.backends import open_backend
    from orchestrator.config import load_config
    from worker.warm.registry import parse

    with errors_as_json(as_json):
        backend = open_backend(load_config(config))
    try:
        found = backend.standbys(clear)
        labels = [backend.transport(h).host_label for h in found.keys]
    finally:
        backend.close()
    if as_json:
        hosts = [
            {"host": labels[i], "keepers": found.succeeded.get(h),
             "error": found.reason(h, labels[i]) if h in found.failed else None}
            for i, h in enumerate(found.keys)
        ]  # fmt: skip
        echo(dumps({"hosts": hosts}))
        return
    for i, h in enumerate(found.keys):
        if h in found.failed:
            echo(f"{labels[i]}: unreachable: {found.reason(h, labels[i])}")
            continue
        entries = [parse(raw) for raw in found.succeeded[h] or []]
        if not entries:
            echo(f"{labels[i]}: nothing kept")
        for entry in entries:
            echo(f"{labels[i]}: {entry.describe() if entry else 'an entry that is not one'}")
