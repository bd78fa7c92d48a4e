"""Preflight every host, build the plan, push each task's spec, start the agents; if any host
fails to start, stop what did start. Talks only to the Transport seam."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.backends import Backend
from orchestrator.config import ClusterConfig, LocalBackend, SshBackend
from orchestrator.errors import LaunchError, OrchestrateError, PreflightError
from orchestrator.fanout import parallel
from orchestrator.plan import LaunchPlan, build_plan, fixed_ports, task_slots
from worker.spec import ENV_PROFILE_STEPS, ENV_STRATEGY, HOST_PROTOCOL, JobLayout, WorkerSpec

PROBE_TIMEOUT = 60.0
AGENT_STOP_MARGIN = 2.0


@dataclass(frozen=True)
class HostReport:
    host_index: int
    host_label: str
    problems: tuple[str, ...]
    python: str = ""
    tensorflow: str = ""
    free_bytes: int = 0
    ports: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def host_labels(config: ClusterConfig) -> list[str]:
    backend = config.backend
    if isinstance(backend, LocalBackend):
        return ["local"]
    assert isinstance(backend, SshBackend)
    return [h.label for h in backend.hosts]


def preflight(config: ClusterConfig, backend: Backend, job_id: str) -> list[HostReport]:
    """Check every host in parallel; raise PreflightError naming every failing host."""
    labels = host_labels(config)
    slots_per_host = [0] * len(labels)
    for slot in task_slots(config):
        slots_per_host[slot.host_index] += 1
    shared = str(config.job.shared_dir)
    token_dir = f"{shared}/.orchestrate-preflight-{job_id}"
    token = secrets.token_hex(8)
    if isinstance(config.backend, LocalBackend):
        # On one machine there is nothing to mount: make the directory. On SSH hosts a missing
        # shared_dir is a preflight error (an unmounted share must not be papered over).
        with contextlib.suppress(OrchestrateError):
            backend.transport(0).run(["mkdir", "-p", shared], timeout=PROBE_TIMEOUT)

    def probe(i: int) -> HostReport:
        args = {
            "shared_dir": shared,
            "ports": slots_per_host[i],
            "token_file": f"{token_dir}/{i}",
            "token": f"{token}-{i}",
        }
        try:
            data = backend.transport(i).worker_call("probe", args, timeout=PROBE_TIMEOUT)
        except OrchestrateError as exc:  # its message already names the host
            return HostReport(i, labels[i], (str(exc).removeprefix(f"{labels[i]}: "),))
        problems = list(data.get("problems", []))
        if data.get("protocol") != HOST_PROTOCOL:
            problems.append(
                f"its orchestrate worker package is another version (protocol "
                f"{data.get('protocol', 1)}, here {HOST_PROTOCOL}): install the same orchestrate"
            )
        if not data.get("tensorflow"):
            problems.append("TensorFlow is not installed for " + backend.python(i))
        return HostReport(
            i,
            labels[i],
            tuple(problems),
            python=data.get("python", ""),
            tensorflow=data.get("tensorflow") or "",
            free_bytes=int(data.get("free_bytes", 0)),
            ports=tuple(data.get("ports", [])),
        )

    reports = parallel(len(labels), probe)
    if all(r.ok for r in reports) and len(labels) > 1:
        reports = _check_shared(backend, reports, token_dir, token)
    versions = {r.tensorflow for r in reports if r.ok}
    if len(versions) > 1:
        detail = ", ".join(f"{r.host_label}={r.tensorflow}" for r in reports)
        reports = [
            HostReport(r.host_index, r.host_label, (*r.problems, f"TensorFlow differs: {detail}"))
            for r in reports
        ]
    for report in reports:  # remove the tokens through any host that answered
        if report.ok or report.tensorflow:
            with contextlib.suppress(OrchestrateError):
                backend.transport(report.host_index).worker_call("remove", {"path": token_dir})
            break
    failing = [r for r in reports if not r.ok]
    if failing:
        lines = "; ".join(f"{r.host_label}: {', '.join(r.problems)}" for r in failing)
        raise PreflightError(f"preflight failed on {len(failing)} host(s): {lines}")
    return reports


def _check_shared(
    backend: Backend, reports: list[HostReport], token_dir: str, token: str
) -> list[HostReport]:
    """Every host reads back the token every other host wrote to the shared directory."""
    paths = [f"{token_dir}/{r.host_index}" for r in reports]

    def read_back(i: int) -> HostReport:
        report = reports[i]
        try:
            seen = backend.transport(i).worker_call(
                "read_tokens", {"paths": paths}, timeout=PROBE_TIMEOUT
            )
        except OrchestrateError as exc:
            return HostReport(i, report.host_label, (*report.problems, str(exc)))
        missing = [
            reports[j].host_label
            for j, path in enumerate(paths)
            if seen.get(path) != f"{token}-{j}"
        ]
        if not missing:
            return report
        problem = f"shared_dir is not shared: cannot see files written by {', '.join(missing)}"
        return HostReport(i, report.host_label, (*report.problems, problem))

    return parallel(len(reports), read_back)


def run_setup(config: ClusterConfig, backend: Backend) -> None:
    """Each host's `setup` commands, in order, once per job, before any agent starts."""
    if not isinstance(config.backend, SshBackend):
        return
    hosts = config.backend.hosts
    timeout = config.backend.command_timeout

    def setup(i: int) -> str:
        for argv in hosts[i].setup:
            try:
                result = backend.transport(i).run(argv, timeout=timeout)
            except OrchestrateError as exc:
                return str(exc)
            if not result.ok:
                return (
                    f"{hosts[i].label}: setup {argv!r} exited {result.exit_code}: {result.tail()}"
                )
        return ""

    errors = [e for e in parallel(len(hosts), setup) if e]
    if errors:
        raise LaunchError("setup failed, nothing started: " + "; ".join(errors))


def plan_launch(config: ClusterConfig, reports: Sequence[HostReport]) -> LaunchPlan:
    """Assign ports (fixed, or those probed free on each host) and build the plan."""
    slots = task_slots(config)
    ports = fixed_ports(config, slots)
    if ports is None:
        taken: dict[int, int] = {}
        ports = []
        for slot in slots:
            n = taken.get(slot.host_index, 0)
            taken[slot.host_index] = n + 1
            ports.append(reports[slot.host_index].ports[n])
    return build_plan(config, ports)


def trainer_argv(config: ClusterConfig, python: str) -> list[str]:
    entry = config.entrypoint
    target = ["-m", entry.module] if entry.module else [str(entry.script)]
    return [python, *target, *entry.args]


def make_specs(
    config: ClusterConfig, plan: LaunchPlan, job_id: str, attempt: int, backend: Backend
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
                **config.entrypoint.env,
                ENV_STRATEGY: config.strategy.model_dump_json(),
                ENV_PROFILE_STEPS: ",".join(map(str, config.strategy.profile_steps)),
            },
            workdir=str(config.entrypoint.workdir),
            shared_dir=str(config.job.shared_dir),
            heartbeat_interval=sup.heartbeat_interval,
            stop_grace=sup.stop_grace,
            preemption_exit_code=config.restart.preemption_exit_code,
            instrument=config.entrypoint.instrument,
        )
        for task in plan.tasks
    ]


@dataclass(frozen=True)
class StartOutcome:
    task_index: int
    host_label: str
    agent_pid: int | None
    error: str = ""


def start_agents(
    backend: Backend, plan: LaunchPlan, specs: Sequence[WorkerSpec], stop_grace: float
) -> dict[int, int]:
    """Push every spec and start every agent in parallel; on any failure, stop those that did
    start and raise LaunchError with each host's outcome. Returns task index -> agent pid."""

    def start(i: int) -> StartOutcome:
        task, spec = plan.tasks[i], specs[i]
        layout = spec.layout
        transport = backend.transport(task.host_index)
        try:
            spec_path = str(layout.spec_path(i))
            pid = transport.start_detached(
                [backend.python(task.host_index), "-m", "worker.agent", spec_path],
                log_path=str(layout.task_dir(i) / "agent.log"),
                stdin_file=(spec_path, spec.to_json().encode()),
            )
        except OrchestrateError as exc:
            return StartOutcome(i, task.host_label, None, str(exc))
        return StartOutcome(i, task.host_label, pid)

    outcomes = parallel(len(plan.tasks), start)
    failed = [o for o in outcomes if o.agent_pid is None]
    if failed:
        started = [
            AgentRef(o.task_index, plan.tasks[o.task_index].host_index, o.agent_pid)
            for o in outcomes
            if o.agent_pid is not None
        ]
        stop_agents(backend, started, stop_grace + AGENT_STOP_MARGIN)
        detail = "; ".join(
            f"worker-{o.task_index}@{o.host_label}: "
            + (o.error if o.agent_pid is None else "started, then stopped")
            for o in outcomes
        )
        raise LaunchError(f"could not start every task, none left running: {detail}")
    return {o.task_index: o.agent_pid for o in outcomes if o.agent_pid is not None}


@dataclass(frozen=True)
class AgentRef:
    task_index: int
    host_index: int
    pid: int


def stop_agents(backend: Backend, agents: Sequence[AgentRef], grace: float) -> dict[int, bool]:
    """Stop each agent's whole process group in parallel (SIGTERM, grace, SIGKILL); task index
    -> True when nothing of it is left. For a graceful stop pass the agents' own stop_grace plus
    AGENT_STOP_MARGIN: each agent escalates to SIGKILL itself and writes a final status first."""

    def stop(n: int) -> bool:
        agent = agents[n]
        try:
            return backend.transport(agent.host_index).stop_process_group(agent.pid, grace)
        except OrchestrateError:
            return False

    if not agents:
        return {}
    return {a.task_index: ok for a, ok in zip(agents, parallel(len(agents), stop), strict=True)}


def job_layout(config: ClusterConfig, job_id: str) -> JobLayout:
    return JobLayout(str(config.job.shared_dir), job_id)
