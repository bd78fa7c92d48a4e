"""A Slurm job's allocation, through Slurm's own commands run here: submitting it (after
`sbatch --test-only`), its state (squeue, then scontrol, then the accounting records), requeue,
cancel, and releasing it at the job's end."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from orchestrator.backends.slurm_commands import (
    SQUEUE_FORMAT,
    AllocationView,
    SlurmState,
    literal_for_pattern,
    refusal_key,
    refusal_reason,
    sbatch_argv,
)
from orchestrator.config import ClusterConfig
from orchestrator.errors import (
    AllocationEnded,
    ConfigError,
    LaunchError,
    TransportError,
    UsageError,
)
from worker.spec import JobLayout

SLURM_TIMEOUT = 30.0  # seconds for one Slurm command
RELEASE_WAIT = 10.0  # seconds for the hold script to see the release file before scancel


def run_slurm(
    argv: Sequence[str], timeout: float = SLURM_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise LaunchError(
            f"{argv[0]} not found: the Slurm backend runs Slurm's commands (sbatch, srun, squeue, "
            "scancel, scontrol) on this machine"
        ) from None
    except subprocess.TimeoutExpired:
        raise TransportError(f"{argv[0]} did not answer in {timeout:g}s") from None


def one_line(text: str) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-2:] if line.strip())


class Allocation:
    """The job's allocation, by Slurm job id."""

    def __init__(self, slurm_job: str) -> None:
        self.id = slurm_job

    def view(self) -> AllocationView:
        out = run_slurm(["squeue", "-h", "-j", self.id, "-o", SQUEUE_FORMAT])
        line = out.stdout.strip().splitlines()[:1]
        if out.returncode == 0 and line:
            return AllocationView.parse(line[0])
        # Not in squeue (a moment during a requeue; or ended): ask the controller itself,
        # which knows the job until MinJobAge, then the accounting records.
        shown = run_slurm(["scontrol", "show", "job", "-o", self.id])
        fields = dict(
            item.split("=", 1) for item in shown.stdout.split() if "=" in item
        )  # JobState=PENDING Reason=BeginTime ...
        if shown.returncode == 0 and "JobState" in fields:
            state = SlurmState.parse(fields["JobState"])
            return AllocationView(state, fields.get("Reason", ""), fields.get("NodeList", ""))
        if "invalid job id" not in shown.stderr.lower():  # the controller busy: ask again
            return AllocationView(SlurmState.OTHER, one_line(shown.stderr))
        return AllocationView(self.final_state())

    def preempting(self) -> bool:
        """Whether Slurm has chosen the job for preemption (its PreemptTime is set): it stays
        RUNNING through the partition's GraceTime, then is requeued or cancelled."""
        shown = run_slurm(["scontrol", "show", "job", "-o", self.id])
        for item in shown.stdout.split():
            if item.startswith("PreemptTime="):
                return item.removeprefix("PreemptTime=") not in ("", "None", "Unknown")
        return False

    def final_state(self) -> SlurmState:
        """How the job ended, from accounting, else from the job completion log (sacct -c):
        Slurm forgets a job past MinJobAge, our store does not."""
        out = run_slurm(["sacct", "-X", "-n", "-P", "-j", self.id, "-o", "State"])
        if out.returncode == 0 and out.stdout.strip():
            return SlurmState.parse(out.stdout.strip().splitlines()[-1])
        out = run_slurm(["sacct", "-c", "-n", "-P", "-j", self.id, "-o", "JobID,State"])
        states = [
            line.split("|")[1] for line in out.stdout.splitlines() if line.startswith(f"{self.id}|")
        ]
        return SlurmState.parse(states[-1]) if out.returncode == 0 and states else SlurmState.GONE

    def steps(self) -> set[str]:
        out = run_slurm(["squeue", "-h", "-s", "-j", self.id, "-o", "%i"])
        return set(out.stdout.split()) if out.returncode == 0 else set()

    def step_named(self, name: str) -> str:
        """The id of this job's running step named `name` ("" when none)."""
        out = run_slurm(["squeue", "-h", "-s", "-j", self.id, "-o", "%i %j"])
        for line in out.stdout.splitlines() if out.returncode == 0 else ():
            step, _, step_name = line.strip().partition(" ")
            if step_name == name and step.startswith(f"{self.id}."):
                return step.removeprefix(f"{self.id}.")
        return ""

    def requeue(self) -> None:
        out = run_slurm(["scontrol", "requeue", self.id])
        if out.returncode != 0:
            raise AllocationEnded(
                f"Slurm job {self.id} could not be requeued: {one_line(out.stderr)}"
            )

    def cancel(self, wait: float = 0.0) -> bool:
        """scancel the whole job; with `wait`, until Slurm says it ended. True: it has."""
        run_slurm(["scancel", self.id])
        deadline = time.monotonic() + wait
        while True:
            state = self.view().state
            if state.is_terminal():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def release(self, release_file: Path) -> None:
        """End the allocation: the hold script exits on the release file (the job COMPLETES,
        as accounting should show a job that succeeded); scancel if it does not."""
        with contextlib.suppress(OSError):
            release_file.parent.mkdir(parents=True, exist_ok=True)
            release_file.touch()
        deadline = time.monotonic() + RELEASE_WAIT
        while time.monotonic() < deadline:
            view = self.view()
            if view.state.is_terminal():
                return
            if view.state != SlurmState.RUNNING:
                break  # queued: nothing to release, cancel it
            time.sleep(0.5)
        self.cancel(wait=RELEASE_WAIT)


def check_submission(config: ClusterConfig, source: str) -> None:
    """sbatch --test-only: Slurm's own verdict on the partition, account, QOS, GRES, node count
    and time limit, before anything is registered or submitted. A refusal is the user's to fix:
    a ConfigError naming the file and the key."""
    checked = run_slurm(sbatch_argv(config, "check", "/dev/null", "/dev/null", test_only=True))
    if checked.returncode != 0:
        reason = refusal_reason(checked.stderr or checked.stdout)
        raise ConfigError(f"{source}: {refusal_key(reason)}: Slurm refuses the job: {reason}")


def batch_output(layout: JobLayout, slurm_job: str) -> Path:
    """Where the batch script's output goes (sbatch --output, unless the user's sbatch_args
    say otherwise)."""
    return Path(layout.root) / "slurm" / f"batch-{slurm_job}.out"


def submit(config: ClusterConfig, job_id: str, layout: JobLayout) -> Allocation:
    """Submit the allocation; its batch output and release file live in the job's directory."""
    slurm_dir = Path(layout.root) / "slurm"
    slurm_dir.mkdir(parents=True, exist_ok=True)
    output = literal_for_pattern(str(slurm_dir)) + "/batch-%j.out"  # batch_output()
    release = str(slurm_dir / "release")
    out = run_slurm(sbatch_argv(config, job_id, output, release))
    slurm_job = out.stdout.strip().split(";")[0]
    if out.returncode != 0 or not slurm_job.isdigit():
        reason = refusal_reason(out.stderr or out.stdout)
        raise UsageError(f"{refusal_key(reason)}: Slurm refuses the job: {reason}")
    return Allocation(slurm_job)
