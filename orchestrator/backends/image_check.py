"""The preflight of a job whose trainer runs in an image (`[container]`), on one host: the
runtime is there, the image is there (never pulled by a preflight), its own Python reads its
TensorFlow version, and the GPUs the host's tasks get are visible inside it. Each failure is
one line naming the image."""

from __future__ import annotations

import json
from collections.abc import Sequence

from orchestrator.config.container import ContainerSection
from orchestrator.errors import PreflightError
from orchestrator.transport.base import Transport
from worker.container import gpu_flags, missing_image, present_argv, versions_argv

# Starting a container and reading package metadata in it (no TensorFlow import).
VERSIONS_TIMEOUT = 120.0
GPU_HINTS = {
    "podman": "generate the NVIDIA Container Toolkit's CDI spec: nvidia-ctk cdi generate",
    "docker": "install the NVIDIA Container Toolkit and configure Docker for it",
    "apptainer": "--nv binds the host's NVIDIA driver: is it installed on this host?",
}


def image_tensorflow(
    transport: Transport, section: ContainerSection, gpus: Sequence[int] = ()
) -> str:
    """The image's TensorFlow version on this host, with the host's `gpus` (those its tasks
    get) passed in as a trainer gets them; PreflightError naming what is wrong."""
    image, runtime = section.image, section.runtime
    present = present_argv(runtime, image)
    if present is not None:
        found = transport.run(present, timeout=VERSIONS_TIMEOUT)
        if found.exit_code == 127:
            raise PreflightError(f"{runtime} is not installed (needed for image {image})")
        if not found.ok:
            raise PreflightError(
                f"image {image} is not on this host ({runtime}): build, load or pull it there "
                "first (a launch pulls nothing)"
            )
    argv = versions_argv(runtime, image, section.python, gpus)
    seen = transport.run(argv, timeout=VERSIONS_TIMEOUT)
    if seen.exit_code == 127 and present is None:
        raise PreflightError(f"{runtime} is not installed (needed for image {image})")
    if not seen.ok and missing_image(seen.stderr.decode(errors="replace")):
        raise PreflightError(
            f"image {image} is not on this host ({runtime}): build, load or pull it there "
            "first (a launch pulls nothing)"
        )
    try:
        versions = json.loads(seen.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise PreflightError(
            f"image {image}: {section.python} did not start in it ({runtime} exit "
            f"{seen.exit_code}: {seen.tail()})"
        ) from None
    if not versions.get("tensorflow") or not versions.get("tf_keras"):
        raise PreflightError(
            f"image {image}: no TensorFlow and tf-keras for {section.python} in it "
            f"(found TensorFlow {versions.get('tensorflow')}, tf-keras {versions.get('tf_keras')})"
        )
    visible = versions.get("gpus")
    if gpus and runtime != "pyxis" and isinstance(visible, int) and visible < len(gpus):
        raise PreflightError(
            f"image {image}: {len(gpus)} GPU(s) asked for, {visible} visible inside it with "
            f"{' '.join(gpu_flags(runtime, gpus))} ({GPU_HINTS.get(runtime, '')})"
        )
    return str(versions["tensorflow"])
