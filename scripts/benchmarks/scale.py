#!/usr/bin/env python3
"""What supervision costs the coordinator as hosts are added (the scaling curve), on namespaced
SSH hosts (tests/beds/ssh.py) with stand-in trainers (scripts/benchmarks/scale_trainer.py: progress
and a line a second, like a Keras fit, no TensorFlow), so the figures are the coordinator's.

For each size: `launch --detach`, the time from the job's record to every agent started (the
launch's fan-out), wait until every task steps, then over a window of steady training the
detached supervisor's CPU (per host and per task per second) and resident size; then one
trainer SIGKILLed and the time until the supervisor begins stopping (P4).

    sudo uv run python -m scripts.benchmarks.scale --hosts 16 64 256 [--slots 8] [--window 20]
        [--baseline] [--profile] [--out docs/bench/supervision-scale.json]

--slots runs that many tasks on each host (GPU nodes hold 4-8), each with its own agent.

--baseline adds, for each size, the same measurement with `keepalive = 0.2` (each host read
every poll interval, as the supervisor did before its long poll); --profile samples the
supervisor with py-spy where it is installed and prints where its CPU went.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchmarks.measure import PY, REPO, kill_job_process, orch_env, status_json, wait
from tests.beds import ssh as tb

TRAINER = Path(__file__).resolve().with_name("scale_trainer.py")
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _config(
    bed: tb.Testbed, hosts: int, root: Path, keepalive: float | None, slots: int = 1
) -> Path:
    text = Path(bed.cluster_toml).read_text()
    text = text.replace('module = "worker.examples.digits"', f'script = "{TRAINER}"')
    text = text.replace('args = ["--epochs", "8"]', "args = []")
    # Every namespaced host shares this machine's cores: 64 helpers starting at once take
    # longer than a real host's one.
    # (256 of them, with their sshd logins, take minutes on 2 cores.)
    text = text.replace("connect_timeout = 5.0", f"connect_timeout = {max(60.0, hosts):g}")
    head, _, _ = text.partition("[[backend.hosts]]")
    # A stand-in reports "training" without TensorFlow: no standby to import it for.
    head += "\n[restart]\nwarm_restart = false\nmax_restarts = 0\n\n"
    if keepalive is not None:
        head += f"[supervision]\nkeepalive = {keepalive}\n\n"
    body = "".join(
        f'[[backend.hosts]]\naddress = "{h.address}"\nname = "{h.name}"\nslots = {slots}\n\n'
        for h in bed.hosts[:hosts]
    )
    path = root / f"scale-{hosts}x{slots}-{keepalive}.toml"
    path.write_text(head + body)
    return path


def _top_frames(collapsed: Path, top: int = 12) -> tuple[list[tuple[float, str]], ...]:
    """Where a py-spy "raw" profile's samples were (only the thread holding the GIL is
    sampled: Python's own work): each frame's share of samples with it on the stack
    (inclusive), and at the top (self)."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            if "(" in frame and "threading.py" not in frame and "click/" not in frame:
                inclusive[frame] = inclusive.get(frame, 0) + n

    def ranked(counts: dict[str, int]) -> list[tuple[float, str]]:
        best = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [(n / max(total, 1), frame) for frame, n in best]

    return ranked(inclusive), ranked(own)


def measure(
    bed: tb.Testbed, hosts: int, root: Path, window: float, keepalive: float | None,
    profile: bool = False, slots: int = 1,
) -> dict[str, float]:  # fmt: skip
    home = root / f"home-{hosts}x{slots}-{keepalive}"
    env = orch_env(home)
    config = _config(bed, hosts, root, keepalive, slots)
    argv = [PY, "-m", "orchestrator", "launch", "--detach", str(config)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    job_id = out.stdout.split()[1]
    try:
        try:
            job = wait(
                lambda: (
                    (j := status_json(home, job_id)["jobs"][0])
                    and all(t["step"] > 0 for t in j["tasks"])
                    and j
                ),
                600,
                interval=2.0,
            )
        except TimeoutError:
            j = status_json(home, job_id)["jobs"][0]
            stepping = sum(t["step"] > 0 for t in j["tasks"])
            raise TimeoutError(
                f"{hosts} hosts: {stepping} task(s) stepping after 600 s; job {j['state']}: "
                f"{j.get('last_cause')}; events: {[e['message'] for e in j['events']][-5:]}"
            ) from None
        supervisor = job["supervisor"]["pid"]  # type: ignore[index]
        launched = next(e["ts"] for e in job["events"] if e["kind"] == "launched")  # type: ignore[index]
        fan_out = launched - job["created"]  # type: ignore[index]  # the supervisor's own clock
        time.sleep(3.0)  # past the start: steady training
        spy = None
        if profile and shutil.which("py-spy"):
            spy = subprocess.Popen(
                ["py-spy", "record", "--pid", str(supervisor), "--duration", str(int(window)),
                 "--format", "raw", "--nonblocking", "--gil", "--output",
                 str(root / f"profile-{hosts}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        steps0 = [t["step"] for t in status_json(home, job_id)["jobs"][0]["tasks"]]
        cpu0, t0 = _cpu_seconds(supervisor), time.monotonic()
        time.sleep(window)
        cpu = _cpu_seconds(supervisor) - cpu0
        # The saving must not come from seeing less: every task's progress reached the store.
        tasks = status_json(home, job_id)["jobs"][0]["tasks"]
        advanced = sum(t["step"] > s for t, s in zip(tasks, steps0, strict=True))
        oldest = max(t["heartbeat_age"] or 0.0 for t in tasks)
        if spy is not None:
            spy.wait(timeout=60)
            inclusive, own = _top_frames(root / f"profile-{hosts}.txt")
            for title, rows in (("on the stack", inclusive), ("at the top", own)):
                print(f"where the supervisor's CPU went at {hosts} hosts (py-spy, {title}):")
                for share, frame in rows:
                    print(f"  {share * 100:5.1f} %  {frame}")
        elapsed = time.monotonic() - t0
        rss = _rss_mb(supervisor)
        job = status_json(home, job_id)["jobs"][0]
        victim = job["tasks"][len(job["tasks"]) // 2]["pid"]
        killed = time.time()
        kill_job_process(victim, job_id)
        ended = wait(
            lambda: next(
                (e["ts"] for e in status_json(home, job_id)["jobs"][0]["events"]
                 if e["kind"] == "failure"),
                None,
            ),
            120,
            interval=0.05,
        )  # fmt: skip
        return {
            "hosts": hosts,
            "slots": slots,
            "tasks": hosts * slots,
            "keepalive": keepalive or 1.0,
            "cpu_ms_per_host_s": cpu / elapsed / hosts * 1000,
            "cpu_ms_per_task_s": cpu / elapsed / (hosts * slots) * 1000,
            "fan_out_s": fan_out,
            "cpu_share": cpu / elapsed,
            "rss_mb": rss,
            "p4_s": float(ended) - killed,  # type: ignore[arg-type]
            "tasks_advanced": advanced,
            "oldest_heartbeat_s": oldest,
        }
    finally:
        subprocess.run([PY, "-m", "orchestrator", "stop", job_id], env=env, cwd=REPO,
                       capture_output=True, timeout=600)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--slots", type=int, default=1, help="tasks on each host")
    parser.add_argument("--out", type=Path, help="add the rows to this JSON file's list")
    parser.add_argument(
        "--baseline", action="store_true",
        help="also each size with keepalive = poll_interval (every host read every 0.2 s, as "
        "before the long poll), in the same run",
    )  # fmt: skip
    parser.add_argument(
        "--profile", action="store_true", help="sample the supervisor with py-spy (if on PATH)"
    )
    parser.add_argument(
        "--keepalive", type=float, nargs="+", default=[],
        help="the keep-alives to measure (default: the configured default, plus 0.2 with "
        "--baseline)",
    )  # fmt: skip
    args = parser.parse_args()
    reason = tb.missing_requirements()
    if reason:
        print(f"no SSH test bed: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="orch-bench-scale-") as tmp:
        root = Path(tmp)
        started = time.monotonic()
        bed = tb.up(max(args.hosts), root / "bed")
        print(f"test bed of {max(args.hosts)} hosts up in {time.monotonic() - started:.0f} s",
              flush=True)  # fmt: skip
        try:
            results = []
            for n in sorted(args.hosts):
                keepalives = args.keepalive or [None, *([0.2] if args.baseline else [])]
                for keepalive in keepalives:
                    profiled = args.profile and keepalive is None
                    results.append(
                        measure(bed, n, root, args.window, keepalive, profiled, args.slots)
                    )
                    print(json.dumps(results[-1]), flush=True)
        finally:
            tb.down(root / "bed")
    if args.out:
        kept = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps(kept + results, indent=1) + "\n")
    print()
    print("| hosts | keep-alive | supervisor CPU per host per second | vs read every tick "
          "| one core | RSS | kill -> stopping |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    base = {r["hosts"]: r["cpu_ms_per_host_s"] for r in results if r["keepalive"] == 0.2}
    for r in results:
        ratio = f"{r['cpu_ms_per_host_s'] / base[r['hosts']]:.2f}x" if r["hosts"] in base else "-"
        cells = [f"{r['hosts']}", f"{r['keepalive']:g} s", f"{r['cpu_ms_per_host_s']:.2f} ms",
                 ratio, f"{r['cpu_share'] * 100:.0f} %", f"{r['rss_mb']:.0f} MB",
                 f"{r['p4_s']:.2f} s"]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
