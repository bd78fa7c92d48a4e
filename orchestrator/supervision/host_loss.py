"""Losing a host, for the supervisor: when a host is lost (the timing rule), which hosts the next
launch is for, waiting for a lost host (re-probed with backoff, up to host_wait) without
spending restarts, replacing it with a spare, going on without it (min_workers), and growing
back when it returns (regrow).

The pool of hosts (host_pool.py) is stored with the job after every change, for `status`."""

from __future__ import annotations

import time
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from orchestrator.errors import OrchestrateError
from orchestrator.planning.plan import host_labels, initial_hosts, task_slots
from orchestrator.state.host_pool import REPLACE_AFTER_FAILURES, HostPool, HostRole
from orchestrator.supervision.attempt import Attempt
from orchestrator.supervision.observations import Decision, FailureKind, failure
from orchestrator.supervision.warm_spares import WarmSpares
from worker.spec import WorkerSpec

if TYPE_CHECKING:
    from orchestrator.supervision.context import SupervisionContext

# Re-probing a lost host: the first wait, doubling up to the last.
PROBE_BACKOFF = (1.0, 15.0)
# How often a host dropped from the group is probed while regrow is on.
REGROW_PROBE_INTERVAL = 5.0


class HostWaitExpired(OrchestrateError):
    """A lost host stayed away past host_wait, and neither a spare nor min_workers helps."""


class Hosts:
    def __init__(self, ctx: SupervisionContext) -> None:
        self.store = ctx.store
        self.job_state = ctx.job_state
        self.job_id = job_id = ctx.job_id
        self.config = config = ctx.config
        self.backend = ctx.backend
        self.sink = ctx.sink
        self.timing = ctx.timing
        self.labels = host_labels(config)
        self.gpu_counts: dict[int, int] = {}  # GPUs each host had at its latest preflight
        self._delay = PROBE_BACKOFF[0]  # the next wait for an unreachable host
        self._waiting_said: set[int] = set()
        stored = HostPool.from_json(ctx.store.get_job(job_id).hosts_json)
        spares = set(range(len(self.labels))) - set(initial_hosts(config))
        self.pool = stored or HostPool.initial(self.labels, spares)
        self._probe: Future[list[int]] | None = None
        self._probed_at = float("-inf")
        self._back_at_epoch: int | None = None  # the chief's epoch when a dropped host came back
        self._executor: ThreadPoolExecutor | None = None
        warm_spares = ctx.warm and ctx.backend.capabilities.elastic_width  # spares at all
        self.spares = WarmSpares(ctx.backend, self._idle, self.labels) if warm_spares else None
        self._save()

    def close(self) -> None:
        """No more probes or visits to spares (before the job's standbys are released)."""
        if self.spares is not None:
            self.spares.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _save(self) -> None:
        self.store.update_job(self.job_id, hosts_json=self.pool.to_json())

    def _event(self, kind: str, message: str) -> None:
        self.store.add_event(self.job_id, kind, message)
        self.sink.info(message)

    def tasks_on(self, hosts: tuple[int, ...]) -> int:
        return len(task_slots(self.config, hosts, self.gpu_counts))

    # --- after a failure ----------------------------------------------------------------
    def _idle(self) -> tuple[int, ...]:
        return self.pool.idle(time.time())

    def lost(self, attempt: Attempt) -> Decision | None:
        """A failure decision when some host's reads failed for host_timeout."""
        for message in self.spares.said() if self.spares is not None else ():
            self._event("spare", message)
        watch, now = attempt.watch, time.monotonic()
        lost = self.timing.lost_hosts({a.host_index for a in attempt.agents}, watch, now)
        if not lost:
            return None
        parts = [
            f"{self.labels[h]} unreachable for "
            f"{watch.silent_for(h, now):.1f}s ({watch.why_failing(h)})"
            for h in lost
        ]
        tasks = tuple(a.task_index for a in attempt.agents if a.host_index in lost)
        return failure(FailureKind.HOST_LOST, "; ".join(parts), tasks, hosts=tuple(lost))

    def record_failure(self, attempt: Attempt | None, decision: Decision) -> None:
        """Note what a failure says about the hosts: lost ones become LOST (since their last
        good read); a host whose tasks failed REPLACE_AFTER_FAILURES times in a row is
        replaced by a spare when there is one."""
        wall, mono = time.time(), time.monotonic()
        pool = self.pool
        for h in decision.hosts if decision.kind == FailureKind.HOST_LOST and attempt else ():
            assert attempt is not None
            pool = pool.unreachable(h, wall - attempt.watch.silent_for(h, mono))
        if attempt is not None and decision.kind not in (FailureKind.HOST_LOST, FailureKind.REGROW):
            failing = {attempt.plan.tasks[i].host_index for i in decision.tasks}
            for h in failing:
                pool = pool.failed(h)
            pool = pool.healthy(tuple(h for h in pool.group() if h not in failing))
        self.pool = pool
        for h in self.pool.with_role(HostRole.MEMBER):
            if self.pool.hosts[h].failures >= REPLACE_AFTER_FAILURES:
                self._replace(h, f"its tasks failed {self.pool.hosts[h].failures} times in a row")
        self._save()

    def _replace(self, h: int, why: str) -> bool:
        spare = self.pool.spare_for(time.time())
        if spare is None:
            return False
        self.pool = self.pool.replace(h, spare, time.time(), self.config.restart.quarantine)
        self._save()
        self._event(
            "replaced",
            f"{self.labels[spare]} replaces {self.labels[h]} ({why}); {self.labels[h]} "
            f"quarantined for {self.config.restart.quarantine:g}s",
        )
        return True

    # --- launching ----------------------------------------------------------------------
    def for_launch(self) -> tuple[int, ...]:
        """The hosts the next attempt starts on: the pool's group, a spare in for each host
        that is lost."""
        for h in self.pool.with_role(HostRole.LOST):
            self._replace(h, "unreachable")
        return self.pool.group()

    def unreachable(self, hosts: Collection[int]) -> float:
        """A launch found these hosts unreachable (nothing started: not an attempt). Returns how
        long to wait before the next try (0: try again now, a spare can step in or only spares
        were away); past host_wait the group shrinks to at least min_workers, or
        HostWaitExpired."""
        now = time.time()
        for h in hosts:
            self.pool = self.pool.unreachable(h, now)
        self._save()
        lost = self.pool.with_role(HostRole.LOST)
        if not lost or self.pool.spare_for(now) is not None:
            return 0.0
        away = now - min(self.pool.lost_since(h) for h in lost)
        if away >= self.config.supervision.host_wait:
            self._shrink(lost, away)
            return 0.0
        for h in lost:
            if h not in self._waiting_said:
                self._waiting_said.add(h)
                self._event("waiting", f"waiting for {self.labels[h]}: unreachable")
        names = ", ".join(self.labels[h] for h in lost)
        self.job_state.note_cause(f"waiting for {names}: unreachable for {away:.0f} s")
        delay, self._delay = self._delay, min(self._delay * 2, PROBE_BACKOFF[1])
        return delay

    def launched(self, attempt: Attempt, specs: list[WorkerSpec]) -> None:
        """An attempt started: its hosts answer, and its preflight counted their GPUs; the
        spares keep standbys for its tasks."""
        if self.spares is not None:
            self.spares.launched(specs)
        for h in attempt.hosts():
            self.pool = self.pool.reachable(h)
        self.gpu_counts.update(attempt.gpu_counts)
        self._delay = PROBE_BACKOFF[0]
        self._waiting_said.clear()
        self._save()

    def _shrink(self, lost: tuple[int, ...], away: float) -> None:
        names = ", ".join(self.labels[h] for h in lost)
        survivors = tuple(h for h in self.pool.group() if h not in lost)
        width = self.tasks_on(survivors)
        minimum = self.config.restart.min_workers
        if minimum is None or width < minimum or not survivors:
            need = (
                "every worker (restart.min_workers unset)"
                if minimum is None
                else (f"at least {minimum} worker(s)")
            )
            raise HostWaitExpired(
                f"{names} unreachable for {away:.0f} s (supervision.host_wait "
                f"{self.config.supervision.host_wait:g}s), no spare left, and {width} "
                f"worker(s) remain where the job needs {need}"
            )
        for h in lost:
            self.pool = self.pool.drop(h)
        self._save()
        full = self.tasks_on(self.pool.group() + self.pool.with_role(HostRole.OUT))
        self._event(
            "width",
            f"going on with {width} of {full} worker(s), without {names} (unreachable for "
            f"{away:.0f} s, no spare left)",
        )

    # --- growing back -------------------------------------------------------------------
    def regrow(self, attempt: Attempt) -> Decision | None:
        """With regrow on and hosts out of the group: probe them now and then (off the tick's
        thread); once one is back, a decision to restart at full width when the chief's epoch
        next advances (its checkpoint was just written)."""
        out = self.pool.with_role(HostRole.OUT)
        if not (self.config.restart.regrow and out):
            return None
        epoch = attempt.watch.last_reported(0, "epoch")
        if self._back_at_epoch is not None:
            if isinstance(epoch, int) and epoch > self._back_at_epoch:
                names = ", ".join(self.labels[h] for h in out)
                return failure(
                    FailureKind.REGROW,
                    f"{names} back: growing to full width at the epoch boundary",
                    hosts=out,
                )
            return None
        if self._probe is not None and self._probe.done():
            back = self._probe.result()
            self._probe = None
            if back and isinstance(epoch, int):
                self._back_at_epoch = epoch
                names = ", ".join(self.labels[h] for h in back)
                self._event("back", f"{names} reachable again: regrowing at the next epoch")
        elif self._probe is None and time.monotonic() - self._probed_at >= REGROW_PROBE_INTERVAL:
            self._probed_at = time.monotonic()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="regrow-probe")
            self._probe = self._executor.submit(self._reachable, out)
        return None

    def _reachable(self, hosts: tuple[int, ...]) -> list[int]:
        back = []
        for h in hosts:
            try:
                if self.backend.transport(h).run(["true"], timeout=10.0).ok:
                    back.append(h)
            except OrchestrateError:
                pass
        return back

    def grow_back(self, decision: Decision) -> None:
        for h in decision.hosts:
            self.pool = self.pool.rejoin(h)
        self._back_at_epoch = None
        self._save()
        self._event("width", f"back to {self.tasks_on(self.pool.group())} worker(s)")
