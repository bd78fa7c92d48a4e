"""The rules about time, in one room: when a host is lost, how long a read may take, how long an
agent cut off from everyone trains on, and when a host counts as answering. Every rule runs on
the coordinator's monotonic clock; no host's clock is ever compared with ours. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from orchestrator.config import SupervisionSection

# A read is never given less than this, even when its host's host_timeout is nearly spent.
MIN_READ_TIMEOUT = 0.5


class HostsSeen(Protocol):
    """What the supervisor has seen of an attempt's hosts
    (orchestrator.supervision.attempt.Watch)."""

    def silent_for(self, host: int, now: float) -> float: ...  # since its last good read

    def failing(self, host: int) -> bool: ...  # its last read failed


@dataclass(frozen=True)
class Timing:
    """The supervision's clocks (cluster.toml [supervision])."""

    host_timeout: float = 5.0  # a host whose reads fail this long is lost
    keepalive: float = 1.0  # a quiet host answers its long poll after this
    poll_interval: float = 0.2  # between rounds; also the pause after a refused read

    @classmethod
    def of(cls, supervision: SupervisionSection) -> Timing:
        return cls(supervision.host_timeout, supervision.keepalive, supervision.poll_interval)

    def read_timeout(self, wait: float, since_ok: float) -> float:
        """How long a read may take: what is left of host_timeout since the host last answered
        (so a host that stops answering is lost host_timeout after its last answer), but never
        less than the keep-alive `wait` plus a margin."""
        return max(wait + MIN_READ_TIMEOUT, self.host_timeout - since_ok)

    def lost_hosts(self, hosts: Iterable[int], seen: HostsSeen, now: float) -> list[int]:
        """Hosts whose reads have failed for host_timeout (counted from the attempt's start for a
        host never read yet): lost, whatever their tasks last said."""
        return sorted(
            h for h in hosts if seen.failing(h) and seen.silent_for(h, now) >= self.host_timeout
        )

    def overdue_hosts(self, hosts: Iterable[int], seen: HostsSeen, now: float) -> list[int]:
        """Hosts that have neither answered within a keep-alive (and a read's margin) nor failed
        a read: the stop should wait for them to say which they are."""
        margin = self.keepalive + MIN_READ_TIMEOUT
        return [h for h in hosts if not seen.failing(h) and seen.silent_for(h, now) > margin]

    def orphan_timeout(self) -> float:
        """How long an agent cut off from the coordinator and every peer trains on: well past
        the moment the coordinator gives its host up (host_timeout), so that only a real
        partition, never a slow tick, stops a trainer."""
        return 2 * self.host_timeout + 5.0
