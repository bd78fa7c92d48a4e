"""Host-loss decisions (pure: the backend is never called; the store is a file): when a host is
lost, waiting for it with backoff, a spare stepping in, shrinking past host_wait."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestrator.backends.base import TaskHandle
from orchestrator.config import ClusterConfig, parse_config
from orchestrator.config.timing import Timing
from orchestrator.logs.logstream import LineSink
from orchestrator.planning.plan import LaunchPlan, TaskPlan
from orchestrator.planning.task_specs import job_layout
from orchestrator.state.host_pool import HostRole
from orchestrator.state.job_records import register_job
from orchestrator.state.job_state import JobStateMachine
from orchestrator.state.store import Store
from orchestrator.supervision.attempt import Attempt, Watch
from orchestrator.supervision.context import SupervisionContext
from orchestrator.supervision.host_loss import PROBE_BACKOFF, Hosts, HostWaitExpired
from orchestrator.supervision.observations import FailureKind


def config(tmp_path: Path, spare: bool = False, restart: dict | None = None) -> ClusterConfig:
    hosts = [{"address": f"10.0.0.{i}", "name": f"h{i}"} for i in range(3)]
    if spare:
        hosts.append({"address": "10.0.0.9", "name": "spare", "spare": True})
    return parse_config({
        "job": {"name": "loss", "shared_dir": str(tmp_path)},
        "entrypoint": {"module": "m"},
        "backend": {"type": "ssh", "hosts": hosts},
        "supervision": {"host_timeout": 5.0, "host_wait": 60.0},
        "restart": restart or {},
    })  # fmt: skip


def hosts_for(tmp_path: Path, cfg: ClusterConfig) -> tuple[Hosts, Store, str]:
    store = Store(tmp_path / "s.db")
    job = register_job(store, cfg, str(tmp_path / "cluster.toml"))
    sink = LineSink(tmp_path / "copies", io.StringIO())
    ctx = SupervisionContext(
        store, JobStateMachine(store, job.id), cfg, None, sink,  # type: ignore[arg-type]
        job_layout(cfg, job.id), Timing.of(cfg.supervision), warm=False,
    )  # fmt: skip
    return Hosts(ctx), store, job.id


def attempt_on(hosts: tuple[int, ...], watch: Watch) -> Attempt:
    plan = LaunchPlan("loss", tuple(TaskPlan(i, h, f"h{h}", "a", 1) for i, h in enumerate(hosts)))
    return Attempt(0, plan, [TaskHandle(i, h, "1/") for i, h in enumerate(hosts)], {}, watch)


def test_a_host_is_lost_only_once_its_reads_failed_for_host_timeout(tmp_path: Path) -> None:
    hosts, _, _ = hosts_for(tmp_path, config(tmp_path))
    watch = Watch(started=0.0, host_ok={0: 100.0, 1: 100.0}, host_error={1: "reset"})
    attempt = attempt_on((0, 1, 2), watch)
    assert hosts.timing.lost_hosts((0, 1, 2), watch, 104.9) == []
    assert hosts.timing.lost_hosts((0, 1, 2), watch, 105.0) == [1]
    watch.host_ok[1] = -1e9  # failing since long before now
    decision = hosts.lost(attempt)
    assert decision is not None and decision.kind == FailureKind.HOST_LOST
    assert (decision.hosts, decision.tasks) == ((1,), (1,))
    assert "h1 unreachable for" in decision.cause and "(reset)" in decision.cause


def test_an_unreachable_host_is_waited_for_with_backoff_and_said(tmp_path: Path) -> None:
    hosts, store, job_id = hosts_for(tmp_path, config(tmp_path))
    waits = [hosts.unreachable([2]) for _ in range(6)]
    assert waits[0] == PROBE_BACKOFF[0]
    assert waits == sorted(waits) and waits[-1] == PROBE_BACKOFF[1]  # doubling up to the last
    assert hosts.pool.hosts[2].role == HostRole.LOST
    assert store.get_job(job_id).last_cause.startswith("waiting for h2: unreachable for")
    assert [e.message for e in store.events(job_id) if e.kind == "waiting"] == [
        "waiting for h2: unreachable"  # said once
    ]


def test_a_spare_steps_in_for_a_lost_host_at_once(tmp_path: Path) -> None:
    hosts, store, job_id = hosts_for(tmp_path, config(tmp_path, spare=True))
    assert hosts.for_launch() == (0, 1, 2)
    assert hosts.unreachable([2]) == 0.0  # no wait: a spare can step in
    assert hosts.for_launch() == (0, 1, 3)
    assert any("spare replaces h2" in e.message for e in store.events(job_id))


def test_past_host_wait_the_group_shrinks_to_min_workers_or_the_job_ends(
    tmp_path: Path,
) -> None:
    hosts, store, job_id = hosts_for(tmp_path, config(tmp_path, restart={"min_workers": 2}))
    hosts.pool = hosts.pool.unreachable(2, 0.0)  # lost since the epoch: past host_wait
    assert hosts.unreachable([2]) == 0.0
    assert hosts.for_launch() == (0, 1)
    assert any("going on with 2 of 3" in e.message for e in store.events(job_id))

    strict, _, _ = hosts_for(tmp_path / "strict", config(tmp_path))
    strict.pool = strict.pool.unreachable(2, 0.0)
    with pytest.raises(HostWaitExpired, match=r"restart\.min_workers unset"):
        strict.unreachable([2])
