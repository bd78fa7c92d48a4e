"""scripts/bench.py's measurements of the coordinator's side: SSH fan-out and the supervisor's
memory on the test bed (P1, P7b), `status` over a full store (P6), the agent's and the
trainer's memory (P7a), and a 1,000-host dry run (P8)."""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from scripts.benchmarks.measure import (
    PY,
    REPO,
    TRAINER,
    launch_and_watch_peak,
    local_config,
    orch_env,
    peak_rss_kb,
    processes_running,
)
from scripts.benchmarks.rows import Row

# --- P1 and P7 (supervisor): SSH test bed ---------------------------------------------------

P1_CPU_PER_HOST_MS = 10.0  # P1's second condition: the coordinator's CPU per host


def ssh_rows(root: Path, hosts: list[int], repeat: int, p1: Row, p7s: Row) -> None:
    from scripts.benchmarks.launch import bench_config, orchestrate_round, raw_round
    from tests.beds import ssh as tb

    reason = tb.missing_requirements()
    if reason:
        p1.skipped = p7s.skipped = f"no SSH test bed: {reason}"
        return
    bed = tb.up(max(hosts), root / "bed")
    try:
        per_host = {}
        for n in hosts:
            cfg = bench_config(bed, n, root)
            # Interleaved: a raw round, then ours, so drift hits both alike (after one warm-up
            # each: imports, the first connections' key loading).
            orchestrate_round(cfg, f"b{n}-warm")
            raw_round(bed, n, root)
            raw, ours = [], []
            for k in range(repeat):
                raw.append(raw_round(bed, n, root))
                ours.append(orchestrate_round(cfg, f"b{n}-{k}"))
            per_host[n] = {
                "launch": [r["launch"] for r in ours],
                "preflight": [r["preflight"] for r in ours],
                "start": [r["start"] for r in ours],
                "cpu_per_host_ms": [r["cpu"] / n * 1000 for r in ours],
                "raw": [r["launch"] for r in raw],
                "raw_cpu_per_host_ms": [r["cpu"] / n * 1000 for r in raw],
            }
        top = max(hosts)
        p1.values = per_host[top]["launch"]
        p1.baseline = per_host[top]["raw"]
        cpu = statistics.median(per_host[top]["cpu_per_host_ms"])
        p1.note = "; ".join(
            f"{n} host(s): {statistics.median(v['launch']) * 1000:.0f} ms "
            f"(preflight {statistics.median(v['preflight']) * 1000:.0f}, start "
            f"{statistics.median(v['start']) * 1000:.0f}) vs raw "
            f"{statistics.median(v['raw']) * 1000:.0f} ms, CPU "
            f"{statistics.median(v['cpu_per_host_ms']):.1f} ms/host (raw "
            f"{statistics.median(v['raw_cpu_per_host_ms']):.1f})"
            for n, v in per_host.items()
        )
        p1.note += f"; coordinator CPU at {top} hosts: {cpu:.1f} ms/host (target <= 10)"
        p1.also_met = cpu <= P1_CPU_PER_HOST_MS

        # The supervisor of a whole job on every host: its peak RSS while it runs.
        config = bench_config(bed, top, root)
        text = config.read_text().replace('args = ["--mode", "sleep"]', 'args = ["--mode", "ok"]')
        config.write_text(text)
        peak, code = launch_and_watch_peak(config, root / "home-ssh", lambda proc: [proc.pid])
        p7s.values = [peak]
        p7s.note = f"supervisor of {top} SSH hosts; exit {code}"
    finally:
        tb.down(root / "bed")


# --- P6 / P7 (agent) / P8: cheap ones --------------------------------------------------------


def status_with_store(root: Path, runs: int) -> list[float]:
    from orchestrator.state.states import JobState, TaskState
    from orchestrator.state.store import JobRecord, Store, TaskRecord

    home = root / "home-status"
    store = Store(home / "state.db")
    now = time.time()
    for j in range(20):
        job_id = f"bench-{j:02d}"
        store.create_job(
            JobRecord(
                job_id,
                "bench",
                JobState.SUCCEEDED,
                "ssh",
                "c.toml",
                "{}",
                "/x",
                now - 1000 + j,
                now,
            ),
            [
                TaskRecord(
                    job_id,
                    i,
                    "worker",
                    i,
                    f"h{i}",
                    f"10.0.0.{i}:2222",
                    TaskState.SUCCEEDED,
                    epoch=10,
                    step=1000,
                    loss=0.1,
                    heartbeat_at=now,
                )
                for i in range(16)
            ],
        )
    store.close()
    times = []
    for _ in range(runs + 1):
        t0 = time.perf_counter()
        subprocess.run(
            [PY, "-m", "orchestrator", "status", "--limit", "20"],
            env=orch_env(home),
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        times.append(time.perf_counter() - t0)
    return times[1:]


def agent_rss(root: Path) -> float:
    from worker.spec import WorkerSpec

    spec = WorkerSpec(
        job_id="rss",
        task_index=0,
        host_label="local",
        tf_config={"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}},
        argv=[PY, "-c", "import time; time.sleep(2)"],
        workdir=str(root),
        shared_dir=str(root / "rss"),
    )
    path = root / "rss-spec.json"
    path.write_text(spec.to_json())
    proc = subprocess.Popen([PY, "-m", "worker.agent", str(path)])
    peak = 0
    while proc.poll() is None:
        peak = max(peak, peak_rss_kb(proc.pid))
        time.sleep(0.05)
    return peak / 1024


def trainer_rss(root: Path, home: Path) -> float:
    """The trainer's own peak RSS, from a short orchestrate job (read while it trains). A cold
    trainer: one started in a standby kept from an earlier job runs under the standby's command
    line, which does not name the script."""
    config = local_config(root, 4, "keep_standbys = 0")
    peak, code = launch_and_watch_peak(config, home, lambda proc: processes_running(TRAINER))
    assert code == 0 and peak > 0, f"the RSS job ended with {code}, peak {peak} MB"
    return peak


def dry_run_1000(root: Path, runs: int) -> list[float]:
    hosts = "".join(
        f'[[backend.hosts]]\naddress = "10.{i // 250}.{i % 250}.1"\nname = "node-{i:04d}"\n\n'
        for i in range(1000)
    )
    path = root / "big.toml"
    path.write_text(
        '[job]\nname = "big"\nshared_dir = "/nfs/big"\n\n[entrypoint]\nmodule = "train"\n\n'
        '[backend]\ntype = "ssh"\nuser = "ml"\n\n' + hosts
    )
    times = []
    for _ in range(runs + 1):
        t0 = time.perf_counter()
        out = subprocess.run(
            [PY, "-m", "orchestrator", "launch", "--dry-run", str(path)],
            env=orch_env(root / "home-dry"),
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        times.append(time.perf_counter() - t0)
        assert out.returncode == 0 and out.stdout.count("TF_CONFIG=") == 1000, out.stderr
    return times[1:]


# --- the suite ------------------------------------------------------------------------------
