"""Why a job's restarts are cold: one verdict, for the specs a launch makes and for `status`."""

from __future__ import annotations

from worker.container import WARM_RUNTIMES


def cold_reason(
    warm_restart: bool,
    instrument: bool,
    runtime: str | None,
    backend_warm: bool,
    backend_warm_in_image: bool,
) -> str | None:
    """Why a job's restarts are cold (a task's next attempt imports TensorFlow afresh), as
    `status` says it; None: they may be warm. Plain values, so that `status` decides it from
    a stored configuration without building it; `backend_*`: its backend's capabilities. In
    an image, a standby needs its keeper in a container of its own beside the trainer's."""
    if not warm_restart:
        return "warm_restart = false"
    if not instrument:
        return "the entrypoint is not instrumented (instrument = false): no standby can run it"
    if not backend_warm:
        return "this backend keeps no standbys"
    if runtime is not None and runtime not in WARM_RUNTIMES:
        return (
            f"{runtime} runs no long-lived container beside the trainer's to hold a standby "
            "in the image (podman and Docker do)"
        )
    if runtime is not None and not backend_warm_in_image:
        return "this backend's standbys run on the node's own Python, not in the image"
    return None
