"""The run report: wall time, restarts and their causes, per-task throughput and resources,
stragglers, final metrics, a chart of loss and steps/s per task over time and a chart per
resource per task. Written at the end of every job (`$ORCHESTRATE_HOME/jobs/JOB/report.json`,
`report.png` and `report-resources.png`) and by `orchestrate report JOB`."""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
from pathlib import Path
from typing import Any

from orchestrator.state.store import EventRecord, JobRecord, ResourceSample, Sample, Store

# The resource chart's panels: (ResourceSample field, axis label, scale).
RESOURCE_PANELS = (
    ("cpu_percent", "trainer CPU %", 1.0),
    ("cpu_wait_percent", "% waiting for a CPU", 1.0),
    ("rss_bytes", "trainer RSS MiB", 1 / 2**20),
    ("gpu_utilization", "GPU utilisation %", 1.0),
    ("collective_percent", "% waiting for peers", 1.0),
    ("input_percent", "% waiting for input", 1.0),
)


def _median_of(values: list[float | int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 1) if known else None


def build_report(
    store: Store,
    job: JobRecord,
    job_home: Path,
    samples: list[Sample],
    events: list[EventRecord],
    resources: list[ResourceSample] | None = None,
) -> dict[str, Any]:
    tasks = store.tasks(job.id)
    resources = store.resource_samples(job.id) if resources is None else resources
    per_task: dict[int, dict[str, Any]] = {}
    for task in tasks:
        mine = [s for s in samples if s.task == task.idx]
        rates = [s.steps_per_sec for s in mine if s.steps_per_sec]
        used = [r for r in resources if r.task == task.idx]
        rss = [r.rss_bytes for r in used if r.rss_bytes is not None]
        per_task[task.idx] = {
            "host": task.host,
            "state": task.state.value,
            "epoch": task.epoch,
            "steps": task.step,
            "loss": task.loss,
            "median_steps_per_sec": round(statistics.median(rates), 2) if rates else None,
            "median_cpu_percent": _median_of([r.cpu_percent for r in used]),
            "max_rss_bytes": max(rss) if rss else None,
            "median_gpu_utilization": _median_of([r.gpu_utilization for r in used]),
            "median_collective_percent": _median_of([r.collective_percent for r in used]),
            "median_input_percent": _median_of([r.input_percent for r in used]),
        }
    metrics_path = job_home / "collected" / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    return {
        "job": job.id,
        "state": job.state.value,
        "wall_seconds": round((job.ended or job.updated) - job.created, 1),
        "restarts": job.restarts,
        "preemptions": job.preemptions,
        "restart_causes": [e.message for e in events if e.kind == "restart"],
        "stragglers": [e.message for e in events if e.kind == "straggler"],
        "stacks": [e.message for e in events if e.kind == "stacks"],  # taken before a stop
        "width": width_over_time(job, events),
        "last_cause": job.last_cause,
        "tasks": per_task,
        "metrics": metrics,
    }


def width_over_time(job: JobRecord, events: list[EventRecord]) -> list[dict[str, Any]]:
    """How many workers each attempt started with, and when (seconds since launch): the width
    changes when a group shrinks (min_workers) or grows back (regrow)."""
    widths = []
    for event in events:
        started = re.match(r"attempt (\d+): (\d+) task\(s\) started", event.message)
        if event.kind == "launched" and started:
            widths.append(
                {
                    "seconds": round(event.ts - job.created, 1),
                    "attempt": int(started.group(1)),
                    "workers": int(started.group(2)),
                }
            )
    return widths


def draw_chart(
    job: JobRecord, samples: list[Sample], events: list[EventRecord], path: Path
) -> list[str]:
    """Loss and steps/s per task over time; returns the labels of the lines drawn per panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, rate_ax) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    labels = []
    for task in sorted({s.task for s in samples}):
        mine = [s for s in samples if s.task == task]
        times = [s.ts - job.created for s in mine]
        label = f"worker-{task}"
        loss_ax.plot(
            times, [s.loss if s.loss is not None else float("nan") for s in mine], label=label
        )
        rate_ax.plot(times, [s.steps_per_sec or float("nan") for s in mine], label=label)
        labels.append(label)
    for event in events:
        if event.kind == "restart":
            for ax in (loss_ax, rate_ax):
                ax.axvline(event.ts - job.created, color="grey", linestyle="--", linewidth=1)
    loss_ax.set_ylabel("loss")
    rate_ax.set_ylabel("steps/s")
    rate_ax.set_xlabel("seconds since launch (dashed: restarts)")
    loss_ax.set_title(f"{job.id}: {job.state.value}")
    if labels:
        loss_ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    drawn = [
        line.get_label() for line in loss_ax.get_lines() if not line.get_label().startswith("_")
    ]
    plt.close(fig)
    return drawn


def draw_resource_chart(
    job: JobRecord, samples: list[ResourceSample], events: list[EventRecord], path: Path
) -> list[str]:
    """A panel per resource sampled (CPU, RSS, GPU, waits), a line per task; returns the
    panels drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in RESOURCE_PANELS if any(getattr(s, p[0]) is not None for s in samples)]
    if not panels:
        return []
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 * len(panels) + 0.6), sharex=True)
    axes = axes if len(panels) > 1 else [axes]
    for ax, (name, label, scale) in zip(axes, panels, strict=True):
        for task in sorted({s.task for s in samples}):
            mine = [s for s in samples if s.task == task]
            values = [getattr(s, name) for s in mine]
            ax.plot(
                [s.ts - job.created for s in mine],
                [float("nan") if v is None else v * scale for v in values],
                label=f"worker-{task}",
            )
        for event in events:
            if event.kind in ("restart", "straggler"):
                style = "--" if event.kind == "restart" else ":"
                ax.axvline(event.ts - job.created, color="grey", linestyle=style, linewidth=1)
        ax.set_ylabel(label)
    axes[0].set_title(f"{job.id}: resources per task")
    axes[0].legend()
    axes[-1].set_xlabel("seconds since launch (dashed: restarts, dotted: stragglers)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [label for _, label, _ in panels]


def write_report(store: Store, job: JobRecord, job_home: Path) -> Path:
    samples, events = store.samples(job.id), store.events(job.id)  # read once, used twice
    resources = store.resource_samples(job.id)
    report = build_report(store, job, job_home, samples, events, resources)
    chart = job_home / "report.png"
    resource_chart = job_home / "report-resources.png"
    if importlib.util.find_spec("matplotlib") is None:  # a coordinator installed without it
        why = "matplotlib is not installed here: pip install 'orchestrate[report]'"
        report["chart"] = {"path": None, "lines": [], "not_drawn": why}
        report["resource_chart"] = {"path": None, "panels": [], "not_drawn": why}
    else:
        lines = draw_chart(job, samples, events, chart)
        report["chart"] = {"path": str(chart), "lines": lines}
        report["resource_chart"] = {
            "path": str(resource_chart),
            "panels": draw_resource_chart(job, resources, events, resource_chart),
        }
    (job_home / "report.json").write_text(json.dumps(report, indent=2))
    return job_home / "report.json" if report["chart"]["path"] is None else chart
