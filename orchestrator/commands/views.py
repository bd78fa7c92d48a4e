"""What `orchestrate status` and `report` show as text: aligned tables over the job documents
(supervision/job_document.py, the `--json` form), the dry run's plan. No rich on the status
path."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

from orchestrator.state.states import TaskState
from orchestrator.state.store import JobRecord, Store
from orchestrator.supervision.job_document import status_documents
from worker.spec import Phase, Resources

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig
    from orchestrator.planning.plan import LaunchPlan


def _write(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _epoch_cell(task: dict[str, Any]) -> str:
    """Epoch of total; '-' where no epoch was reported (a custom loop: epochs are its own)."""
    if not task["epochs_observed"]:
        return "-"
    return f"{task['epoch']}/{task['total_epochs']}" if task["total_epochs"] else str(task["epoch"])


def _unsupervised_cell(seen: str | None) -> str:
    return {
        None: "",
        "alive": " (agent alive)",
        "gone": " (agent gone)",
        "unconfirmed": " (unconfirmed: no supervisor)",
    }[seen]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _step_cell(task: dict[str, Any]) -> str:
    if not task["steps_observed"] and Phase(task["phase"]).past_rendezvous():
        return "not observed"
    return str(task["step"])


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return "-"
    return f"{nbytes / 2**30:.1f}G" if nbytes >= 2**30 else f"{nbytes >> 20}M"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


RESOURCE_HEADERS = ["CPU", "RSS", "GPU", "WAIT"]


def resource_cells(r: Resources | None) -> list[str]:
    """CPU, RSS, GPU (mean utilisation, memory used) and WAIT (in collectives) cells."""
    if r is None:
        return ["-"] * len(RESOURCE_HEADERS)
    utils = [g.utilization for g in r.gpus if g.utilization is not None]
    used = [g.memory_used for g in r.gpus if g.memory_used is not None]
    gpu = "-"
    if r.gpus:
        gpu = _pct(sum(utils) / len(utils) if utils else None)
        gpu += f" {_size(sum(used) << 20)}" if used else ""
    return [_pct(r.cpu_percent), _size(r.rss_bytes), gpu, _pct(r.collective_percent)]


def straggler_cell(reason: str | None) -> str:
    """The reason's head ("CPU saturated", "input-bound"): the whole is in the events."""
    if not reason:
        return "-"
    return "; ".join(part.split(" (")[0] for part in reason.split("; "))


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Plain aligned columns: nothing truncated, and no rich import on the status path."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]
    return "\n".join(lines)


def render_status(views: list[dict[str, Any]], detailed: bool) -> None:
    if not views:
        _write("no jobs yet: orchestrate launch cluster.toml")
        return
    rows = []
    for v in views:
        running = sum(
            1
            for t in v["tasks"]
            if TaskState(t["state"]).is_running() and t["unsupervised"] in (None, "alive")
        )
        state = v["state"]
        if v["supervisor"]["alive"] is False:
            state += " (supervisor gone: orchestrate attach)"
        rows.append(
            [
                v["id"],
                state,
                v["backend"] + (f" {v['allocation']}" if v["allocation"] else ""),
                f"{running}/{len(v['tasks'])}",
                str(v["restarts"]),
                f"{v['wall_seconds']:.0f}s",
                v["last_cause"] or "-",
            ]
        )
    _write(table(["JOB", "STATE", "BACKEND", "RUNNING", "RESTARTS", "WALL", "LAST CAUSE"], rows))
    if not detailed:
        return
    for v in views:
        rows = [
            [
                f"{t['type']}-{t['index']}",
                t["host"],
                f"{t['listening']}*" if t["listening"] else t["address"],
                t["state"]
                + (f" ({t['exit_code']})" if t["exit_code"] else "")
                + _unsupervised_cell(t["unsupervised"]),
                t["phase"] or "-",
                str(t["pid"] or "-"),
                _epoch_cell(t),
                _step_cell(t),
                "-" if t["loss"] is None else f"{t['loss']:.4f}",
                "-" if t["steps_per_sec"] is None else f"{t['steps_per_sec']:.1f}",
                _duration(t["eta_seconds"]),
                "-" if t["heartbeat_age"] is None else f"{t['heartbeat_age']:.1f}s ago",
                *resource_cells(Resources.from_dict(t["resources"]) if t["resources"] else None),
                straggler_cell(t["straggler"]),
            ]
            for t in v["tasks"]
        ]
        headers = [
            "TASK",
            "HOST",
            "ADDRESS",
            "STATE",
            "PHASE",
            "PID",
            "EPOCH",
            "STEP",
            "LOSS",
            "STEPS/S",
            "ETA",
            "HEARTBEAT",
            *RESOURCE_HEADERS,
            "STRAGGLER",
        ]
        _write()
        _write(table(headers, rows))
        for note in v["host_notes"]:
            _write(f"  {note}")
        own = [f"{t['type']}-{t['index']}" for t in v["tasks"] if t["listening"]]
        if own:
            _write(f"  * {', '.join(own)}: where the script's own cluster resolver put it, not "
                   "TF_CONFIG's address (which it does not use)")  # fmt: skip
        if v.get("cold_restarts"):
            _write(f"  restarts are cold: {v['cold_restarts']}")


def status_text(store: Store, jobs: list[JobRecord], as_json: bool, one_job: bool) -> str:
    """What `orchestrate status` prints for these jobs (one job: with its latest events)."""
    views = status_documents(store, jobs, with_events=one_job)
    if as_json:
        from orchestrator.commands.json_document import dumps

        return dumps({"jobs": views}) + "\n"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        render_status(views, detailed=one_job or len(jobs) == 1)
        if one_job and views[0]["events"]:
            _write()
            for event in views[0]["events"][-8:]:
                when = time.strftime("%H:%M:%S", time.localtime(event["ts"]))
                _write(f"{when}  {event['kind']:<10} {event['message']}")
    return out.getvalue()


def render_report(data: dict[str, Any]) -> None:
    """`orchestrate report JOB`: the report.json of a job, as text."""
    _write(f"job {data['job']}: {data['state']} in {data['wall_seconds']:.0f}s, "
          f"{data['restarts']} restart(s)")  # fmt: skip
    for cause in data["restart_causes"]:
        _write(f"  restart: {cause}")
    widths = data.get("width", [])
    if len({w["workers"] for w in widths}) > 1:  # only worth a line when it changed
        _write("width: " + ", ".join(f"{w['workers']} at {w['seconds']:.0f}s" for w in widths))
    rows = [
        [f"worker-{i}", t["host"], t["state"], str(t["epoch"]), str(t["steps"]),
         "-" if t["loss"] is None else f"{t['loss']:.4f}",
         "-" if t["median_steps_per_sec"] is None else f"{t['median_steps_per_sec']:.1f}",
         _pct(t.get("median_cpu_percent")), _size(t.get("max_rss_bytes")),
         _pct(t.get("median_gpu_utilization")), _pct(t.get("median_collective_percent"))]
        for i, t in data["tasks"].items()
    ]  # fmt: skip
    headers = ["TASK", "HOST", "STATE", "EPOCH", "STEPS", "LOSS", "STEPS/S", "CPU", "RSS (max)",
               "GPU", "WAIT"]  # fmt: skip
    _write(table(headers, rows))
    _write("(medians over the run; WAIT: share of time in collectives, waiting for peers)")
    for straggler in data.get("stragglers", []):
        _write(f"  {straggler}")
    for stacks in data.get("stacks", []):  # a hung or late group's, before it was stopped
        _write(f"stacks: {stacks}")
    if data["metrics"]:
        _write("metrics: " + ", ".join(f"{k}={v}" for k, v in data["metrics"].items()))
    chart = data["chart"]
    _write(f"chart: {chart['path'] or 'not drawn: ' + chart.get('not_drawn', '')}")
    if data.get("resource_chart", {}).get("panels"):
        _write(f"resources: {data['resource_chart']['path']}")


def plan_size(cfg: ClusterConfig, plan: LaunchPlan) -> str:
    """'3 task(s) on 2 host(s)'; with "per_gpu" hosts, at least that many: their GPUs are
    counted at launch."""
    from orchestrator.planning.plan import per_gpu_hosts

    hosts = {t.host_index for t in plan.tasks}
    per_gpu = [h for h in per_gpu_hosts(cfg) if h in hosts]
    size = f"{len(plan.tasks)} task(s) on {len(hosts)} host(s)"
    if not per_gpu:
        return size
    labels = ", ".join(t.host_label for t in plan.tasks if t.host_index in per_gpu)
    return f"at least {size} ({labels}: tasks counted from the GPUs found at launch)"


def render_dry_run(cfg: ClusterConfig) -> None:
    """`launch --dry-run`: the plan, the trainer's command and each task's TF_CONFIG."""
    from orchestrator.planning.gpus import task_env
    from orchestrator.planning.plan import dry_run_plan, per_gpu_hosts
    from orchestrator.planning.task_specs import container_argv, entrypoint_command

    plan = dry_run_plan(cfg)
    per_gpu = set(per_gpu_hosts(cfg))
    _write(
        f"job {cfg.job.name}: {'at least ' if per_gpu else ''}{len(plan.tasks)} task(s), "
        f"{cfg.backend.type} backend, shared_dir {cfg.job.shared_dir}"
    )
    through = " (through orchestrate's bootstrap)" if cfg.entrypoint.instrument else ""
    python = cfg.container.python if cfg.container else "<python>"
    _write(f"trainer: {' '.join(entrypoint_command(cfg, python))}{through}")
    for task in plan.tasks:
        gpus = ""
        if task.host_index in per_gpu:
            g = cfg.backend.host_gpus_per_task(task.host_index)
            gpus = f" GPUs: one task per {'GPU' if g == 1 else f'{g} GPUs'}, counted at launch"
        elif task.gpus:
            gpus = f" GPUs {','.join(map(str, task.gpus))}"
        _write(
            f"worker-{task.index} on {task.host_label} ({task.endpoint})"
            f"{' chief' if task.is_chief else ''}{gpus}"
        )
        _write(f"  TF_CONFIG={plan.tf_config_json(task.index)}")
        if (runs := container_argv(cfg, task, os.getuid())) is not None:
            _write(f"  in the image: {shlex.join(runs)}")
    if any(t.gpus for t in plan.tasks):
        env = task_env(["<its GPUs>"], cfg.strategy.gpu_memory_growth)
        _write(
            "(GPUs are nvidia-smi indexes, counted and checked free at launch; a task with "
            f"GPUs gets {' '.join(f'{k}={v}' for k, v in env.items())})"
        )
    if any(t.port is None for t in plan.tasks):
        _write("(auto ports are probed free on each host at launch)")
    from orchestrator.backends import dry_run_notes

    for line in dry_run_notes(cfg):
        _write(line)
