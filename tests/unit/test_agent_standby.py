"""When an agent asks its keeper for the next attempt's standby (worker.warm.next_standby): only
once the trainer has trained `standby_delay` seconds (after a restart: as it trains), or as a
trainer that trained exits."""

from __future__ import annotations

import threading

import pytest

from worker.spec import Phase, WorkerSpec
from worker.warm import next_standby
from worker.warm.next_standby import AgentStandby


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _standby(
    monkeypatch: pytest.MonkeyPatch, phase: list[Phase], delay: float = 30.0, **spec: object
) -> tuple[AgentStandby, Clock, threading.Event]:
    clock = Clock()
    monkeypatch.setattr(next_standby.time, "monotonic", clock)
    fields: dict = {"warm_restart": True, "instrument": True, "standby_delay": delay, **spec}
    worker_spec = WorkerSpec(job_id="j", task_index=0, host_label="h", tf_config={},
                             argv=["python", "train.py"], workdir="/", shared_dir="/s",
                             **fields)  # fmt: skip
    stop = threading.Event()
    return AgentStandby(worker_spec, {}, lambda _: None, stop, lambda: phase[0]), clock, stop


def test_the_delay_counts_from_the_first_time_the_trainer_is_seen_training(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    phase = [Phase.JOINING]
    standby, clock, _ = _standby(monkeypatch, phase)
    clock.now += 100  # a long start: not training yet, so not due
    assert not standby.due()
    phase[0] = Phase.TRAINING
    assert not standby.due()
    clock.now += 29.9
    assert not standby.due()
    clock.now += 0.1
    assert standby.due()


def test_after_a_restart_the_next_standby_starts_as_the_trainer_trains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Faults back to back: the attempt after a restart does not wait `standby_delay`."""
    phase = [Phase.JOINING]
    standby, _, stop = _standby(monkeypatch, phase, attempt=1)
    assert not standby.due()  # not before it trains: its own first steps come first
    phase[0] = Phase.TRAINING
    assert standby.due()
    stop.set()
    assert not standby.due()  # stopping: no import beside the stop


def test_a_trainer_that_trained_gets_its_standby_as_it_exits_even_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    phase = [Phase.TRAINING]
    standby, _, stop = _standby(monkeypatch, phase, keep_standbys=600.0)
    assert not standby.due()
    stop.set()
    assert not standby.due()  # a stop never starts one while the trainer runs
    phase[0] = Phase.FINISHED
    assert standby.due(exit_code=143)


@pytest.mark.parametrize("phase", [Phase.NONE, Phase.IMPORTED, Phase.JOINED])
def test_a_trainer_that_never_trained_gets_none(
    monkeypatch: pytest.MonkeyPatch, phase: Phase
) -> None:
    standby, clock, _ = _standby(monkeypatch, [phase], delay=0.0)
    clock.now += 100
    assert not standby.due() and not standby.due(exit_code=1)


@pytest.mark.parametrize("spec", [{"warm_restart": False}, {"instrument": False}])
def test_none_without_warm_restarts_or_the_bootstrap(
    monkeypatch: pytest.MonkeyPatch, spec: dict
) -> None:
    standby, _, _ = _standby(monkeypatch, [Phase.TRAINING], delay=0.0, **spec)
    assert not standby.due() and not standby.due(exit_code=1)


def test_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    standby, _, _ = _standby(monkeypatch, [Phase.TRAINING], delay=0.0)
    monkeypatch.setattr(next_standby, "prepare_standby", lambda *a: None)
    assert standby.due()
    standby.prepare()
    assert not standby.due() and not standby.due(exit_code=1)


@pytest.mark.parametrize(
    ("code", "stopped", "keep", "due"),
    [
        (1, False, 0.0, True),  # its own failure: the restart takes it
        (0, False, 0.0, False),  # succeeded, nothing kept: no next attempt, no next job
        (143, True, 0.0, False),  # stopped, nothing kept
        (0, False, 600.0, True),  # kept for the user's next job
        (143, True, 600.0, True),
    ],
)
def test_at_its_exit_only_for_a_restart_after_its_failure_or_for_keeping(
    monkeypatch: pytest.MonkeyPatch, code: int, stopped: bool, keep: float, due: bool
) -> None:
    standby, _, stop = _standby(monkeypatch, [Phase.TRAINING], keep_standbys=keep)
    if stopped:
        stop.set()
    assert standby.due(exit_code=code) is due
