"""Which hosts a job trains on, and what became of the others. Pure: the supervisor asks it
what to do when a host is lost, and stores it (as JSON) for `status`.

Roles: a MEMBER trains; a LOST member could not be reached (the group waits for it up to
`host_wait`); a SPARE waits to replace one; a QUARANTINED host was replaced and rests for a
cool-down before it may serve as a spare; an OUT host was dropped when the group shrank
(`min_workers`) and may rejoin (`regrow`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from enum import StrEnum


class HostRole(StrEnum):
    MEMBER = "member"
    LOST = "lost"
    SPARE = "spare"
    QUARANTINED = "quarantined"
    OUT = "out"


@dataclass(frozen=True)
class HostEntry:
    label: str
    role: HostRole
    since: float = 0.0  # LOST: unreachable since; QUARANTINED: replaced at
    until: float = 0.0  # QUARANTINED: may serve as a spare from then on
    failures: int = 0  # failures of this host's tasks in a row


# Failures of a host's tasks in a row after which a spare takes its place.
REPLACE_AFTER_FAILURES = 2


@dataclass(frozen=True)
class HostPool:
    hosts: tuple[HostEntry, ...]

    @classmethod
    def initial(cls, labels: list[str], spares: set[int]) -> HostPool:
        return cls(
            tuple(
                HostEntry(label, HostRole.SPARE if i in spares else HostRole.MEMBER)
                for i, label in enumerate(labels)
            )
        )

    # --- reading ------------------------------------------------------------------------
    def group(self) -> tuple[int, ...]:
        """The hosts the next launch is for, in cluster.toml order (lost members included:
        the group waits for them)."""
        return tuple(
            i for i, h in enumerate(self.hosts) if h.role in (HostRole.MEMBER, HostRole.LOST)
        )

    def with_role(self, role: HostRole) -> tuple[int, ...]:
        return tuple(i for i, h in enumerate(self.hosts) if h.role == role)

    def idle(self, now: float) -> tuple[int, ...]:
        """The hosts that may replace a member now: spares, and quarantined hosts whose
        cool-down is over."""
        return tuple(
            i
            for i, h in enumerate(self.hosts)
            if h.role == HostRole.SPARE or (h.role == HostRole.QUARANTINED and h.until <= now)
        )

    def spare_for(self, now: float) -> int | None:
        """The first host that may replace a member now."""
        idle = self.idle(now)
        return idle[0] if idle else None

    def lost_since(self, i: int) -> float:
        return self.hosts[i].since

    # --- changing -----------------------------------------------------------------------
    def _set(self, i: int, **changes: object) -> HostPool:
        hosts = list(self.hosts)
        hosts[i] = replace(hosts[i], **changes)  # type: ignore[arg-type]
        return HostPool(tuple(hosts))

    def unreachable(self, i: int, now: float) -> HostPool:
        """A member could not be reached: LOST from now (or since it first was). A spare that
        could not be reached rests like a replaced host."""
        h = self.hosts[i]
        if h.role == HostRole.MEMBER:
            return self._set(i, role=HostRole.LOST, since=now)
        if h.role in (HostRole.SPARE, HostRole.QUARANTINED):
            return self._set(i, role=HostRole.QUARANTINED, since=now, until=now + 60.0)
        return self

    def reachable(self, i: int) -> HostPool:
        h = self.hosts[i]
        return self._set(i, role=HostRole.MEMBER, since=0.0) if h.role == HostRole.LOST else self

    def replace(self, i: int, spare: int, now: float, quarantine: float) -> HostPool:
        """The spare takes member i's place; i rests for `quarantine` seconds."""
        pool = self._set(spare, role=HostRole.MEMBER, since=0.0, until=0.0, failures=0)
        return pool._set(i, role=HostRole.QUARANTINED, since=now, until=now + quarantine)

    def drop(self, i: int) -> HostPool:
        """The group goes on without member i (elastic width)."""
        return self._set(i, role=HostRole.OUT)

    def rejoin(self, i: int) -> HostPool:
        return self._set(i, role=HostRole.MEMBER, since=0.0, failures=0)

    def failed(self, i: int) -> HostPool:
        return self._set(i, failures=self.hosts[i].failures + 1)

    def healthy(self, hosts: tuple[int, ...]) -> HostPool:
        pool = self
        for i in hosts:
            if pool.hosts[i].failures:
                pool = pool._set(i, failures=0)
        return pool

    # --- storing ------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps([asdict(h) for h in self.hosts], separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> HostPool | None:
        if not text:
            return None
        return cls(tuple(HostEntry(**{**h, "role": HostRole(h["role"])}) for h in json.loads(text)))


def describe_hosts(pool: HostPool, now: float) -> list[str]:
    """One phrase per host that is not simply training, for `status`."""
    lines = []
    for h in pool.hosts:
        if h.role == HostRole.LOST:
            lines.append(f"waiting for {h.label}: unreachable for {now - h.since:.0f} s")
        elif h.role == HostRole.QUARANTINED:
            rest = max(0.0, h.until - now)
            lines.append(
                f"{h.label}: quarantined (replaced), "
                + (f"a spare again in {rest:.0f} s" if rest else "a spare again")
            )
        elif h.role == HostRole.SPARE:
            lines.append(f"{h.label}: spare")
        elif h.role == HostRole.OUT:
            lines.append(f"{h.label}: out of the group (lost; the job goes on without it)")
    return lines
