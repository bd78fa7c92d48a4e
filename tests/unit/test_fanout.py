"""The one result type of every per-host round: each key's value or its error, in order; calls
really run at once; a bug (an error that is not ours) is not swallowed as a host failure."""

from __future__ import annotations

import threading

import pytest

from orchestrator.errors import PreflightError, TransportError
from orchestrator.transport.fanout import Fanout, HostResults, each


def test_each_maps_every_key_to_its_value_or_its_error_in_order() -> None:
    def work(k: int) -> int:
        if k % 2:
            raise TransportError(f"h{k}: no route to host")
        return k * 10

    results = each([3, 0, 1, 2], work)
    assert results.keys == (3, 0, 1, 2)
    assert dict(results.succeeded) == {0: 0, 2: 20}
    assert set(results.failed) == {1, 3}
    assert not results.ok
    assert results.values() == [0, 20]  # key order, failed keys left out
    assert (
        results.describe_failures(lambda k: f"h{k}") == "h3: no route to host; h1: no route to host"
    )


def test_calls_run_at_once() -> None:
    barrier = threading.Barrier(5)  # opens only if all five calls wait together

    def work(k: int) -> int:
        barrier.wait(timeout=10)
        return k

    assert each(range(5), work).values() == [0, 1, 2, 3, 4]
    fanout = Fanout()
    try:
        barrier.reset()
        assert fanout.each(range(5), work).ok
        barrier.reset()
        assert fanout.each(range(5), work).values() == [0, 1, 2, 3, 4]  # the pool is reused
    finally:
        fanout.close()


def test_an_error_that_is_not_ours_is_a_bug_and_is_raised() -> None:
    def work(k: int) -> int:
        if k == 1:
            raise KeyError("bug")
        return k

    with pytest.raises(KeyError):
        each(range(3), work)


def test_with_failures_moves_keys_from_succeeded_to_failed() -> None:
    results: HostResults[int, str] = each(range(3), lambda k: f"tf-2.{k}")
    differs = PreflightError("TensorFlow differs")
    merged = results.with_failures({0: differs, 2: differs})
    assert dict(merged.succeeded) == {1: "tf-2.1"}
    assert merged.describe_failures(str) == "0: TensorFlow differs; 2: TensorFlow differs"
    assert results.ok  # the original is unchanged


def test_no_keys_is_an_empty_success() -> None:
    results = each([], lambda k: k)
    assert results.ok and results.values() == [] and results.keys == ()
