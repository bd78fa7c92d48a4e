"""The error hierarchy, and the one place that maps errors to exit codes."""

from __future__ import annotations


class OrchestrateError(Exception):
    """Base of every error the CLI reports as one line (never a traceback)."""

    exit_code = 1


class UsageError(OrchestrateError):
    """Bad input from the user: a bad config file, an unknown job, a wrong flag."""

    exit_code = 2


class ConfigError(UsageError):
    """cluster.toml cannot be read or does not validate. The message names the file and key."""


class JobNotFoundError(UsageError):
    """No job with that id (or name) in the state store."""


class PreflightError(OrchestrateError):
    """One or more hosts failed their checks; nothing was started (a refusal, not a failed
    job: the hosts, not the training, need attention)."""

    exit_code = 3


REFUSED_EVENT = "refused"  # the job event a supervisor records for a PreflightError


class ResourcesBusy(PreflightError):
    """Every host that failed its checks either holds GPUs busy with another program or could
    not be reached: what a queued job waits out (`scheduling.wait_for_resources`)."""


class HostsUnreachable(PreflightError):
    """Preflight could not reach some hosts at all (as opposed to hosts that answered unfit)."""

    def __init__(self, message: str, hosts: tuple[int, ...], waitable: bool = False) -> None:
        super().__init__(message)
        self.hosts = hosts  # by position in cluster.toml
        self.waitable = waitable  # every other failing host only had busy GPUs


class LaunchError(OrchestrateError):
    """Agents could not be started; those that did start were stopped again."""


class AllocationEnded(OrchestrateError):
    """The scheduler's allocation of the job is over (or about to be) and cannot be used again."""


class TransportError(OrchestrateError):
    """A command or file operation on a host failed (unreachable, timed out, refused)."""


class JobFailedError(OrchestrateError):
    """The job ran and ended without success."""


class JobStoppedError(OrchestrateError):
    """The job was stopped (`orchestrate stop`, Ctrl-C) before it ended by itself."""

    exit_code = 4


class JobFailed(JobFailedError):
    """A job waited for ended without success (`api.Job.wait`): its `state` (`failed` or
    `stopped`) and its `cause`; the exit code `wait` gives it."""

    def __init__(self, job_id: str, state: str, cause: str) -> None:
        super().__init__(f"job {job_id} {state}" + (f": {cause}" if cause else ""))
        self.job_id, self.state, self.cause = job_id, state, cause
        self.exit_code = JobStoppedError.exit_code if state == "stopped" else 1


class WaitTimedOut(OrchestrateError):
    """`wait --timeout` passed; the job goes on."""

    exit_code = 5


# What a command that waits for a job's end (`wait`, `logs --follow`, `status --watch`) exits
# with, by the job's final state.
ENDED_EXIT_CODES = {"succeeded": 0, "failed": JobFailedError.exit_code,
                    "stopped": JobStoppedError.exit_code}  # fmt: skip


def exit_code_for(error: BaseException) -> int:
    """Map any error to the CLI's exit code: 2 for bad input, 3 for a preflight's refusal,
    4 for a job that was stopped, 5 for a wait that timed out, 1 for everything else (a job
    that failed, a stop that could not reach a host)."""
    if isinstance(error, OrchestrateError):
        return error.exit_code
    return 1
