#!/usr/bin/env python3
"""P10/P11: losing a host, on the namespaced SSH test bed (3 hosts, real TensorFlow, the plain
`fit` script of P9, which imports nothing of orchestrate). Needs root (network namespaces).

P10: link down -> orchestrate's group stopping (the job's failure event), against TensorFlow's
     own failure time in the same run: the same script started by hand with TF_CONFIG on the
     three hosts, link down -> the first surviving worker exits.
P11: link down -> training resumed on a spare (two hosts train, the third is a spare), against
     P10 plus 2 s: the link goes down once the job is as a user's runs most of the time, past
     standby_delay, every task's standby and the spare's ready (default settings).

    sudo uv run python -m scripts.benchmarks.hostloss [--repeat N]
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchmarks.measure import epochs_logged, no_kept_standbys, wait, wait_epochs_past
from scripts.benchmarks.rows import Row, measure_alone
from tests.beds import ssh as tb

REPO = Path(__file__).resolve().parents[2]

PY = sys.executable
PLAIN = REPO / "tests" / "fixtures" / "plain_fit.py"
EPOCHS = 400  # far more than a measurement lasts: every run is ended on purpose
RAW_PORT = 23456
MARGIN = 2.0  # P11's target: P10 (the loss noticed) plus this, a warm restart's worth
RAW_CAP = 120.0  # seconds: a survivor still hung then is a failed round, not a number


def link(host: tb.TestHost, state: str) -> None:
    subprocess.run(["ip", "link", "set", host.veth, state], check=True)


def raw_link_down(bed: tb.Testbed, root: Path) -> float | None:
    """TensorFlow's own reaction: three workers started by hand in the hosts' namespaces; h2's
    link goes down at epoch 2; seconds until a surviving worker exits."""
    hosts = bed.hosts[:3]
    cluster = {"worker": [f"{h.address}:{RAW_PORT}" for h in hosts]}
    run_dir = Path(tempfile.mkdtemp(dir=root, prefix="raw-loss-"))
    logs = [run_dir / f"w{i}.log" for i in range(3)]
    procs = []
    for i, host in enumerate(hosts):
        env = {
            **os.environ,
            "TF_USE_LEGACY_KERAS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
        }
        argv = ["ip", "netns", "exec", host.namespace, PY, str(PLAIN), "--bench",
                "--epochs", str(EPOCHS), "--backup-dir", str(run_dir / "backup")]  # fmt: skip
        with open(logs[i], "wb") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env))
    try:
        wait(lambda: all(epochs_logged(log) >= 2 for log in logs), 180)
        link(hosts[2], "down")
        cut = time.time()
        try:
            wait(lambda: procs[0].poll() is not None or procs[1].poll() is not None, RAW_CAP, 0.05)
            return time.time() - cut
        except TimeoutError:
            return None
    finally:
        link(hosts[2], "up")
        for p in procs:  # `ip netns exec` execs the trainer: the pid is the trainer's
            if p.poll() is None:
                p.kill()
            p.wait()


def job_toml(bed: tb.Testbed, root: Path, name: str, spare: str | None) -> Path:
    text = Path(bed.cluster_toml).read_text()
    shared = root / f"shared-{name}"
    shared.mkdir()
    text = text.replace(f'shared_dir = "{bed.root}/shared"', f'shared_dir = "{shared}"')
    text = text.replace('name = "testbed"', f'name = "{name}"')
    text = text.replace('module = "worker.examples.digits"', f'script = "{PLAIN}"')
    text = re.sub(
        r"(?m)^args = .*$",
        f'args = ["--bench", "--epochs", "{EPOCHS}", "--backup-dir", "{shared}/backup"]',
        text,
    )
    text = text.replace("connect_timeout = 5.0", "connect_timeout = 2.0")
    text = text.replace("[backend]", "[restart]\nbackoff = 0.2\n\n[backend]")
    if spare is not None:
        text = text.replace(f'name = "{spare}"', f'name = "{spare}"\nspare = true')
    path = root / f"{name}.toml"
    path.write_text(text)
    return path


def orchestrate(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCHESTRATE_HOME": str(home)}
    return subprocess.run([PY, "-m", "orchestrator", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300, check=False)  # fmt: skip


def job_json(home: Path, job: str) -> dict:
    out = orchestrate(home, "status", job, "--json")
    return json.loads(out.stdout)["jobs"][0]


def standbys_ready(job_id: str) -> int:
    """The job's keepers (on every namespaced host: they share this /tmp) whose standby has
    imported TensorFlow."""
    from worker.warm.registry import entries

    return sum(1 for e in entries(every_host=True) if e.job == job_id and e.standby_ready)


def orchestrated_link_down(
    bed: tb.Testbed, root: Path, home: Path, spare: bool
) -> tuple[float, float | None, str]:
    """Launch (detached) on the test bed, cut a training host's link at epoch 2: seconds to
    the job's failure event (the group stopping), and with h2 as a spare and h1 cut, seconds
    to the first training step on the spare (else None) and how the task moved there started
    ('warm' or 'cold', from its log)."""
    name = f"loss-{'spare' if spare else 'stop'}-{int(time.time() * 1000) % 100000}"
    path = job_toml(bed, root, name, "h2" if spare else None)
    no_kept_standbys()
    out = orchestrate(home, "launch", "--detach", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split()[1]
    victim = bed.hosts[1 if spare else 2]
    tasks = len(job_json(home, job_id)["tasks"])  # two beside a spare, else three
    logs = [root / f"shared-{name}" / job_id / "logs" / f"worker-{i}.log" for i in range(tasks)]
    try:
        wait(lambda: all(epochs_logged(log) >= 2 for log in logs), 240, 0.3)
        if spare:  # one standby per task and one on the spare
            wait(lambda: standbys_ready(job_id) >= tasks + 1, 240, 1.0)
        before = [epochs_logged(log) for log in logs]
        link(victim, "down")
        cut = time.time()
        # The times are the supervisor's own records (its failure event, its first step on the
        # spare), read back once they exist; `orchestrate status` is not polled often while
        # they are made, as each call is a Python start taking CPU from the job it times.

        def stopping() -> list[float]:
            events = job_json(home, job_id)["events"]
            return [e["ts"] for e in events if e["kind"] == "failure"]

        if not spare:
            failure = wait(stopping, 120, 1.0)
            return failure[0] - cut, None, ""  # type: ignore[index]

        def resumed() -> float | None:
            """The new attempt's first step seen, on any task once the spare is in the group:
            a step is counted after its gradients' all-reduce, which the spare's task is
            part of. (Not the spare's own status: here the cut-off host still reaches the
            shared directory, and its agent writes that task's status file until it gives
            up, which a host cut off from an NFS share could not.)"""
            job = job_json(home, job_id)
            now = [t for t in job["tasks"] if t["attempt"] == job["attempt"]]
            if not any(t["host"] == "h2" for t in now):
                return None
            steps = [t["first_step_at"] for t in now if t["first_step_at"]]
            return min(steps) if steps else None

        wait_epochs_past(logs, before)
        on_spare = float(wait(resumed, 60, 0.5)) - cut  # type: ignore[arg-type]
        starts = re.findall(r"\] (warm|cold) start", logs[1].read_text(errors="replace"))
        return wait(stopping, 30, 0.5)[0] - cut, on_spare, starts[-1] if starts else "?"  # type: ignore[index]
    finally:
        link(victim, "up")
        orchestrate(home, "stop", job_id)
        orchestrate(home, "stop", job_id)  # a second one confirms what the first could not


def host_loss_rows(root: Path, repeat: int, p10: Row, p11: Row, quick: bool = False) -> None:
    """`quick` (a smoke run): P10 is read from P11's run (its failure event), one job fewer."""
    reason = tb.missing_requirements()
    if reason:
        p10.skipped = p11.skipped = f"no SSH test bed: {reason}"
        return
    bed = tb.up(3, root / "bed-loss")
    home = root / "home-loss"
    spare_starts: list[str] = []
    try:
        for _ in range(repeat):
            raw = raw_link_down(bed, root)
            ours = None if quick else orchestrated_link_down(bed, root, home, spare=False)[0]
            noticed, on_spare, start = orchestrated_link_down(bed, root, home, spare=True)
            spare_starts.append(start)
            ours = noticed if ours is None else ours
            if raw is None:
                p10.failed_rounds += 1  # TensorFlow still hung at the cap: no pair
            else:
                p10.baseline.append(raw)
                p10.values.append(ours)
            assert on_spare is not None
            p11.values.append(on_spare)
        p11.baseline = list(p10.baseline)
        p11.target_value = statistics.median(p10.values) + MARGIN
        p11.paired = False  # P11 is shown beside TensorFlow's failure time, not a ratio
        p10.note = "3 SSH hosts, plain fit script; rounds (ours/TF): " + ", ".join(
            f"{a:.1f}/{b:.1f}" for a, b in zip(p10.values, p10.baseline, strict=True)
        )
        rounds = zip(p11.values, spare_starts, strict=True)
        p11.note = "2 hosts + 1 spare, standbys ready; rounds (the moved task's start): " + (
            ", ".join(f"{v:.1f} ({how})" for v, how in rounds)
        )
    finally:
        tb.down(root / "bed-loss")


def rows() -> tuple[Row, Row]:
    p10 = Row(
        "P10",
        "host link down -> group stopping",
        "s",
        target_value=5.0,
        baseline_label="TensorFlow's own: a survivor exits",
        target="<= 5 s",
    )
    p11 = Row(
        "P11",
        "host link down -> training resumed on a spare",
        "s",
        baseline_label="TensorFlow's own: a survivor exits",
        target="<= P10 + 2 s",
    )
    return p10, p11


def main() -> int:
    p10, p11 = rows()
    return measure_alone(
        __doc__ or "", "scripts/benchmarks/hostloss.py", [p10, p11],
        lambda tmp, repeat: host_loss_rows(tmp, repeat, p10, p11),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
