#!/usr/bin/env python3
"""P3 by counts: what the kernel counts for a training step, hand-started workers against the
same training under `orchestrate launch` (every default on), in interleaved pairs.

    uv run python -m scripts.benchmarks.p3_counts [--pairs 9] [--epochs 16] [--out FILE.json]

Each pair runs P3's training (scripts/benchmarks/trainer.py, 2 local MWMS workers) by hand and
under orchestrate, the order alternating pair by pair. Between the end of epoch 3 and the end
of epoch `epochs - 1` (the middle epochs P3's throughput is read from) it reads each trainer's
threads from /proc: CPU time and run-queue wait (schedstat), voluntary and involuntary context
switches and migrations (sched), page faults (stat); per training step, summed over both
trainers. Hardware counters (instructions, cycles) are what `perf stat` would add; the
development machine's VM does not expose them (`<not supported>`), so the kernel's own
accounting is what both sides are compared by.

Once per side it also takes what the trainer runs with: environment, rlimits, scheduling policy
and nice, CPU affinity, cgroup, capabilities and seccomp, open descriptors by kind, threads;
and prints what differs.

The ratio is P3's: the median over pairs of ours / by hand, with a distribution-free 95 %
confidence interval for that median (order statistics of the pairs' ratios).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchmarks.measure import (
    PY,
    REPO,
    TRAINER,
    epoch_rates,
    free_ports,
    kill_left,
    local_config,
    middle_rate,
    no_kept_standbys,
    orch_env,
    wait,
)

STEPS_PER_EPOCH = 56  # the digits set: (1797 // 2 workers) // 16 rows a step
FIRST_COUNTED = 3  # epochs 1-3 are the warm-up P3's throughput leaves out
COUNTS = ("cpu_ms", "runqueue_wait_ms", "timeslices", "voluntary_switches",
          "involuntary_switches", "migrations", "minor_faults", "major_faults")  # fmt: skip
SETUP_FIELDS = ("policy", "nice", "affinity", "cgroup", "limits", "caps", "seccomp",
                "no_new_privs", "umask", "oom_score_adj", "threads", "fds")  # fmt: skip


def _sched_field(text: str, name: str) -> int:
    found = re.search(rf"^{re.escape(name)}\s*:\s*(\d+)", text, re.M)
    return int(found.group(1)) if found else 0


def counts(pid: int) -> dict[str, float]:
    """The process's threads, summed: what the kernel has counted for it so far."""
    total = dict.fromkeys(COUNTS, 0.0)
    for thread in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu_ns, wait_ns, slices = map(int, (thread / "schedstat").read_text().split())
            sched = (thread / "sched").read_text()
        except (OSError, ValueError):
            continue  # a thread that ended between the listing and the read
        total["cpu_ms"] += cpu_ns / 1e6
        total["runqueue_wait_ms"] += wait_ns / 1e6
        total["timeslices"] += slices
        total["voluntary_switches"] += _sched_field(sched, "nr_voluntary_switches")
        total["involuntary_switches"] += _sched_field(sched, "nr_involuntary_switches")
        total["migrations"] += _sched_field(sched, "se.nr_migrations")
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    total["minor_faults"], total["major_faults"] = float(fields[7]), float(fields[9])
    return total


def setup(pid: int) -> dict[str, object]:
    """What the trainer runs with, beside its code."""
    proc = Path(f"/proc/{pid}")
    status = (proc / "status").read_text()

    def status_field(name: str) -> str:
        found = re.search(rf"^{name}:\s*(.*)$", status, re.M)
        return found.group(1).strip() if found else ""

    fds: dict[str, int] = {}
    for fd in (proc / "fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        kind = target.split(":")[0] if ":" in target and not target.startswith("/") else "file"
        fds[kind] = fds.get(kind, 0) + 1
    stat = (proc / "stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    environ = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
    return {
        "policy": os.sched_getscheduler(pid),
        "nice": int(fields[16]),
        "affinity": sorted(os.sched_getaffinity(pid)),
        "cgroup": (proc / "cgroup").read_text().strip(),
        "limits": (proc / "limits").read_text().splitlines()[1:],
        "caps": status_field("CapEff"),
        "seccomp": status_field("Seccomp"),
        "no_new_privs": status_field("NoNewPrivs"),
        "umask": status_field("Umask"),
        "oom_score_adj": (proc / "oom_score_adj").read_text().strip(),
        "threads": int(status_field("Threads") or 0),
        "fds": dict(sorted(fds.items())),
        "environ": dict(e.split("=", 1) for e in environ if "=" in e),
    }


def _text(logs: list[Path]) -> str:
    return "\n".join(log.read_text(errors="replace") for log in logs if log.exists())


def _both_past(logs: list[Path], epoch: int) -> bool:
    return sum(1 for e, _ in epoch_rates(_text(logs)) if e == epoch) >= 2


def _window(pids: list[int], logs: list[Path], epochs: int) -> tuple[dict[str, float], list[dict]]:
    """The trainers' counts from the end of FIRST_COUNTED to the end of epochs - 1, per step
    of one trainer (both trainers' counts over both trainers' steps); each one's setup."""
    wait(lambda: _both_past(logs, FIRST_COUNTED), 300, 0.02)
    before = [counts(p) for p in pids]
    setups = [setup(p) for p in pids]
    wait(lambda: _both_past(logs, epochs - 1), 300, 0.02)
    after = [counts(p) for p in pids]
    steps = 2 * STEPS_PER_EPOCH * (epochs - 1 - FIRST_COUNTED)
    per_step = {k: sum(a[k] - b[k] for a, b in zip(after, before, strict=True)) / steps
                for k in COUNTS}  # fmt: skip
    return per_step, setups


def by_hand(root: Path, epochs: int) -> dict:
    """Two workers started by hand (measure.raw_run's way), counted over the middle epochs."""
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    job_dir = Path(tempfile.mkdtemp(dir=root, prefix="raw-"))
    logs = [job_dir / f"w{i}.log" for i in range(2)]  # one each: no line of one inside another's
    procs = []
    for i in range(2):
        with open(logs[i], "wb") as out:
            env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                   "ORCHESTRATE_JOB_DIR": str(job_dir),
                   "TF_CONFIG": json.dumps({"cluster": cluster,
                                            "task": {"type": "worker", "index": i}})}  # fmt: skip
            procs.append(subprocess.Popen([PY, str(TRAINER), "--epochs", str(epochs), "--raw"],
                                          stdout=out, stderr=subprocess.STDOUT, env=env,
                                          cwd=REPO))  # fmt: skip
    try:
        per_step, setups = _window([p.pid for p in procs], logs, epochs)
        for p in procs:
            p.wait(timeout=300)
    finally:
        kill_left(procs)
    rate = middle_rate(epoch_rates(_text(logs)), epochs)
    return {"steps_per_s": rate, "per_step": per_step, "setups": setups}


def _trainer_pids(home: Path) -> list[int]:
    """The job's two trainers: the bootstrap processes of this ORCHESTRATE_HOME (a first launch
    with no kept standby starts them cold, by the bootstrap's path), or the script itself."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        started = cmdline.split("\0")[1:2]
        trainer = "bootstrap.py" in cmdline or started == [str(TRAINER)]  # instrument = false
        if trainer and f"ORCHESTRATE_HOME={home}\0".encode() in environ:
            found.append(int(entry.name))
    return sorted(found)


def under_orchestrate(root: Path, home: Path, epochs: int) -> dict:
    """`orchestrate launch` in the foreground, every default on, counted over the same epochs."""
    no_kept_standbys()
    log = root / f"ours-{time.monotonic_ns()}.log"
    with open(log, "ab") as out:
        launch = subprocess.Popen([PY, "-m", "orchestrator", "launch",
                                   str(local_config(root, epochs))],
                                  stdout=out, stderr=subprocess.STDOUT, env=orch_env(home),
                                  cwd=REPO)  # fmt: skip
    try:
        wait(lambda: len(_trainer_pids(home)) == 2, 300, 0.05)
        per_step, setups = _window(_trainer_pids(home), [log], epochs)
        assert launch.wait(timeout=300) == 0, log.read_text()[-2000:]
    finally:
        kill_left([launch])
    rate = middle_rate(epoch_rates(log.read_text(errors="replace")), epochs)
    return {"steps_per_s": rate, "per_step": per_step, "setups": setups}


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """The median's distribution-free confidence interval of at least 95 % (the order
    statistics a binomial(n, 1/2) puts the median between), and the confidence it has."""
    ordered, n = sorted(values), len(values)
    best = (ordered[0], ordered[-1], 1 - 2 * 0.5**n)
    for j in range(2, (n + 1) // 2 + 1):  # [x_(j), x_(n+1-j)], narrower as j grows
        cover = 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n
        if cover < 0.95:
            break
        best = (ordered[j - 1], ordered[n - j], cover)
    return best


def differences(ours: dict, theirs: dict) -> list[str]:
    """What a trainer under orchestrate runs with that a hand-started one does not."""
    lines = []
    for field in SETUP_FIELDS:
        if ours[field] != theirs[field]:
            lines.append(f"{field}: by hand {theirs[field]!r}, ours {ours[field]!r}")
    env_ours, env_theirs = ours["environ"], theirs["environ"]
    for key in sorted(set(env_ours) | set(env_theirs)):
        a, b = env_theirs.get(key), env_ours.get(key)
        if a != b and key != "TF_CONFIG":  # TF_CONFIG's ports differ by construction
            lines.append(f"env {key}: by hand {_short(a)}, ours {_short(b)}")
    return lines


def _short(value: str | None) -> str:
    if value is None:
        return "(unset)"
    return repr(value if len(value) <= 60 else value[:57] + "...")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "p3_counts.json")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="orch-p3-counts-"))
    home = root / "home"
    pairs = []
    for i in range(args.pairs):  # the order alternates: neither side always goes first
        if i % 2:
            ours = under_orchestrate(root, home, args.epochs)
            theirs = by_hand(root, args.epochs)
        else:
            theirs = by_hand(root, args.epochs)
            ours = under_orchestrate(root, home, args.epochs)
        pairs.append({"by_hand": theirs, "ours": ours})
        print(f"pair {i + 1}: {theirs['steps_per_s']:.1f} by hand, {ours['steps_per_s']:.1f} "
              f"ours ({ours['steps_per_s'] / theirs['steps_per_s']:.3f}x)", flush=True)  # fmt: skip
    ratios = [p["ours"]["steps_per_s"] / p["by_hand"]["steps_per_s"] for p in pairs]
    low, high, cover = median_interval(ratios)
    table = {}
    for key in COUNTS:
        theirs = statistics.median(p["by_hand"]["per_step"][key] for p in pairs)
        ours = statistics.median(p["ours"]["per_step"][key] for p in pairs)
        table[key] = {"by_hand": round(theirs, 4), "ours": round(ours, 4),
                      "ratio": round(ours / theirs, 3) if theirs else None}  # fmt: skip
    diff = differences(pairs[0]["ours"]["setups"][0], pairs[0]["by_hand"]["setups"][0])
    print(f"\nP3 {statistics.median(ratios):.3f}x, median of {len(ratios)} pairs; "
          f"{cover:.1%} interval {low:.3f}-{high:.3f}")  # fmt: skip
    print("\nper training step (one trainer), medians over pairs:  by hand / ours / ratio")
    for key, row in table.items():
        ratio = f"{row['ratio']:.3f}x" if row["ratio"] is not None else "-"
        print(f"  {key:22} {row['by_hand']:10.4f} {row['ours']:10.4f}  {ratio}")
    print("\nwhat the trainer runs with, where it differs from a hand-started one:")
    for line in diff or ["(nothing)"]:
        print("  " + line)
    # The environment is summed up by its differences; the rlimits kept once, for each side.
    setups = {side: {k: v for k, v in pairs[0][side]["setups"][0].items() if k != "environ"}
              for side in ("by_hand", "ours")}  # fmt: skip
    for p in pairs:
        for side in p.values():
            side["per_step"] = {k: round(v, 4) for k, v in side["per_step"].items()}
            for s in side["setups"]:
                s.pop("environ")
                s.pop("limits")
    result = {"measured": time.strftime("%Y-%m-%d %H:%M"), "pairs": len(pairs),
              "epochs": args.epochs, "counted_epochs":
              [FIRST_COUNTED + 1, args.epochs - 1], "ratios": [round(r, 4) for r in ratios],
              "median": round(statistics.median(ratios), 4),
              "interval": [round(low, 4), round(high, 4)], "confidence": round(cover, 4),
              "per_step": table, "differences": diff, "setups": setups,
              "rounds": pairs}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
