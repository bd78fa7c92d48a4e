"""scripts/bench.py's result rows: a figure next to its baseline and target, the ratio and
whether it is met, and their rendering (the Markdown table, the chart)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Row:
    id: str
    measurement: str
    unit: str
    values: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    baseline_label: str = ""
    target: str = ""
    # "ratio" rows compare value/baseline with target_ratio; "value" rows compare the value with
    # target_value; "inverse" rows need the ratio to be at least target_ratio.
    kind: str = "value"
    target_value: float | None = None
    target_ratio: float | None = None
    note: str = ""
    skipped: str = ""
    # Rows measured in alternating pairs (ours, raw) report the median of the per-pair ratios:
    # on a noisy machine that is steadier than a ratio of two medians.
    paired: bool = False
    # A second condition of the target (P1: coordinator CPU per host); None: there is none.
    also_met: bool | None = None

    @property
    def value(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def base(self) -> float | None:
        return statistics.median(self.baseline) if self.baseline else None

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.base:
            return None
        if self.paired and len(self.values) == len(self.baseline):
            return statistics.median(v / b for v, b in zip(self.values, self.baseline, strict=True))
        return self.value / self.base

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        if self.also_met is False:
            return False
        if self.kind == "ratio" and self.ratio is not None and self.target_ratio is not None:
            return self.ratio <= self.target_ratio
        if self.kind == "inverse" and self.ratio is not None and self.target_ratio is not None:
            return self.ratio >= self.target_ratio
        if self.target_value is not None:
            return self.value <= self.target_value
        return None

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data.update(value=self.value, base=self.base, ratio=self.ratio, met=self.met)
        return data


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}" if len(values) > 1 else ""


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3g} {unit}".strip()


# --- helpers --------------------------------------------------------------------------------


def render_table(rows: list[Row]) -> str:
    lines = [
        "| id | measurement | orchestrate (median, spread) | baseline | ratio | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.skipped:
            lines.append(
                f"| {r.id} | {r.measurement} | skipped: {r.skipped} | | | {r.target} | - |"
            )
            continue
        value = fmt(r.value, r.unit) + (f" ({spread(r.values)})" if spread(r.values) else "")
        base = (
            (fmt(r.base, r.unit) + f" {r.baseline_label}")
            if r.base is not None
            else r.baseline_label or "-"
        )
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        met = {True: "yes", False: "**no**", None: "-"}[r.met]
        lines.append(
            f"| {r.id} | {r.measurement} | {value} | {base} | {ratio} | {r.target} | {met} |"
        )
    notes = [f"- {r.id}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + (["", *notes] if notes else []))


def draw_chart(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.met is not None]

    # How much of its budget each row uses: < 1 meets the target.
    def used(r: Row) -> float:
        if r.kind == "ratio" and r.ratio is not None and r.target_ratio:
            return r.ratio / r.target_ratio
        if r.kind == "inverse" and r.ratio and r.target_ratio:
            return r.target_ratio / r.ratio
        return (r.value or 0.0) / (r.target_value or 1.0)

    fig, ax = plt.subplots(figsize=(8, 0.5 * len(shown) + 1.5))
    values = [used(r) for r in shown]
    colors = ["tab:green" if r.met else "tab:red" for r in shown]
    ax.barh([f"{r.id} {r.measurement}" for r in shown], values, color=colors)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.invert_yaxis()
    ax.set_xlabel("share of the target used (< 1 meets it)")
    ax.set_title("orchestrate benchmarks against their targets")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
