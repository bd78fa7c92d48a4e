"""One attempt on Slurm: its srun step (started here, or adopted by id), and the hello each of
its tasks writes when it starts (worker.slurm_task)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.slurm_allocation import Allocation, run_slurm
from orchestrator.errors import OrchestrateError
from worker.proctl import HURRY, LEADER_LAST_WORDS

STEP_LOOKUP_INTERVAL = 1.0  # squeue at most this often for an adopted step


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
        self, allocation: Allocation, proc: subprocess.Popen[bytes] | None, step_id: str = ""
    ) -> None:
        self.allocation = allocation
        self.proc = proc
        self.step_id = step_id
        self._seen_at = float("-inf")
        self._seen = True

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
