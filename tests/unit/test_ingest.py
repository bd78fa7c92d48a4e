"""The ingest: hosts' answers turned into one observation per task, on the coordinator's clock
(pure: an answer is a value; the store is a file)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from orchestrator.backends.base import TaskHandle
from orchestrator.errors import TransportError
from orchestrator.logs.logstream import LineSink, LogTailer
from orchestrator.planning.plan import LaunchPlan, TaskPlan
from orchestrator.state.states import JobState, TaskState
from orchestrator.state.store import JobRecord, Store, TaskRecord
from orchestrator.supervision.attempt import Attempt, Watch
from orchestrator.supervision.host_poller import PollResult
from orchestrator.supervision.ingest import Ingest
from orchestrator.transport.base import Observation
from worker.spec import AgentState, Progress, TaskStatus

JOB = "unit-1"


def setup(tmp_path: Path, attempt: int = 0) -> tuple[Ingest, Attempt, Store, io.StringIO]:
    store = Store(tmp_path / "s.db")
    store.create_job(
        JobRecord(JOB, "unit", JobState.RUNNING, "local", "c", "{}", "/x", 0.0, 0.0),
        [TaskRecord(JOB, i, "worker", i, f"h{i}", f"10.0.0.{i}:1", TaskState.STARTING)
         for i in range(2)],
    )  # fmt: skip
    console = io.StringIO()
    ingest = Ingest(store, JOB, LineSink(tmp_path / "copies", console), instrumented=True)
    plan = LaunchPlan("unit", tuple(TaskPlan(i, i, f"h{i}", f"10.0.0.{i}", 1) for i in range(2)))
    tailers = {i: LogTailer(None, f"/x/{i}.log") for i in range(2)}  # type: ignore[arg-type]
    agents = [TaskHandle(i, i, f"{100 + i}/") for i in range(2)]
    return ingest, Attempt(attempt, plan, agents, tailers, Watch(started=10.0)), store, console


def answer(host: int, status: TaskStatus | None, log: bytes = b"", at: float = 11.0) -> PollResult:
    raw = None if status is None else json.dumps(status.to_dict()).encode()
    seen = Observation({host}, (log,), (raw,), ("k",))  # one task per host: task `host`
    return PollResult(host, at, (0,), seen=seen)


def running(seq: int, step: int = 0, attempt: int = 0) -> TaskStatus:
    return TaskStatus(
        AgentState.RUNNING, seq=seq, agent_pid=100, attempt=attempt, progress=Progress(step=step)
    )


def test_a_new_heartbeat_and_step_are_timed_on_our_clock_and_recorded(tmp_path: Path) -> None:
    ingest, attempt, store, _ = setup(tmp_path)
    ingest.ingest(attempt, [answer(0, running(1, step=5)), answer(1, running(1))], at=20.0)
    seen = ingest.ingest(attempt, [], at=23.0)  # nothing new for 3 s
    assert [o.heartbeat_age for o in seen] == [3.0, 3.0]
    assert [o.reached_first_step for o in seen] == [True, False]
    # Task 0 beats again at the same step: alive, but its progress ages on.
    seen = ingest.ingest(attempt, [answer(0, running(2, step=5))], at=30.0)
    assert (seen[0].heartbeat_age, seen[0].progress_age) == (0.0, 10.0)
    rows = store.tasks(JOB)
    assert rows[0].state == TaskState.RUNNING and rows[0].step == 5
    assert rows[0].first_step_at is not None and rows[1].first_step_at is None


def test_a_status_left_over_from_an_earlier_attempt_is_not_this_attempts(
    tmp_path: Path,
) -> None:
    ingest, attempt, _, _ = setup(tmp_path, attempt=2)
    [first, _] = ingest.ingest(attempt, [answer(0, running(9, step=50, attempt=1))], at=20.0)
    assert first.state == TaskState.STARTING  # agent alive, no status of attempt 2 yet
    assert not first.reached_first_step


def test_a_host_that_fails_a_read_keeps_its_tasks_last_state_and_ages(tmp_path: Path) -> None:
    ingest, attempt, _, _ = setup(tmp_path)
    ingest.ingest(attempt, [answer(1, running(1), at=20.0)], at=20.0)
    failed = PollResult(1, 21.0, (), error=TransportError("h1: connection reset"))
    seen = ingest.ingest(attempt, [failed], at=25.0)
    assert attempt.watch.host_error == {1: "connection reset"}  # its label taken off
    assert attempt.watch.host_ok == {1: 20.0}
    assert seen[1].state == TaskState.RUNNING and seen[1].heartbeat_age == 5.0


def test_log_lines_are_streamed_once_with_the_task_prefix(tmp_path: Path) -> None:
    ingest, attempt, _, console = setup(tmp_path)
    ingest.ingest(attempt, [answer(0, running(1), log=b"one\ntw")], at=20.0)
    stale = PollResult(0, 21.0, (0,), seen=Observation({0}, (b"one\ntw",), (None,), ("k",)))
    ingest.ingest(attempt, [stale], at=21.0)  # read at an offset already taken: dropped
    assert attempt.tailers[0].offset == len(b"one\ntw")
    printed = console.getvalue()
    assert printed.count("one") == 1 and "[worker-0 h0]" in printed and "tw" not in printed
