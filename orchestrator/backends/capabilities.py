"""What a backend can do, as flags the rest of the code reads instead of asking which backend it
is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    # A task's next attempt may start in a standby that imported TensorFlow already.
    warm_restarts: bool = True
    # A task's ready standby may be kept past the job's end for this user's next job.
    kept_standbys: bool = True
    # Agents stop their trainer when cut off from the coordinator and every peer (where no
    # scheduler ends the tasks for us).
    orphan_timeout: bool = True
    # The group may shrink and grow back across hosts (restart.min_workers, regrow, spares).
    elastic_width: bool = True
    # Hosts are known before the job (`orchestrate check` can try their ports).
    hosts_known_before_launch: bool = True
