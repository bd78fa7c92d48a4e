"""The supervisor: launch a job, watch it to the end, restart the whole group on failure, and
record everything in the store. It runs in the foreground (`orchestrate launch`), detached
(`launch --detach`: `python -m orchestrator supervise JOB`), or adopts a running job whose
supervisor died (`orchestrate attach JOB`). It owns the restart loop and is the one that moves
the job's state (through job_state.py, its only writer); the rules live in monitor.py,
restart_policy.py and timing.py, one round of reads in tick.py, starting and stopping an
attempt in attempts.py (the backend does the work), and lost hosts in host_loss.py."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from types import FrameType

from orchestrator.backends import Backend, open_backend
from orchestrator.backends.agents import AGENT_STOP_MARGIN
from orchestrator.config import ClusterConfig
from orchestrator.errors import (
    REFUSED_EVENT,
    AllocationEnded,
    HostsUnreachable,
    OrchestrateError,
    PreflightError,
)
from orchestrator.logs.logstream import LineSink
from orchestrator.state.paths import collected_dir
from orchestrator.state.states import JobState, TaskState
from orchestrator.state.store import JobRecord, Store
from orchestrator.supervision import handover
from orchestrator.supervision.agent_errors import name_agent_errors
from orchestrator.supervision.attempt import Attempt
from orchestrator.supervision.attempt_control import BROKEN_GROUP_GRACE, AttemptControl
from orchestrator.supervision.collect import collect_job, draw_report
from orchestrator.supervision.context import SupervisionContext
from orchestrator.supervision.host_loss import Hosts, HostWaitExpired
from orchestrator.supervision.hung_stacks import take_stacks
from orchestrator.supervision.monitor import decide
from orchestrator.supervision.notify import Notifier
from orchestrator.supervision.observations import Decision, FailureKind, Verdict, failure
from orchestrator.supervision.queue import Queue, QueueTimedOut, waitable
from orchestrator.supervision.restart_policy import plan_restart
from orchestrator.supervision.stop_outcome import unconfirmed_cause
from orchestrator.supervision.straggler_report import tell_stragglers
from orchestrator.supervision.stragglers import StragglerWatch
from orchestrator.supervision.tick import Tick
from worker.proctl import identity, not_nested


class Supervisor:
    def __init__(
        self,
        store: Store,
        job: JobRecord,
        config: ClusterConfig,
        sink: LineSink,
        backend: Backend | None = None,
    ) -> None:
        ctx = SupervisionContext.of(store, job.id, config, backend or open_backend(config), sink)
        self.ctx = ctx
        self.store = store
        self.job = job
        self.config = config
        self.sink = sink
        self.backend = ctx.backend
        self.layout = ctx.layout
        self.job_state = ctx.job_state
        self.stop_requested = threading.Event()
        self.stopped_by: int | None = None  # the first signal that asked for the stop
        self.attempt = job.attempt
        self.in_a_row = 0  # counted restarts in a row: the backoff doubles with each
        self.tick = Tick(ctx)
        self.attempts = AttemptControl(ctx, self.tick, self.stop_requested)
        self.hosts = Hosts(ctx)
        self.notifier = Notifier(config.notify, store, job.id)
        self._given_back = False  # backend.finish: once, whichever way the job ends
        self.hangup = threading.Event()  # the terminal closed: hand the job over
        self.handover = handover.Handover()
        self.handed_to: int | None = None  # the supervisor that took the job over
        # Until its first attempt starts, a job that waits for what others hold (queue.py).
        self.queue = (
            Queue(ctx.job_state, config, self.stop_requested, self._say)
            if config.scheduling.wait_for_resources
            else None
        )

    def install_signal_handlers(self, hand_over_on_hangup: bool = False) -> None:
        """SIGINT and SIGTERM stop the job. SIGHUP (the terminal closed) hands it to a
        detached supervisor where `hand_over_on_hangup` (a foreground one), else stops it."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if self.stopped_by is None:
                self.stopped_by = signum
            self.stop_requested.set()

        def on_hangup(signum: int, frame: FrameType | None) -> None:
            handover.silence_terminal()
            self.hangup.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, not_nested(on_signal))
        signal.signal(signal.SIGHUP, not_nested(on_hangup if hand_over_on_hangup else on_signal))

    # --- entry points -------------------------------------------------------------------
    def run(self) -> JobState:
        """Launch a registered job and supervise it to a terminal state."""
        return self._main(adopted=None)

    def adopt(self) -> JobState:
        """Supervise a job whose agents are running but whose supervisor is gone."""
        self.store.add_event(self.job.id, "attached", f"supervisor {os.getpid()} adopted the job")
        self.sink.info(f"attached to job {self.job.id} (attempt {self.job.attempt})")
        if self.job.state == JobState.QUEUED:  # nothing started yet: back in the queue
            return self._main(adopted=None, replacing=True)
        self.queue = None  # it launched before: it holds what it asked for
        attempt = self.attempts.adopted(self.job.attempt)
        if len(attempt.agents) < len(attempt.plan.tasks):  # died mid-launch: it is incomplete
            return self._main(
                adopted=attempt, first=failure(FailureKind.LOST, "launch was interrupted")
            )
        return self._main(adopted=attempt)

    # --- the restart loop ---------------------------------------------------------------
    def _main(
        self, adopted: Attempt | None, first: Decision | None = None, replacing: bool = False
    ) -> JobState:
        # Claimed in one store statement: a launch and an `attach` racing for one job leave
        # one supervisor, and the other refuses in one line before it touches anything.
        me = (os.getpid(), identity(os.getpid()) or "", socket.gethostname())
        dead = (self.job.supervisor_pid, self.job.supervisor_ident)
        first_state = JobState.QUEUED if self.queue is not None else JobState.LAUNCHING
        self.job_state.claim(
            JobState.RUNNING if adopted else first_state,
            me,
            dead if adopted or replacing else (None, ""),
        )
        try:
            return self._loop(adopted, first)
        except OrchestrateError as exc:
            if isinstance(exc, PreflightError):  # `launch --detach` exits as a refusal too
                self.store.add_event(self.job.id, REFUSED_EVENT, str(exc))
            self._fail_on_error(str(exc))
            raise
        except Exception as exc:  # a bug of ours: still nothing left running, and a true state
            self._fail_on_error(f"internal error: {type(exc).__name__}: {exc}")
            raise
        finally:  # however it ended: so does what the backend holds for it
            self._give_back(self.job_state.state == JobState.SUCCEEDED)
            self.hosts.close()
            self.notifier.close()
            self.sink.close()
            self.tick.close()
            self.backend.close()

    def _attempt(self, attempt: Attempt | None) -> tuple[Attempt | None, Decision | None]:
        """Launch (unless adopted) and watch one attempt; a None decision: stop requested."""
        if attempt is None:
            try:
                attempt = self._launch(self.attempt)
            except HostWaitExpired as exc:
                return None, failure(FailureKind.HOST_WAIT, str(exc))
            except AllocationEnded as exc:
                return None, failure(FailureKind.ALLOCATION_ENDED, str(exc))
            except OrchestrateError as exc:
                if self.attempt == 0 or isinstance(exc, QueueTimedOut):
                    raise  # the first launch fails fast: fix the hosts, then relaunch
                return None, failure(FailureKind.LAUNCH, f"relaunch failed: {exc}")
            if attempt is None:  # a stop was requested while waiting for a host
                return None, None
        return attempt, self._watch(attempt)

    def _event(self, kind: str, message: str) -> None:
        self.store.add_event(self.job.id, kind, message)

    def _say(self, kind: str, message: str) -> None:
        self._event(kind, message)
        self.sink.info(message)

    def _fail_on_error(self, cause: str) -> None:
        """An error ends the job FAILED with its cause, after stopping whatever it started.
        No task row is left saying it runs: what the stop confirmed is `stopped`, the rest
        `lost` (its end is not known); `unreachable` rows stay (a later stop retries them)."""
        confirmed = self.attempts.stop_everything()
        with contextlib.suppress(Exception):  # the store may be what failed
            tasks = self.store.tasks(self.job.id)
            open_rows = [t for t in tasks if t.state.is_running() or t.state == TaskState.PENDING]
            state = TaskState.STOPPED if confirmed else TaskState.LOST
            self.store.update_tasks(self.job.id, {t.idx: {"state": state} for t in open_rows})
        if not self.job_state.state.is_terminal():
            self._finish(JobState.FAILED, cause)

    def _loop(self, attempt: Attempt | None, pending: Decision | None) -> JobState:
        job = self.store.get_job(self.job.id)
        restarts, preemptions = job.restarts, job.preemptions
        while True:
            if pending is not None:
                decision = pending
            else:
                attempt, outcome = self._attempt(attempt)
                if outcome is None:
                    return self._stop_on_request(attempt)
                if outcome.verdict == Verdict.SUCCEEDED:
                    assert attempt is not None
                    return self._succeed(attempt, outcome)
                decision = outcome
            if attempt is not None and decision.tasks and decision.kind != FailureKind.HOST_LOST:
                decision = self.attempts.name_shared_dir_trouble(attempt, decision)
                decision = name_agent_errors(self.backend, self.layout, attempt, decision)
            self.job_state.to(JobState.STOPPING, last_cause=decision.cause)
            regrow = decision.kind == FailureKind.REGROW
            kind = "regrow" if regrow else "failure"
            self.store.add_event(self.job.id, kind, decision.cause, *decision.tasks[:1])
            if decision.kind == FailureKind.HOST_LOST:
                self.notifier.event("host_lost", decision.cause)
            if attempt is not None:  # a hung or late group: its stacks, before it is stopped
                seen = take_stacks(self.backend, self.layout, self.config, attempt, decision,
                                   self._event)  # fmt: skip
                if seen is not decision:  # the cause now says where each task was
                    decision = seen
                    self.job_state.note_cause(decision.cause)
            self.sink.info(f"{decision.cause}: stopping every task")
            ran_for = 0.0 if attempt is None else attempt.watch.elapsed(time.monotonic())
            if attempt is not None:
                preempted = decision.exit_code == self.config.restart.preemption_exit_code
                graceful = preempted or regrow
                grace = self.config.supervision.stop_grace if graceful else BROKEN_GROUP_GRACE
                lost = set(decision.hosts) if decision.kind == FailureKind.HOST_LOST else set()
                self.attempts.stop(attempt, grace, lost | attempt.watch.failing_hosts())
            if regrow:
                self.hosts.grow_back(decision)
            else:
                self.hosts.record_failure(attempt, decision)
            restart = plan_restart(
                decision,
                self.config.restart,
                restarts - preemptions - job.budget_base,
                self.config.supervision.on_startup_timeout == "restart",
                (self.in_a_row, ran_for),
            )
            self.in_a_row = restart.in_a_row
            if not restart.restart:
                self._collect()
                cause = decision.cause
                if restarts:
                    cause += f" ({restart.reason})"
                self._finish(JobState.FAILED, cause)
                return JobState.FAILED
            restarts += 1
            preemptions += 0 if restart.counts else 1
            self.job_state.to(JobState.RESTARTING, restarts=restarts, preemptions=preemptions)
            message = f"{restart.reason}, in {restart.delay:g}s, after: {decision.cause}"
            self.store.add_event(self.job.id, "restart", message)
            self.notifier.event("preempted" if restart.preempted else "restarted", message)
            self.sink.info(message)
            if self.stop_requested.wait(restart.delay):
                return self._stop_on_request(None)
            self.attempt += 1
            attempt, pending = None, None

    def _launch(self, number: int) -> Attempt | None:
        """Start attempt `number` on the hosts the pool chooses. A host that cannot be reached
        is waited for (re-probed with backoff, up to host_wait: these tries are not attempts,
        nothing started), replaced by a spare, or left out (min_workers); the first launch
        fails fast instead. None: a stop was requested while waiting."""
        while True:
            try:
                if self.queue is not None and not self.queue.wait_turn():
                    return None
                attempt = self.attempts.start(number, self.hosts.for_launch())
            except PreflightError as exc:
                if self.queue is not None and waitable(exc):
                    if not self.queue.back(exc):
                        return None
                    continue
                if number == 0 or not isinstance(exc, HostsUnreachable):
                    raise  # the first launch fails fast: fix the hosts, then relaunch
                wait = self.hosts.unreachable(exc.hosts)
                if self.stop_requested.wait(wait):
                    return None
                continue
            break
        if attempt is None:  # a stop was requested while the allocation waited
            return None
        self.queue = None  # its turn came: from now on it holds what it asked for
        self.hosts.launched(attempt, self.attempts.specs)
        self.job_state.to(JobState.RUNNING, attempt=number)
        self.store.add_event(
            self.job.id, "launched", f"attempt {number}: {len(attempt.agents)} task(s) started"
        )
        self.sink.info(
            f"job {self.job.id}: {len(attempt.agents)} task(s) running; "
            + ", ".join(f"worker-{t.index}={t.endpoint}" for t in attempt.plan.tasks)
        )
        return attempt

    # --- watching ---------------------------------------------------------------------
    def _watch(self, attempt: Attempt) -> Decision | None:
        """Poll until the attempt needs a decision; None when a stop was requested."""
        self.tick.begin(attempt)
        try:
            decision = self._decide_until_done(attempt)
            self.tick.settle(attempt)  # what the stop that follows should not wait on
            return decision
        finally:
            self.tick.end()

    def _decide_until_done(self, attempt: Attempt) -> Decision | None:
        sup = self.config.supervision
        watch = attempt.watch
        stragglers = StragglerWatch(sup.straggler_threshold)
        # The startup deadline is checked once, when it passes: a group that met it then (a
        # task whose steps are not observed meets it at the rendezvous) is not judged again.
        startup_passed = False
        while not self.stop_requested.is_set():
            if self.hangup.is_set() and self._handed_over():
                return None
            observations = self.tick.next(attempt, sup.poll_interval)
            lost = self.hosts.lost(attempt)
            if lost is not None:  # before the rules: its tasks' errors follow from it
                return lost
            elapsed = watch.elapsed(time.monotonic())
            decision = decide(
                observations,
                elapsed=elapsed,
                startup_deadline=float("inf") if startup_passed else sup.startup_deadline,
                heartbeat_timeout=sup.heartbeat_timeout,
                progress_timeout=sup.progress_timeout,
            )
            if decision.verdict != Verdict.CONTINUE:
                return decision
            regrow = self.hosts.regrow(attempt)
            if regrow is not None:
                return regrow
            startup_passed = elapsed > sup.startup_deadline
            tell_stragglers(stragglers, attempt, self.store, self.job.id, self.notifier, self.sink)
        return None

    # --- ending -----------------------------------------------------------------------
    def _succeed(self, attempt: Attempt, outcome: Decision) -> JobState:
        # The chief succeeded: the others are normally exiting too; give them a moment.
        deadline = time.monotonic() + self.config.supervision.stop_grace
        while time.monotonic() < deadline and not self.stop_requested.is_set():
            if not self.tick.alive_tasks(attempt.agents):
                break
            time.sleep(self.config.supervision.poll_interval)
        self.attempts.stop(attempt, self.config.supervision.stop_grace + AGENT_STOP_MARGIN)
        self._collect()
        self._finish(JobState.SUCCEEDED, outcome.cause)
        return JobState.SUCCEEDED

    def _handed_over(self) -> bool:
        """Whether the job is now its detached successor's (handover.py)."""
        self.handed_to = self.handover.poll(self.store, self.job.id, self.sink.info)
        return self.handed_to is not None

    def _stop_on_request(self, attempt: Attempt | None) -> JobState:
        if self.handed_to is not None:  # nothing stopped, nothing given back: it is theirs
            self._given_back = True
            return self.job_state.state
        self.job_state.to(JobState.STOPPING)
        self.sink.info("stop requested: stopping every task")
        if attempt is not None:  # else between attempts: only what earlier stops left
            grace = self.config.supervision.stop_grace + AGENT_STOP_MARGIN
            self.attempts.stop(attempt, grace, attempt.watch.failing_hosts())
        stuck = self.attempts.leftovers
        if stuck:  # not confirmed: the job stays STOPPING, and says what a later stop must do
            hosts = sorted({self.hosts.labels[a.host_index] for a in stuck})
            cause = unconfirmed_cause(self.job.id, f"{', '.join(hosts)} unreachable")
            self.job_state.note_cause(cause)
            self.store.add_event(self.job.id, "stop_unconfirmed", cause)
            self.sink.info(cause)
            return JobState.STOPPING
        self._finish(JobState.STOPPED, "stopped on request")
        return JobState.STOPPED

    def _collect(self) -> None:
        try:
            collect_job(self.backend, self.layout.root, collected_dir(self.job.id))
        except (OSError, OrchestrateError) as exc:
            self.store.add_event(self.job.id, "collect_failed", str(exc))

    def _give_back(self, succeeded: bool) -> None:
        if not self._given_back:
            self._given_back = True
            self.backend.finish(self.layout, succeeded)

    def _finish(self, state: JobState, cause: str) -> None:
        self._give_back(state == JobState.SUCCEEDED)  # before the job says so
        self.hosts.close()  # no spare visited after its standbys are released
        self.attempts.end_standbys()
        self.job_state.to(state, last_cause=cause)
        self.store.add_event(self.job.id, state.value, cause)
        self.notifier.event(state.value, cause)
        self.sink.info(f"job {self.job.id} {state.value}: {cause}")
        draw_report(self.job.id, self.sink.info, self._event)
