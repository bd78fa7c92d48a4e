"""One attempt on Slurm: its srun step (started here, or adopted by id), and the hello each of
its tasks writes when it starts (worker.slurm_task)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.slurm_allocation import Allocation, run_slurm
from orchestrator.errors import OrchestrateError
from worker.proctl import HURRY, LEADER_LAST_WORDS

STEP_LOOKUP_INTERVAL = 1.0  # squeue at most this often for an adopted step
# What srun says the moment a task of its step ends by a signal or a non-zero exit, e.g.
# "srun: error: n0: task 1: Killed", "srun: error: n1: tasks 2-3,5: Exited with exit code 1".
SRUN_TASK_END = re.compile(rb"^srun: error: [^:\s]+: tasks? ([0-9][0-9,-]{0,200}): ", re.M)
SRUN_LOG_READ = 64 * 1024  # bytes of srun's log read per look


@dataclass(frozen=True)
class Hello:
    """What one task of a step said about itself (worker.slurm_task)."""

    procid: int
    node: str
    address: str
    port: int
    pid: int
    step: str  # SLURM_STEP_ID
    python: str
    tensorflow: str | None
    protocol: int
    problems: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> Hello | None:
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        return cls(
            int(data["procid"]), str(data["node"]), str(data["address"]), int(data["port"]),
            int(data["pid"]), str(data.get("step", "")), str(data.get("python", "")),
            data.get("tensorflow"), int(data.get("protocol", 0)),
            tuple(data.get("problems", [])),
        )  # fmt: skip


class Step:
    """One attempt's srun step: started here (srun is our child), or adopted by id."""

    def __init__(
        self,
        allocation: Allocation,
        proc: subprocess.Popen[bytes] | None,
        step_id: str = "",
        log: tuple[Path, int] | None = None,
    ) -> None:
        self.allocation = allocation
        self.proc = proc
        self.step_id = step_id
        self._seen_at = float("-inf")
        self._seen = True
        self._log: Path | None = None if log is None else log[0]
        self._read_to = 0 if log is None else log[1]
        self._ended: frozenset[int] = frozenset()

    @property
    def name(self) -> str:
        return f"{self.allocation.id}.{self.step_id}"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        now = time.monotonic()
        if now - self._seen_at >= STEP_LOOKUP_INTERVAL:
            with contextlib.suppress(OrchestrateError):
                self._seen = self.name in self.allocation.steps()
            self._seen_at = now
        return self._seen

    def living(self, tasks: Iterable[int]) -> set[int]:
        """Of `tasks`, those alive: all while the step lives, less those srun said ended."""
        return set(tasks) - self.ended_tasks() if self.alive() else set()

    def ended_tasks(self) -> frozenset[int]:
        """The tasks srun has said ended by a signal or a non-zero exit, read from its log (from
        `log`'s offset on, whole lines only) as it grows. Seen at once, where the step itself
        lives on until srun has ended its other tasks (--kill-on-bad-exit) and they are gone."""
        if self._log is None:
            return self._ended
        try:
            with open(self._log, "rb") as log:
                log.seek(self._read_to)
                data = log.read(SRUN_LOG_READ)
        except OSError:
            return self._ended
        whole = data[: data.rfind(b"\n") + 1]
        self._read_to += len(whole)
        for found in SRUN_TASK_END.finditer(whole):
            self._ended |= task_ranks(found.group(1).decode())
        return self._ended

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self, grace: float) -> bool:
        """SIGTERM to every task (they checkpoint or stop), up to `grace`, then the agents'
        "hurry" (each kills its trainer and says how it ended), then scancel the step
        (SIGKILL after KillWait); True once the step is gone."""
        if not self.alive():
            return True
        if self.step_id:
            run_slurm(["scancel", "--signal=TERM", self.name])
        elif self.proc is not None:
            self.proc.terminate()  # before the step id is known: srun ends the step
        if self.wait(grace):
            return True
        if self.step_id:
            run_slurm(["scancel", f"--signal={int(HURRY)}", self.name])
            if self.wait(LEADER_LAST_WORDS):
                return True
            run_slurm(["scancel", self.name])
        if self.wait(10.0):
            return True
        if self.proc is not None:  # srun itself stuck: Slurm still ends the step without it
            self.proc.kill()
            self.proc.wait()
        self._seen_at = float("-inf")
        self.proc = None
        return not self.alive()


def task_ranks(text: str, most: int = 65536) -> frozenset[int]:
    """Slurm's task list ("0-3,5") as ranks; a malformed or huge part is left out."""
    ranks: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            continue
        first, last = int(low), int(high or low)
        if first <= last < most:
            ranks.update(range(first, last + 1))
    return frozenset(ranks)
