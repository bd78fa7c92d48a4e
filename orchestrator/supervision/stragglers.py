"""Stragglers: the task that holds a synchronous group back, and the likely reason. Pure.

Under MultiWorkerMirroredStrategy every step waits for the slowest task, so every task reports
the same steps/s. What differs is each task's own part of a step: its step time less the time
it spends in collectives waiting for its peers (worker.wait_clock). A straggler is a task
whose own part is longer than the other tasks' (their median) by more than the threshold, in
CONSISTENT judgements in a row (one every JUDGE_EVERY seconds); it is cleared after as many
judgements without. A warning and a `status` column, never a failure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from worker.spec import Resources

JUDGE_EVERY = 5.0  # seconds between judgements (each on windows of worker.resources' length)
CONSISTENT = 3  # judgements in a row that name (or clear) a straggler
MEMORY_PRESSURE = 0.10  # host memory available below this share of its total
CPU_WAIT = 20.0  # % of its threads' runnable time spent waiting for a CPU ...
CPU_WAIT_ABOVE_PEERS = 10.0  # ... and this many points above its peers'
HOST_CPU_BUSY = 95.0  # % of its host's CPUs busy (where its peers' hosts are not)
INPUT_BOUND = 20.0  # % of its time waiting for input
GPU_IDLE = 50.0  # mean % utilisation of its GPUs
UNKNOWN = "unknown (no sampled resource explains it)"


@dataclass(frozen=True)
class Straggler:
    task: int
    own_percent: float  # its own share of a step (100 - % waiting in collectives)
    peers_percent: float  # the other tasks' median own share
    reason: str

    @property
    def slower_by(self) -> float:
        """How much longer its own part of a step is than its peers', as a fraction."""
        return self.own_percent / max(self.peers_percent, 0.1) - 1

    def message(self) -> str:
        return (
            f"worker-{self.task} is a straggler: its own part of each step is "
            f"{self.slower_by:.0%} longer than the other tasks' ({self.own_percent:.0f}% of "
            f"the step against {self.peers_percent:.0f}%; they wait for it); likely reason: "
            f"{self.reason}"
        )


@dataclass(frozen=True)
class Change:
    """A straggler named (`straggler` set) or cleared (`straggler` None) for `task`."""

    task: int
    straggler: Straggler | None

    def message(self) -> str:
        if self.straggler is not None:
            return self.straggler.message()
        return f"worker-{self.task} keeps pace again: no longer a straggler"


def candidate(
    resources: Mapping[int, Resources | None],
    threshold: float,
    hosts: Mapping[int, int] | None = None,
) -> Straggler | None:
    """The task whose own part of a step exceeds the others' median by more than
    `threshold`, from one round of samples; None: none, or fewer than two tasks timed.
    `hosts`: each task's host (tasks on one host share its CPUs and memory)."""
    own = {
        i: 100.0 - r.collective_percent
        for i, r in resources.items()
        if r is not None and r.collective_percent is not None
    }
    if len(own) < 2:
        return None
    slowest = max(own, key=lambda i: own[i])
    peers = statistics.median(v for i, v in own.items() if i != slowest)
    if own[slowest] <= (1 + threshold) * max(peers, 0.1):
        return None
    host_of = hosts or {}
    others = [r for i, r in resources.items() if i != slowest and r is not None]
    elsewhere = [
        r
        for i, r in resources.items()
        if r is not None and host_of.get(i, -1 - i) != host_of.get(slowest, -1 - slowest)
    ]
    mine = resources[slowest]
    assert mine is not None
    return Straggler(slowest, own[slowest], peers, likely_reason(mine, others, elsewhere))


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def likely_reason(
    mine: Resources, peers: list[Resources], elsewhere: list[Resources] | None = None
) -> str:
    """What the samples show about a straggler, against its peers' (`elsewhere`: those of
    peers on other hosts, whose host-wide figures differ from its own; default: all)."""
    elsewhere = peers if elsewhere is None else elsewhere
    reasons = []
    available, total = mine.host_mem_available, mine.host_mem_total
    if available is not None and total and available < MEMORY_PRESSURE * total:
        reasons.append(
            f"memory pressure ({available >> 20} MiB of {total >> 20} MiB available on its host)"
        )
    peer_wait = _median([p.cpu_wait_percent for p in peers]) or 0.0
    peer_host = _median([p.host_cpu_percent for p in elsewhere])
    if (
        mine.cpu_wait_percent is not None
        and mine.cpu_wait_percent >= CPU_WAIT
        and mine.cpu_wait_percent >= peer_wait + CPU_WAIT_ABOVE_PEERS
    ):
        reasons.append(
            f"CPU saturated (its threads waited for a CPU {mine.cpu_wait_percent:.0f}% of the "
            f"time they could run, the others' {peer_wait:.0f}%)"
        )
    elif (
        mine.host_cpu_percent is not None
        and mine.host_cpu_percent >= HOST_CPU_BUSY
        and peer_host is not None
        and peer_host < HOST_CPU_BUSY
    ):  # a busy host where its peers' hosts are not (one host's tasks share its CPUs)
        reasons.append(f"CPU saturated (its host's CPUs {mine.host_cpu_percent:.0f}% busy)")
    if mine.input_percent is not None and mine.input_percent >= INPUT_BOUND:
        reasons.append(f"input-bound ({mine.input_percent:.0f}% of its time waits for input)")
    utilizations = [g.utilization for g in mine.gpus if g.utilization is not None]
    if utilizations and statistics.mean(utilizations) < GPU_IDLE:
        reasons.append(f"GPU idle ({statistics.mean(utilizations):.0f}% utilisation)")
    return "; ".join(reasons) if reasons else UNKNOWN


class StragglerWatch:
    """Judges one attempt's group every JUDGE_EVERY seconds; says when a straggler is named or
    cleared."""

    def __init__(
        self, threshold: float, every: float = JUDGE_EVERY, consistent: int = CONSISTENT
    ) -> None:
        self.threshold = threshold
        self.every = every
        self.consistent = consistent
        self.named: Straggler | None = None
        self._next = 0.0
        self._streak_task: int | None = None
        self._streak = 0

    def judge(
        self,
        now: float,
        resources: Mapping[int, Resources | None],
        hosts: Mapping[int, int] | None = None,
    ) -> list[Change]:
        """`now`: a monotonic clock; resources: each task's latest sample; hosts: its host."""
        if now < self._next:
            return []
        self._next = now + self.every
        found = candidate(resources, self.threshold, hosts)
        task = found.task if found is not None else None
        if task == self._streak_task:
            self._streak += 1
        else:
            self._streak_task, self._streak = task, 1
        named = self.named.task if self.named is not None else None
        if self._streak < self.consistent or task == named:
            return []
        changes = [] if named is None else [Change(named, None)]
        self.named = found
        if found is not None:
            changes.append(Change(found.task, found))
        return changes
