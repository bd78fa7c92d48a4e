"""scripts/bench.py's measurements: each runs real processes (orchestrate, hand-started
workers, the SSH test bed) and returns figures; the suite puts them into rows."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAINER = Path(__file__).resolve().with_name("trainer.py")  # run by path
PLAIN_TRAINER = REPO / "tests" / "fixtures" / "plain_fit.py"  # also the tests' plain script
BENCH_AB = Path(__file__).resolve().with_name("ab.py")  # run by path
FAKE = REPO / "tests" / "fixtures" / "fake_trainer.py"
PY = sys.executable
SURVIVOR_CAP = 90.0  # seconds: a survivor still hung then is a failed round
RESTART_EXTRA = ""  # more of every job's [restart]: the quick run's shorter standby_delay


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def kill_job_process(pid: object, job_id: str) -> None:
    """SIGKILL a process of the benchmark's own job, as `orchestrate status` named it, checked
    through a pidfd first (checked_signal.signal_job_process)."""
    from tests.beds.checked_signal import signal_job_process

    signal_job_process(pid, job_id, signal.SIGKILL)


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


def _fields(text: str, kind: str) -> list[list[str]]:
    fields = (line.partition("BENCH ")[2].split() for line in text.splitlines())
    return [f for f in fields if f[:1] == [kind]]


def bench_lines(text: str) -> tuple[float | None, list[float]]:
    """First-step wall time (the latest over the workers) and every epoch's steps/s."""
    firsts = [float(f[1]) for f in _fields(text, "first_step")]
    return (max(firsts) if firsts else None), [r for _, r in epoch_rates(text)]


def epoch_rates(text: str) -> list[tuple[int, float]]:
    return [(int(f[1]), float(f[2])) for f in _fields(text, "epoch")]


def middle_rate(rates: list[tuple[int, float]], epochs: int, fast: bool = False) -> float:
    """The middle epochs' median steps/s; `fast`: their fastest tenth's (90th percentile): the
    epochs not held to this machine's 108/n steps/s (docs/measurements.md)."""
    keep = [r for e, r in rates if 2 < e <= epochs - 1]
    if fast and len(keep) > 1:
        return statistics.quantiles(keep, n=10)[-1]
    return statistics.median(keep)


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
{RESTART_EXTRA}
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


def epochs_logged(log: Path) -> int:
    """How many epochs a trainer's log tells of (the BENCH lines of the benchmarks' scripts)."""
    try:
        return log.read_text(errors="replace").count("BENCH epoch")
    except OSError:
        return 0


def wait_epochs_past(logs: list[Path], before: list[int], more: int = 2) -> None:
    """Until every log tells of `more` epochs past `before` (one more may come from a survivor
    before it stops): the next attempt has trained, so its first steps are recorded. Our side
    of a timed window is waited out on logs, as the by-hand side is: an `orchestrate status`
    every 0.1 s is a Python start each time, CPU taken from the trainers it times."""
    wanted = [seen + more for seen in before]
    wait(lambda: all(epochs_logged(log) >= n for log, n in zip(logs, wanted, strict=True)), 240)


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
                procs[0].wait(timeout=SURVIVOR_CAP)
                result["survivor_exit"] = time.time() - killed
            except subprocess.TimeoutExpired:
                pass  # still hung at the cap: a failed round, not a number
            return result
        for p in procs:
            p.wait(timeout=300)
    finally:
        kill_left(procs)
    text = "\n".join(log.read_text() for log in logs)
    result["first_step"] = first_step(text) - t0
    if epochs > 3:  # middle epochs exist
        result["throughput"] = middle_rate(epoch_rates(text), epochs)
        result["fast"] = middle_rate(epoch_rates(text), epochs, fast=True)
    return result


def kill_left(procs: list[subprocess.Popen[bytes]]) -> None:
    """Whatever the round's end: no trainer of it outlives it."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def first_step(text: str) -> float:
    """The workers' logs: the wall time of the later first step."""
    first, _ = bench_lines(text)
    assert first is not None, text[-2000:]
    return first


def raw_cold_start(root: Path) -> float:
    """Two hand-started workers, their start to the first training step: the baseline a
    restart is compared with, measured in the same round as the restart."""
    return raw_run(root, 3)["first_step"]


def no_kept_standbys() -> None:
    """A measured launch starts as on a fresh machine: no standby kept from the last job
    ([restart] keep_standbys) on any host of ours here. P15 measures a launch that has them."""
    from worker.warm.registry import clear

    clear(every_host=True, kept_only=False)


def launch(config: Path, home: Path, fresh: bool = True) -> str:
    """`orchestrate launch CONFIG` in the foreground, to success; its output. `fresh`: without
    the standbys the last job kept."""
    if fresh:
        no_kept_standbys()
    argv = [PY, "-m", "orchestrator", "launch", str(config)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=orch_env(home), cwd=REPO,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def orchestrate_run(root: Path, home: Path, epochs: int) -> dict[str, float]:
    """P2/P3: a launch in the foreground; its first step and throughput, and where the time to
    the first step went: the job registered (CLI start, validation), agents started (preflight,
    plan, specs), and from there the trainers' own start (interpreter, TensorFlow, MWMS)."""
    no_kept_standbys()
    t0 = time.time()
    out = launch(local_config(root, epochs), home, fresh=False)
    first, _ = bench_lines(out)
    assert first is not None
    job_id = re.findall(r"job (\S+) succeeded", out)[-1]
    events = {e["kind"]: e["ts"] for e in status_json(home, job_id)["jobs"][0]["events"]}
    rates = epoch_rates(out)
    return {"first_step": first - t0, "throughput": middle_rate(rates, epochs),
            "fast": middle_rate(rates, epochs, fast=True),
            "created": events["created"] - t0, "launched": events["launched"] - t0}  # fmt: skip


def plain_run(root: Path, home: Path, epochs: int, instrument: bool, extra: str = "") -> float:
    """P9's plain_rates: the middle epochs' median steps/s."""
    return middle_rate(plain_rates(root, home, epochs, instrument, extra), epochs)


def plain_rates(
    root: Path, home: Path, epochs: int, instrument: bool, extra: str = ""
) -> list[tuple[int, float]]:
    """P9: a plain fit script (nothing of ours imported) under orchestrate, with or without
    the bootstrap; each worker's (epoch, steps/s). `extra`: more of cluster.toml."""
    config = root / f"plain-{instrument}.toml"
    backup = root / "shared" / f"plain-backup-{time.monotonic_ns()}"
    config.write_text(
        f"""
[job]
name = "bench-plain"
shared_dir = "{root / "shared"}"
[entrypoint]
script = "{PLAIN_TRAINER}"
args = ["--bench", "--epochs", "{epochs}", "--backup-dir", "{backup}"]
env = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}
instrument = {str(instrument).lower()}
[backend]
type = "local"
workers = 2
{extra}
"""
    )
    return epoch_rates(launch(config, home))


def callback_ab(root: Path, rounds: int) -> list[tuple[float, float]]:
    """P9b: one process alternates fit calls without and with the callbacks the bootstrap adds
    to a plain script's fit: (without, with) steps/s per round. Same process, same warm state:
    the machine's noise between processes drops out."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [PY, str(BENCH_AB), "--backup-dir", str(root), "--callbacks", str(rounds)],
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
