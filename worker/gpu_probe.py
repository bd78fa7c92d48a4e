"""The GPUs of this host, for the preflight probe when a job asks for GPUs: what `nvidia-smi`
says (each GPU, its memory and the compute processes on it, the driver and the CUDA version it
supports) and what the installed TensorFlow was built for (its `build_info.py`, read as text:
TensorFlow is never imported). Standard library only.

The coordinator judges the facts (orchestrator/planning/gpus.py); only a missing or failing
nvidia-smi is a problem found here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any

NVIDIA_SMI = "nvidia-smi"
QUERY_GPUS = "index,uuid,name,memory.used,memory.total,driver_version"
QUERY_APPS = "gpu_uuid,pid,used_memory"
TIMEOUT = 20.0
BUILD_INFO = os.path.join("tensorflow", "python", "platform", "build_info.py")


def _mib(text: str) -> int | None:
    """A MiB count as nvidia-smi writes it; None for "[N/A]", "[Not Supported]" and the like."""
    try:
        return int(float(text))
    except ValueError:
        return None


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,driver_version
    --format=csv,noheader,nounits`: one dict per GPU, in nvidia-smi's order."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 6 or not fields[0].isdigit():
            raise ValueError(f"unexpected nvidia-smi line: {line.strip()[:120]!r}")
        # A name holding a comma: everything between the uuid and the last three fields.
        name = ", ".join(fields[2:-3])
        gpus.append(
            {
                "index": int(fields[0]),
                "uuid": fields[1],
                "name": name,
                "memory_used": _mib(fields[-3]),
                "memory_total": _mib(fields[-2]),
                "driver": fields[-1],
            }
        )
    return gpus


def parse_apps(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits`:
    one dict per compute process (a process on two GPUs is listed twice)."""
    apps = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[1].isdigit():
            continue  # "No running processes found" and the like
        apps.append({"uuid": fields[0], "pid": int(fields[1]), "memory": _mib(fields[2])})
    return apps


_CUDA = re.compile(r"CUDA Version\s*:\s*([0-9]+(?:\.[0-9]+)*)")


def parse_cuda_version(text: str) -> str | None:
    """The CUDA version the driver supports, from `nvidia-smi`'s header ("CUDA Version: 12.4")
    or `nvidia-smi -q` ("CUDA Version : 12.4")."""
    found = _CUDA.search(text)
    return found.group(1) if found else None


_BUILD_CUDA = re.compile(r"""['"]?cuda_version(?:_number)?['"]?\s*[,:=]\s*['"]([0-9.]+)['"]""")
_BUILD_IS_CUDA = re.compile(r"""['"]?is_cuda_build['"]?\s*[,:=]\s*(True|False)""")


def parse_build_info(text: str) -> dict[str, Any]:
    """What tensorflow/python/platform/build_info.py says: whether it is a CUDA build, and the
    CUDA version it was built with (None: not said). Both spellings: the OrderedDict of
    TensorFlow >= 2.4, the module constants before it."""
    is_cuda = _BUILD_IS_CUDA.search(text)
    cuda = _BUILD_CUDA.search(text)
    return {
        "is_cuda_build": None if is_cuda is None else is_cuda.group(1) == "True",
        "cuda_version": cuda.group(1) if cuda else None,
    }


def tensorflow_build(paths: list[str] | None = None) -> dict[str, Any] | None:
    """The build of the TensorFlow this interpreter would import: the first build_info.py on
    sys.path, read as text (importing TensorFlow would take seconds and gigabytes). None: no
    TensorFlow found."""
    for entry in sys.path if paths is None else paths:
        path = os.path.join(entry or ".", BUILD_INFO)
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read(1 << 16)
        except OSError:
            continue
        return {"path": path, **parse_build_info(text)}
    return None


def _run(argv: list[str]) -> str:
    result = subprocess.run(
        argv, capture_output=True, text=True, errors="replace", timeout=TIMEOUT, check=False
    )
    if result.returncode != 0:
        detail = " ".join((result.stderr or result.stdout).split())[:200] or "no output"
        raise OSError(f"{' '.join(argv[:2])} exited {result.returncode}: {detail}")
    return result.stdout


def job_of(pid: int) -> str | None:
    """The orchestrate job a process belongs to (its ORCHESTRATE_JOB_ID), when readable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"ORCHESTRATE_JOB_ID="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return None


def probe_gpus(job_id: str = "") -> dict[str, Any]:
    """This host's GPUs, for the coordinator: {"counted", "gpus": [{index, uuid, name,
    memory_used, memory_total, busy: [{pid, memory}]}], "driver", "cuda", "tensorflow_build",
    "problems"}. A process of `job_id` itself (an earlier attempt's) does not make a GPU busy."""
    report: dict[str, Any] = {
        "counted": False,  # whether nvidia-smi answered (else "problems" says why)
        "gpus": [],
        "driver": "",
        "cuda": "",
        "tensorflow_build": tensorflow_build(),
        "problems": [],
    }
    smi = shutil.which(NVIDIA_SMI)
    if smi is None:
        report["problems"].append(
            "GPUs asked for (gpus_per_task / per_gpu) but no nvidia-smi on PATH here"
        )
        return report
    try:
        gpus = parse_gpus(_run([smi, f"--query-gpu={QUERY_GPUS}", "--format=csv,noheader,nounits"]))
        apps = parse_apps(
            _run([smi, f"--query-compute-apps={QUERY_APPS}", "--format=csv,noheader,nounits"])
        )
        cuda = parse_cuda_version(_run([smi]))
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        report["problems"].append(f"nvidia-smi failed: {exc}")
        return report
    by_uuid = {g["uuid"]: g for g in gpus}
    for gpu in gpus:
        gpu["busy"] = []
    for app in apps:
        on = by_uuid.get(app["uuid"])
        if on is None or (job_id and job_of(app["pid"]) == job_id):
            continue
        on["busy"].append({"pid": app["pid"], "memory": app["memory"]})
    report["counted"] = True
    report["gpus"] = gpus
    report["driver"] = gpus[0]["driver"] if gpus else ""
    report["cuda"] = cuda or ""
    return report
