"""The committed benchmark figures: docs/bench/results.json holds every row of one full run of
scripts/bench.py (rows a single script measured again are named with their run), each with the
target the code fixes now (scripts/benchmarks/); README's table is the one made from that file.
Pure: reads files."""

from __future__ import annotations

import json
import statistics

import pytest

from scripts.benchmarks import container, hostloss, slurm, warm
from scripts.benchmarks import rows as bench_rows
from tests.conftest import REPO

SUITE = REPO / "scripts" / "benchmarks" / "suite.py"  # the rows the suite itself defines
RESULTS = REPO / "docs" / "bench" / "results.json"


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads(RESULTS.read_text())


def defined_rows() -> dict[str, bench_rows.Row]:
    """Every row as the scripts define it now, with its fixed target."""
    rows = {r.id: r for r in (*hostloss.rows(), *slurm.rows(), *warm.rows(),
                              warm.relaunch_row(), container.row(), container.warm_row())}  # fmt: skip
    source = SUITE.read_text()
    for row_id in ("P1", "P2", "P3", "P3c", "P4", "P6", "P7a", "P7b", "P8", "P9", "P9b"):
        assert f'"{row_id}": Row(' in source, row_id
    return rows


def test_every_row_is_there_from_a_full_run(results: dict) -> None:
    ids = [row["id"] for row in results["rows"]]
    assert ids == bench_rows.ORDER
    full = [run for run in results["runs"].values() if run["command"] == "scripts/bench.py"]
    assert len(full) == 1 and not full[0]["quick"], results["runs"]
    for row in results["rows"]:
        assert row["measured"] in results["runs"], row["id"]
        assert not row["skipped"], f"{row['id']} skipped: {row['skipped']}"


def test_targets_are_the_ones_fixed_in_the_code(results: dict) -> None:
    defined = defined_rows()
    source = SUITE.read_text()
    by_id = {row["id"]: row for row in results["rows"]}
    for row in results["rows"]:
        if row["id"] == "P11":  # relative to the loss noticed in the same run
            assert row["target_value"] == pytest.approx(by_id["P10"]["value"] + hostloss.MARGIN)
        elif row["id"] in defined:
            code = defined[row["id"]]
            assert (row["target_ratio"], row["target_value"]) == (
                code.target_ratio,
                code.target_value,
            ), row["id"]
        for target in (row["target_ratio"], row["target_value"]):
            if target is not None and row["id"] not in defined:
                assert repr(target) in source or f"{target:g}" in source, row["id"]


def test_every_ratio_is_the_median_of_interleaved_rounds(results: dict) -> None:
    for row in results["rows"]:
        if row["kind"] not in ("ratio", "inverse"):
            continue
        assert row["paired"] and len(row["values"]) == len(row["baseline"]) > 0, row["id"]
        ratios = [v / b for v, b in zip(row["values"], row["baseline"], strict=True)]
        assert row["pair_ratios"] == pytest.approx(ratios), row["id"]
        assert row["ratio"] == pytest.approx(statistics.median(ratios)), row["id"]


def test_the_readme_shows_the_table_made_from_the_file() -> None:
    readme = (REPO / "README.md").read_text()
    table = bench_rows.load_document(RESULTS.parent)
    block = f"{bench_rows.README_BEGIN}\n{table}\n{bench_rows.README_END}"
    assert block in readme
    assert (RESULTS.parent / "results.md").read_text() == table + "\n"
