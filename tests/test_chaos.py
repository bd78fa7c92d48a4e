"""The chaos soak's quick mode (`python -m scripts.chaos --quick`): eight faults drawn from a seed on
real two-worker jobs of the local backend, every invariant checked. The seed is the date, so
each day's run draws a new schedule; it is printed, and any failure replays with
`python -m scripts.chaos --quick --seed S`."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_quick_chaos_soak_recovers_from_every_fault_with_no_violation() -> None:
    seed = int(datetime.date.today().strftime("%Y%m%d"))
    print(f"\n[chaos] seed {seed}: replay with python -m scripts.chaos --quick --seed {seed}")
    out = subprocess.run(
        [sys.executable, "-m", "scripts.chaos", "--quick", "--seed", str(seed)],
        capture_output=True, text=True, timeout=1100, cwd=REPO, check=False,
    )  # fmt: skip
    print(out.stdout[-4000:])
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    assert re.fullmatch(rf"chaos: 8 faults, 8 recovered, 0 violations \(seed {seed}\)", last), (
        out.stdout[-6000:] + out.stderr[-2000:]
    )
    assert out.returncode == 0
