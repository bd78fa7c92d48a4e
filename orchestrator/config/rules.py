"""Rules across keys that pydantic cannot express alone; each error still names its key."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.container import check_container
from orchestrator.config.model import (
    PER_GPU,
    ClusterConfig,
    EntrypointSection,
    LocalBackend,
    SlurmBackend,
    SshBackend,
)
from orchestrator.config.values import (
    DEFAULT_SSH_PORT,
    EXEC_BUDGET,
    MAX_ARG_STRLEN,
    MAX_PORT,
    key_path,
    normalized_address,
    printable,
    show,
)
from orchestrator.errors import ConfigError


def check_semantics(config: ClusterConfig, source: str) -> None:
    """Rules pydantic cannot express alone; each error still names its key."""
    backend = config.backend
    if isinstance(backend, SshBackend):
        _check_hosts(backend, config.ports.base, source)
    if isinstance(backend, LocalBackend):
        script = config.entrypoint.script
        if script is not None and not script.is_file():
            raise ConfigError(
                f"{source}: entrypoint.script: no such file: {printable(str(script))}"
            )
        workdir = config.entrypoint.workdir
        if workdir is not None and not workdir.is_dir():
            raise ConfigError(
                f"{source}: entrypoint.workdir: no such directory: {printable(str(workdir))}"
            )
        _check_local_shared_dir(config.job.shared_dir, source)
    if isinstance(backend, SlurmBackend):
        _check_slurm(config, backend, source)
    # A "per_gpu" host counts as one task here: its GPUs are counted at launch.
    places = backend.places()
    host_count = len(places)
    counts = [backend.host_slots(h) or 1 for h in range(host_count)]
    per_gpu_hosts = [h for h in range(host_count) if backend.host_slots(h) is None]
    per_host = max(counts)
    base = config.ports.base
    if base and base + per_host - 1 > MAX_PORT:
        raise ConfigError(
            f"{source}: ports.base: {base} + {per_host} task(s) on a host needs ports up to "
            f"{base + per_host - 1} (> {MAX_PORT})"
        )
    tasks = sum(counts[h] for h, place in enumerate(places) if not place.spare)
    if isinstance(backend, SshBackend) and tasks == 0:
        raise ConfigError(
            f"{source}: backend.hosts: every host is a spare: at least one must not be"
        )
    _check_gpus(config, source)
    _check_elastic(config, None if per_gpu_hosts else tasks, source)  # None: known at launch
    if config.strategy.kind != "multi_worker_mirrored" and per_gpu_hosts:
        where = (
            "backend.workers"
            if isinstance(backend, LocalBackend)
            else f"backend.hosts[{per_gpu_hosts[0]}].slots"
        )
        raise ConfigError(
            f"{source}: strategy.kind: {config.strategy.kind} runs as a single task, but "
            f'{where} = "{PER_GPU}" plans one per GPU: use a count of 1 (or '
            "multi_worker_mirrored)"
        )
    if config.strategy.kind != "multi_worker_mirrored" and tasks != 1:
        raise ConfigError(
            f"{source}: strategy.kind: {config.strategy.kind} runs as a single task, "
            f"but the backend plans {tasks}: use one worker (or multi_worker_mirrored)"
        )
    _check_exec_size(config.entrypoint, source)
    if config.container is not None:
        check_container(config.container, config.job.shared_dir, source,
                        on_slurm=isinstance(backend, SlurmBackend))  # fmt: skip
    _check_keepalive(config, source)
    _check_heartbeat(config, source)


def _check_heartbeat(config: ClusterConfig, source: str) -> None:
    """An agent writes a heartbeat every heartbeat_interval: one not below heartbeat_timeout
    makes every healthy task look silent."""
    sup = config.supervision
    if sup.heartbeat_interval >= sup.heartbeat_timeout:
        raise ConfigError(
            f"{source}: supervision.heartbeat_interval: {sup.heartbeat_interval:g}s must be less "
            f"than supervision.heartbeat_timeout ({sup.heartbeat_timeout:g}s), or every task "
            "would look silent"
        )


def _check_keepalive(config: ClusterConfig, source: str) -> None:
    """A quiet host answers once per keep-alive: longer than host_timeout or heartbeat_timeout,
    and a healthy quiet host would look lost or silent."""
    sup = config.supervision
    for name, limit in (("host_timeout", sup.host_timeout),
                        ("heartbeat_timeout", sup.heartbeat_timeout)):  # fmt: skip
        if sup.keepalive >= limit:
            raise ConfigError(
                f"{source}: supervision.keepalive: {sup.keepalive:g}s must be less than "
                f"supervision.{name} ({limit:g}s), or a quiet host would look lost"
            )


# Set by orchestrate for each task given GPUs: the same names in entrypoint.env would contradict
# the assignment (CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA number GPUs as nvidia-smi does).
GPU_ENV_MANAGED = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def _check_gpus(config: ClusterConfig, source: str) -> None:
    backend = config.backend
    hosts = range(len(backend.places()))
    if not any(backend.host_gpus_per_task(h) for h in hosts):
        return
    for name in GPU_ENV_MANAGED:
        if name in config.entrypoint.env:
            raise ConfigError(
                f"{source}: entrypoint.env.{name}: orchestrate sets it for each task given "
                'GPUs (gpus_per_task, "per_gpu"): remove it here'
            )


def _check_elastic(config: ClusterConfig, tasks: int | None, source: str) -> None:
    restart = config.restart
    if restart.min_workers is not None and tasks is not None and restart.min_workers > tasks:
        raise ConfigError(
            f"{source}: restart.min_workers: {restart.min_workers} is more than the "
            f"{tasks} worker(s) planned"
        )
    if restart.regrow and restart.min_workers is None:
        raise ConfigError(
            f"{source}: restart.regrow: needs restart.min_workers (without it the job never "
            "shrinks, so there is nothing to grow back)"
        )


# sbatch options orchestrate sets itself: a second spelling in sbatch_args would contradict it.
_SBATCH_MANAGED = {
    "-N": "nodes", "--nodes": "nodes", "-n": "tasks_per_node", "--ntasks": "tasks_per_node",
    "--ntasks-per-node": "tasks_per_node", "-p": "partition", "--partition": "partition",
    "-t": "time", "--time": "time", "-A": "account", "--account": "account", "-q": "qos",
    "--qos": "qos", "--gres": "gres", "--exclusive": "exclusive", "--signal": "signal_before_end",
    "--requeue": "requeue", "--no-requeue": "requeue", "-J": "", "--job-name": "", "-o": "",
    "--output": "", "-e": "", "--error": "", "--wrap": "", "--parsable": "", "-D": "",
    "--chdir": "", "--test-only": "",
}  # fmt: skip


# sbatch's short options that take no value (getopt: they may be clustered, `-vQ`); any other
# short option takes the rest of the word as its value (`-o/path`, `-Jname`).
_SBATCH_FLAGS = frozenset("hHIkOQsuvVW")


def managed_sbatch_option(arg: str) -> str | None:
    """The option of ours that `arg` spells, read as sbatch (getopt_long) reads it: a long
    option by any prefix (`--outp=` is --output), short options clustered or with their value
    attached (`-vo/path` is -o). None: not one of ours."""
    if arg.startswith("--"):
        name = arg[2:].split("=", 1)[0]
        if not name:
            return None
        ours = [o for o in _SBATCH_MANAGED if o.startswith("--") and o[2:].startswith(name)]
        exact = f"--{name}"
        return exact if exact in _SBATCH_MANAGED else (ours[0] if ours else None)
    for char in arg[1:]:
        if f"-{char}" in _SBATCH_MANAGED:
            return f"-{char}"
        if char not in _SBATCH_FLAGS:
            return None  # an option of its own whose value is the rest of the word
    return None


def _check_slurm(config: ClusterConfig, backend: SlurmBackend, source: str) -> None:
    for i, arg in enumerate(backend.sbatch_args):
        if not arg.startswith("-"):
            raise ConfigError(
                f"{source}: backend.sbatch_args[{i}]: {show(arg)} is not an option; give each "
                'option with its value, e.g. "--constraint=ib"'
            )
        name = managed_sbatch_option(arg)
        if name is not None:
            key = _SBATCH_MANAGED[name]
            instead = f"use backend.{key}" if key else "orchestrate sets it"
            raise ConfigError(
                f"{source}: backend.sbatch_args[{i}]: {show(arg)} is sbatch's {name}: {instead}"
            )
    if config.ports.base:
        raise ConfigError(
            f"{source}: ports.base: the Slurm backend has each task pick a port free on its "
            "own node; leave ports.base at 0"
        )
    if config.restart.min_workers is not None:
        raise ConfigError(
            f"{source}: restart.min_workers: not on the Slurm backend (an allocation's nodes "
            "are Slurm's to replace: a requeue gets a whole new set)"
        )


def _check_hosts(backend: SshBackend, base_port: int, source: str) -> None:
    """One entry per host: the same address (hostnames ignore case, IPs in any spelling) and SSH
    port twice is one host; with fixed ports, the same address twice would share task ports."""
    seen: dict[tuple[str, int], int] = {}
    by_address: dict[str, int] = {}
    for i, host in enumerate(backend.hosts):
        address = normalized_address(host.address)
        port = host.port or backend.port or DEFAULT_SSH_PORT
        if (address, port) in seen:
            j = seen[(address, port)]
            other = backend.hosts[j].address
            shown = f"[{host.address}]" if ":" in host.address else host.address
            same = "" if other == host.address else f" {other!r}: the same host"
            raise ConfigError(
                f"{source}: backend.hosts[{i}].address: duplicate host {shown}:{port} "
                f"(same as backend.hosts[{j}]{same})"
            )
        seen[(address, port)] = i
        if base_port and address in by_address:
            j = by_address[address]
            raise ConfigError(
                f"{source}: backend.hosts[{i}].address: {host.address} is also "
                f"backend.hosts[{j}]'s address: with fixed ports (ports.base = {base_port}) "
                "their tasks would share ports; use one entry with more slots, or ports.base = 0"
            )
        by_address.setdefault(address, i)


def _check_local_shared_dir(shared: Path, source: str) -> None:
    """The local backend creates shared_dir here: it, or its nearest existing parent, must be a
    directory (the preflight would only say it does not exist)."""
    try:
        existing = shared
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if existing.is_dir():
            return
    except OSError:
        return  # unreadable here: the preflight will say what is wrong
    raise ConfigError(f"{source}: job.shared_dir: not a directory: {printable(str(existing))}")


def _check_exec_size(entry: EntrypointSection, source: str) -> None:
    """Every arg and variable must fit in one exec string, and all of them in the exec budget:
    otherwise the trainer's exec fails on the host (E2BIG)."""
    total = 0
    for i, arg in enumerate(entry.args):
        size = len(arg.encode()) + 1
        if size > MAX_ARG_STRLEN:
            raise ConfigError(
                f"{source}: entrypoint.args[{i}]: {size} bytes; one argument must fit in "
                f"{MAX_ARG_STRLEN} bytes (the kernel's MAX_ARG_STRLEN)"
            )
        total += size + 8
    for name, value in entry.env.items():
        if not name or "=" in name or not name.isprintable():
            raise ConfigError(f"{source}: entrypoint.env: invalid variable name {show(name)}")
        size = len(name.encode()) + 1 + len(value.encode()) + 1
        if size > MAX_ARG_STRLEN:
            raise ConfigError(
                f"{source}: {key_path(('entrypoint', 'env', name))}: {size} bytes as "
                f"NAME=value; one variable must fit in {MAX_ARG_STRLEN} bytes "
                "(the kernel's MAX_ARG_STRLEN)"
            )
        total += size + 8
    if total > EXEC_BUDGET:
        raise ConfigError(
            f"{source}: entrypoint.env: with entrypoint.args, {total} bytes; together they must "
            f"stay under {EXEC_BUDGET} bytes (the exec size limit, shared with the host's own "
            "environment)"
        )
