#!/usr/bin/env python3
"""Launch fan-out on the namespaced SSH test bed, against a raw paramiko fan-out in the same run.

    sudo .venv/bin/python -m scripts.benchmarks.launch --hosts 1 3 --repeat 5

For each host count it times, in this process: preflight (every host probed in parallel, the
shared-directory token round included), then the start of every agent (spec pushed on the start
command's stdin, agent detached), and the coordinator's CPU time over both. The baseline is the
least a launcher can do: threads + paramiko on a TCP_NODELAY socket, per host one exec that
writes a 1 KB file from stdin and starts a detached process. Agents run a stand-in trainer that
sleeps; they are stopped (untimed) after each round. Prints medians with min-max.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator.backends import open_backend
from orchestrator.backends.agents import start_agents
from orchestrator.backends.preflight import preflight
from orchestrator.config import load_config
from orchestrator.planning.plan import plan_on_hosts
from orchestrator.planning.task_specs import make_specs
from tests.beds import ssh as tb

REPO = Path(__file__).resolve().parents[2]

FAKE = REPO / "tests" / "fixtures" / "fake_trainer.py"


def bench_config(bed: tb.Testbed, hosts: int, root: Path) -> Path:
    text = Path(bed.cluster_toml).read_text()
    text = text.replace('module = "worker.examples.digits"', f'script = "{FAKE}"')
    text = text.replace('args = ["--epochs", "8"]', 'args = ["--mode", "sleep"]')
    head, _, _ = text.partition("[[backend.hosts]]")
    body = "".join(
        f'[[backend.hosts]]\naddress = "{h.address}"\nname = "{h.name}"\n\n'
        for h in bed.hosts[:hosts]
    )
    path = root / f"bench-{hosts}.toml"
    path.write_text(head + body)
    return path


def orchestrate_round(config_path: Path, job: str) -> dict[str, float]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    cfg = load_config(config_path)
    backend = open_backend(cfg)
    reports = preflight(cfg, backend, job)
    t1 = time.perf_counter()
    plan = plan_on_hosts(cfg, {h: r.ports for h, r in reports.items()}, {})
    specs = make_specs(cfg, plan, job, 0, backend)
    agents = start_agents(backend, plan, specs, stop_grace=2.0)
    t2 = time.perf_counter()
    cpu = time.process_time() - cpu0
    backend.stop_agents(agents, 2.0)
    backend.close()
    return {"preflight": t1 - t0, "start": t2 - t1, "launch": t2 - t0, "cpu": cpu}


def raw_round(bed: tb.Testbed, hosts: int, root: Path) -> dict[str, float]:
    import shlex
    import socket

    import paramiko

    payload = b"x" * 1024
    started: list[tuple[paramiko.SSHClient, int]] = []

    def one(i: int) -> None:
        host = bed.hosts[i]
        sock = socket.create_connection((host.address, 22), 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = paramiko.SSHClient()
        client.load_host_keys(bed.known_hosts)
        client.connect(host.address, username="root", key_filename=bed.identity_file, sock=sock,
                       allow_agent=False, look_for_keys=False)  # fmt: skip
        target = shlex.quote(str(root / f"raw-{i}.bin"))
        command = f"cat > {target}; setsid nohup sleep 300 </dev/null >/dev/null 2>&1 & echo $!"
        stdin, stdout, _ = client.exec_command(command)
        stdin.write(payload)
        stdin.channel.shutdown_write()
        started.append((client, int(stdout.read().strip())))

    cpu0, t0 = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=hosts) as pool:
        list(pool.map(one, range(hosts)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    for client, pid in started:
        client.exec_command(f"kill {pid}")[1].read()
        client.close()
    return {"launch": wall, "cpu": cpu}


def summarize(rounds: list[dict[str, float]], key: str) -> str:
    values = sorted(r[key] for r in rounds)
    low, mid, high = values[0] * 1000, statistics.median(values) * 1000, values[-1] * 1000
    return f"{mid:7.1f} ms ({low:.0f}-{high:.0f})"


def measure(repeat: int, action: Callable[[int], dict[str, float]]) -> list[dict[str, float]]:
    action(-1)  # warm-up: imports, first connections' key loading
    return [action(n) for n in range(repeat)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    reason = tb.missing_requirements()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        root = Path(tmp)
        bed = tb.up(max(args.hosts), root / "bed")
        try:
            headers = [
                f"{'hosts':>5}",
                f"{'orchestrate launch':>26}",
                f"{'preflight':>24}",
                f"{'agent start':>24}",
                f"{'CPU/host':>9}",
                f"{'raw fan-out':>24}",
                f"{'raw CPU/host':>12}",
                "ratio",
            ]
            print(" | ".join(headers))
            for n in args.hosts:
                cfg = bench_config(bed, n, root)
                ours = measure(
                    args.repeat, lambda k, cfg=cfg, n=n: orchestrate_round(cfg, f"bench-{n}-{k}")
                )
                raw = measure(args.repeat, lambda k, n=n: raw_round(bed, n, root))
                cpu_per_host = statistics.median(r["cpu"] for r in ours) / n * 1000
                ratio = statistics.median(r["launch"] for r in ours) / statistics.median(
                    r["launch"] for r in raw
                )
                cells = [
                    f"{n:>5}",
                    f"{summarize(ours, 'launch'):>26}",
                    f"{summarize(ours, 'preflight'):>24}",
                    f"{summarize(ours, 'start'):>24}",
                    f"{cpu_per_host:6.1f} ms",
                    f"{summarize(raw, 'launch'):>24}",
                    f"{statistics.median(r['cpu'] for r in raw) / n * 1000:9.1f} ms",
                    f"{ratio:.2f}x",
                ]
                print(" | ".join(cells))
        finally:
            tb.down(root / "bed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
