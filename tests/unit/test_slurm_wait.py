"""The wait between two squeue while an allocation is pending: cut short when the batch script's
output file appears (the allocation has started), never by a file that was there already."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from orchestrator.backends.slurm import _wait_or_start


def test_the_batch_output_appearing_ends_the_wait(tmp_path: Path) -> None:
    output = tmp_path / "batch-7.out"
    timer = threading.Timer(0.1, output.touch)
    timer.start()
    began = time.monotonic()
    try:
        assert _wait_or_start(threading.Event(), 30.0, output) is False
    finally:
        timer.cancel()
    assert time.monotonic() - began < 10.0  # order: returned on the file, long before 30 s


def test_an_output_file_left_from_a_run_before_a_requeue_waits_the_whole_pause(
    tmp_path: Path,
) -> None:
    output = tmp_path / "batch-7.out"
    output.write_text("the run before the requeue\n")
    began = time.monotonic()
    assert _wait_or_start(threading.Event(), 0.3, output) is False
    assert time.monotonic() - began >= 0.3  # order: the whole pause, then the return


def test_a_stop_request_ends_the_wait_and_says_so(tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()
    assert _wait_or_start(stop, 30.0, tmp_path / "batch-7.out") is True
