"""One supervisor tick over several hosts, with in-memory transports (no processes): every host
is read at once, and one host that fails costs only its own tasks."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import load_config
from orchestrator.errors import TransportError
from orchestrator.launcher import AgentRef
from orchestrator.logstream import LineSink
from orchestrator.plan import LaunchPlan, TaskPlan
from orchestrator.states import TaskState
from orchestrator.store import Store
from orchestrator.supervisor import Supervisor, _Group, _Watch, register_job
from orchestrator.transport.base import Transport

HOSTS = 4
DOWN = 2  # the host whose reads fail


class MemoryHost:
    """Answers reads from memory; its liveness call meets every other host's at a barrier, which
    only opens if all hosts are being read at the same time."""

    def __init__(self, index: int, barrier: threading.Barrier) -> None:
        self.index = index
        self.barrier = barrier
        self.served: set[str] = set()

    def alive_pids(self, pids: Sequence[int]) -> set[int]:
        self.barrier.wait(timeout=10)  # BrokenBarrierError (a test failure) if read one by one
        if self.index == DOWN:
            raise TransportError(f"host-{self.index}: connection reset")
        return set(pids)

    def read_file(self, path: str, offset: int = 0) -> bytes | None:
        if path.endswith(".log"):
            first = path not in self.served
            self.served.add(path)
            return f"hello from host {self.index}\n".encode() if first and offset == 0 else b""
        return None  # no status file yet: the task is starting

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a tick should not call {name}")


class MemoryBackend:
    kind = "memory"
    alive_check_interval = 0.0

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
    from orchestrator.logstream import LogTailer

    plan = LaunchPlan(
        "tick", tuple(TaskPlan(i, i, f"host-{i}", f"10.9.0.{i + 1}", 2222) for i in range(HOSTS))
    )
    group = _Group(0, plan, [AgentRef(i, i, 1000 + i) for i in range(HOSTS)])
    supervisor._tailers = {
        i: LogTailer(supervisor.backend.transport(i), str(supervisor.layout.log_path(i)))
        for i in range(HOSTS)
    }
    try:
        observations = supervisor._observe(group, _Watch(started=time.monotonic()))
    finally:
        supervisor._fanout.close()

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
    assert supervisor._alive_cache == {1000 + i for i in range(HOSTS)}
