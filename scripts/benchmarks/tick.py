#!/usr/bin/env python3
"""Time one supervisor tick (liveness + new log lines + status file of every task) over 1, 4
and 16 hosts of the SSH test bed, all hosts at once (what the supervisor does) and one host
after another (what it did before), against the floor: one SFTP read on one host.

    sudo uv run python -m scripts.benchmarks.tick [--hosts 1 4 16] [--ticks 30] [--delay-ms 5]

--delay-ms puts a proxy (tests/beds/delay_proxy.py) on loopback in front of each host that delays
every packet that long each way: the test bed's own round trip is ~0.2 ms, a real network's is
longer, and that is where reading hosts at once matters.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.backends import open_backend
from orchestrator.backends.base import TaskHandle
from orchestrator.config import load_config
from orchestrator.logs.logstream import LineSink, LogTailer
from orchestrator.planning.plan import LaunchPlan, TaskPlan
from orchestrator.state.job_records import register_job
from orchestrator.state.store import Store
from orchestrator.supervision.attempt import Attempt, Watch, agents_by_host
from orchestrator.supervision.supervisor import Supervisor
from scripts.benchmarks.launch import bench_config
from tests.beds import ssh as tb

DELAY_PROXY = Path(__file__).resolve().parents[2] / "tests" / "beds" / "delay_proxy.py"  # by path


def tick_times(config_path: Path, root: Path, ticks: int) -> dict[str, float]:
    config = load_config(config_path)
    store = Store(root / f"state-{config_path.stem}.db")
    job = register_job(store, config, str(config_path))
    backend = open_backend(config)
    sup = Supervisor(store, job, config, LineSink(root / "copies", None), backend)
    hosts = backend.host_count()
    plan = LaunchPlan(
        job.name, tuple(TaskPlan(i, i, f"host-{i}", f"h{i}", 2222) for i in range(hosts))
    )
    # pid 1 (handle "1/": any identity) lives on every host; the status files are absent (a
    # task still starting)
    tailers = {
        i: LogTailer(backend.transport(i), str(sup.layout.log_path(i))) for i in range(hosts)
    }
    watch = Watch(started=time.monotonic())
    group = Attempt(0, plan, [TaskHandle(i, i, "1/") for i in range(hosts)], tailers, watch)
    by_host = agents_by_host(group.agents)
    try:
        sup.tick.observe(group)  # connects every host
        at_once, one_by_one = [], []
        for _ in range(ticks):
            t0 = time.perf_counter()
            sup.tick.observe(group)
            at_once.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for agents in by_host.values():
                sup.tick.observe(Attempt(0, plan, agents, tailers, watch))
            one_by_one.append(time.perf_counter() - t0)
        transport = backend.transport(0)
        floor = []
        for _ in range(ticks):
            t0 = time.perf_counter()
            transport.read_file(str(sup.layout.status_path(0)))
            floor.append(time.perf_counter() - t0)
    finally:
        sup.tick.close()
        backend.close()
    return {
        "at_once": statistics.median(at_once),
        "one_by_one": statistics.median(one_by_one),
        "floor": statistics.median(floor),
    }


def delayed_config(
    bed: tb.Testbed, hosts: int, root: Path, delay_ms: float
) -> tuple[Path, subprocess.Popen[bytes]]:
    """The bench config with each host reached through a delaying proxy on 127.0.0.1."""
    ports = []
    for _ in range(hosts):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    routes = [f"{p}:{h.address}:22" for p, h in zip(ports, bed.hosts[:hosts], strict=True)]
    proxy = subprocess.Popen(
        [sys.executable, str(DELAY_PROXY), str(delay_ms), *routes],
        stdout=subprocess.PIPE,
    )
    assert proxy.stdout is not None and proxy.stdout.readline().strip() == b"ready"
    keys = {}
    for line in Path(bed.known_hosts).read_text().splitlines():
        address, _, key = line.partition(" ")
        keys[address] = key
    known = root / f"known_hosts-{hosts}"
    known.write_text(
        "".join(
            f"[127.0.0.1]:{p} {keys[h.address]}\n" for p, h in zip(ports, bed.hosts, strict=False)
        )
    )
    text = bench_config(bed, hosts, root).read_text()
    text = text.replace(bed.known_hosts, str(known))
    for p, h in zip(ports, bed.hosts, strict=False):
        text = text.replace(f'address = "{h.address}"\n', f'address = "127.0.0.1"\nport = {p}\n')
    path = root / f"bench-{hosts}-delayed.toml"
    path.write_text(text)
    return path, proxy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--ticks", type=int, default=30)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="added one-way delay")
    args = parser.parse_args()
    reason = tb.missing_requirements()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="orch-tick-") as tmp:
        root = Path(tmp)
        bed = tb.up(max(args.hosts), root / "bed")
        try:
            delay = f", {args.delay_ms:g} ms added each way" if args.delay_ms else ""
            print(
                f"hosts | tick, all hosts at once | one host after another | floor: 1 read{delay}"
            )
            for n in args.hosts:
                proxy = None
                if args.delay_ms:
                    config, proxy = delayed_config(bed, n, root, args.delay_ms)
                else:
                    config = bench_config(bed, n, root)
                try:
                    t = tick_times(config, root, args.ticks)
                finally:
                    if proxy is not None:
                        proxy.kill()
                        proxy.wait()
                print(
                    f"{n:>5} | {t['at_once'] * 1000:8.1f} ms ({t['at_once'] / t['floor']:.1f}x) "
                    f"| {t['one_by_one'] * 1000:8.1f} ms ({t['one_by_one'] / t['floor']:.1f}x) "
                    f"| {t['floor'] * 1000:.2f} ms"
                )
        finally:
            tb.down(root / "bed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
