"""GPU hosts, pure: what a host's probe said about its GPUs (worker.gpu_probe), what is wrong
with them for this job (too few, busy with another program, a TensorFlow that cannot use them),
the one console line per host, and the environment that gives each task its own GPUs.

Which GPUs a task gets is the plan's (plan.task_slots: task k of a host asking g GPUs a task
gets the host's GPUs k*g .. k*g+g-1, in nvidia-smi's order)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# CUDA numbers GPUs fastest first unless told otherwise; nvidia-smi by PCI bus. With this, the
# indexes in CUDA_VISIBLE_DEVICES are nvidia-smi's.
PCI_BUS_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
FORCE_HINT = "orchestrate launch --force uses busy GPUs anyway"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_total: int | None  # MiB
    memory_used: int | None  # MiB
    busy: tuple[tuple[int, int | None], ...] = ()  # (pid, MiB) of other programs' processes


@dataclass(frozen=True)
class HostGpus:
    gpus: tuple[Gpu, ...]
    driver: str = ""
    cuda: str = ""  # the CUDA version the driver supports ("": not found)
    tf_cuda_build: bool | None = None  # None: TensorFlow's build_info.py not found
    tf_cuda: str | None = None  # the CUDA version TensorFlow was built with


def host_gpus(data: Mapping[str, Any]) -> HostGpus:
    """The probe's "gpu" answer as values."""
    build = data.get("tensorflow_build") or {}
    return HostGpus(
        gpus=tuple(
            Gpu(
                index=int(g["index"]),
                name=str(g.get("name", "")),
                memory_total=g.get("memory_total"),
                memory_used=g.get("memory_used"),
                busy=tuple((int(b["pid"]), b.get("memory")) for b in g.get("busy", [])),
            )
            for g in data.get("gpus", [])
        ),
        driver=str(data.get("driver", "")),
        cuda=str(data.get("cuda", "")),
        tf_cuda_build=build.get("is_cuda_build"),
        tf_cuda=build.get("cuda_version"),
    )


def version(text: str | None) -> tuple[int, ...]:
    """'12.5.1' -> (12, 5, 1); () when there is no version."""
    found = re.match(r"\d+(?:\.\d+)*", text or "")
    return tuple(int(p) for p in found.group(0).split(".")) if found else ()


def cuda_too_old(driver_cuda: str, build_cuda: str | None) -> bool:
    """Whether the driver's CUDA is older than the major.minor TensorFlow was built with
    (unknown on either side: not judged)."""
    have, need = version(driver_cuda)[:2], version(build_cuda)[:2]
    return bool(have and need) and have < need


def busy_phrase(gpu: Gpu) -> str:
    """'GPU 1 in use by pid 4242 (812 MiB)' (every process of another program on it)."""
    users = " and ".join(
        f"pid {pid}" + (f" ({mib} MiB)" if mib is not None else "") for pid, mib in gpu.busy
    )
    return f"GPU {gpu.index} in use by {users}"


def busy_problem(host: HostGpus, per_task: int, slots: int | None) -> str:
    """The GPUs the host's tasks would get that other programs' processes use, in one phrase
    ("": none): what a queued job waits out, and what `--force` overrides."""
    used = (len(host.gpus) // per_task if slots is None else slots) * per_task
    busy = [g for g in host.gpus[:used] if g.busy]
    return "; ".join(busy_phrase(g) for g in busy) + f" ({FORCE_HINT})" if busy else ""


def gpu_problems(
    host: HostGpus,
    per_task: int,
    slots: int | None,
    force: bool = False,
    tensorflow: str = "",
) -> list[str]:
    """What keeps this host's GPUs from serving its tasks, one phrase each: too few GPUs for
    `slots` tasks of `per_task` GPUs (slots None: "per_gpu", at least one task's worth), a GPU
    the tasks would get busy with another program (unless `force`), a TensorFlow without CUDA,
    or a driver too old for the CUDA TensorFlow was built with."""
    problems = []
    found = len(host.gpus)
    if slots is None and found < per_task:
        problems.append(
            f'no GPU for a task: {found} GPU(s) found, slots = "per_gpu" with '
            f"gpus_per_task = {per_task}"
        )
    elif slots is not None and found < slots * per_task:
        problems.append(
            f"{found} GPU(s) found, {slots * per_task} needed ({slots} task(s) x {per_task} GPU(s))"
        )
    busy = "" if force else busy_problem(host, per_task, slots)
    if busy:
        problems.append(busy)
    tf = f"TensorFlow {tensorflow}" if tensorflow else "TensorFlow"
    if host.tf_cuda_build is False:
        problems.append(
            f"{tf} here is a CPU-only build: it cannot use the GPUs asked for (install a CUDA "
            "build, e.g. pip install 'tensorflow[and-cuda]')"
        )
    elif host.tf_cuda_build and cuda_too_old(host.cuda, host.tf_cuda):
        built = ".".join(map(str, version(host.tf_cuda)[:2]))
        problems.append(
            f"NVIDIA driver {host.driver or '?'} supports CUDA {host.cuda}, older than the "
            f"CUDA {built} {tf} was built with: update the driver"
        )
    return problems


def summary(label: str, host: HostGpus, used: int | None = None) -> str:
    """One console line: 'gpu0: 2x NVIDIA H200 (143771 MiB), driver 550.54, CUDA 12.4', and
    what busy GPUs among the first `used` (all: None) the job takes anyway (--force)."""
    groups: dict[tuple[str, int | None], int] = {}
    for gpu in host.gpus:
        key = (gpu.name, gpu.memory_total)
        groups[key] = groups.get(key, 0) + 1
    kinds = " + ".join(
        f"{n}x {name}" + (f" ({mib} MiB)" if mib is not None else "")
        for (name, mib), n in groups.items()
    )
    line = f"{label}: {kinds or 'no GPU'}"
    if host.driver:
        line += f", driver {host.driver}"
    if host.cuda:
        line += f", CUDA {host.cuda}"
    busy = [g for g in host.gpus[:used] if g.busy]
    if busy:
        line += "; " + "; ".join(busy_phrase(g) for g in busy) + ": used anyway (--force)"
    return line


def task_env(gpus: Sequence[int | str], memory_growth: bool) -> dict[str, str]:
    """The environment that gives a task these GPUs (by nvidia-smi index); {} for none."""
    if not gpus:
        return {}
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)), **PCI_BUS_ORDER}
    if memory_growth:
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    return env
