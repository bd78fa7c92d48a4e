"""Keeps the benchmark suite working: `python -m scripts.bench --quick` runs every row once. It checks
that each row produced a figure (or says why it was skipped); it asserts no timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REPO

pytestmark = pytest.mark.slow

BENCH_LIMIT = 1200  # seconds; the quick suite takes 3-5 minutes on 2 cores


@pytest.mark.timeout(BENCH_LIMIT + 120)
def test_quick_benchmark_produces_every_row(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.bench", "--quick", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "ORCHESTRATE_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=BENCH_LIMIT)
    finally:  # however the test ends: SIGTERM, so the suite tears its test beds down
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=90)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    rows = {row["id"]: row for row in data["rows"]}
    assert set(rows) == {
        *(
            "P1",
            "P2",
            "P2c",
            "P3",
            "P3c",
            "P4",
            "P5",
            "P6",
            "P7a",
            "P7b",
            "P8",
            "P9",
            "P9b",
            "P10",
            "P11",
            "P12",
            "P13",
            "P14",
            "P14b",
            "P14c",
            "P15",
        )
    }
    for row in rows.values():
        if row["skipped"]:
            assert not IN_CI, f"{row['id']} skipped under CI: {row['skipped']}"
            continue
        assert row["value"] is not None and row["value"] > 0, row
        has_target = row["target_value"] is not None or row["target_ratio"] is not None
        assert row["met"] in ((True, False) if has_target else (None,)), row
    ratios = ("P1", "P2", "P2c", "P3", "P3c", "P4", "P9", "P9b", "P10", "P12", "P13", "P14",
              "P14b", "P14c", "P15")  # fmt: skip
    for row_id in ratios:
        if not rows[row_id]["skipped"]:
            assert rows[row_id]["base"] and rows[row_id]["ratio"], rows[row_id]
    assert (out / "results.png").stat().st_size > 10_000
    assert "| P8 |" in (out / "results.md").read_text()
    assert "job registered" in rows["P2"]["note"], rows["P2"]  # where a first launch's time goes
