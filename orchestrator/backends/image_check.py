"""The preflight of a job whose trainer runs in an image (`[container]`), on one host: the
runtime is there, the image is there (podman and Docker pull a missing one, with their own
registries and credentials, and say so with its size), its own Python reads its TensorFlow
version, and the GPUs the host's tasks get are visible inside it. Each failure is one line
naming the image."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.config.container import ContainerSection
from orchestrator.errors import PreflightError
from orchestrator.transport.base import Transport
from worker.container import (
    gpu_flags,
    missing_image,
    present_argv,
    pull_argv,
    size_argv,
    versions_argv,
)

# Starting a container and reading package metadata in it (no TensorFlow import).
VERSIONS_TIMEOUT = 120.0
# A TensorFlow image with CUDA is 5-15 GB: a pull on a slow link takes a while.
PULL_TIMEOUT = 3600.0
GPU_HINTS = {
    "podman": "generate the NVIDIA Container Toolkit's CDI spec: nvidia-ctk cdi generate",
    "docker": "install the NVIDIA Container Toolkit and configure Docker for it",
    "apptainer": "--nv binds the host's NVIDIA driver: is it installed on this host?",
}


@dataclass(frozen=True)
class ImageCheck:
    """What the preflight found of the image on one host."""

    tensorflow: str
    pulled: str = ""  # "pulled IMAGE (SIZE) in S s" when this preflight pulled it


def image_tensorflow(
    transport: Transport, section: ContainerSection, gpus: Sequence[int] = ()
) -> ImageCheck:
    """The image's TensorFlow version on this host, with the host's `gpus` (those its tasks
    get) passed in as a trainer gets them; a missing image is pulled where the runtime can;
    PreflightError naming what is wrong."""
    image, runtime = section.image, section.runtime
    present = present_argv(runtime, image)
    if present is not None:
        found = transport.run(present, timeout=VERSIONS_TIMEOUT)
        if found.exit_code == 127:
            raise PreflightError(f"{runtime} is not installed (needed for image {image})")
        if not found.ok:
            raise PreflightError(
                f"image {image} is not on this host ({runtime}): copy or build it there first"
            )
    argv = versions_argv(runtime, image, section.python, gpus)
    seen = transport.run(argv, timeout=VERSIONS_TIMEOUT)
    if seen.exit_code == 127 and present is None:
        raise PreflightError(f"{runtime} is not installed (needed for image {image})")
    pulled = ""
    if not seen.ok and missing_image(seen.stderr.decode(errors="replace")):
        pulled = _pull(transport, section)
        seen = transport.run(argv, timeout=VERSIONS_TIMEOUT)
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
    return ImageCheck(str(versions["tensorflow"]), pulled)


def _pull(transport: Transport, section: ContainerSection) -> str:
    """Pull the image that is not on this host; what to say of it ("pulled IMAGE (2.1 GB) in
    31 s"), or PreflightError with the runtime's reason."""
    image, runtime = section.image, section.runtime
    argv = pull_argv(runtime, image)
    if argv is None:
        raise PreflightError(f"image {image} is not on this host ({runtime}): put it there first")
    began = time.monotonic()
    pull = transport.run(argv, timeout=PULL_TIMEOUT)
    if not pull.ok:
        raise PreflightError(
            f"image {image} is not on this host and could not be pulled ({runtime} exit "
            f"{pull.exit_code}: {pull.tail()})"
        )
    seconds = time.monotonic() - began
    size = transport.run(size_argv(runtime, image), timeout=VERSIONS_TIMEOUT)
    text = size.stdout.decode(errors="replace").strip()
    said = f"{int(text) / 1e9:.2f} GB" if size.ok and text.isdigit() else "size unknown"
    return f"pulled image {image} ({said}) in {seconds:.0f} s"
