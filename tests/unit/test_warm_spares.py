"""Which standbys a spare host is asked to keep, how often it is told, and what is said about
it (orchestrator/supervision/warm_spares.py), with a backend that records the visits. That the
spare's standby is made and taken is shown for real in tests/test_standby.py and test_ssh.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from orchestrator.errors import TransportError
from orchestrator.supervision.warm_spares import WarmSpares
from tests.conftest import wait_for
from worker.spec import WorkerSpec


def spec(task: int, host: str) -> WorkerSpec:
    return WorkerSpec(
        job_id="j", task_index=task, host_label=host, tf_config={}, argv=["python", "t.py"],
        workdir="/w", shared_dir="/s", warm_restart=True, standby_linger=3.0,
    )  # fmt: skip


class Visits:
    """The backend's side: each visit's host and tasks; host 3 does not answer."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, tuple[int, ...]]] = []
        self.lock = threading.Lock()

    def keep_spare_warm(self, host_index: int, specs: Sequence[WorkerSpec]) -> None:
        with self.lock:
            self.seen.append((host_index, tuple(s.task_index for s in specs)))
        if host_index == 3:
            raise TransportError("h3: connection refused")


def test_each_spare_is_visited_with_the_busiest_hosts_tasks_and_said_once() -> None:
    visits = Visits()
    spares: tuple[int, ...] = (2, 3)
    warm = WarmSpares(visits, lambda: spares, ["h0", "h1", "h2", "h3"])  # type: ignore[arg-type]
    try:
        warm.launched([spec(0, "h0"), spec(1, "h1"), spec(2, "h1")])
        assert wait_for(lambda: {h for h, _ in visits.seen} == {2, 3}, 10)
        assert {tasks for _, tasks in visits.seen} == {(1, 2)}  # h1's two tasks
        said: list[str] = []
        assert wait_for(lambda: said.extend(warm.said()) or len(said) >= 2, 10)
        assert sorted(said) == [
            "h2 keeps 2 standby(s) warm as a spare",
            "h3: no standby kept as a spare: connection refused",
        ]
        # Visits go on (every third of the linger), said no more; a spare taken into the group
        # is visited no more.
        spares = (3,)
        count = len(visits.seen)
        assert wait_for(lambda: len(visits.seen) >= count + 2, 10)
        assert warm.said() == []
        assert visits.seen[-1][0] == 3
    finally:
        warm.close()
    count = len(visits.seen)
    warm.launched([spec(0, "h0")])  # after the close: nothing
    assert len(visits.seen) == count


def test_no_spare_no_visit() -> None:
    visits = Visits()
    warm = WarmSpares(visits, lambda: (), ["h0"])  # type: ignore[arg-type]
    try:
        warm.launched([spec(0, "h0")])
        time.sleep(1.5)  # longer than a round: a visit would have come
        assert visits.seen == []
    finally:
        warm.close()
