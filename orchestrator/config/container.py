"""`[container]`: the trainer runs inside a container image (worker.container builds each
runtime's command line from it). Absent: the trainer runs on the host's `python`."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from orchestrator.config.base import ConfigModel
from orchestrator.config.values import Interpreter, printable, show
from orchestrator.errors import ConfigError

MAX_MOUNTS = 64


def _check_image(image: str) -> str:
    # An image reference or a path (.sif, a squashfs): one word, never an option.
    if not image.isprintable() or image != image.strip() or " " in image or image.startswith("-"):
        raise ValueError(f"must be an image reference or a path, one word: {show(image)}")
    return image


def _check_mount(mount: str) -> str:
    """SRC:DST or SRC:DST:ro, both absolute paths (a mount the trainer sees at DST)."""
    parts = mount.split(":")
    if len(parts) == 2:
        parts.append("rw")
    src, dst, mode = parts if len(parts) == 3 else ("", "", "")
    if not (src.startswith("/") and dst.startswith("/") and mode in ("ro", "rw")):
        raise ValueError(f"must be SRC:DST or SRC:DST:ro, absolute paths: {show(mount)}")
    if not mount.isprintable() or "," in mount or ".." in PurePosixPath(dst).parts:
        raise ValueError(f"must be printable, without ',' or '..': {show(mount)}")
    return mount


def _check_arg(arg: str) -> str:
    if not arg.isprintable():
        raise ValueError(f"must be printable: {show(arg)}")
    return arg


Image = Annotated[str, Field(min_length=1, max_length=512), AfterValidator(_check_image)]
Mount = Annotated[str, Field(max_length=4096), AfterValidator(_check_mount)]
RuntimeArg = Annotated[str, Field(max_length=4096), AfterValidator(_check_arg)]


class ContainerSection(ConfigModel):
    # An image the runtime has (podman/docker: a reference; apptainer: a .sif path or a
    # reference; pyxis: what `srun --container-image` takes).
    image: Image
    runtime: Literal["podman", "docker", "apptainer", "pyxis"] = "podman"
    # The interpreter inside the image that runs the entrypoint.
    python: Interpreter = "python3"
    # More mounts, SRC:DST[:ro]; the paths the trainer needs are mounted already.
    mounts: list[Mount] = Field(default_factory=list, max_length=MAX_MOUNTS)
    # More arguments for the runtime, placed before the image (e.g. ["--shm-size=8g"]).
    args: list[RuntimeArg] = Field(default_factory=list, max_length=MAX_MOUNTS)

    def mount_targets(self) -> list[str]:
        return [m.split(":")[1] for m in self.mounts]


def check_container(
    section: ContainerSection, shared_dir: Path, source: str, *, on_slurm: bool
) -> None:
    """Rules across keys: pyxis is Slurm's; no mount may hide the job's shared directory (the
    trainer's checkpoints, logs and status live there) or this user's cache (the worker
    package the trainer starts from)."""
    if section.runtime == "pyxis" and not on_slurm:
        raise ConfigError(
            f"{source}: container.runtime: pyxis runs containers in Slurm steps "
            '(srun --container-image): use it with [backend] type = "slurm", or podman, '
            "docker or apptainer here"
        )
    shared = PurePosixPath(shared_dir)
    home = PurePosixPath(Path("~").expanduser())
    for i, target in enumerate(section.mount_targets()):
        dst = PurePosixPath(target)
        if dst == shared or dst in shared.parents or shared in dst.parents:
            what = f"job.shared_dir ({printable(str(shared))})"
        elif dst == home or dst in home.parents or dst == home / ".cache":
            what = "this user's home and cache (where the worker package is copied)"
        else:
            continue
        raise ConfigError(
            f"{source}: container.mounts[{i}]: {show(target)} would hide {what} from the "
            "trainer: those are mounted already, at the same paths"
        )
