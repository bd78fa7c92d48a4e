from __future__ import annotations

from orchestrator.monitor import TaskObservation, Verdict, decide, task_state_of
from orchestrator.states import JobState, TaskState
from worker.spec import AgentState, TaskStatus

KW = {"elapsed": 5.0, "startup_deadline": 60.0, "heartbeat_timeout": 10.0}


def obs(index: int, state: TaskState, **kw) -> TaskObservation:
    return TaskObservation(index=index, state=state, is_chief=index == 0, **kw)


def test_chief_success_wins_even_if_others_still_run() -> None:
    d = decide([obs(0, TaskState.SUCCEEDED), obs(1, TaskState.RUNNING)], **KW)
    assert d.verdict == Verdict.SUCCEEDED


def test_non_chief_success_alone_is_not_success() -> None:
    d = decide(
        [
            obs(0, TaskState.RUNNING, heartbeat_age=1, reached_first_step=True),
            obs(1, TaskState.SUCCEEDED),
        ],
        **KW,
    )
    assert d.verdict == Verdict.CONTINUE


def test_any_failure_fails_the_group_naming_the_task() -> None:
    d = decide([obs(0, TaskState.RUNNING), obs(1, TaskState.FAILED, exit_code=137)], **KW)
    assert d.verdict == Verdict.FAILED
    assert d.cause == "worker-1 exited with code 137" and d.tasks == (1,)
    d = decide([obs(0, TaskState.LOST), obs(1, TaskState.RUNNING)], **KW)
    assert d.cause == "worker-0's agent is gone"


def test_silent_task_fails_after_heartbeat_timeout() -> None:
    ok = [obs(0, TaskState.RUNNING, heartbeat_age=9.9), obs(1, TaskState.RUNNING, heartbeat_age=1)]
    assert decide(ok, **KW).verdict == Verdict.CONTINUE
    silent = [
        obs(0, TaskState.RUNNING, heartbeat_age=1),
        obs(1, TaskState.RUNNING, heartbeat_age=11),
    ]
    d = decide(silent, **KW)
    assert d.verdict == Verdict.FAILED and d.tasks == (1,) and "no heartbeat" in d.cause


def test_startup_deadline_names_tasks_that_never_stepped() -> None:
    tasks = [
        obs(0, TaskState.RUNNING, heartbeat_age=1, reached_first_step=True),
        obs(1, TaskState.STARTING, heartbeat_age=1),
    ]
    assert decide(tasks, **{**KW, "elapsed": 59}).verdict == Verdict.CONTINUE
    d = decide(tasks, **{**KW, "elapsed": 61})
    assert d.verdict == Verdict.FAILED and d.tasks == (1,)
    assert "never reached the first training step: worker-1" in d.cause


def test_task_state_mapping() -> None:
    running = TaskStatus(state=AgentState.RUNNING, seq=3, agent_pid=10)
    assert task_state_of(running, agent_alive=True) == TaskState.RUNNING
    assert task_state_of(running, agent_alive=False) == TaskState.LOST
    done = TaskStatus(state=AgentState.SUCCEEDED, seq=4, agent_pid=10, exit_code=0)
    assert task_state_of(done, agent_alive=False) == TaskState.SUCCEEDED
    assert task_state_of(None, agent_alive=True) == TaskState.STARTING
    assert task_state_of(None, agent_alive=False) == TaskState.LOST


def test_terminal_sets() -> None:
    assert {s for s in TaskState if s.is_terminal()} == {
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.STOPPED,
        TaskState.LOST,
    }
    assert {s for s in JobState if s.is_terminal()} == {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.STOPPED,
    }
