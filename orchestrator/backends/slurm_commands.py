"""Slurm's command lines and what they print, as pure functions: the sbatch and srun argv of a
job, squeue's fields, Slurm's time spellings, and which cluster.toml key a refusal is about."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.backends.capabilities import SLURM
from orchestrator.config import ClusterConfig, SlurmBackend
from orchestrator.planning.task_specs import warm_for
from orchestrator.transport import worker_package
from worker import ship
from worker.container import Container, mount_of, pyxis_flags

# The batch script only holds the allocation: orchestrate starts every task as a step in it.
# It ends (COMPLETED) when orchestrate writes the release file, else at the time limit.
HOLD_SCRIPT = 'while [ ! -e "$1" ]; do sleep 2; done'
# squeue's fields, '|'-separated: state, reason, node list, time left, job name.
SQUEUE_FORMAT = "%T|%r|%N|%L"


class SlurmState(StrEnum):
    """The states of a Slurm job that matter here (squeue/sacct %T)."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"
    # Ended
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    GONE = "GONE"  # no longer known to Slurm (past MinJobAge, no accounting record)
    OTHER = "OTHER"  # a state this version does not know: waited on, never taken for an end

    @classmethod
    def parse(cls, text: str) -> SlurmState:
        word = text.strip().split()[0].upper() if text.strip() else "GONE"
        try:
            return cls(word)
        except ValueError:
            return cls.OTHER

    def is_terminal(self) -> bool:
        return self in _ENDED

    def is_waiting(self) -> bool:
        """Queued (again): the allocation will run later."""
        return self in (
            SlurmState.PENDING,
            SlurmState.CONFIGURING,
            SlurmState.REQUEUED,
            SlurmState.REQUEUE_HOLD,
            SlurmState.REQUEUE_FED,
            SlurmState.SUSPENDED,
            SlurmState.STOPPED,
            SlurmState.COMPLETING,  # a requeue passes through it
            SlurmState.OTHER,
        )


_ENDED = {
    SlurmState.COMPLETED, SlurmState.CANCELLED, SlurmState.FAILED, SlurmState.TIMEOUT,
    SlurmState.PREEMPTED, SlurmState.NODE_FAIL, SlurmState.BOOT_FAIL, SlurmState.DEADLINE,
    SlurmState.OUT_OF_MEMORY, SlurmState.GONE,
}  # fmt: skip


@dataclass(frozen=True)
class AllocationView:
    """One squeue line about the job's allocation."""

    state: SlurmState
    reason: str = ""
    nodes: str = ""  # Slurm's compressed node list, e.g. n[0-2]
    time_left: float | None = None  # seconds; None: unlimited or unknown

    @classmethod
    def parse(cls, line: str) -> AllocationView:
        fields = [*line.strip().split("|"), "", "", "", ""][:4]
        state, reason, nodes, left = fields
        return cls(SlurmState.parse(state), reason.strip(), nodes.strip(), slurm_seconds(left))

    def describe(self) -> str:
        why = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        return f"{self.state.value}{why}"


def slurm_seconds(text: str) -> float | None:
    """Seconds of a Slurm duration ("MM:SS", "H:MM:SS", "D-HH:MM:SS", "MM"); None for
    UNLIMITED, NOT_SET, INVALID or an empty field."""
    text = text.strip()
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        return None
    days, a, b, c = match.groups()
    parts = [int(a)] + [int(x) for x in (b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = [*parts, 0, 0][:3]
        return float(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)
    if len(parts) == 1:  # MM (squeue never prints this; --time accepts it)
        return float(parts[0] * 60)
    if len(parts) == 2:  # MM:SS
        return float(parts[0] * 60 + parts[1])
    return float((parts[0] * 60 + parts[1]) * 60 + parts[2])  # HH:MM:SS


def literal_for_pattern(path: str) -> str:
    """A path as Slurm's --output reads it literally: `%` starts a filename pattern (%j, %t),
    `%%` is a percent sign."""
    return path.replace("%", "%%")


def sbatch_argv(
    config: ClusterConfig,
    job_id: str,
    output: str,
    release_file: str,
    test_only: bool = False,
) -> list[str]:
    """The allocation: nodes and tasks, limits, the end-of-allocation signal and requeue,
    the user's own options last but one, and the script that holds the allocation."""
    backend = config.backend
    assert isinstance(backend, SlurmBackend)
    argv = [
        "sbatch",
        "--test-only" if test_only else "--parsable",
        f"--job-name={config.job.name}",
        f"--comment=orchestrate {job_id}",
        f"--nodes={backend.nodes}",
        f"--ntasks-per-node={backend.tasks_per_node}",
        f"--signal=TERM@{backend.signal_before_end}",
        "--requeue" if backend.requeue else "--no-requeue",
        f"--output={output}",
        f"--chdir={config.job.shared_dir}",
    ]
    optional = {
        "--partition": backend.partition,
        "--time": backend.time,
        "--account": backend.account,
        "--qos": backend.qos,
        "--gres": backend.gres,
    }
    argv += [f"{flag}={value}" for flag, value in optional.items() if value is not None]
    if backend.exclusive:
        argv.append("--exclusive")
    argv += backend.sbatch_args
    # --wrap is a shell line: the one place a value is quoted for a shell.
    return [*argv, "--wrap", shlex.join(["sh", "-c", HOLD_SCRIPT, "hold", release_file])]


def worker_copies(config: ClusterConfig) -> str:
    """Where a Slurm job's nodes find the worker package: copies in the shared directory (the
    coordinator reaches the nodes through nothing else before a step starts)."""
    return f"{config.job.shared_dir}/.orchestrate"


def slurm_task_argv(config: ClusterConfig, copy: str | None = None) -> list[str]:
    """[python, COPY/worker, slurm_task]: each task of a step, run from the worker's copy."""
    assert isinstance(config.backend, SlurmBackend)
    copy = copy or f"{worker_copies(config)}/{ship.PREFIX}{worker_package.digest()}"
    python = config.backend.python
    if config.container is not None and config.container.runtime == "pyxis":
        python = config.container.python  # the whole task runs in the image
    return worker_package.program_argv(python, copy, "slurm_task")


def pyxis_step_flags(config: ClusterConfig) -> list[str]:
    """srun's pyxis options when `[container] runtime = "pyxis"`: every task of the step (our
    agent and its trainer) in the image, with the shared directory (the worker's copy is
    there), the working directory and the script's directory mounted at the same paths."""
    c = config.container
    if c is None or c.runtime != "pyxis":
        return []
    workdir = str(config.entrypoint.workdir)
    paths = [str(config.job.shared_dir), workdir]
    if config.entrypoint.script is not None:
        paths.append(str(config.entrypoint.script.parent))
    mounts = tuple(dict.fromkeys([*(mount_of(p) for p in paths), *c.mounts]))
    image = Container("pyxis", c.image, "", "", mounts=mounts, args=tuple(c.args))
    return pyxis_flags(image, workdir)


def srun_argv(
    config: ClusterConfig,
    allocation: str,
    attempt: int,
    step_dir: str,
    agent_logs: str,
    program: Sequence[str],
) -> list[str]:
    """One attempt's step: one task per worker, block-distributed (a node's tasks are
    consecutive, as in the plan); a task that dies unexpectedly ends the whole step. `program`
    runs worker.slurm_task (from the worker package's copy in the shared directory)."""
    backend = config.backend
    assert isinstance(backend, SlurmBackend)
    return [
        "srun",
        f"--jobid={allocation}",
        f"--job-name=attempt-{attempt}",
        f"--nodes={backend.nodes}",
        f"--ntasks={backend.nodes * backend.tasks_per_node}",
        f"--ntasks-per-node={backend.tasks_per_node}",
        "--distribution=block",
        "--kill-on-bad-exit=1",
        "--overlap",  # the batch script that holds the allocation is not a step's business
        f"--output={agent_logs}",
        "--open-mode=append",
        *pyxis_step_flags(config),
        *program,
        step_dir,
        str(attempt),
    ]


KEEPER_STEP_NAME = "keepers"  # the keeper step, found by name in squeue to signal its tasks


def keeper_srun_argv(
    config: ClusterConfig, allocation: str, logs: str, program: Sequence[str], job_root: str
) -> list[str]:
    """The job's keeper step: a warm-standby keeper for each task, on the task's node (the same
    block distribution as the attempts' steps), living as long as the allocation runs, so that
    a restart's new step finds its standbys ready (worker.slurm_task --keeper)."""
    backend = config.backend
    assert isinstance(backend, SlurmBackend)
    return [
        "srun",
        f"--jobid={allocation}",
        f"--job-name={KEEPER_STEP_NAME}",
        f"--nodes={backend.nodes}",
        f"--ntasks={backend.nodes * backend.tasks_per_node}",
        f"--ntasks-per-node={backend.tasks_per_node}",
        "--distribution=block",
        "--overlap",  # beside the attempts' steps, on the same CPUs
        f"--output={logs}",
        "--open-mode=append",
        *program,
        "--keeper",
        job_root,
    ]


# Words of sbatch's refusals and the key they are about.
_REFUSAL_KEYS: Sequence[tuple[str, str]] = (
    ("account", "backend.account"),  # before partition: "account/partition combination"
    ("qos", "backend.qos"),
    ("partition", "backend.partition"),
    ("gres", "backend.gres"),
    ("time limit", "backend.time"),
    ("node count", "backend.nodes"),
    ("node configuration", "backend.nodes"),
    ("nodes", "backend.nodes"),
    ("tasks", "backend.tasks_per_node"),
)


def refusal_key(message: str) -> str:
    """The cluster.toml key an sbatch refusal names ("backend" when none)."""
    lowered = message.lower()
    for words, key in _REFUSAL_KEYS:
        if words in lowered:
            return key
    return "backend"


def refusal_reason(stderr: str) -> str:
    """The line of sbatch's stderr that says why (its last error line)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()] or lines or ["refused"]
    reason = errors[-1]
    for prefix in ("sbatch: error: ", "Batch job submission failed: "):
        reason = reason.removeprefix(prefix)
    return reason


def dry_run_lines(config: ClusterConfig) -> list[str]:
    """`launch --dry-run`: the allocation's sbatch and each attempt's srun, as they would run."""
    assert isinstance(config.backend, SlurmBackend)
    job_dir = f"{config.job.shared_dir}/<job>"
    pattern_dir = literal_for_pattern(job_dir)
    sbatch = sbatch_argv(
        config, "<job>", f"{pattern_dir}/slurm/batch-%j.out", f"{job_dir}/slurm/release"
    )
    srun = srun_argv(
        config, "<slurm job>", 0, f"{job_dir}/slurm/attempt-0",
        f"{pattern_dir}/tasks/%t/agent.log", slurm_task_argv(config),
    )  # fmt: skip
    lines = [
        "(nodes are named by Slurm when the allocation runs)",
        "allocation: " + shlex.join(sbatch),
        "each attempt: " + shlex.join(srun),
    ]
    if warm_for(config, SLURM):
        keepers = keeper_srun_argv(
            config, "<slurm job>", f"{pattern_dir}/tasks/%t/standby.log",
            slurm_task_argv(config), job_dir,
        )  # fmt: skip
        lines.append("warm standbys, while the allocation runs: " + shlex.join(keepers))
    return lines
