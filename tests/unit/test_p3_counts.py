"""P3's counts (scripts/benchmarks/p3_counts.py): the median's confidence interval and the
kernel's counts of a live process, read as the benchmark reads them."""

from __future__ import annotations

import os
import threading

from scripts.benchmarks.p3_counts import COUNTS, counts, differences, median_interval, setup


def test_the_medians_interval_is_the_order_statistics_a_binomial_allows() -> None:
    # nine pairs: the 2nd and 8th of the sorted ratios hold the median with 96.1 % confidence
    low, high, cover = median_interval([0.9, 1.1, 0.8, 1.0, 0.95, 1.2, 0.85, 1.05, 0.99])
    assert (low, high) == (0.85, 1.1) and round(cover, 4) == 0.9609
    # fifteen: the 4th and the 12th (96.5 %)
    low, high, cover = median_interval([float(i) for i in range(15)])
    assert (low, high) == (3.0, 11.0) and round(cover, 4) == 0.9648
    # too few for 95 %: the whole range, with the confidence it has
    low, high, cover = median_interval([2.0, 1.0, 3.0])
    assert (low, high) == (1.0, 3.0) and cover == 0.75


def test_a_live_process_counts_grow_and_its_setup_is_read() -> None:
    stop = threading.Event()
    busy = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
    before = counts(os.getpid())
    busy.start()
    try:
        stop.wait(0.2)
    finally:
        stop.set()
        busy.join()
    after = counts(os.getpid())
    assert set(before) == set(COUNTS)
    assert after["cpu_ms"] > before["cpu_ms"] and after["timeslices"] >= before["timeslices"]
    mine = setup(os.getpid())
    assert mine["threads"] >= 1 and mine["affinity"] and "environ" in mine
    assert differences(mine, mine) == []
    other = {**mine, "nice": mine["nice"] + 5, "environ": {**mine["environ"], "EXTRA": "x"}}
    assert differences(other, mine) == [
        f"nice: by hand {mine['nice']}, ours {mine['nice'] + 5}",
        "env EXTRA: by hand (unset), ours 'x'",
    ]
