"""The agent's side of warm restarts (worker/warm/activation.py, worker/warm/keeper.py): start this
attempt's trainer in the task's standby when a keeper holds one, and have the keeper prepare the
next attempt's once this trainer has trained `standby_delay` seconds (a restarted one: as it
trains), or as a trainer that trained exits (for the restart after its failure, or for the
user's next job)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from worker.container import image_of, name_for_attempt, warm_env
from worker.spec import Phase, WorkerSpec
from worker.warm.activation import KeeperLink, WarmTrainer, fingerprint
from worker.warm.activation import warm_start as start_in_standby
from worker.warm.import_env import undone_reason
from worker.warm.preparation import prepare_standby


class AgentStandby:
    def __init__(
        self,
        spec: WorkerSpec,
        env: dict[str, str],
        note: Callable[[str], None],
        stop: threading.Event,
        phase: Callable[[], Phase],
    ) -> None:
        self.spec = spec
        # The trainer's; in an image, what it sees beyond the image's own (worker/container.py)
        self.env = warm_env(spec, env) if spec.container else env
        self._note = note
        self._stop = stop
        self._phase = phase
        self.keeper: KeeperLink | None = None
        self._asked = False
        self._training_since: float | None = None  # when the trainer was first seen training

    @property
    def _enabled(self) -> bool:
        return self.spec.warm_restart and self.spec.instrument

    def warm_start(self, log_path: str) -> WarmTrainer | None:
        """This attempt's trainer from the task's standby, when a keeper has a matching one
        (ready, or soon); None: start cold (and say why, when a keeper was there)."""
        spec = self.spec
        task_dir = spec.layout.task_dir(spec.task_index)
        undone = undone_reason(str(task_dir))
        if undone:
            self._note(f"cold start: {undone}")
        if not self._enabled or undone:
            return None
        python, *target = spec.argv
        image = image_of(spec)
        order = {"fingerprint": fingerprint(self.env, python, spec.env, image), "env": self.env,
                 "target": target, "cwd": spec.workdir, "log": log_path,
                 "job_id": spec.job_id, "task_index": spec.task_index,
                 "linger": spec.standby_linger, "keep": spec.keep_standbys,
                 "keep_bytes": spec.keep_standbys_bytes,
                 "standby_log": str(task_dir / "standby.log")}  # fmt: skip
        keep = spec.keep_standbys > 0
        cluster = spec.tf_config.get("cluster", {})
        tasks = sum(len(v) for v in cluster.values() if isinstance(v, list))
        trainer, self.keeper, problem = start_in_standby(
            spec.job_id, spec.task_index, order, self.ready, keep, self._stop, tasks
        )
        if trainer is None:
            if problem or spec.attempt > 0:  # a restart says why it is cold
                self._note(f"cold start: {problem or 'no standby was prepared on this host'}")
            return None
        waited = trainer.link.import_waited
        after = f" (after {waited:.1f}s waiting for its TensorFlow import)" if waited >= 0.1 else ""
        self._note(f"warm start: the standby (pid {trainer.pid}) runs the entrypoint{after}")
        if spec.container:  # the trainer is in the keeper's container: named for this attempt
            runtime = str(spec.container["runtime"])
            threading.Thread(
                target=name_for_attempt, name="name-container", daemon=True,
                args=(runtime, spec.job_id, spec.task_index, spec.attempt),
            ).start()  # fmt: skip
        return trainer

    def due(self, exit_code: int | None = None) -> bool:
        """Whether to have the keeper prepare the next attempt's standby now: once the trainer
        has trained `standby_delay` seconds (a standby importing TensorFlow beside the first
        steps slows them on a host without cores to spare), or, given its `exit_code`, as a
        trainer that trained exits: after its own failure (for the restart), or at any end
        while standbys are kept for the user's next job. After a restart the delay is not
        waited: a job that failed once may fail again soon, and a standby still importing
        then is a restart that waits for it (faults back to back)."""
        if not self._enabled or self._asked:
            return False
        if exit_code is not None:
            failed = exit_code != 0 and not self._stop.is_set()
            if not (failed or self.spec.keep_standbys > 0):
                return False
        if self._training_since is None:
            if self._phase() not in (Phase.TRAINING, Phase.FINISHED):
                return False
            self._training_since = time.monotonic()
        if exit_code is not None:
            return True
        trained = time.monotonic() - self._training_since
        delay = self.spec.standby_delay if self.spec.attempt == 0 else 0.0
        return not self._stop.is_set() and trained >= delay

    def prepare(self) -> None:
        self._asked = True
        self.keeper = prepare_standby(self.spec, self.env, self.keeper, self._note, self.ready)

    def ready(self, pid: int, rss: int) -> None:
        self._note(f"warm standby ready for a restart: pid {pid}, RSS {rss >> 20} MB")

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.close()
