"""What a backend can do, as flags the rest of the code reads instead of asking which backend it
is; each built-in backend's, here, so that its plug-in can say so before the backend is opened
(`status` reads them without importing any backend)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    # A task's next attempt may start in a standby that imported TensorFlow already.
    warm_restarts: bool = True
    # A task's ready standby may be kept past the job's end for this user's next job.
    kept_standbys: bool = True
    # A standby may wait in the trainer's image: its keeper in a container of its own on the
    # task's host, beside the attempts' (podman, Docker).
    warm_in_image: bool = True
    # Agents stop their trainer when cut off from the coordinator and every peer (where no
    # scheduler ends the tasks for us).
    orphan_timeout: bool = True
    # The group may shrink and grow back across hosts (restart.min_workers, regrow, spares).
    elastic_width: bool = True
    # Hosts are known before the job (`orchestrate check` can try their ports).
    hosts_known_before_launch: bool = True


LOCAL = Capabilities()
SSH = Capabilities()
# Slurm ends the step's tasks itself, places them, and names the nodes only once the
# allocation runs. Standbys live in a keeper step of their own, beside the attempts' steps,
# for as long as the allocation runs: never past the job.
SLURM = Capabilities(
    kept_standbys=False,
    warm_in_image=False,  # the keeper step runs on the node's own Python
    orphan_timeout=False,
    elastic_width=False,
    hosts_known_before_launch=False,
)
