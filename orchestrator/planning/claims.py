"""What a job holds while it runs, pure: each of its hosts' GPUs (those its tasks get) or, on a
host without GPUs asked, its task slots. The queue (`scheduling.wait_for_resources`) starts a
queued job only when no running job, and no job queued before it, holds any of the same.

Hosts are told apart by their address in cluster.toml; a host whose address is the scheduler's
choice (Slurm) claims nothing here: its scheduler queues the job."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.config import ClusterConfig
from orchestrator.planning.plan import initial_hosts

EVERY_GPU = -1  # a "per_gpu" host: its task count is its GPU count, so it takes them all


@dataclass(frozen=True, order=True)
class Claim:
    address: str
    label: str
    gpu: int | None  # a GPU's index (EVERY_GPU: all of them); None: a task slot
    slot: int = 0

    def overlaps(self, other: Claim) -> bool:
        if self.address != other.address or (self.gpu is None) != (other.gpu is None):
            return False
        if self.gpu is None:
            return self.slot == other.slot
        return EVERY_GPU in (self.gpu, other.gpu) or self.gpu == other.gpu

    def describe(self) -> str:
        if self.gpu is None:
            return f"task slot {self.slot} on {self.label}"
        return f"{'the GPUs' if self.gpu == EVERY_GPU else f'GPU {self.gpu}'} on {self.label}"


def claims(config: ClusterConfig) -> tuple[Claim, ...]:
    """What a job of this configuration holds on the hosts it starts on (not its spares)."""
    backend = config.backend
    places = backend.places()
    held: list[Claim] = []
    for h in initial_hosts(config):
        place = places[h]
        if not place.address:
            continue
        per_task, slots = backend.host_gpus_per_task(h), backend.host_slots(h)
        if per_task and slots is None:
            held.append(Claim(place.address, place.label, EVERY_GPU))
        elif per_task:
            gpus = range((slots or 1) * per_task)
            held += [Claim(place.address, place.label, g) for g in gpus]
        else:
            held += [Claim(place.address, place.label, None, s) for s in range(slots or 1)]
    return tuple(held)


def first_overlap(mine: Iterable[Claim], theirs: Iterable[Claim]) -> Claim | None:
    """The first of `mine` that one of `theirs` overlaps; None when they share nothing."""
    others = tuple(theirs)
    return next((c for c in mine if any(c.overlaps(o) for o in others)), None)
