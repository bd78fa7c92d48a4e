"""Rules the test suite keeps about itself (pure: reads the test files)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
# An assertion that compares a clock reading, or a duration taken from one, with a number.
CLOCKED = re.compile(r"\bassert\b.*(monotonic\(\)|time\.time\(\)|\belapsed\b|\btook\b|\bheld\b"
                     r"|\bseen_after\b|\bbetween\b|keepalive_due|heartbeat_age\b.*<=|\bgaps\b)")  # fmt: skip


def test_no_timed_assertion_is_a_speed_claim() -> None:
    """Speed is measured by scripts/bench*.py against a baseline, never asserted in a test. A
    comparison with a clock that stays says what order of events it checks (`# order: ...`):
    one that a slow machine cannot fail, e.g. "answered before the keep-alive ended"."""
    unmarked = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if CLOCKED.search(line) and ("<" in line or ">" in line) and "# order:" not in line:
                unmarked.append(f"{path.name}:{number}: {line.strip()}")
    assert unmarked == [], "\n".join(unmarked)
