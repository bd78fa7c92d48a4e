"""Preflight: is every host fit to run its tasks? Each host's helper probes itself (Python,
TensorFlow, the worker package's protocol, free ports, the shared directory, GPUs); a Slurm
step's tasks say the same in their hello. One verdict (`version_problems`) judges both."""

from __future__ import annotations

import concurrent.futures
import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from orchestrator.backends.agents import TransportHosts
from orchestrator.backends.image_check import image_tensorflow
from orchestrator.config import ClusterConfig
from orchestrator.errors import (
    HostsUnreachable,
    OrchestrateError,
    PreflightError,
    ResourcesBusy,
    TransportError,
)
from orchestrator.planning.gpus import HostGpus, busy_problem, gpu_problems, host_gpus
from orchestrator.planning.plan import host_labels, initial_hosts
from orchestrator.transport.fanout import HostResults, each
from worker.spec import HOST_PROTOCOL

T = TypeVar("T")
PROBE_TIMEOUT = 60.0
LOW_SPACE = 1 << 20  # bytes: below this a shared directory is as good as full


@dataclass(frozen=True)
class HostReport:
    """What a host that passed preflight told about itself."""

    host_index: int
    host_label: str
    python: str = ""
    tensorflow: str = ""
    free_bytes: int = 0
    ports: tuple[int, ...] = ()
    gpu: HostGpus | None = None  # its GPUs, when the job asks for GPUs there
    image_pulled: str = ""  # what this preflight pulled there ("pulled image ... (2.1 GB)")


def version_problems(protocol: object, tensorflow: object, python: str) -> list[str]:
    """What a host's own account of itself (a probe, or a Slurm task's hello) says is wrong
    with its versions: another worker protocol, or no TensorFlow for its interpreter."""
    problems = []
    if protocol != HOST_PROTOCOL:
        problems.append(
            f"its orchestrate worker package is another version (protocol {protocol}, here "
            f"{HOST_PROTOCOL}): install the same orchestrate"
        )
    if not tensorflow:
        problems.append(
            f"TensorFlow is not installed for {python} (install tensorflow and tf-keras for "
            "it, or set `python` to an interpreter that has them)"
        )
    return problems


def preflight(
    config: ClusterConfig,
    backend: TransportHosts,
    job_id: str,
    hosts: Sequence[int] | None = None,
    on_answer: Callable[[HostReport, float], None] = lambda report, seconds: None,
    force: bool = False,
) -> dict[int, HostReport]:
    """Check the hosts (default: those a job starts on) in parallel; raise PreflightError
    naming every failing host (HostsUnreachable when some could not be reached at all).
    `on_answer` hears of each fit host as it answers, with the seconds it took. Hosts whose
    tasks get GPUs have them counted and checked; `force`: GPUs busy with other programs are
    not a problem."""
    labels = host_labels(config)
    hosts = initial_hosts(config) if hosts is None else tuple(hosts)
    shared = str(config.job.shared_dir)
    token_dir = f"{shared}/.orchestrate-preflight-{job_id}"
    token = secrets.token_hex(8)
    answered: set[int] = set()  # hosts whose helper ran (and may have written a token)

    began = time.monotonic()

    def probe(i: int) -> HostReport:
        args = {
            "shared_dir": shared,
            # A fixed count of tasks, else ("per_gpu") the probe counts them from the GPUs.
            "ports": config.backend.host_slots(i) or 1,
            "token_file": f"{token_dir}/{i}",
            "token": f"{token}-{i}",
        }
        per_task = config.backend.host_gpus_per_task(i)
        if per_task:
            per_gpu = config.backend.host_slots(i) is None
            args["gpu"] = {"job_id": job_id, "per_task": per_task, "per_gpu": per_gpu}
        in_image = None  # the trainer's TensorFlow is the image's: read beside the probe
        if config.container is not None:
            # The GPUs the host's tasks get (each slot's, or at least one task's), passed in
            # as they will be: each must be visible inside.
            asked = (per_task or 0) * (config.backend.host_slots(i) or 1)
            in_image = _beside(
                image_tensorflow, backend.transport(i), config.container, tuple(range(asked))
            )
        data = backend.transport(i).worker_call("probe", args, timeout=PROBE_TIMEOUT)
        answered.add(i)
        problems = list(data.get("problems", []))
        image = None if in_image is None else in_image.result()
        tensorflow = data.get("tensorflow") if image is None else image.tensorflow
        problems += version_problems(data.get("protocol", 1), tensorflow, backend.python(i))
        gpus, busy = None, ""
        if per_task and "gpu" not in data:
            problems.append("its orchestrate worker package cannot count GPUs: install the same")
        elif per_task and data["gpu"].get("counted"):  # else the probe said why not
            gpus = host_gpus(data["gpu"])
            slots = config.backend.host_slots(i)
            problems += gpu_problems(gpus, per_task, slots, True, tensorflow or "")
            busy = "" if force else busy_problem(gpus, per_task, slots)
        if problems:
            raise PreflightError(", ".join([*problems, busy] if busy else problems))
        if busy:
            raise ResourcesBusy(busy)  # only that: a queued job waits it out
        return HostReport(
            i,
            labels[i],
            python=data.get("python", ""),
            tensorflow=tensorflow or "",
            free_bytes=int(data.get("free_bytes", 0)),
            ports=tuple(data.get("ports", [])),
            gpu=gpus,
            image_pulled="" if image is None else image.pulled,
        )

    def probe_and_tell(i: int) -> HostReport:
        report = probe(i)
        on_answer(report, time.monotonic() - began)
        return report

    results = each(hosts, probe_and_tell)
    if results.ok and len(hosts) > 1:
        shared_ok = _check_shared(backend, hosts, labels, token_dir, token)
        results = results.with_failures(shared_ok.failed)
    versions = {r.tensorflow for r in results.values()}
    if len(versions) > 1:
        detail = ", ".join(f"{r.host_label}={r.tensorflow}" for r in results.values())
        differs = PreflightError(f"TensorFlow differs: {detail}")
        results = results.with_failures({k: differs for k in results.succeeded})
    for i in sorted(answered):  # remove the tokens through any host that answered
        with contextlib.suppress(OrchestrateError):
            backend.transport(i).worker_call("remove", {"path": token_dir})
        break
    if not results.ok:
        message = f"preflight failed on {len(results.failed)} host(s): " + (
            results.describe_failures(lambda i: labels[i])
        )
        unreachable = tuple(i for i, e in results.failed.items() if isinstance(e, TransportError))
        failed = results.failed.values()
        waitable = all(isinstance(e, TransportError | ResourcesBusy) for e in failed)
        if unreachable:
            raise HostsUnreachable(message, unreachable, waitable)
        raise ResourcesBusy(message) if waitable else PreflightError(message)
    return dict(results.succeeded)


def _beside(call: Callable[..., T], *args: object) -> concurrent.futures.Future[T]:
    """`call(*args)` on a thread of its own, now (its result or its error taken later)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(call(*args))
        except BaseException as exc:  # handed to whoever takes the result
            future.set_exception(exc)

    threading.Thread(target=run, name="beside-probe", daemon=True).start()
    return future


def _check_shared(
    backend: TransportHosts, hosts: Sequence[int], labels: list[str], token_dir: str, token: str
) -> HostResults[int, None]:
    """Every host reads back the token every other host wrote to the shared directory."""
    paths = [f"{token_dir}/{i}" for i in hosts]

    def read_back(i: int) -> None:
        seen = backend.transport(i).worker_call(
            "read_tokens", {"paths": paths}, timeout=PROBE_TIMEOUT
        )
        missing = [
            labels[j]
            for j, path in zip(hosts, paths, strict=True)
            if seen.get(path) != f"{token}-{j}"
        ]
        if missing:
            raise PreflightError(
                f"shared_dir is not shared: cannot see files written by {', '.join(missing)}"
            )

    return each(hosts, read_back)


def shared_dir_trouble(
    config: ClusterConfig, backend: TransportHosts, host_indexes: Sequence[int]
) -> list[str]:
    """What is wrong with the shared directory as these hosts see it now (full, not writable,
    gone), one phrase per host; hosts that do not answer are left out. Asked when a task fails
    or goes silent: a full or read-only shared directory stops heartbeats and checkpoints, and
    the cause should say so rather than only "silent"."""
    labels = host_labels(config)
    shared = str(config.job.shared_dir)

    def check(i: int) -> str:
        data = backend.transport(i).worker_call(
            "probe", {"shared_dir": shared, "ports": 0, "token_file": None, "token": ""}, 10.0
        )
        if data.get("problems"):
            return f"{', '.join(data['problems'])} on {labels[i]}"
        free = int(data.get("free_bytes", LOW_SPACE))
        return f"shared_dir full on {labels[i]} ({free} bytes free)" if free < LOW_SPACE else ""

    return [t for t in each(sorted(set(host_indexes)), check).values() if t]


class Introduction(Protocol):
    """What a task of a Slurm step said about its node (orchestrator.backends.slurm.Hello)."""

    @property
    def node(self) -> str: ...

    @property
    def python(self) -> str: ...

    @property
    def tensorflow(self) -> str | None: ...

    @property
    def protocol(self) -> int: ...

    @property
    def problems(self) -> tuple[str, ...]: ...


def step_problems(hellos: Sequence[Introduction], trainer_in_image: bool = False) -> str:
    """What a step's tasks said is wrong with their nodes (the preflight's checks), by node.
    `trainer_in_image`: each task starts its trainer in an image (podman, Apptainer), so the
    node's own python needs no TensorFlow."""
    by_node: dict[str, list[str]] = {}
    for h in hellos:
        tensorflow = "in the image" if trainer_in_image else h.tensorflow
        problems = [
            *h.problems,
            *version_problems(h.protocol, tensorflow, f"the node's python ({h.python})"),
        ]
        by_node.setdefault(h.node, [])
        by_node[h.node] += [p for p in problems if p not in by_node[h.node]]
    versions = set() if trainer_in_image else {h.tensorflow for h in hellos if h.tensorflow}
    trouble = [f"{node}: {', '.join(p)}" for node, p in by_node.items() if p]
    if len(versions) > 1:
        seen = {h.node: h.tensorflow for h in hellos}
        trouble.append("TensorFlow differs: " + ", ".join(f"{n}={v}" for n, v in seen.items()))
    return "; ".join(trouble)
