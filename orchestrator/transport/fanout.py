"""One call per host, all at once: hosts are independent, so a round over N hosts should cost
the slowest host, not the sum of all of them.

Every round answers with one type, `HostResults` (after fabric's GroupResult): each key (a host
index, or a task index where each task is a call) mapped to its value, or to the error that the
call raised. A call fails by raising an `OrchestrateError`; anything else is a bug and is raised
again to the caller."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from orchestrator.errors import OrchestrateError

_K = TypeVar("_K")
_T = TypeVar("_T")

MAX_THREADS = 64


@dataclass(frozen=True)
class HostResults(Generic[_K, _T]):
    """The outcome of one round: `succeeded` maps a key to its value, `failed` to its error;
    `keys` keeps the order the round was asked in."""

    keys: tuple[_K, ...]
    succeeded: Mapping[_K, _T]
    failed: Mapping[_K, OrchestrateError]

    @property
    def ok(self) -> bool:
        return not self.failed

    def __iter__(self) -> Iterator[_K]:
        return iter(self.keys)

    def values(self) -> list[_T]:
        """The values of the calls that succeeded, in key order."""
        return [self.succeeded[k] for k in self.keys if k in self.succeeded]

    def reason(self, key: _K, label: str) -> str:
        """Why `key` failed, without the `label: ` prefix that transport errors carry."""
        return str(self.failed[key]).removeprefix(f"{label}: ")

    def describe_failures(self, label: Callable[[_K], str]) -> str:
        """`label: reason; label: reason` for each failed key, in key order."""
        return "; ".join(
            f"{label(k)}: {self.reason(k, label(k))}" for k in self.keys if k in self.failed
        )

    def with_failures(self, failures: Mapping[_K, OrchestrateError]) -> HostResults[_K, _T]:
        """These results, with more keys failed (a check made across the whole round)."""
        return HostResults(
            self.keys,
            {k: v for k, v in self.succeeded.items() if k not in failures},
            {**self.failed, **failures},
        )


def _outcome(work: Callable[[_K], _T], key: _K) -> tuple[bool, _T | OrchestrateError]:
    try:
        return True, work(key)
    except OrchestrateError as exc:
        return False, exc


def _gather(keys: tuple[_K, ...], outcomes: Iterable[tuple[bool, object]]) -> HostResults:
    succeeded: dict[_K, object] = {}
    failed: dict[_K, OrchestrateError] = {}
    for key, (ok, value) in zip(keys, outcomes, strict=True):
        if ok:
            succeeded[key] = value
        else:
            assert isinstance(value, OrchestrateError)
            failed[key] = value
    return HostResults(keys, succeeded, failed)


def each(keys: Iterable[_K], work: Callable[[_K], _T]) -> HostResults[_K, _T]:
    """work(key) for every key, all at once (a one-off round)."""
    ordered = tuple(keys)
    if len(ordered) <= 1:
        return _gather(ordered, [_outcome(work, k) for k in ordered])
    with ThreadPoolExecutor(max_workers=min(len(ordered), MAX_THREADS)) as pool:
        return _gather(ordered, pool.map(lambda k: _outcome(work, k), ordered))


class Fanout:
    """The same, for a round repeated every tick: the pool (and its threads) is kept between
    rounds rather than made anew twice a second."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def each(self, keys: Iterable[_K], work: Callable[[_K], _T]) -> HostResults[_K, _T]:
        ordered = tuple(keys)
        if len(ordered) <= 1:
            return _gather(ordered, [_outcome(work, k) for k in ordered])
        if self._pool is None:
            self._pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="host-round")
        return _gather(ordered, self._pool.map(lambda k: _outcome(work, k), ordered))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
