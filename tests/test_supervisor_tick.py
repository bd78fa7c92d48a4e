"""One supervisor tick over several hosts, with in-memory transports (no processes): every host
is read at once, in one call each, and one host that fails costs only its own tasks."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.agents import AgentTasks, agent_handle
from orchestrator.backends.capabilities import Capabilities
from orchestrator.config import load_config
from orchestrator.config.timing import Timing
from orchestrator.errors import TransportError
from orchestrator.logs.logstream import LineSink
from orchestrator.planning.plan import LaunchPlan, TaskPlan
from orchestrator.state.job_records import register_job
from orchestrator.state.states import TaskState
from orchestrator.state.store import Store
from orchestrator.supervision.attempt import Attempt
from orchestrator.supervision.host_poller import PollResult
from orchestrator.supervision.observations import FailureKind
from orchestrator.supervision.supervisor import Supervisor
from orchestrator.transport.base import Observation, ProcessRef, Transport
from orchestrator.transport.local import LocalTransport
from worker import proctl
from worker.spec import AgentState, TaskStatus

HOSTS = 4
DOWN = 2  # the host whose reads fail


class MemoryHost:
    """Answers a tick's reads from memory; each call first meets every other host's at a
    barrier, which only opens if all hosts are being read at the same time."""

    def __init__(self, index: int, barrier: threading.Barrier) -> None:
        self.index = index
        self.barrier = barrier
        self.calls = 0
        self.status: bytes | None = None  # the agent's status file, once it has one
        self.hang = 0.0  # seconds the down host takes to fail

    def observe(
        self,
        procs: Sequence[ProcessRef] | None,
        files: Sequence[tuple[str, int]],
        timeout: float | None = None,
        contact: Sequence[int] = (),
        watching: Any = None,
    ) -> Observation:
        self.calls += 1
        self.contact = list(contact)
        self.barrier.wait(timeout=10)  # BrokenBarrierError (a test failure) if read one by one
        if self.index == DOWN:
            time.sleep(self.hang)
            raise TransportError(f"host-{self.index}: connection reset")
        data: list[bytes | None] = []
        for path, offset in files:
            if path.endswith(".log"):
                data.append(f"hello from host {self.index}\n".encode()[offset:])
            else:
                data.append(self.status)  # None: no status file yet, the task is starting
        return Observation(None if procs is None else {p.pid for p in procs}, tuple(data))

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a tick should not call {name}")


class MemoryBackend(AgentTasks):
    kind = "memory"
    capabilities = Capabilities(warm_restarts=False)

    def __init__(self) -> None:
        barrier = threading.Barrier(HOSTS)
        self.hosts = [MemoryHost(i, barrier) for i in range(HOSTS)]

    def host_count(self) -> int:
        return HOSTS

    def transport(self, host_index: int) -> Transport:
        return self.hosts[host_index]  # type: ignore[return-value]

    def python(self, host_index: int) -> str:
        return "python3"

    def close(self) -> None:
        pass


def one_task_per_host(supervisor: Supervisor, pids: list[tuple[int, str]] | None = None) -> Attempt:
    from orchestrator.logs.logstream import LogTailer

    plan = LaunchPlan(
        "tick", tuple(TaskPlan(i, i, f"host-{i}", f"10.9.0.{i + 1}", 2222) for i in range(HOSTS))
    )
    tailers = {
        i: LogTailer(supervisor.backend.transport(i), str(supervisor.layout.log_path(i)))
        for i in range(HOSTS)
    }
    pids = pids or [(1000 + i, "") for i in range(HOSTS)]
    return Attempt(0, plan, [agent_handle(i, i, ProcessRef(pid, ident)) for i, (pid, ident) in enumerate(pids)],
                   tailers)  # fmt: skip


@pytest.fixture
def supervisor(tmp_path: Path, home: Path) -> Supervisor:
    hosts = "".join(f'[[backend.hosts]]\naddress = "10.9.0.{i + 1}"\n' for i in range(HOSTS))
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[job]\nname = "tick"\nshared_dir = "{tmp_path}"\n'
        f'[entrypoint]\nmodule = "m"\n[backend]\ntype = "ssh"\n{hosts}'
    )
    config = load_config(path)
    store = Store()
    job = register_job(store, config, str(path))
    sink = LineSink(tmp_path / "copies", console=None)
    return Supervisor(store, job, config, sink, backend=MemoryBackend())


def test_a_tick_reads_every_host_at_once_and_a_failing_host_costs_only_its_tasks(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    group = one_task_per_host(supervisor)
    try:
        observations = supervisor.tick.observe(group)
    finally:
        supervisor.tick.close()

    assert [o.index for o in observations] == list(range(HOSTS))
    for o in observations:
        assert o.state == TaskState.STARTING  # the down host's task too: not proof of death
    copies = tmp_path / "copies"
    for i in range(HOSTS):
        log = copies / f"worker-{i}.log"
        if i == DOWN:  # its reads never ran this tick; the next tick retries
            assert not log.exists() or b"hello" not in log.read_bytes()
        else:
            assert log.read_bytes().count(f"hello from host {i}".encode()) == 1
    assert [h.calls for h in supervisor.backend.hosts] == [1] * HOSTS  # type: ignore[attr-defined]


def test_a_slow_host_does_not_age_the_heartbeats_of_the_hosts_read_beside_it(
    supervisor: Supervisor,
) -> None:
    """Regression: the tick's clock was read after the reads, so a host that took seconds to
    fail made every other task look silent for as long."""
    group = one_task_per_host(supervisor)
    hosts = supervisor.backend.hosts  # type: ignore[attr-defined]
    for host in hosts:
        status = TaskStatus(AgentState.RUNNING, seq=1, agent_pid=1000 + host.index)
        host.status = json.dumps(status.to_dict()).encode()
    hang = 2.0
    try:
        before_first = time.monotonic()
        supervisor.tick.observe(group)  # every healthy task's heartbeat seen now
        hosts[DOWN].hang = hang
        observations = supervisor.tick.observe(group)  # no new heartbeat: the same seq
        after_second = time.monotonic()
    finally:
        supervisor.tick.close()
    # The heartbeats were seen after `before_first`; a clock read before the reads is at most
    # `after_second - hang` (the down host's read ends at least `hang` after it). So an age
    # taken before the reads is at most that difference however slowly this machine runs, and
    # one taken after them (the bug) is at least `hang` more.
    bound = after_second - hang - before_first
    for o in observations:
        assert o.heartbeat_age is not None
        if o.index != DOWN:
            assert o.state == TaskState.RUNNING
            assert o.heartbeat_age <= bound, (o, bound)  # order: not aged by the slow read


def test_a_host_whose_reads_fail_for_host_timeout_is_lost_and_only_that_host(
    supervisor: Supervisor,
) -> None:
    group = one_task_per_host(supervisor)
    supervisor.tick.timing = supervisor.hosts.timing = Timing(host_timeout=0.5)
    try:
        supervisor.tick.observe(group)
        assert supervisor.hosts.lost(group) is None  # one failed read is not a loss
        time.sleep(0.6)
        supervisor.tick.observe(group)
        decision = supervisor.hosts.lost(group)
    finally:
        supervisor.tick.close()
    assert decision is not None and decision.kind == FailureKind.HOST_LOST
    assert decision.hosts == (DOWN,) and decision.tasks == (DOWN,)
    assert "unreachable for" in decision.cause and "connection reset" in decision.cause
    hosts = supervisor.backend.hosts  # type: ignore[attr-defined]
    assert hosts[0].contact == [1000]  # every read tells the host's agents they are reached


class CountingLocal(LocalTransport):
    """This machine as a host, counting the reads the supervisor makes of it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[float] = []

    def observe(self, *args: Any, **kwargs: Any) -> Observation:
        seen = super().observe(*args, **kwargs)
        self.reads.append(time.monotonic())
        return seen


class LocalHosts(MemoryBackend):
    def __init__(self) -> None:
        self.hosts = [CountingLocal() for _ in range(HOSTS)]  # type: ignore[misc]


def test_a_quiet_host_is_read_once_per_keepalive_and_a_death_on_it_is_seen_at_once(
    tmp_path: Path, home: Path
) -> None:
    """While a group is watched each host is long-polled. A host with nothing new
    (here: agents that are real processes, status files that do not change) answers once per
    keep-alive however often the supervisor decides (poll_interval 0.05 s here); an agent
    that dies on such a host is seen at once, well within one keep-alive."""
    keepalive = 2.0
    hosts = "".join(f'[[backend.hosts]]\naddress = "10.9.0.{i + 1}"\n' for i in range(HOSTS))
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[job]\nname = "quiet"\nshared_dir = "{tmp_path}"\n'
        f"[supervision]\nkeepalive = {keepalive}\npoll_interval = 0.05\n"
        f'[entrypoint]\nmodule = "m"\n[backend]\ntype = "ssh"\n{hosts}'
    )
    config = load_config(path)
    store = Store()
    job = register_job(store, config, str(path))
    backend = LocalHosts()
    supervisor = Supervisor(store, job, config, LineSink(tmp_path / "copies", None), backend)
    layout = supervisor.layout
    procs = []
    try:
        for i in range(HOSTS):
            procs.append(
                backend.hosts[i].start_detached(  # type: ignore[attr-defined]
                    [sys.executable, "-c", "import time; time.sleep(60)"],
                    log_path=str(layout.log_path(i)),
                )
            )
            status = TaskStatus(AgentState.RUNNING, seq=1, agent_pid=procs[i].pid)
            Path(layout.status_path(i)).parent.mkdir(parents=True, exist_ok=True)
            Path(layout.status_path(i)).write_text(json.dumps(status.to_dict()))
        group = one_task_per_host(supervisor, [(p.pid, p.ident) for p in procs])
        supervisor.tick.begin(group)
        begun = time.monotonic()
        while time.monotonic() - begun < 2.0:  # each host's first answer: at once
            states = {o.state for o in supervisor.tick.next(group, 0.05)}
            if states == {TaskState.RUNNING}:
                break
        assert states == {TaskState.RUNNING}
        # Watch until every host has given two keep-alive answers after its first one.
        rounds = 0
        reads_of = [host.reads for host in backend.hosts]  # type: ignore[attr-defined]
        while min(len(reads) for reads in reads_of) < 3:
            observations = supervisor.tick.next(group, 0.05)
            rounds += 1
            assert all(o.state == TaskState.RUNNING for o in observations)
        for reads in reads_of:
            # The first answer at once (nothing known yet), then one per keep-alive, never
            # sooner: a quiet host is not read every poll_interval.
            gaps = [b - a for a, b in itertools.pairwise(reads[1:])]
            assert all(g >= keepalive * 0.9 for g in gaps), gaps  # order: never sooner
        # The supervisor decided every poll_interval all the while, far more often than the
        # hosts answered.
        assert rounds > 4 * sum(len(reads) for reads in reads_of), (rounds, reads_of)

        # A death is answered by the next read, not held for the keep-alive: kill right after
        # host 1 answered, and the answer that reports it must come before that host's next
        # keep-alive would have.
        answered = len(reads_of[1])
        while len(reads_of[1]) == answered:
            observations = supervisor.tick.next(group, 0.05)
        os.kill(procs[1].pid, signal.SIGKILL)
        keepalive_due = reads_of[1][-1] + keepalive * 0.9  # no keep-alive answer is sooner
        while not observations[1].state.is_terminal():
            observations = supervisor.tick.next(group, 0.05)
        assert observations[1].state == TaskState.LOST, observations[1]
        assert reads_of[1][-1] < keepalive_due, reads_of[1]  # order: before the keep-alive
        assert observations[0].state == TaskState.RUNNING
    finally:
        supervisor.tick.close()
        for proc in procs:
            proctl.stop_group(proc.pid, 0.5, proc.ident)


def test_a_round_ends_and_decides_however_fast_answers_come(supervisor: Supervisor) -> None:
    """Regression (256 hosts, every one answering five times a second, on 2 cores): a round
    took answers until the queue was empty, which it never was, and so never decided."""
    group = one_task_per_host(supervisor)
    tick = supervisor.tick
    tick._pollers = [object()] * HOSTS  # type: ignore[list-item]
    quiet = Observation({1000}, (b"",), (None,), ("",), urgent=False)

    def flood(stop: threading.Event) -> None:
        while not stop.is_set():
            tick._answers.put(PollResult(0, time.monotonic(), (0,), seen=quiet))

    stop = threading.Event()
    flooders = [threading.Thread(target=flood, args=(stop,)) for _ in range(4)]
    for flooder in flooders:
        flooder.start()
    try:
        # The old code never returns here: run the round in a thread and wait for it (the
        # wait is a cap on a hang, not a speed claim).
        decided: list[list[Any]] = []
        rounder = threading.Thread(
            target=lambda: decided.append(tick.next(group, 0.1)),
            daemon=True,
        )
        rounder.start()
        rounder.join(60)
        still_flooded = rounder.is_alive()
    finally:
        stop.set()
        for flooder in flooders:
            flooder.join()
        rounder.join(10)
        tick._pollers = []
        tick.close()
    assert not still_flooded, "the round did not end while answers kept coming"
    [observations] = decided
    assert [o.index for o in observations] == list(range(HOSTS))
