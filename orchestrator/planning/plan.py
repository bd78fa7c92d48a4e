"""Pure planning: config -> ordered task slots -> LaunchPlan -> one TF_CONFIG per task. No I/O.

MWMS facts this module encodes (docs/architecture.md, "How a launch flows"): every task gets the
identical `cluster` dict, built once in cluster.toml order; `task.index` is the position in
that list; with no `chief` job, worker 0 is chief.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from orchestrator.config import MAX_PORT, ClusterConfig
from orchestrator.errors import LaunchError


@dataclass(frozen=True)
class HostSlot:
    """One task's place: which host (by position in cluster.toml) and which slot on it."""

    host_index: int
    host_label: str
    address: str
    slot: int
    gpus: tuple[int, ...] = ()  # the host's GPUs (nvidia-smi indexes) this task gets


@dataclass(frozen=True)
class TaskPlan:
    index: int
    host_index: int
    host_label: str
    address: str
    port: int | None  # None: probed free on the host at launch (shown in --dry-run only)
    type: str = "worker"
    gpus: tuple[int, ...] = ()  # its GPUs on its host (CUDA_VISIBLE_DEVICES); (): none assigned

    @property
    def endpoint(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{'auto' if self.port is None else self.port}"

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    @property
    def name(self) -> str:
        return f"{self.type}-{self.index}"


@dataclass(frozen=True)
class LaunchPlan:
    job_name: str
    tasks: tuple[TaskPlan, ...]

    @cached_property
    def _endpoints(self) -> tuple[str, ...]:
        # Made once: every task's TF_CONFIG holds them all (a 1,000-host dry run: 10^6 else).
        return tuple(t.endpoint for t in self.tasks)

    @cached_property
    def _cluster_json(self) -> str:
        return json.dumps(self.cluster(), separators=(",", ":"))

    def cluster(self) -> dict[str, list[str]]:
        return {"worker": list(self._endpoints)}

    def tf_config(self, index: int) -> dict[str, Any]:
        task = self.tasks[index]
        return {"cluster": self.cluster(), "task": {"type": task.type, "index": task.index}}

    def tf_config_json(self, index: int) -> str:
        """json.dumps(self.tf_config(index)), compact, with the cluster's part made once."""
        task = self.tasks[index]
        own = json.dumps({"type": task.type, "index": task.index}, separators=(",", ":"))
        return f'{{"cluster":{self._cluster_json},"task":{own}}}'


def host_labels(config: ClusterConfig) -> list[str]:
    """Every host's label, by position in cluster.toml."""
    return [place.label for place in config.backend.places()]


def initial_hosts(config: ClusterConfig) -> tuple[int, ...]:
    """The hosts a job starts on: every host in cluster.toml but the spares."""
    return tuple(h for h, place in enumerate(config.backend.places()) if not place.spare)


def task_slots(
    config: ClusterConfig,
    hosts: Sequence[int] | None = None,
    gpu_counts: Mapping[int, int] | None = None,
) -> list[HostSlot]:
    """One slot per task, in file order: hosts in order, each host's slots consecutive. Only
    the given hosts (by position in cluster.toml; default: `initial_hosts`) get tasks.

    `gpu_counts`: the GPUs each host has (from its preflight). A "per_gpu" host gets one task
    per gpus_per_task of them; a "per_gpu" host not counted yet stands as one task (a dry run,
    or the tasks a job is registered with). Task k of a host asking g GPUs a task gets the
    host's GPUs k*g .. k*g+g-1."""
    backend = config.backend
    counts = gpu_counts or {}

    def count(h: int) -> int:
        fixed = backend.host_slots(h)
        if fixed is not None:
            return fixed
        return counts[h] // backend.host_gpus_per_task(h) if h in counts else 1

    def gpus(h: int, s: int) -> tuple[int, ...]:
        g = backend.host_gpus_per_task(h)
        return tuple(range(s * g, s * g + g))

    chosen = set(initial_hosts(config) if hosts is None else hosts)
    return [
        HostSlot(h, place.label, place.address, s, gpus(h, s))
        for h, place in enumerate(backend.places())
        if h in chosen
        for s in range(count(h))
    ]


def per_gpu_hosts(config: ClusterConfig) -> list[int]:
    """Hosts (by position) whose task count is their GPU count ("per_gpu")."""
    places = config.backend.places()
    return [h for h in range(len(places)) if config.backend.host_slots(h) is None]


@dataclass(frozen=True)
class StepTask:
    """One task of a Slurm step, as it introduced itself (worker.slurm_task)."""

    node: str
    address: str
    port: int


def step_plan(job_name: str, tasks: Sequence[StepTask]) -> LaunchPlan:
    """The plan of a Slurm step, from its tasks in SLURM_PROCID order: a task's host is its
    node's position in the step (first seen first), its address and port what it reported."""
    nodes: dict[str, int] = {}
    plan = tuple(
        TaskPlan(
            index=i,
            host_index=nodes.setdefault(t.node, len(nodes)),
            host_label=t.node,
            address=t.address,
            port=t.port,
        )
        for i, t in enumerate(tasks)
    )
    endpoints = [t.endpoint for t in plan]
    if len(set(endpoints)) != len(endpoints):
        raise ValueError(f"two tasks share an address: {endpoints}")
    return LaunchPlan(job_name=job_name, tasks=plan)


def dry_run_plan(config: ClusterConfig) -> LaunchPlan:
    """The plan as far as it is known without touching a host (auto ports unresolved)."""
    slots = task_slots(config)
    return plan_of_slots(config, slots, fixed_ports(config, slots) or [None] * len(slots))


def fixed_ports(config: ClusterConfig, slots: Sequence[HostSlot]) -> list[int] | None:
    """Ports from `ports.base` (base + n for the n-th task on a host), or None to probe."""
    base = config.ports.base
    if base == 0:
        return None
    per_host: dict[int, int] = {}
    ports = []
    for slot in slots:
        n = per_host.get(slot.host_index, 0)
        per_host[slot.host_index] = n + 1
        ports.append(base + n)
    return ports


def plan_on_hosts(
    config: ClusterConfig,
    free_ports: Mapping[int, Sequence[int]],
    gpu_counts: Mapping[int, int],
    hosts: Sequence[int] | None = None,
) -> LaunchPlan:
    """The plan of a launch on these hosts (default: those a job starts on): ports fixed by
    `ports.base`, or those each host's preflight found free; a "per_gpu" host gets a task per
    GPUs its preflight counted."""
    slots = task_slots(config, hosts, gpu_counts)
    ports = fixed_ports(config, slots)
    if ports and max(ports) > MAX_PORT:  # "per_gpu" tasks from a fixed ports.base
        raise LaunchError(
            f"ports.base: {config.ports.base} + the task(s) on a host counted from its GPUs "
            f"need ports up to {max(ports)} (> {MAX_PORT})"
        )
    if ports is None:
        taken: dict[int, int] = {}
        ports = []
        for slot in slots:
            n = taken.get(slot.host_index, 0)
            taken[slot.host_index] = n + 1
            ports.append(free_ports[slot.host_index][n])
    return plan_of_slots(config, slots, ports)


def build_plan(
    config: ClusterConfig,
    ports: Sequence[int | None],
    hosts: Sequence[int] | None = None,
    gpu_counts: Mapping[int, int] | None = None,
) -> LaunchPlan:
    return plan_of_slots(config, task_slots(config, hosts, gpu_counts), ports)


def plan_of_slots(
    config: ClusterConfig, slots: Sequence[HostSlot], ports: Sequence[int | None]
) -> LaunchPlan:
    """The plan of these slots (task_slots, decided once per launch), a port each."""
    if len(ports) != len(slots):
        raise ValueError(f"need {len(slots)} ports, got {len(ports)}")
    tasks = tuple(
        TaskPlan(
            index=i,
            host_index=slot.host_index,
            host_label=slot.host_label,
            address=slot.address,
            port=port,
            gpus=slot.gpus,
        )
        for i, (slot, port) in enumerate(zip(slots, ports, strict=True))
    )
    endpoints = [t.endpoint for t in tasks if t.port is not None]
    if len(set(endpoints)) != len(endpoints):
        raise ValueError(f"two tasks share an address: {endpoints}")
    return LaunchPlan(job_name=config.job.name, tasks=tasks)
