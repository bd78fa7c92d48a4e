"""Answers turned into what the supervisor decides on: each host's answer (its lines, its
tasks' statuses and liveness) becomes one observation per task, with the bookkeeping on the
coordinator's clock (heartbeats, steps, first steps), the streamed lines, and one store write
per round (task rows, progress and resource samples). tick.py gets the answers."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from orchestrator.backends.base import TaskHandle
from orchestrator.logs.logstream import LineSink
from orchestrator.planning.plan import TaskPlan
from orchestrator.state.states import TaskState
from orchestrator.state.store import ResourceSample, Sample, Store
from orchestrator.supervision.attempt import Attempt, Watch, agents_by_host
from orchestrator.supervision.host_poller import PollResult
from orchestrator.supervision.monitor import task_state_of
from orchestrator.supervision.observations import TaskObservation
from worker.spec import Phase, StepSignal, TaskStatus

RESOURCE_SAMPLE_EVERY = 5.0  # seconds between a task's resource samples kept for the report


@dataclass
class _Round:
    """What one round writes to the store, in one transaction."""

    updates: dict[int, dict[str, object]] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    resources: list[ResourceSample] = field(default_factory=list)


class Ingest:
    """Takes one job's answers: it keeps each task's log tailer and writes the store."""

    def __init__(self, store: Store, job_id: str, sink: LineSink, instrumented: bool) -> None:
        self.store = store
        self.job_id = job_id
        self.sink = sink
        self.instrumented = instrumented

    def ingest(
        self,
        attempt: Attempt,
        results: Iterable[PollResult],
        skip: Collection[int] = (),
        at: float | None = None,
    ) -> list[TaskObservation]:
        """Take these answers (bookkeeping, store, streamed lines), then every task's
        observation, tasks on `skip` hosts left out; `at`: the round's monotonic time."""
        watch = attempt.watch
        now_mono = time.monotonic() if at is None else at
        now = time.time() - (time.monotonic() - now_mono)
        by_host = agents_by_host(attempt.agents)
        round_ = _Round()
        for result in results:
            if result.crash is not None:
                raise result.crash
            h = result.host
            if h not in by_host:
                continue
            if result.error is not None or result.seen is None:
                label = attempt.plan.tasks[by_host[h][0].task_index].host_label
                watch.host_error[h] = str(result.error).removeprefix(f"{label}: ")
                continue
            watch.host_ok[h] = result.at
            watch.host_error.pop(h, None)
            self._take(attempt, by_host[h], result, now_mono, now, round_)
        self.store.record_round(self.job_id, round_.updates, round_.samples, round_.resources)
        observations = []
        for agent in attempt.agents:
            i = agent.task_index
            if agent.host_index in skip:
                continue
            base = watch.seen.get(i)
            if agent.host_index in watch.host_error or base is None:
                # Unreachable for now (the poller retries); its heartbeat age keeps growing,
                # so a host that stays away is caught by the timeout.
                base = self.unreachable(i, attempt.plan.tasks[i], watch)
            observations.append(
                dataclasses.replace(
                    base,
                    heartbeat_age=now_mono - watch.seq_changed.get(i, watch.started),
                    progress_age=now_mono - watch.step_changed.get(i, watch.started),
                    reached_first_step=i in watch.first_step,
                )
            )
        return observations

    def _take(
        self,
        attempt: Attempt,
        agents: list[TaskHandle],
        result: PollResult,
        now_mono: float,
        now: float,
        round_: _Round,
    ) -> None:
        """One host's answer: its tasks' new lines, statuses and observations."""
        watch = attempt.watch
        seen = result.seen
        assert seen is not None
        alive = seen.alive if seen.alive is not None else {a.task_index for a in agents}
        for k, agent in enumerate(agents):
            i = agent.task_index
            task = attempt.plan.tasks[i]
            tailer = attempt.tailers[i]
            if k < len(result.offsets) and tailer.offset == result.offsets[k]:
                self.sink.task_lines(i, task.host_label, tailer.feed(seen.files[k]))
            raw = seen.statuses[k] if k < len(seen.statuses) else None
            changed = i not in watch.status or raw != watch.raw_status.get(i)
            if changed:
                watch.raw_status[i] = raw
                status = parse_status(raw)
                if status is not None and status.attempt != attempt.number:
                    status = None  # left over from an earlier attempt
                watch.status[i] = status
                self._status_seen(attempt, i, status, now_mono, now, round_)
            status = watch.status[i]
            state = task_state_of(status, i in alive)
            last = watch.last.get(i, {})
            if last.get("state") != state:
                round_.updates.setdefault(i, {})["state"] = state
                watch.last[i] = {**last, "state": state}
            if changed or i not in watch.seen or watch.seen[i].state != state:
                progress = status.progress if status is not None else None
                watch.seen[i] = TaskObservation(
                    index=i,
                    state=state,
                    exit_code=status.exit_code if status is not None else None,
                    phase=progress.phase if progress is not None else Phase.NONE,
                    is_chief=task.is_chief,
                    step_signal=progress.step_signal if progress else StepSignal.NONE,
                    instrumented=self.instrumented,
                )

    def _status_seen(
        self,
        attempt: Attempt,
        i: int,
        status: TaskStatus | None,
        now_mono: float,
        now: float,
        round_: _Round,
    ) -> None:
        """A task's status file changed: its heartbeat and step on our clock, its row."""
        watch = attempt.watch
        progress = status.progress if status is not None else None
        if status is not None and status.seq != watch.seq.get(i):
            watch.seq[i] = status.seq
            watch.seq_changed[i] = now_mono
        if progress is not None and progress.step != watch.step.get(i):
            watch.step[i] = progress.step
            watch.step_changed[i] = now_mono
        if progress is not None and progress.step > 0 and i not in watch.first_step:
            watch.first_step.add(i)
            round_.updates.setdefault(i, {})["first_step_at"] = now
        row: dict[str, object] = dict(watch.last.get(i, {}))
        if status is not None and progress is not None:
            row.update(
                trainer_pid=status.trainer_pid,
                exit_code=status.exit_code,
                epoch=progress.epoch,
                initial_epoch=progress.initial_epoch,
                step=progress.step,
                loss=progress.loss,
                steps_per_sec=progress.steps_per_sec,
                phase=progress.phase.value,
                step_signal=progress.step_signal.value,
                total_epochs=progress.epochs,
                steps_per_epoch=progress.steps_per_epoch,
                epoch_step=progress.epoch_step,
                listening=progress.listening,
                resources=status.resources,
                seq=status.seq,
            )
            # Kept every RESOURCE_SAMPLE_EVERY seconds of our clock, and stamped with it: the
            # host's own `at` may be minutes off ours, or jump.
            kept = watch.resources_kept.get(i)
            if status.resources and (kept is None or now_mono - kept >= RESOURCE_SAMPLE_EVERY):
                watch.resources_kept[i] = now_mono
                sample = ResourceSample.of(i, attempt.number, status.resources)
                round_.resources.append(dataclasses.replace(sample, ts=now))
        if row != watch.last.get(i):
            if progress is not None and progress.step != watch.last.get(i, {}).get("step"):
                round_.samples.append(
                    Sample(
                        i,
                        now,
                        attempt.number,
                        progress.epoch,
                        progress.step,
                        progress.loss,
                        progress.steps_per_sec,
                    )
                )
            watch.last[i] = row
            values = {k: v for k, v in row.items() if k not in ("seq", "state")}
            values["heartbeat_at"] = now - (now_mono - watch.seq_changed.get(i, now_mono))
            round_.updates.setdefault(i, {}).update(values)

    @staticmethod
    def unreachable(i: int, task: TaskPlan, watch: Watch) -> TaskObservation:
        last_state = watch.last.get(i, {}).get("state", TaskState.STARTING)
        return TaskObservation(
            index=i,
            state=last_state if isinstance(last_state, TaskState) else TaskState.STARTING,
            is_chief=task.is_chief,
        )


def parse_status(raw: bytes | None) -> TaskStatus | None:
    if not raw:
        return None
    try:
        return TaskStatus.from_json(raw)
    except ValueError:
        return None
