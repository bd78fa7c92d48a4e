"""scripts/bench.py's result rows: a figure next to its baseline and target, the ratio and
whether it is met, and their rendering (the Markdown table, the chart, the README's copy).

One method for every ratio: each round measures the baseline and the value back to back
(interleaved), and the row's ratio is the median of the per-round ratios, with their spread.
Every target is a constant written here or in the row's definition before the run; none is
computed from a measured value. A round that hit a cap (a hang, a timeout) is a failed round,
counted and said, never a number."""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The order rows are listed in, whichever script measured them.
ORDER = ["P1", "P2", "P2c", "P3", "P3c", "P4", "P5", "P6", "P7a", "P7b", "P8", "P9", "P9b", "P10",
         "P11", "P12", "P13", "P14", "P14b", "P14c", "P15"]  # fmt: skip
README_BEGIN = "<!-- bench-table: generated from docs/bench/results.json; do not edit -->"
README_END = "<!-- /bench-table -->"


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
    # Ratio rows are measured in interleaved rounds (baseline, value): True for every ratio row.
    paired: bool = False
    # A second condition of the target (P1: coordinator CPU per host); None: there is none.
    also_met: bool | None = None
    # Rounds that hit a cap or failed: not numbers, but said.
    failed_rounds: int = 0
    # Which script and run measured the row (a script run alone merges its rows).
    measured: str = ""

    def __post_init__(self) -> None:
        if self.kind in ("ratio", "inverse"):
            self.paired = True

    @property
    def value(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def base(self) -> float | None:
        return statistics.median(self.baseline) if self.baseline else None

    @property
    def pair_ratios(self) -> list[float]:
        """value/baseline of each interleaved round (empty unless the rounds pair up)."""
        if not self.paired or len(self.values) != len(self.baseline):
            return []
        return [v / b for v, b in zip(self.values, self.baseline, strict=True) if b]

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.base:
            return None
        pairs = self.pair_ratios
        return statistics.median(pairs) if pairs else self.value / self.base

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

    @property
    def within_noise(self) -> bool:
        """The rounds fall on both sides of the target: the median's yes or no is not
        resolved by this run (the spread is wider than the target's margin)."""
        if self.kind in ("ratio", "inverse") and self.target_ratio is not None:
            points = self.pair_ratios
            goal = self.target_ratio
        elif self.target_value is not None:
            points, goal = self.values, self.target_value
        else:
            return False
        return len(points) > 1 and min(points) < goal < max(points)

    @property
    def verdict(self) -> str:
        if self.met is None:
            return "-"
        word = "yes" if self.met else "**no**"
        # Rounds on both sides of the target: this run does not resolve it, and says so.
        return f"within noise (median: {word})" if self.within_noise else word

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data.update(
            value=self.value,
            base=self.base,
            ratio=self.ratio,
            pair_ratios=self.pair_ratios,
            met=self.met,
            within_noise=self.within_noise,
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Row:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})  # type: ignore[arg-type]


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}" if len(values) > 1 else ""


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3g} {unit}".strip()


# --- helpers --------------------------------------------------------------------------------


def render_table(rows: list[Row]) -> str:
    lines = [
        "| id | measurement | orchestrate (median, spread) | baseline (median) "
        "| ratio (median of rounds, spread) | target | met |",
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
        if len(r.pair_ratios) > 1:
            ratio += f" ({min(r.pair_ratios):.2f}-{max(r.pair_ratios):.2f})"
        lines.append(
            f"| {r.id} | {r.measurement} | {value} | {base} | {ratio} | {r.target} | {r.verdict} |"
        )
    notes = [
        f"- {r.id}: {r.note}"
        + (f" {r.failed_rounds} round(s) failed (a cap): not counted." if r.failed_rounds else "")
        for r in rows
        if r.note or r.failed_rounds
    ]
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

    fig, ax = plt.subplots(figsize=(11, 0.5 * len(shown) + 1.5))
    values = [used(r) for r in shown]
    colors = ["tab:green" if r.met else "tab:red" for r in shown]
    bars = ax.barh([f"{r.id} {r.measurement}" for r in shown], values, color=colors)
    for bar, row in zip(bars, shown, strict=True):
        if row.within_noise:  # the rounds fall on both sides of the target
            bar.set_hatch("//")
            bar.set_alpha(0.6)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.invert_yaxis()
    ax.set_xlabel("share of the target used (< 1 meets it; hatched: rounds on both sides)")
    ax.set_title("benchmarks against their targets (median of rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- results.json: written by bench.py, and by a script that measures some rows alone -------


def run_meta(command: str, started: float, quick: bool) -> dict[str, object]:
    import os
    import platform
    import time

    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": command,
        "quick": quick,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
        f"Python {platform.python_version()}",
        "wall_seconds": round(time.time() - started, 1),
        "bytecode": bytecode_state(),
    }


def compile_checkout() -> None:
    """Bytecode for this checkout's own packages, as `pip install` writes at install: uv
    installs a checkout in place, without it, and where PYTHONDONTWRITEBYTECODE is set every
    `orchestrate` would compile its own modules from source at each start (0.08 s here). The
    hand-started workers import worker.runtime from here too: both sides start from it."""
    import compileall

    for package in ("orchestrator", "worker"):
        compileall.compile_dir(REPO / package, quiet=2)


def bytecode_state() -> str:
    """Whether the installed libraries start from bytecode: without it (no compile at install
    and PYTHONDONTWRITEBYTECODE set) every start compiles them from source again, the trainers'
    TensorFlow included, and the figures are not what an installed machine gives."""
    import importlib.util
    import sys

    import pydantic

    ours = REPO / "orchestrator" / "cli.py"
    caches = [importlib.util.cache_from_source(str(f)) for f in (pydantic.__file__, ours)]
    if all(Path(cache).exists() for cache in caches):
        return "present"
    if not sys.dont_write_bytecode:
        return "written by Python at first use"
    return "none: every start compiles the libraries from source"


def write_results(out: Path, rows: list[Row], meta: dict[str, object], readme: Path | None) -> str:
    """Merge `rows` into out/results.json (a row measured again replaces its old self), then
    write results.md, results.png and, where given, the README's copy of the table. Returns
    the table."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    runs: dict[str, dict[str, object]] = {}
    kept: dict[str, Row] = {}
    if path.exists():
        old = json.loads(path.read_text())
        runs = old.get("runs", {})
        kept = {d["id"]: Row.from_json(d) for d in old.get("rows", [])}
    run_id = str(meta["date"])
    runs[run_id] = meta
    for row in rows:
        row.measured = run_id
        kept[row.id] = row
    merged = sorted(kept.values(), key=lambda r: ORDER.index(r.id) if r.id in ORDER else 99)
    used = {r.measured for r in merged}
    runs = {k: v for k, v in runs.items() if k in used}
    path.write_text(json.dumps({"runs": runs, "rows": [r.to_json() for r in merged]}, indent=2))
    table = render_document(merged, runs)
    (out / "results.md").write_text(table + "\n")
    draw_chart(merged, out / "results.png")
    if readme is not None:
        write_readme_block(readme, table)
    return table


def render_document(rows: list[Row], runs: dict[str, dict[str, object]]) -> str:
    """The table with the run(s) it comes from: one line per run, naming its rows."""
    lines = []
    for run_id, meta in sorted(runs.items()):
        ids = ", ".join(r.id for r in rows if r.measured == run_id)
        quick = " (--quick)" if meta.get("quick") else ""
        lines.append(
            f"Run {run_id} by `{meta.get('command', 'scripts/bench.py')}`{quick} on "
            f"{meta['machine']}, {float(meta['wall_seconds']):.0f} s: {ids}."  # type: ignore[arg-type]
        )
    return "\n".join(lines) + "\n\n" + render_table(rows)


def load_document(out: Path) -> str:
    data = json.loads((out / "results.json").read_text())
    return render_document([Row.from_json(d) for d in data["rows"]], data["runs"])


def write_readme_block(readme: Path, table: str) -> None:
    text = readme.read_text()
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{readme}: no {README_BEGIN} ... {README_END} block to fill")
    block = f"{README_BEGIN}\n{table}\n{README_END}"
    readme.write_text(pattern.sub(lambda _: block, text))


def measure_alone(
    doc: str,
    script: str,
    rows: list[Row],
    measure: Callable[[Path, int], None],
    *,
    flag: str = "--repeat",
    default: int = 2,
) -> int:
    """A benchmark that measures its own rows again, alone (`python -m scripts.benchmarks.X
    FLAG N`): `measure(tmp, N)` fills the rows, which are then written to the results as a
    run of their own. 1 when the first row could not be measured."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument(flag, type=int, default=default, dest="count", metavar="N")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    args = parser.parse_args()
    compile_checkout()
    # SIGTERM unwinds like Ctrl-C: every test bed and trainer is torn down on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        measure(Path(tmp), args.count)
    if rows[0].skipped:
        print(f"error: {rows[0].skipped}", file=sys.stderr)
        return 1
    meta = run_meta(f"{script} {flag} {args.count}", started, quick=False)
    print(write_results(args.out, rows, meta, REPO / "README.md"))
    return 0
