"""One call per host, all at once: hosts are independent, so a round over N hosts should cost
the slowest host, not the sum of all of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

_K = TypeVar("_K")
_T = TypeVar("_T")

MAX_THREADS = 64


def parallel(count: int, work: Callable[[int], _T]) -> list[_T]:
    """work(i) for i in range(count), all at once, results in order (a one-off round)."""
    if count == 1:
        return [work(0)]
    with ThreadPoolExecutor(max_workers=min(count, MAX_THREADS)) as pool:
        return list(pool.map(work, range(count)))


class Fanout:
    """The same, for a round repeated every tick: the pool (and its threads) is kept between
    rounds rather than made anew twice a second."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def map(self, work: Callable[[_K], _T], keys: Sequence[_K]) -> list[_T]:
        if len(keys) <= 1:
            return [work(k) for k in keys]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="host-round")
        return list(self._pool.map(work, keys))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
