"""The chaos soak's quick mode (`python -m scripts.chaos --quick`): eight faults drawn from a seed on
real two-worker jobs of the local backend, every invariant checked. The seed is the date, so
each day's run draws a new schedule; it is printed, and any failure replays with
`python -m scripts.chaos --quick --seed S`."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_quick_chaos_soak_recovers_from_every_fault_with_no_violation(tmp_path: Path) -> None:
    seed = int(datetime.date.today().strftime("%Y%m%d"))
    print(f"\n[chaos] seed {seed}: replay with python -m scripts.chaos --quick --seed {seed}")
    record = tmp_path / "chaos.json"
    out = subprocess.run(
        [sys.executable, "-m", "scripts.chaos", "--quick", "--seed", str(seed), "--json",
         str(record)],
        capture_output=True, text=True, timeout=1100, cwd=REPO, check=False,
    )  # fmt: skip
    print(out.stdout[-4000:])
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    assert re.fullmatch(rf"chaos: 8 faults, 8 recovered, 0 violations \(seed {seed}\)", last), (
        out.stdout[-6000:] + out.stderr[-2000:]
    )
    assert out.returncode == 0
    # The record holds what its recoveries are compared with, and each restart's backoff apart.
    run = json.loads(record.read_text())
    assert 1.0 < run["cold_start_s"] < 120, run["cold_start_s"]
    counted = [f for f in run["faults"] if f["budget_spent"] >= 1]  # a preemption waits none
    assert all(f["backoff_s"] is not None and f["backoff_s"] >= 0.5 for f in counted), counted
    # Each restart's starts, warm or cold, as both agents said them in the log.
    assert all(f["warm"] is not None and f["tasks"] == 2 for f in counted), counted
