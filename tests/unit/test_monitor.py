from __future__ import annotations

from orchestrator.state.states import JobState, TaskState
from orchestrator.supervision.monitor import decide, task_state_of
from orchestrator.supervision.observations import FailureKind, TaskObservation, Verdict, failure
from orchestrator.supervision.restart_policy import plan_restart
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
    assert "startup deadline of 60s passed" in d.cause


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


def test_watchdog_fires_only_while_training_after_the_first_step() -> None:
    from worker.spec import Phase

    kw = {**KW, "progress_timeout": 8.0}
    hung = obs(
        1,
        TaskState.RUNNING,
        heartbeat_age=0.5,
        progress_age=9,
        phase=Phase.TRAINING,
        reached_first_step=True,
    )
    ok = obs(
        0,
        TaskState.RUNNING,
        heartbeat_age=0.5,
        progress_age=1,
        phase=Phase.TRAINING,
        reached_first_step=True,
    )
    d = decide([ok, hung], **kw)
    assert d.verdict == Verdict.FAILED and d.kind == FailureKind.HUNG and d.tasks == (1,)
    assert d.cause == "no training progress for 8s from worker-1 (steps not observed)"
    saving = obs(
        1,
        TaskState.RUNNING,
        heartbeat_age=0.5,
        progress_age=30,
        phase=Phase.FINISHED,
        reached_first_step=True,
    )
    assert decide([ok, saving], **kw).verdict == Verdict.CONTINUE
    assert decide([ok, hung], **{**kw, "progress_timeout": 0}).verdict == Verdict.CONTINUE


def test_startup_deadline_names_the_task_that_never_reported_first() -> None:
    from worker.spec import Phase

    waiting = obs(0, TaskState.RUNNING, heartbeat_age=1, phase=Phase.JOINING)
    silent = obs(1, TaskState.RUNNING, heartbeat_age=1, phase=Phase.NONE)
    loading = obs(2, TaskState.RUNNING, heartbeat_age=1, phase=Phase.STARTING)
    d = decide([waiting, silent, loading], **{**KW, "elapsed": 61})
    assert d.kind == FailureKind.STARTUP and d.tasks == (1,)
    assert d.cause.endswith(
        "never reported: worker-1; starting: worker-2; waiting for peers: worker-0"
    )
    # Nobody silent: the ones still starting (importing TensorFlow) are named first.
    d = decide([waiting, loading], **{**KW, "elapsed": 61})
    assert d.tasks == (2,)
    assert d.cause.endswith("starting: worker-2; waiting for peers: worker-0")


def test_restart_policy() -> None:
    from orchestrator.config import RestartSection

    policy = RestartSection(
        max_restarts=2,
        backoff=1.0,
        backoff_max=1.5,
        retryable_exit_codes=[137],
        preemption_exit_code=42,
    )
    crash = failure(FailureKind.EXITED, "worker-1 exited with code 137", (1,), 137)
    first = plan_restart(crash, policy, 0, False)
    assert (first.restart, first.counts, first.delay, first.in_a_row) == (True, True, 1.0, 1)
    second = plan_restart(crash, policy, 1, False, (first.in_a_row, 5.0))
    assert (second.delay, second.in_a_row) == (1.5, 2)  # doubled, capped
    assert not plan_restart(crash, policy, 2, False).restart  # max_restarts reached
    usage = failure(FailureKind.EXITED, "worker-0 exited with code 2", (0,), 2)
    assert plan_restart(usage, policy, 0, False).reason == "exit code 2 is not retryable"
    preempted = failure(FailureKind.EXITED, "worker-0 exited with code 42", (0,), 42)
    plan = plan_restart(preempted, policy, 2, False)  # even with no restarts left
    assert plan.restart and not plan.counts
    lost = failure(FailureKind.LOST, "worker-1's agent is gone", (1,))
    assert plan_restart(lost, policy, 0, False).restart  # always retryable
    late = failure(FailureKind.STARTUP, "startup deadline", (1,))
    assert not plan_restart(late, policy, 0, False).restart
    assert plan_restart(late, policy, 0, True).restart


def test_watchdog_names_the_signal_that_went_still() -> None:
    from worker.spec import Phase, StepSignal

    def training(i: int, signal: StepSignal, age: float) -> TaskObservation:
        return obs(i, TaskState.RUNNING, heartbeat_age=0.5, progress_age=age,
                   phase=Phase.TRAINING, reached_first_step=True, step_signal=signal)  # fmt: skip

    d = decide(
        [
            training(0, StepSignal.KERAS, 30),
            training(1, StepSignal.OPTIMIZER, 30),
            training(2, StepSignal.KERAS, 30),
            training(3, StepSignal.KERAS, 1),
        ],
        **{**KW, "progress_timeout": 20.0},
    )
    assert d.kind == FailureKind.HUNG and d.tasks == (0, 1, 2)
    assert d.cause == (
        "no training progress for 20s from worker-0, worker-2 (Keras fit steps); "
        "worker-1 (optimizer iterations)"
    )


def test_startup_deadline_judges_only_what_it_can_see() -> None:
    from worker.spec import Phase, StepSignal

    late = {**KW, "elapsed": 61}
    # Past the rendezvous with no step signal (a custom loop without a Keras optimizer): the
    # rendezvous is the bar, and it was met.
    unobserved = obs(0, TaskState.RUNNING, heartbeat_age=1, phase=Phase.JOINED)
    assert decide([unobserved], **late).verdict == Verdict.CONTINUE
    # With a step signal, the first step is the bar.
    observed = obs(0, TaskState.RUNNING, heartbeat_age=1, phase=Phase.JOINED,
                   step_signal=StepSignal.OPTIMIZER)  # fmt: skip
    d = decide([observed], **late)
    assert d.kind == FailureKind.STARTUP and d.cause.endswith("no first step: worker-0")
    # TensorFlow imported, the strategy not created yet: named before the ones waiting for it.
    waiting = obs(0, TaskState.RUNNING, heartbeat_age=1, phase=Phase.JOINING)
    loading = obs(1, TaskState.RUNNING, heartbeat_age=1, phase=Phase.IMPORTED)
    d = decide([waiting, loading], **late)
    assert d.tasks == (1,)
    assert d.cause.endswith("before the rendezvous: worker-1; waiting for peers: worker-0")
    # Uninstrumented, a plain script reports nothing: running is all that can be judged...
    plain = obs(0, TaskState.RUNNING, heartbeat_age=1, instrumented=False)
    assert decide([plain], **late).verdict == Verdict.CONTINUE
    # ...but under the bootstrap, a trainer that never reported is named.
    silent = obs(0, TaskState.RUNNING, heartbeat_age=1)
    assert decide([silent], **late).cause.endswith("never reported: worker-0")


def test_the_backoff_starts_over_after_a_healthy_stretch() -> None:
    """Doubling with each counted restart in a row; an attempt that ran backoff_reset seconds
    ends the row (the budget, max_restarts, is not given back); a preemption leaves it."""
    from orchestrator.config import RestartSection

    policy = RestartSection(max_restarts=10, backoff=2.0, backoff_max=100.0, backoff_reset=600.0)
    crash = failure(FailureKind.EXITED, "worker-1 exited with code 1", (1,), 1)
    row, delays = 0, []
    for counted, ran_for in enumerate([5.0, 30.0, 599.0, 600.0, 1.0, 3600.0]):
        plan = plan_restart(crash, policy, counted, False, (row, ran_for))
        delays.append(plan.delay)
        row = plan.in_a_row
    assert delays == [2.0, 4.0, 8.0, 2.0, 4.0, 2.0]
    preempted = failure(FailureKind.EXITED, "worker-0 exited with code 42", (0,), 42)
    assert plan_restart(preempted, policy, 3, False, (3, 1.0)).in_a_row == 3
    never = RestartSection(backoff=2.0, backoff_max=100.0, backoff_reset=0.0)
    assert plan_restart(crash, never, 2, False, (2, 1e6)).delay == 8.0  # 0: never reset
