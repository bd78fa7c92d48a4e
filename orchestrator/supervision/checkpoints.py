"""A job's checkpoints: found under its directory on the shared filesystem and its working
directory, and verified, on its first host (worker.checkpoints, through the host helper: the
host's Python reads each with TensorFlow, without building the model). `orchestrate
checkpoints` lists them, `collect` copies the newest verified one, and `resume` says which one
its next attempt starts from, or refuses to start from one that is corrupt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.backends import Backend, open_backend
from orchestrator.config import ClusterConfig
from orchestrator.state.job_records import stored_config
from orchestrator.state.store import JobRecord

CALL_TIMEOUT = 900.0  # TensorFlow's import on the host, and every checkpoint read


@dataclass(frozen=True)
class Checkpoint:
    prefix: str  # the path without .index / .data-*
    number: int | None  # the N of ckpt-N (its manager's save counter)
    epoch: int | None  # epochs done when it was written (BackupAndRestore's), where held
    step: int | None  # the optimizer's steps, where held
    size: int  # bytes: its index and data shards
    age_s: float | None  # seconds since it was written, on its host's clock
    latest: bool  # its directory's `checkpoint` file names it
    ok: bool | None  # verified whole; False: `problem` says what is wrong; None: not verified
    problem: str | None

    @classmethod
    def from_host(cls, raw: dict[str, Any]) -> Checkpoint:
        return cls(str(raw["prefix"]), raw.get("number"), raw.get("epoch"), raw.get("step"),
                   int(raw.get("bytes") or 0), raw.get("age_s"), bool(raw.get("latest")),
                   raw.get("ok"), raw.get("problem"))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.prefix,
            "number": self.number,
            "epoch": self.epoch,
            "step": self.step,
            "bytes": self.size,
            "age_seconds": self.age_s,
            "latest": self.latest,
            "verified": self.ok,
            "problem": self.problem,
        }


def roots(job: JobRecord, config: ClusterConfig) -> list[str]:
    return [job.job_dir, str(config.entrypoint.workdir)]


def find_checkpoints(
    job: JobRecord, verify: bool = True, backend: Backend | None = None
) -> list[Checkpoint]:
    """Every checkpoint the job wrote, newest first, verified when asked."""
    config = stored_config(job)
    own = backend is None
    backend = backend or open_backend(config)
    try:
        found = backend.transport(0).worker_call(
            "checkpoints",
            {"roots": roots(job, config), "verify": verify, "own": job.job_dir},
            timeout=CALL_TIMEOUT,
        )
    finally:
        if own:
            backend.close()
    return [Checkpoint.from_host(raw) for raw in found]


def newest_verified(found: list[Checkpoint]) -> Checkpoint | None:
    return next((c for c in found if c.ok), None)


def resume_from(found: list[Checkpoint]) -> tuple[Checkpoint | None, Checkpoint | None]:
    """What a resume starts from: the newest checkpoint if it is whole, and the newest if it
    is not (to be named, never used silently)."""
    if not found:
        return None, None
    newest = found[0]
    return (newest, None) if newest.ok is not False else (None, newest)


def resume_point(job: JobRecord) -> str:
    """Which checkpoint a resume of the job starts from, in one line; UsageError naming the
    newest if it is corrupt (never used silently)."""
    from orchestrator.errors import UsageError

    usable, corrupt = resume_from(find_checkpoints(job))
    if corrupt is not None:
        raise UsageError(
            f"job {job.id}: its newest checkpoint {corrupt.prefix} is {corrupt.problem}: move "
            "it away, and the next attempt starts from the one before it, or from the beginning "
            f"(orchestrate checkpoints {job.id})"
        )
    if usable is None:
        return "no checkpoint: the next attempt starts from the beginning"
    where = f" (epoch {usable.epoch})" if usable.epoch is not None else ""
    return f"the next attempt starts from checkpoint {usable.prefix}{where}"


def render(job_id: str, found: list[Checkpoint]) -> str:
    if not found:
        return f"job {job_id}: no checkpoint found (BackupAndRestore removes its own as fit ends)"
    rows = [["PATH", "EPOCH", "STEP", "AGE", "SIZE", "VERIFIED"]]
    for c in found:
        verdict = "ok" if c.ok else ("not verified" if c.ok is None else "NO")
        if c.problem and c.ok is not True:
            verdict += f": {c.problem}"
        rows.append([
            c.prefix + (" (latest)" if c.latest else ""),
            "-" if c.epoch is None else str(c.epoch),
            "-" if c.step is None else str(c.step),
            "-" if c.age_s is None else _age(c.age_s),
            _size(c.size),
            verdict,
        ])  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1]
        for r in rows
    )


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _size(nbytes: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"
