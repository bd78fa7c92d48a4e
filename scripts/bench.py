#!/usr/bin/env python3
"""orchestrate's benchmark suite: each figure next to a raw baseline measured in the same run.

    uv run python scripts/bench.py            # the full suite (about 10 minutes on 2 cores)
    uv run python scripts/bench.py --quick    # a smoke run: every row, fewer repeats and hosts

Writes docs/bench/results.json, docs/bench/results.png and docs/bench/results.md (the table the
README shows) unless --out says otherwise. The SSH rows (P1, and the supervisor's RSS in P7) need
root for the namespaced test bed; without it they are reported as skipped, with the reason.

| id | measurement | baseline |
|----|-------------|----------|
| P1 | launch fan-out to every agent running, 1/4/16 SSH hosts | threads + paramiko, 1 exec/host |
| P2 | `launch` to the first training step, 2 local workers | workers started by hand |
| P3 | steady training throughput (middle epochs) | the same hand-started workers |
| P4 | trainer SIGKILLed -> supervisor begins stopping | TensorFlow's own: the survivor exits |
| P5 | trainer SIGKILLed -> training resumed | P2's cold start (target: P2 + 3 s) |
| P6 | `orchestrate status`, 20 jobs x 16 tasks in the store | - |
| P7 | peak RSS: one agent; the supervisor of 16 SSH hosts | the trainer's own peak RSS |
| P8 | `launch --dry-run` of a 1,000-host cluster.toml | - |
| P9 | plain `fit` script: steady throughput via the bootstrap | the same, `instrument = false` |
| P9b | the same cost in one process: fit calls alternating | fit without our callbacks |
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
TRAINER = REPO / "scripts" / "bench_trainer.py"
PLAIN_TRAINER = REPO / "scripts" / "bench_plain_trainer.py"
FAKE = REPO / "tests" / "fixtures" / "fake_trainer.py"
PY = sys.executable
EXTRA_ENV: dict[str, str] = {}


@dataclass
class Row:
    id: str
    measurement: str
    unit: str
    values: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    baseline_label: str = ""
    target: str = ""
    # "ratio" rows compare value/baseline with target_ratio; "value" rows compare the value with
    # target_value; "inverse" rows need the ratio to be at least target_ratio.
    kind: str = "value"
    target_value: float | None = None
    target_ratio: float | None = None
    note: str = ""
    skipped: str = ""
    # Rows measured in alternating pairs (ours, raw) report the median of the per-pair ratios:
    # on a noisy machine that is steadier than a ratio of two medians.
    paired: bool = False
    # A second condition of the target (P1: coordinator CPU per host); None: there is none.
    also_met: bool | None = None

    @property
    def value(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def base(self) -> float | None:
        return statistics.median(self.baseline) if self.baseline else None

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.base:
            return None
        if self.paired and len(self.values) == len(self.baseline):
            return statistics.median(v / b for v, b in zip(self.values, self.baseline, strict=True))
        return self.value / self.base

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        if self.also_met is False:
            return False
        if self.kind == "ratio" and self.ratio is not None and self.target_ratio is not None:
            return self.ratio <= self.target_ratio
        if self.kind == "inverse" and self.ratio is not None and self.target_ratio is not None:
            return self.ratio >= self.target_ratio
        if self.target_value is not None:
            return self.value <= self.target_value
        return None

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data.update(value=self.value, base=self.base, ratio=self.ratio, met=self.met)
        return data


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}" if len(values) > 1 else ""


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3g} {unit}".strip()


# --- helpers --------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def peak_rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def launch_and_watch_peak(
    config: Path, home: Path, pids: Callable[[subprocess.Popen[bytes]], list[int]]
) -> tuple[float, int]:
    """Run `orchestrate launch CONFIG` to its end; the largest peak RSS (MB) among pids(proc)."""
    proc = subprocess.Popen(
        [PY, "-m", "orchestrator", "launch", str(config)],
        env=orch_env(home),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peak = 0
    while proc.poll() is None:
        peak = max([peak, *(peak_rss_kb(pid) for pid in pids(proc))])
        time.sleep(0.05)
    return peak / 1024, proc.returncode


def processes_running(path: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def bench_lines(text: str) -> tuple[float | None, list[float]]:
    """First-step wall time (the latest over the workers) and every epoch's steps/s."""
    firsts, rates = [], []
    for line in text.splitlines():
        _, _, rest = line.partition("BENCH ")
        if rest.startswith("first_step "):
            firsts.append(float(rest.split()[1]))
        elif rest.startswith("epoch "):
            rates.append((int(rest.split()[1]), float(rest.split()[2])))
    return (max(firsts) if firsts else None), [r for _, r in rates]


def middle_rate(rates_per_worker: list[tuple[int, float]], epochs: int) -> float:
    keep = [r for e, r in rates_per_worker if 2 < e <= epochs - 1]
    return statistics.median(keep)


def epoch_rates(text: str) -> list[tuple[int, float]]:
    out = []
    for line in text.splitlines():
        _, _, rest = line.partition("BENCH ")
        if rest.startswith("epoch "):
            out.append((int(rest.split()[1]), float(rest.split()[2])))
    return out


def local_config(root: Path, epochs: int, extra: str = "") -> Path:
    path = root / f"bench-{epochs}.toml"
    path.write_text(
        f"""
[job]
name = "bench"
shared_dir = "{root / "shared"}"

[entrypoint]
script = "{TRAINER}"
args = ["--epochs", "{epochs}"]
env = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}
workdir = "{REPO}"

[backend]
type = "local"
workers = 2

[restart]
backoff = 0.0
{extra}
"""
    )
    return path


def orch_env(home: Path) -> dict[str, str]:
    return {**os.environ, "ORCHESTRATE_HOME": str(home)}


def status_json(home: Path, job: str | None = None) -> dict:
    out = subprocess.run(
        [PY, "-m", "orchestrator", "status", *([job] if job else []), "--json"],
        capture_output=True,
        text=True,
        env=orch_env(home),
        cwd=REPO,
        check=True,
    )
    return json.loads(out.stdout)


def wait(predicate: Callable[[], object], timeout: float, interval: float = 0.1) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("benchmark condition not reached")


# --- P2 / P3: cold start and throughput ------------------------------------------------------


def raw_run(
    root: Path, epochs: int, kill_at_epoch: int | None = None, raw_callbacks: bool = True
) -> dict[str, float]:
    """Two workers started by hand: TF_CONFIG set, a plain script, no launcher."""
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    job_dir = Path(tempfile.mkdtemp(dir=root, prefix="raw-"))
    logs = [job_dir / f"w{i}.log" for i in range(2)]
    t0 = time.time()
    procs = []
    for i in range(2):
        env = {
            **os.environ,
            "TF_USE_LEGACY_KERAS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "ORCHESTRATE_JOB_DIR": str(job_dir),
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
        }
        with open(logs[i], "wb") as log:
            procs.append(
                subprocess.Popen(
                    [PY, str(TRAINER), "--epochs", str(epochs), "--raw"],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=REPO,
                )
            )
    result: dict[str, float] = {}
    try:
        if kill_at_epoch is not None:
            wait(
                lambda: (
                    len([r for r in epoch_rates(logs[1].read_text()) if r[0] >= kill_at_epoch]) > 0
                ),
                120,
            )
            killed = time.time()
            procs[1].kill()
            try:
                procs[0].wait(timeout=90)
                result["survivor_exit"] = time.time() - killed
            except subprocess.TimeoutExpired:
                result["survivor_exit"] = 90.0  # still hung: report the cap
            return result
        for p in procs:
            p.wait(timeout=300)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = "\n".join(log.read_text() for log in logs)
    first, _ = bench_lines(text)
    assert first is not None, text[-2000:]
    result["first_step"] = first - t0
    result["throughput"] = middle_rate(epoch_rates(text), epochs)
    return result


def launch(config: Path, home: Path) -> str:
    """`orchestrate launch CONFIG` in the foreground, to success; its output."""
    proc = subprocess.run(
        [PY, "-m", "orchestrator", "launch", str(config)],
        capture_output=True,
        text=True,
        env=orch_env(home),
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def orchestrate_run(root: Path, home: Path, epochs: int) -> dict[str, float]:
    t0 = time.time()
    out = launch(local_config(root, epochs), home)
    first, _ = bench_lines(out)
    assert first is not None
    return {"first_step": first - t0, "throughput": middle_rate(epoch_rates(out), epochs)}


def plain_run(root: Path, home: Path, epochs: int, instrument: bool) -> float:
    """P9: a plain fit script (nothing of ours imported) under orchestrate, with or without
    the bootstrap; its middle epochs' steps/s."""
    config = root / f"plain-{instrument}.toml"
    backup = root / "shared" / f"plain-backup-{time.monotonic_ns()}"
    config.write_text(
        f"""
[job]
name = "bench-plain"
shared_dir = "{root / "shared"}"

[entrypoint]
script = "{PLAIN_TRAINER}"
args = ["--epochs", "{epochs}", "--backup-dir", "{backup}"]
env = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}
instrument = {str(instrument).lower()}

[backend]
type = "local"
workers = 2
"""
    )
    return middle_rate(epoch_rates(launch(config, home)), epochs)


def callback_ab(root: Path, rounds: int) -> list[tuple[float, float]]:
    """P9b: one process alternates fit calls without and with the callbacks the bootstrap adds
    to a plain script's fit: (without, with) steps/s per round. Same process, same warm state:
    the machine's noise between processes drops out."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [PY, str(PLAIN_TRAINER), "--backup-dir", str(root), "--ab", str(rounds)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    pairs = []
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH ab "):
            without, with_ours = map(float, line.split()[2:4])
            pairs.append((without, with_ours))
    return pairs


# --- P4 / P5: failure detection and recovery ------------------------------------------------


def orchestrate_kill(root: Path, home: Path, epochs: int) -> dict[str, float]:
    config = local_config(root, epochs)
    env = orch_env(home)
    out = subprocess.run(
        [PY, "-m", "orchestrator", "launch", "--detach", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=True,
    )
    job_id = out.stdout.split()[1]

    def training() -> dict | None:
        job = status_json(home, job_id)["jobs"][0]
        return job if all(t["epoch"] >= 3 for t in job["tasks"]) else None

    job = wait(training, 120)
    killed = time.time()
    os.kill(job["tasks"][1]["pid"], signal.SIGKILL)  # type: ignore[index]

    def resumed() -> dict | None:
        job = status_json(home, job_id)["jobs"][0]
        ok = all(t["attempt"] == 1 and t["first_step_at"] for t in job["tasks"])
        return job if ok else None

    job = wait(resumed, 120)
    failure = next(e["ts"] for e in job["events"] if e["kind"] == "failure")  # type: ignore[index]
    # The new attempt's first step, as each trainer itself printed it (as P2 measures it).
    firsts = []
    for i in (0, 1):
        log = Path(job["job_dir"]) / "logs" / f"worker-{i}.log"  # type: ignore[index]
        stamps = [
            float(line.split()[2])
            for line in log.read_text().splitlines()
            if line.startswith("BENCH first_step ")
        ]
        firsts.append(stamps[-1])
    first = max(firsts)
    subprocess.run(
        [PY, "-m", "orchestrator", "stop", job_id],
        env=env,
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    return {"stopping": failure - killed, "resumed": first - killed}


# --- P1 and P7 (supervisor): SSH test bed ---------------------------------------------------


def ssh_rows(root: Path, hosts: list[int], repeat: int, p1: Row, p7s: Row) -> None:
    import testbed as tb
    from bench_launch import bench_config, measure, orchestrate_round, raw_round

    reason = tb.missing_requirements()
    if reason:
        p1.skipped = p7s.skipped = f"no SSH test bed: {reason}"
        return
    bed = tb.up(max(hosts), root / "bed")
    try:
        per_host = {}
        for n in hosts:
            cfg = bench_config(bed, n, root)
            ours = measure(repeat, lambda k, cfg=cfg, n=n: orchestrate_round(cfg, f"b{n}-{k}"))
            raw = measure(repeat, lambda k, n=n: raw_round(bed, n, root))
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
        p1.target = f"{top} hosts <= 1.3x raw; CPU <= 10 ms/host (here {cpu:.1f})"
        p1.also_met = cpu <= 10.0

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
    from orchestrator.states import JobState, TaskState
    from orchestrator.store import JobRecord, Store, TaskRecord

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
    """The trainer's own peak RSS, from a short orchestrate job (read while it trains)."""
    peak, _ = launch_and_watch_peak(
        local_config(root, 4), home, lambda proc: processes_running(TRAINER)
    )
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


def run_suite(quick: bool) -> list[Row]:
    repeat = 1 if quick else 3
    pairs = 1 if quick else 5
    epochs = 6 if quick else 12
    hosts = [1, 4] if quick else [1, 4, 16]
    rows = {
        "P1": Row(
            "P1",
            "launch fan-out to every agent running",
            "s",
            kind="ratio",
            target_ratio=1.3,
            baseline_label="threads + paramiko (NODELAY), 1 exec/host",
        ),
        "P2": Row(
            "P2",
            "launch to first training step, 2 workers",
            "s",
            kind="ratio",
            target_ratio=1.05,
            baseline_label="workers started by hand with TF_CONFIG",
            target="<= 1.05x raw",
        ),
        "P3": Row(
            "P3",
            "steady throughput (middle epochs)",
            "steps/s",
            kind="inverse",
            target_ratio=0.98,
            baseline_label="the same hand-started workers",
            target=">= 0.98x raw",
        ),
        "P4": Row(
            "P4",
            "trainer SIGKILL -> supervisor begins stopping",
            "s",
            target_value=2.0,
            baseline_label="TensorFlow's own: survivor exits",
            target="<= 2 s",
        ),
        "P5": Row(
            "P5",
            "trainer SIGKILL -> training resumed",
            "s",
            baseline_label="P2 cold start",
            target="<= P2 + 3 s",
        ),
        "P6": Row("P6", "status, 20 jobs x 16 tasks", "s", target_value=0.3, target="<= 0.3 s"),
        "P7a": Row(
            "P7a",
            "peak RSS of one agent",
            "MB",
            target_value=40,
            baseline_label="the trainer's own peak RSS",
            target="<= 40 MB",
        ),
        "P7b": Row(
            "P7b",
            "peak RSS of the supervisor, 16 SSH hosts",
            "MB",
            target_value=100,
            baseline_label="the trainer's own peak RSS",
            target="<= 100 MB",
        ),
        "P8": Row("P8", "plan + --dry-run, 1,000 hosts", "s", target_value=1.0, target="<= 1 s"),
        "P9": Row(
            "P9",
            "plain fit script through the bootstrap, steady throughput",
            "steps/s",
            kind="inverse",
            target_ratio=0.98,
            baseline_label="the same script, instrument = false",
            target=">= 0.98x (cost <= 2 %)",
            paired=True,
        ),
        "P9b": Row(
            "P9b",
            "the bootstrap's fit callbacks, one process, best of N",
            "steps/s",
            kind="inverse",
            target_ratio=0.98,
            baseline_label="fit without them",
            target=">= 0.98x (cost <= 2 %)",
        ),
    }
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        root = Path(tmp)
        (root / "shared").mkdir()
        home = root / "home"
        print("P8 dry run of 1,000 hosts ...", flush=True)
        rows["P8"].values = dry_run_1000(root, 2 if quick else 5)
        print("P6 status with 20 x 16 tasks ...", flush=True)
        rows["P6"].values = status_with_store(root, 3 if quick else 10)
        print("P7 agent RSS ...", flush=True)
        rows["P7a"].values = [agent_rss(root) for _ in range(repeat)]
        print("P2/P3 cold start and throughput, raw and orchestrated, alternating ...", flush=True)
        rows["P2"].paired = rows["P3"].paired = True
        for _ in range(pairs):
            raw = raw_run(root, epochs)
            ours = orchestrate_run(root, home, epochs)
            rows["P2"].baseline.append(raw["first_step"])
            rows["P2"].values.append(ours["first_step"])
            rows["P3"].baseline.append(raw["throughput"])
            rows["P3"].values.append(ours["throughput"])
        print("P9 plain fit script with and without the bootstrap, alternating ...", flush=True)
        for _ in range(pairs):
            rows["P9"].baseline.append(plain_run(root, home, epochs, instrument=False))
            rows["P9"].values.append(plain_run(root, home, epochs, instrument=True))
        # This machine flips between a fast and a slow mode (about 2x) from one fit call to the
        # next, whatever runs: noise only slows, so each variant's best round is compared.
        ab = callback_ab(root, 3 if quick else 15)
        rows["P9b"].baseline = [max(without for without, _ in ab)]
        rows["P9b"].values = [max(with_ours for _, with_ours in ab)]
        rows["P9b"].note = (
            f"best of {len(ab)} alternating fit calls of the digits MLP in one process (one-worker "
            "MWMS: the smallest step, where a per-step cost shows most); all rounds without / "
            "with: " + ", ".join(f"{a:.0f}/{b:.0f}" for a, b in ab)
        )
        print("P4/P5 kill and recovery ...", flush=True)
        for _ in range(repeat):
            result = orchestrate_kill(root, home, 30)
            rows["P4"].values.append(result["stopping"])
            rows["P5"].values.append(result["resumed"])
            rows["P4"].baseline.append(raw_run(root, 30, kill_at_epoch=3)["survivor_exit"])
        p2 = rows["P2"].value or 0.0
        rows["P5"].baseline = list(rows["P2"].values)
        rows["P5"].target_value = p2 + 3.0
        rows["P5"].target = f"<= P2 + 3 s = {p2 + 3.0:.1f} s"
        trainer = trainer_rss(root, home)
        for key in ("P7a", "P7b"):
            rows[key].baseline = [trainer]
        print("P1/P7 SSH test bed ...", flush=True)
        ssh_rows(root, hosts, repeat if quick else 5, rows["P1"], rows["P7b"])
    return list(rows.values())


def render_table(rows: list[Row]) -> str:
    lines = [
        "| id | measurement | orchestrate (median, spread) | baseline | ratio | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.skipped:
            lines.append(
                f"| {r.id} | {r.measurement} | skipped: {r.skipped} | | | {r.target} | - |"
            )
            continue
        value = fmt(r.value, r.unit) + (f" ({spread(r.values)})" if spread(r.values) else "")
        base = (
            (fmt(r.base, r.unit) + f" {r.baseline_label}")
            if r.base is not None
            else r.baseline_label or "-"
        )
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        met = {True: "yes", False: "**no**", None: "-"}[r.met]
        lines.append(
            f"| {r.id} | {r.measurement} | {value} | {base} | {ratio} | {r.target} | {met} |"
        )
    notes = [f"- {r.id}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + (["", *notes] if notes else []))


def draw_chart(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.met is not None]

    # How much of its budget each row uses: < 1 meets the target.
    def used(r: Row) -> float:
        if r.kind == "ratio" and r.ratio is not None and r.target_ratio:
            return r.ratio / r.target_ratio
        if r.kind == "inverse" and r.ratio and r.target_ratio:
            return r.target_ratio / r.ratio
        return (r.value or 0.0) / (r.target_value or 1.0)

    fig, ax = plt.subplots(figsize=(8, 0.5 * len(shown) + 1.5))
    values = [used(r) for r in shown]
    colors = ["tab:green" if r.met else "tab:red" for r in shown]
    ax.barh([f"{r.id} {r.measurement}" for r in shown], values, color=colors)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.invert_yaxis()
    ax.set_xlabel("share of the target used (< 1 meets it)")
    ax.set_title("orchestrate benchmarks against their targets")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, fewer hosts and epochs")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    args = parser.parse_args()
    started = time.time()
    rows = run_suite(args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    table = render_table(rows)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "quick": args.quick,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
        f"Python {platform.python_version()}",
        "wall_seconds": round(time.time() - started, 1),
    }
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "rows": [r.to_json() for r in rows]}, indent=2)
    )
    (args.out / "results.md").write_text(
        f"Run {meta['date']} on {meta['machine']}{' (--quick)' if args.quick else ''}, "
        f"{meta['wall_seconds']:.0f} s.\n\n{table}\n"
    )
    draw_chart(rows, args.out / "results.png")
    print(table)
    print(
        f"\nwrote {args.out}/results.json, results.md, results.png in {meta['wall_seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
