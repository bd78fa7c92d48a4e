"""The chaos soak's figures (scripts/chaos_report.py writes them): per backend and fault kind,
the count, the detection and recovery times (median and worst), the restart budget used, the
violations; as Markdown and as a chart."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "chaos"


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def _p95(values: list[float]) -> float:
    return (
        statistics.quantiles(values, n=20, method="inclusive")[-1] if len(values) > 1 else values[0]
    )


def _ratios(ratios: list[float]) -> str:
    """Recovery less the configured backoff, over the run's cold start: median / 95th pct."""
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f}x / {_p95(ratios):.2f}x"


def _counted_from(fault: dict[str, Any]) -> float:
    """Where a recovery's count starts, from the injection: a hang's at the watchdog's verdict
    (`progress_timeout` is the user's to choose), any other fault's at once."""
    if fault["kind"] == "trainer_hang" and fault["detected_s"] is not None:
        return float(fault["detected_s"])
    return 0.0


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_kind: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        for fault in run["faults"]:
            cold = run.get("cold_start_s")  # runs before it was measured have none
            by_kind.setdefault((run["backend"], fault["kind"]), []).append({**fault, "cold": cold})
    table = []
    for (backend, kind), faults in sorted(by_kind.items()):
        detected = [f["detected_s"] for f in faults if f["detected_s"] is not None]
        recovered = [f["recovered_s"] for f in faults if f["recovered_s"] is not None]
        backoffs = [f["backoff_s"] for f in faults if f.get("backoff_s") is not None]
        ratios = [(f["recovered_s"] - _counted_from(f) - (f.get("backoff_s") or 0.0)) / f["cold"]
                  for f in faults if f["recovered_s"] is not None and f["cold"]]  # fmt: skip
        table.append({
            "backend": backend, "kind": kind, "count": len(faults),
            "overlapped": sum(1 for f in faults if f["overlap"]),
            "detected": detected, "recovered": recovered, "backoff": backoffs, "ratios": ratios,
            "budget": sum(f["budget_spent"] for f in faults),
            # recoveries whose every task started in a standby, of those whose starts were seen
            "warm": [f["warm"] == f["tasks"] for f in faults if f.get("warm") is not None],
            "waited": [f["import_wait_s"] for f in faults if f.get("import_wait_s") is not None],
            "violations": sum(len(f["violations"]) for f in faults),
        })  # fmt: skip
    return table


def markdown(runs: list[dict[str, Any]], table: list[dict[str, Any]]) -> str:
    total = sum(r["count"] for r in table)
    lines = [
        "# Chaos soak: figures",
        "",
        "Written by `python -m scripts.chaos_report` from the runs below",
        "(`python -m scripts.chaos --json`).",
        "Times in seconds from the injection, median / worst: *detected* is the supervisor's",
        "failure event, *recovered* the last task's first step of the attempt that followed.",
        "*Budget* is the restarts counted against `max_restarts` (a preemption counts none).",
        "*Backoff* is the restarts' configured wait, median; *vs cold start* is the recovery",
        "(a hang's from the watchdog's verdict) less that backoff, over the cold start measured",
        "in the same run (two workers started by hand to their first step), median / 95th",
        "percentile. *Warm* counts the recoveries whose every task started in a warm standby",
        "(its agent's line in the log; one that waited for the standby's import counts),",
        "of those whose starts were seen; *waited* the longest a warm start waited for its",
        "standby's TensorFlow import in each recovery, median / worst.",
        "",
        "| backend | seed | faults | per job | violations | minutes | cold start (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        minutes = run["seconds"] / 60
        cold = f"{run['cold_start_s']:.2f}" if run.get("cold_start_s") else "-"
        lines.append(f"| {run['backend']} | {run['seed']} | {len(run['faults'])} | "
                     f"{run['per_job']} | {len(run['violations'])} | {minutes:.0f} | "
                     f"{cold} |")  # fmt: skip
    lines += [
        "",
        f"{total} faults in all.",
        "",
        "| backend | fault kind | count | overlapped | detected (s) | recovered (s) | backoff "
        "(s) | vs cold start | warm | waited (s) | budget | violations |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in table:
        backoff = f"{statistics.median(r['backoff']):.2f}" if r["backoff"] else "-"
        warm = f"{sum(r['warm'])} of {len(r['warm'])}" if r["warm"] else "-"
        lines.append(f"| {r['backend']} | `{r['kind']}` | {r['count']} | {r['overlapped']} | "
                     f"{_span(r['detected'])} | {_span(r['recovered'])} | {backoff} | "
                     f"{_ratios(r['ratios'])} | {warm} | {_span(r['waited'])} | {r['budget']} | "
                     f"{r['violations']} |")  # fmt: skip
    lines += ["", "Violations of a whole job (not of one fault), as the runs recorded them:", ""]
    lines += [f"- {run['backend']}: {v}" for run in runs for v in run["violations"]
              if not v.startswith("fault ")] or ["- none"]  # fmt: skip
    lines += ["", "![detection and recovery per fault kind](results.png)", ""]
    return "\n".join(lines)


def beside(before: list[dict[str, Any]], table: list[dict[str, Any]], where: str) -> str:
    """The recovery medians of earlier runs (`where` they are kept) beside this table's."""
    earlier = {(r["backend"], r["kind"]): r for r in rows(before)}
    lines = [
        f"## Beside the earlier runs ([{where}]({where}))",
        "",
        "| backend | fault kind | recovered then (s) | now (s) | count then / now |",
        "|---|---|---|---|---|",
    ]
    for r in table:
        then = earlier.get((r["backend"], r["kind"]))
        if not r["recovered"] or then is None or not then["recovered"]:
            continue
        lines.append(f"| {r['backend']} | `{r['kind']}` | {_span(then['recovered'])} | "
                     f"{_span(r['recovered'])} | {then['count']} / {r['count']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def chart(table: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in table if r["recovered"] or r["detected"]]
    labels = [f"{r['backend']}: {r['kind']}" for r in shown]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(shown) + 1.5))
    for i, r in enumerate(shown):
        for values, color, dy in (
            (r["detected"], "tab:red", -0.15),
            (r["recovered"], "tab:blue", 0.15),
        ):
            ax.scatter(values, [i + dy] * len(values), s=10, color=color, alpha=0.6)
    ax.set_yticks(range(len(shown)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the injection (red: detected, blue: training again)")
    ax.set_title("Chaos soak: every fault's detection and recovery")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
