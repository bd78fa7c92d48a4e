#!/usr/bin/env python3
"""Draw scripts/benchmarks/scale.py's curve: the supervisor's CPU per host per second and its RSS
against the number of hosts, the long poll beside every host read every tick (--baseline), and
hosts of several tasks each (--slots) as a series of their own, labelled with their tasks.

    uv run python -m scripts.benchmarks.plot_scale scale_output.txt docs/bench/supervision-scale.png

It reads the JSON lines scale.py prints (one per measurement) and also writes them, as
one JSON list, next to the picture (same name, .json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

CPU_GOAL_MS = 0.5  # per host per second
RSS_GOAL_MB = 300.0


def main(log: Path, out: Path) -> int:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    if not rows:
        print(f"no measurements in {log}", file=sys.stderr)
        return 1
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    fig, (cpu_ax, rss_ax) = plt.subplots(1, 2, figsize=(10, 4))
    series = sorted({(r["keepalive"], r.get("slots", 1)) for r in rows}, reverse=True)
    for keepalive, slots in series:
        mine = sorted(
            (r for r in rows if (r["keepalive"], r.get("slots", 1)) == (keepalive, slots)),
            key=lambda r: r["hosts"],
        )
        hosts = [r["hosts"] for r in mine]
        label = (
            f"long poll (keep-alive {keepalive:g} s)"
            if keepalive >= 1.0
            else f"every host read every {keepalive:g} s (as before)"
        )
        if slots > 1:
            label += f", {slots} tasks a host (" + ", ".join(f"{r['tasks']}" for r in mine) + ")"
        cpu_ax.plot(hosts, [r["cpu_ms_per_host_s"] for r in mine], "o-", label=label)
        rss_ax.plot(hosts, [r["rss_mb"] for r in mine], "o-", label=label)
    cpu_ax.axhline(CPU_GOAL_MS, color="grey", linestyle="--", label=f"goal: {CPU_GOAL_MS:g} ms")
    rss_ax.axhline(RSS_GOAL_MB, color="grey", linestyle="--", label=f"goal: {RSS_GOAL_MB:g} MB")
    for ax, title in (
        (cpu_ax, "supervisor CPU per host per second (ms)"),
        (rss_ax, "supervisor resident size (MB)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["hosts"] for r in rows}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("hosts (namespaced sshd, stand-in trainers)")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
