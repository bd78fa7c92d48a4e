"""Losing a host, for the supervisor: which hosts the next launch is for, waiting for a lost
host (re-probing with backoff, up to host_wait) without spending restarts, replacing it with a
spare, going on without it (min_workers), and growing back when it returns (regrow).

The pool of hosts (host_pool.py) is stored with the job after every change, for `status`."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from orchestrator.config import ClusterConfig
from orchestrator.errors import HostsUnreachable, OrchestrateError
from orchestrator.group_control import GroupControl
from orchestrator.host_pool import REPLACE_AFTER_FAILURES, HostPool, HostRole
from orchestrator.launcher import host_labels
from orchestrator.logstream import LineSink
from orchestrator.observations import Decision, FailureKind, failure
from orchestrator.plan import initial_hosts, task_slots
from orchestrator.store import Store
from orchestrator.tick import Group, Watch

# Re-probing a lost host: the first wait, doubling up to the last.
PROBE_BACKOFF = (1.0, 15.0)
# How often a host dropped from the group is probed while regrow is on.
REGROW_PROBE_INTERVAL = 5.0


class HostWaitExpired(OrchestrateError):
    """A lost host stayed away past host_wait, and neither a spare nor min_workers helps."""


class Hosts:
    def __init__(
        self,
        store: Store,
        job_id: str,
        config: ClusterConfig,
        control: GroupControl,
        sink: LineSink,
        stop_requested: threading.Event,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.config = config
        self.control = control
        self.sink = sink
        self.stop_requested = stop_requested
        self.labels = host_labels(config)
        stored = HostPool.from_json(store.get_job(job_id).hosts_json)
        spares = set(range(len(self.labels))) - set(initial_hosts(config))
        self.pool = stored or HostPool.initial(self.labels, spares)
        self._probe: Future[list[int]] | None = None
        self._probed_at = float("-inf")
        self._back_at_epoch: int | None = None  # the chief's epoch when a dropped host came back
        self._executor: ThreadPoolExecutor | None = None
        self._save()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _save(self) -> None:
        self.store.update_job(self.job_id, hosts_json=self.pool.to_json())

    def _event(self, kind: str, message: str) -> None:
        self.store.add_event(self.job_id, kind, message)
        self.sink.info(message)

    def tasks_on(self, hosts: tuple[int, ...]) -> int:
        return len(task_slots(self.config, hosts, self.control.gpu_counts))

    # --- after a failure ----------------------------------------------------------------
    def lost(self, group: Group, watch: Watch) -> Decision | None:
        """A failure decision when some host's reads failed for host_timeout."""
        lost = self.control.tick.lost_hosts(group, watch)
        if not lost:
            return None
        now = time.monotonic()
        parts = [
            f"{self.labels[h]} unreachable for "
            f"{now - watch.host_ok.get(h, watch.started):.1f}s ({watch.host_error.get(h, '')})"
            for h in lost
        ]
        tasks = tuple(a.task_index for a in group.agents if a.host_index in lost)
        return failure(FailureKind.HOST_LOST, "; ".join(parts), tasks, hosts=tuple(lost))

    def record_failure(self, group: Group | None, decision: Decision, watch: Watch) -> None:
        """Note what a failure says about the hosts: lost ones become LOST (since their last
        good read); a host whose tasks failed REPLACE_AFTER_FAILURES times in a row is
        replaced by a spare when there is one."""
        wall, mono = time.time(), time.monotonic()
        pool = self.pool
        for h in decision.hosts if decision.kind == FailureKind.HOST_LOST else ():
            pool = pool.unreachable(h, wall - (mono - watch.host_ok.get(h, watch.started)))
        if group is not None and decision.kind not in (FailureKind.HOST_LOST, FailureKind.REGROW):
            failing = {group.plan.tasks[i].host_index for i in decision.tasks}
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
    def launch(self, attempt: int) -> Group | None:
        """Launch on the pool's group. A host that cannot be reached is waited for, re-probed
        with backoff, up to host_wait (these tries are not attempts: nothing started); a spare
        replaces it at once when there is one; past host_wait the group shrinks to at least
        min_workers, or HostWaitExpired. None: a stop was requested while waiting."""
        delay = PROBE_BACKOFF[0]
        waiting_said: set[int] = set()
        while True:
            for h in self.pool.with_role(HostRole.LOST):
                self._replace(h, "unreachable")
            try:
                group = self.control.launch(attempt, self.pool.group())
            except HostsUnreachable as exc:
                if attempt == 0:
                    raise  # the first launch fails fast: fix the hosts, then relaunch
                now = time.time()
                for h in exc.hosts:
                    self.pool = self.pool.unreachable(h, now)
                self._save()
                lost = self.pool.with_role(HostRole.LOST)
                if not lost or self.pool.spare_for(now) is not None:
                    continue  # only spares were away, or a spare can step in: try again now
                away = now - min(self.pool.lost_since(h) for h in lost)
                if away >= self.config.supervision.host_wait:
                    self._shrink(lost, away)
                    continue
                for h in lost:
                    if h not in waiting_said:
                        waiting_said.add(h)
                        self._event("waiting", f"waiting for {self.labels[h]}: unreachable")
                names = ", ".join(self.labels[h] for h in lost)
                self.store.update_job(
                    self.job_id, last_cause=f"waiting for {names}: unreachable for {away:.0f} s"
                )
                if self.stop_requested.wait(delay):
                    return None
                delay = min(delay * 2, PROBE_BACKOFF[1])
                continue
            if group is None:  # a stop was requested while the allocation waited
                return None
            for h in group_hosts(group):
                self.pool = self.pool.reachable(h)
            self._save()
            return group

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
    def regrow(self, group: Group, watch: Watch) -> Decision | None:
        """With regrow on and hosts out of the group: probe them now and then (off the tick's
        thread); once one is back, a decision to restart at full width when the chief's epoch
        next advances (its checkpoint was just written)."""
        out = self.pool.with_role(HostRole.OUT)
        if not (self.config.restart.regrow and out):
            return None
        epoch = watch.last.get(0, {}).get("epoch")
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
                if self.control.backend.transport(h).run(["true"], timeout=10.0).ok:
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


def group_hosts(group: Group) -> tuple[int, ...]:
    return tuple(sorted({t.host_index for t in group.plan.tasks}))
