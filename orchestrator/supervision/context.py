"""What every part of one job's supervision shares, each thing decided once for the job: its
store and state machine, its config, its backend, where its lines go, its directory layout,
its rules about time, and whether its restarts may be warm."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.backends import Backend
from orchestrator.config import ClusterConfig
from orchestrator.config.timing import Timing
from orchestrator.logs.logstream import LineSink
from orchestrator.planning.task_specs import job_layout, warm_restarts
from orchestrator.state.job_state import JobStateMachine
from orchestrator.state.store import Store
from worker.spec import JobLayout


@dataclass(frozen=True)
class SupervisionContext:
    store: Store
    job_state: JobStateMachine  # the only writer of the job's state and cause
    config: ClusterConfig
    backend: Backend
    sink: LineSink
    layout: JobLayout
    timing: Timing
    warm: bool  # a task's next attempt may start in a standby (the config and the backend agree)

    @property
    def job_id(self) -> str:
        return self.job_state.job_id

    @classmethod
    def of(
        cls, store: Store, job_id: str, config: ClusterConfig, backend: Backend, sink: LineSink
    ) -> SupervisionContext:
        return cls(
            store=store,
            job_state=JobStateMachine(store, job_id),
            config=config,
            backend=backend,
            sink=sink,
            layout=job_layout(config, job_id),
            timing=Timing.of(config.supervision),
            warm=warm_restarts(config, backend),
        )
