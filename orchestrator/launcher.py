"""Preflight every host, build the plan, push each task's spec, start the agents; if any host
fails to start, stop what did start. Talks only to the Transport seam."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.backends import Backend
from orchestrator.backends.slurm import SlurmHosts
from orchestrator.config import (
    MAX_PORT,
    ClusterConfig,
    LocalBackend,
    SlurmBackend,
    SshBackend,
    host_gpus_per_task,
    host_slots,
)
from orchestrator.errors import (
    HostsUnreachable,
    LaunchError,
    OrchestrateError,
    PreflightError,
    TransportError,
)
from orchestrator.fanout import HostResults, each
from orchestrator.gpus import HostGpus, gpu_problems, host_gpus, task_env
from orchestrator.plan import (
    LaunchPlan,
    build_plan,
    fixed_ports,
    initial_hosts,
    slurm_node_label,
    task_slots,
)
from orchestrator.transport.base import ProcessRef
from worker.spec import (
    ENV_JOB_ID,
    ENV_PROFILE_STEPS,
    ENV_STRATEGY,
    HOST_PROTOCOL,
    JobLayout,
    WorkerSpec,
)

PROBE_TIMEOUT = 60.0
AGENT_STOP_MARGIN = 2.0


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


def host_labels(config: ClusterConfig) -> list[str]:
    backend = config.backend
    if isinstance(backend, LocalBackend):
        return ["local"]
    if isinstance(backend, SlurmBackend):
        return [slurm_node_label(n) for n in range(backend.nodes)]
    assert isinstance(backend, SshBackend)
    return [h.label for h in backend.hosts]


def preflight(
    config: ClusterConfig,
    backend: Backend,
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
    slots_per_host = [0] * len(labels)
    for slot in task_slots(config, hosts):
        slots_per_host[slot.host_index] += 1
    shared = str(config.job.shared_dir)
    token_dir = f"{shared}/.orchestrate-preflight-{job_id}"
    token = secrets.token_hex(8)
    answered: set[int] = set()  # hosts whose helper ran (and may have written a token)
    if isinstance(config.backend, LocalBackend):
        # On one machine there is nothing to mount: make the directory. On SSH hosts a missing
        # shared_dir is a preflight error (an unmounted share must not be papered over).
        with contextlib.suppress(OrchestrateError):
            backend.transport(0).run(["mkdir", "-p", shared], timeout=PROBE_TIMEOUT)

    began = time.monotonic()

    def probe(i: int) -> HostReport:
        args = {
            "shared_dir": shared,
            "ports": slots_per_host[i],
            "token_file": f"{token_dir}/{i}",
            "token": f"{token}-{i}",
        }
        per_task = host_gpus_per_task(config.backend, i)
        if per_task:
            per_gpu = host_slots(config.backend, i) is None
            args["gpu"] = {"job_id": job_id, "per_task": per_task, "per_gpu": per_gpu}
        data = backend.transport(i).worker_call("probe", args, timeout=PROBE_TIMEOUT)
        answered.add(i)
        problems = list(data.get("problems", []))
        if data.get("protocol") != HOST_PROTOCOL:
            problems.append(
                f"its orchestrate worker package is another version (protocol "
                f"{data.get('protocol', 1)}, here {HOST_PROTOCOL}): install the same orchestrate"
            )
        if not data.get("tensorflow"):
            problems.append("TensorFlow is not installed for " + backend.python(i))
        gpus = None
        if per_task and "gpu" not in data:
            problems.append("its orchestrate worker package cannot count GPUs: install the same")
        elif per_task and data["gpu"].get("counted"):  # else the probe said why not
            gpus = host_gpus(data["gpu"])
            problems += gpu_problems(
                gpus, per_task, host_slots(config.backend, i), force, data.get("tensorflow") or ""
            )
        if problems:
            raise PreflightError(", ".join(problems))
        return HostReport(
            i,
            labels[i],
            python=data.get("python", ""),
            tensorflow=data.get("tensorflow") or "",
            free_bytes=int(data.get("free_bytes", 0)),
            ports=tuple(data.get("ports", [])),
            gpu=gpus,
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
        if unreachable:
            raise HostsUnreachable(message, unreachable)
        raise PreflightError(message)
    return dict(results.succeeded)


def _check_shared(
    backend: Backend, hosts: Sequence[int], labels: list[str], token_dir: str, token: str
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


LOW_SPACE = 1 << 20  # bytes: below this a shared directory is as good as full


def shared_dir_trouble(
    config: ClusterConfig, backend: Backend, host_indexes: Sequence[int]
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


def run_setup(config: ClusterConfig, backend: Backend) -> None:
    """Each host's `setup` commands, in order, once per job, before any agent starts."""
    if not isinstance(config.backend, SshBackend):
        return
    hosts = config.backend.hosts
    timeout = config.backend.command_timeout

    def setup(i: int) -> None:
        for argv in hosts[i].setup:
            result = backend.transport(i).run(argv, timeout=timeout)
            if not result.ok:
                raise LaunchError(f"setup {argv!r} exited {result.exit_code}: {result.tail()}")

    results = each(range(len(hosts)), setup)
    if not results.ok:
        raise LaunchError(
            "setup failed, nothing started: " + results.describe_failures(lambda i: hosts[i].label)
        )


def plan_launch(
    config: ClusterConfig, reports: Mapping[int, HostReport], hosts: Sequence[int] | None = None
) -> LaunchPlan:
    """Assign ports (fixed, or those probed free on each host) and build the plan on the given
    hosts (default: those a job starts on); a "per_gpu" host gets a task per GPUs its
    preflight counted."""
    counts = {h: len(r.gpu.gpus) for h, r in reports.items() if r.gpu is not None}
    slots = task_slots(config, hosts, counts)
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
            ports.append(reports[slot.host_index].ports[n])
    return build_plan(config, ports, hosts, counts)


def trainer_argv(config: ClusterConfig, python: str) -> list[str]:
    entry = config.entrypoint
    target = ["-m", entry.module] if entry.module else [str(entry.script)]
    return [python, *target, *entry.args]


def make_specs(
    config: ClusterConfig,
    plan: LaunchPlan,
    job_id: str,
    attempt: int,
    backend: Backend,
    since_launch: float = 0.0,
) -> list[WorkerSpec]:
    sup = config.supervision
    return [
        WorkerSpec(
            job_id=job_id,
            attempt=attempt,
            task_index=task.index,
            task_type=task.type,
            host_label=task.host_label,
            tf_config=plan.tf_config(task.index),
            argv=trainer_argv(config, backend.python(task.host_index)),
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
            orphan_timeout=orphan_timeout(config),
            warm_restart=warm_restarts(config),
            # The keeper waits out the longest restart gap: the backoff, then the preflight.
            standby_linger=config.restart.backoff_max + 60.0,
            sample_resources=sup.sample_resources,
            since_launch=max(0.0, since_launch),
        )
        for task in plan.tasks
    ]


def warm_restarts(config: ClusterConfig) -> bool:
    return (
        config.restart.warm_restart
        and config.entrypoint.instrument
        and not isinstance(config.backend, SlurmBackend)
    )


def orphan_timeout(config: ClusterConfig) -> float:
    """How long an agent cut off from the coordinator and every peer trains on: well past the
    moment the coordinator gives its host up (host_timeout), so that only a real partition,
    never a slow tick, stops a trainer. Not on Slurm: there the step is Slurm's to end."""
    if isinstance(config.backend, SlurmBackend):
        return 0.0
    return 2 * config.supervision.host_timeout + 5.0


def start_agents(
    backend: Backend,
    plan: LaunchPlan,
    specs: Sequence[WorkerSpec],
    stop_grace: float,
    on_started: Callable[[AgentRef], None] = lambda agent: None,
) -> list[AgentRef]:
    """Push every spec and start every agent in parallel; on any failure, stop those that did
    start and raise LaunchError with each task's outcome. `on_started` hears of each agent as
    soon as its start returns (on the thread that started it), so that a coordinator killed
    mid-launch has recorded every agent it started. Returns the agents in task order."""

    def start(i: int) -> AgentRef:
        task, spec = plan.tasks[i], specs[i]
        layout = spec.layout
        spec_path = str(layout.spec_path(i))
        process = backend.transport(task.host_index).start_detached(
            [backend.python(task.host_index), "-m", "worker.agent", spec_path],
            log_path=str(layout.task_dir(i) / "agent.log"),
            # Marks every process of the job (the trainer inherits it): a stop finds them by
            # it even where no pid was recorded.
            env={ENV_JOB_ID: spec.job_id},
            stdin_file=(spec_path, spec.to_json().encode()),
        )
        agent = AgentRef(i, task.host_index, process.pid, process.ident)
        on_started(agent)
        return agent

    results = each(range(len(plan.tasks)), start)
    if not results.ok:
        started = results.values()
        stop_agents(backend, started, stop_grace + AGENT_STOP_MARGIN)
        detail = "; ".join(
            f"worker-{i}@{plan.tasks[i].host_label}: "
            + (str(results.failed[i]) if i in results.failed else "started, then stopped")
            for i in results
        )
        raise LaunchError(f"could not start every task, none left running: {detail}")
    return results.values()


@dataclass(frozen=True)
class AgentRef:
    task_index: int
    host_index: int
    pid: int
    ident: str = ""  # worker.proctl.identity of pid on its host ("": unknown)

    @property
    def process(self) -> ProcessRef:
        return ProcessRef(self.pid, self.ident)


def stop_agents(
    backend: Backend, agents: Sequence[AgentRef], grace: float
) -> HostResults[int, None]:
    """Stop each agent's whole process group in parallel (SIGTERM, grace, SIGKILL), keyed by
    task index: a task succeeds when nothing of it is left, and fails when its host could not be
    reached or something of it outlived the grace. For a graceful stop pass the agents' own
    stop_grace plus AGENT_STOP_MARGIN: each agent escalates to SIGKILL itself and writes a
    final status first."""
    by_task = {a.task_index: a for a in agents}
    if isinstance(backend, SlurmHosts):  # one step holds every task: scancel, not kill
        if not agents or backend.stop_step(grace):
            return HostResults(tuple(by_task), dict.fromkeys(by_task), {})
        stuck = LaunchError(f"Slurm step still running after {grace:g}s")
        return HostResults(tuple(by_task), {}, dict.fromkeys(by_task, stuck))

    def stop(i: int) -> None:
        agent = by_task[i]
        if not backend.transport(agent.host_index).stop_process_group(agent.process, grace):
            raise LaunchError(f"agent {agent.pid} still running after {grace:g}s")

    return each(by_task, stop)


def job_layout(config: ClusterConfig, job_id: str) -> JobLayout:
    return JobLayout(str(config.job.shared_dir), job_id)
