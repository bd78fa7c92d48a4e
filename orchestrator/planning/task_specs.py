"""Each task's WorkerSpec: what its agent is told (TF_CONFIG, the command, its environment,
the supervision's clocks and switches). Pure: built from the config, the plan and what the
backend can do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from orchestrator.config import ClusterConfig
from orchestrator.config.timing import Timing
from orchestrator.planning.gpus import task_env
from orchestrator.planning.plan import LaunchPlan, TaskPlan
from worker.spec import ENV_PROFILE_STEPS, ENV_STRATEGY, JobLayout, WorkerSpec
from worker.warm.cold import cold_reason


class HostAbilities(Protocol):
    """What a spec needs to know of what its backend can do (its Capabilities)."""

    @property
    def warm_restarts(self) -> bool: ...

    @property
    def kept_standbys(self) -> bool: ...

    @property
    def warm_in_image(self) -> bool: ...

    @property
    def orphan_timeout(self) -> bool: ...


class SpecHosts(Protocol):
    """What a spec needs of its backend: each host's interpreter, and what the backend does."""

    @property
    def capabilities(self) -> HostAbilities: ...

    def python(self, host_index: int) -> str: ...


def entrypoint_command(config: ClusterConfig, python: str) -> list[str]:
    """The user's own command: [python, -m MODULE | SCRIPT, ARG...] (the agent may start it
    through the bootstrap; the script sees the same argv either way)."""
    entry = config.entrypoint
    target = ["-m", entry.module] if entry.module else [str(entry.script)]
    return [python, *target, *entry.args]


def make_specs(
    config: ClusterConfig,
    plan: LaunchPlan,
    job_id: str,
    attempt: int,
    backend: SpecHosts,
    since_launch: float = 0.0,
    *,
    warm: bool | None = None,  # decided for the job (SupervisionContext); None: decide here
) -> list[WorkerSpec]:
    sup = config.supervision
    warm = warm_restarts(config, backend) if warm is None else warm
    return [
        WorkerSpec(
            job_id=job_id,
            attempt=attempt,
            task_index=task.index,
            task_type=task.type,
            host_label=task.host_label,
            tf_config=plan.tf_config(task.index),
            argv=entrypoint_command(config, trainer_python(config, backend, task.host_index)),
            container=container_of(config, task.gpus),
            env={
                **task_env(task.gpus, config.strategy.gpu_memory_growth),
                **config.entrypoint.env,  # its own TF_FORCE_GPU_ALLOW_GROWTH wins
                ENV_STRATEGY: config.strategy.model_dump_json(),
                ENV_PROFILE_STEPS: ",".join(map(str, config.strategy.profile_steps)),
            },
            workdir=str(config.entrypoint.workdir),
            shared_dir=str(config.job.shared_dir),
            heartbeat_interval=sup.heartbeat_interval,
            stop_grace=sup.stop_grace,
            preemption_exit_code=config.restart.preemption_exit_code,
            instrument=config.entrypoint.instrument,
            orphan_timeout=orphan_timeout(config, backend),
            warm_restart=warm,
            warm_imports=config.restart.warm_imports,
            standby_delay=config.restart.standby_delay,
            # The keeper waits out the longest restart gap: the backoff, then the preflight.
            standby_linger=config.restart.backoff_max + 60.0,
            # Kept past the job only on the host: a keeper in an image ends with the job's
            # containers (swept by the job's label).
            keep_standbys=config.restart.keep_standbys
            if backend.capabilities.kept_standbys and config.container is None
            else 0.0,
            keep_standbys_bytes=config.restart.keep_standbys_mb << 20,
            sample_resources=sup.sample_resources,
            since_launch=max(0.0, since_launch),
        )
        for task in plan.tasks
    ]


def trainer_python(config: ClusterConfig, backend: SpecHosts, host_index: int) -> str:
    """The interpreter that runs the entrypoint: the image's, or the host's."""
    return config.container.python if config.container else backend.python(host_index)


def container_of(config: ClusterConfig, gpus: Sequence[int]) -> dict[str, Any] | None:
    """What the agent needs to start its trainer in the image (worker.container)."""
    c = config.container
    if c is None or c.runtime == "pyxis":  # pyxis: the task itself is in the image
        return None
    return {"runtime": c.runtime, "image": c.image, "mounts": list(c.mounts),
            "args": list(c.args), "gpus": list(gpus)}  # fmt: skip


def container_argv(config: ClusterConfig, task: TaskPlan, uid: int) -> list[str] | None:
    """What a task's agent runs to start its trainer in the image, as `launch --dry-run`
    shows it (as user `uid`): the paths and variables a host decides at launch by name."""
    from worker.container import run_argv, task_container

    section = container_of(config, task.gpus)
    if section is None or config.container is None:
        return None
    argv = entrypoint_command(config, config.container.python)
    if config.entrypoint.instrument:
        argv[1:1] = ["<worker copy>/worker/bootstrap.py"]
    container = task_container(
        section, job_id="<job>", task_index=task.index, attempt=0,
        shared_dir=str(config.job.shared_dir), workdir=str(config.entrypoint.workdir),
        argv=argv, copy="<worker copy>",
    )  # fmt: skip
    names = ["TF_CONFIG", "TF_USE_LEGACY_KERAS", "ORCHESTRATE_*", *config.entrypoint.env]
    return run_argv(container, argv, str(config.entrypoint.workdir), names, uid=uid, gid=uid)


def warm_restarts(config: ClusterConfig, backend: SpecHosts) -> bool:
    return warm_for(config, backend.capabilities)


def warm_for(config: ClusterConfig, capabilities: HostAbilities) -> bool:
    """Whether the job's restarts may be warm."""
    return cold_restarts(config, capabilities) is None


def cold_restarts(config: ClusterConfig, capabilities: HostAbilities) -> str | None:
    """Why the job's restarts are cold; None: they may be warm (worker.container.cold_reason)."""
    runtime = config.container.runtime if config.container is not None else None
    return cold_reason(config.restart.warm_restart, config.entrypoint.instrument, runtime,
                       capabilities.warm_restarts, capabilities.warm_in_image)  # fmt: skip


def orphan_timeout(config: ClusterConfig, backend: SpecHosts) -> float:
    """How long an agent cut off from the coordinator and every peer trains on (0: never
    stops itself; where the scheduler ends the tasks, e.g. a Slurm step)."""
    if not backend.capabilities.orphan_timeout:
        return 0.0
    return Timing.of(config.supervision).orphan_timeout()


def job_layout(config: ClusterConfig, job_id: str) -> JobLayout:
    return JobLayout(str(config.job.shared_dir), job_id)
