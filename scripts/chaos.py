"""A chaos soak: real jobs (the plain `fit` script, real TensorFlow), faults injected from a
schedule drawn from a seed, invariants checked after every fault and at the end.

    python scripts/chaos.py --backend local --faults 10 --seed 7 --json chaos.json
    python scripts/chaos.py --quick            # about 10 faults, the seed drawn from the date

Each job runs until it has met `--per-job` faults, then is stopped or allowed to end; a new job
starts until `--faults` faults were injected. One line per fault; the last line is
`chaos: N faults, M recovered, K violations (seed S)`, and the exit status is 0 only when K is 0.
A violation is recorded with the seed and the schedule so far, to be replayed.

Backends: local only for now (the SSH and Slurm test beds are not driven yet).
Fault kinds: a trainer SIGKILLed, an agent SIGKILLed, a trainer SIGSTOPped past
progress_timeout (a hang), a trainer SIGTERMed (a preemption: it checkpoints and exits with the
preemption code; the restart budget is not spent), the supervisor SIGKILLed and `attach`ed, the
supervisor SIGSTOPped for 1-4 s (a coordinator stall) then SIGCONTed.
Invariants: the job ends succeeded or stopped (never running, stopping or failed with the
budget unspent); every restart resumes at or after the last completed epoch; no process of the
job is left; strangers (plain sleeps of this user started beside the job) all survive; each
fault is seen within its bound (a dead process 2 s, a hang progress_timeout + 2 s); a
preemption does not spend the restart budget; a stall restarts nothing; `status` never shows a
killed process `running` past host_timeout + a keep-alive, nor `stopped` a process that runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PLAIN_FIT = REPO / "tests" / "fixtures" / "plain_fit.py"
PY = sys.executable
KINDS = (
    "trainer_kill", "agent_kill", "trainer_hang", "preemption", "supervisor_kill",
    "supervisor_stall",
)  # fmt: skip
PROGRESS_TIMEOUT = 6.0
HOST_TIMEOUT, KEEPALIVE = 5.0, 1.0  # the defaults: a row may say `running` this long after
BOUNDS = {  # seconds from the fault to the supervisor's failure event
    "trainer_kill": 2.0,
    "agent_kill": 2.0,
    "trainer_hang": PROGRESS_TIMEOUT + 2.0,
    "preemption": 2.0,
}


@dataclass
class Fault:
    job: str
    kind: str
    task: int
    at: float  # wall clock of the injection (this machine's; the job's events are too)
    detected_s: float | None = None
    recovered_s: float | None = None
    epoch_before: int = 0
    resumed_at_epoch: int | None = None
    violations: list[str] = field(default_factory=list)


def cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCHESTRATE_HOME": str(home)}
    return subprocess.run(
        [PY, "-m", "orchestrator", *args], capture_output=True, text=True, env=env,
        timeout=timeout, cwd=REPO, check=False,
    )  # fmt: skip


def view(home: Path, job: str) -> dict[str, Any]:
    out = cli(home, "status", job, "--json")
    return dict(json.loads(out.stdout)["jobs"][0])


def wait(predicate: Any, timeout: float, interval: float = 1.0) -> Any:
    """Polls by `status` (a process each): gently, beside two trainers on a small machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def job_processes(job: str) -> list[int]:
    """Every live process carrying the job's id (in its environment or its arguments)."""
    needle = f"ORCHESTRATE_JOB_ID={job}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and (needle in environ.split(b"\0") or job.encode() in cmdline):
            found.append(int(entry.name))
    return found


def runs_in_job(pid: int, job: str) -> bool:
    """Whether pid is a live (not zombie) process carrying the job's id."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return ") Z " not in stat and f"ORCHESTRATE_JOB_ID={job}".encode() in environ.split(b"\0")


def write_config(root: Path, name: str, epochs: int) -> Path:
    shared = root / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}.toml"
    path.write_text(f"""
[job]
name = "{name}"
shared_dir = "{shared}"

[entrypoint]
script = "{PLAIN_FIT}"
args = ["--epochs", "{epochs}", "--backup-dir", "{shared}/backup-{name}", "--step-delay", "0.05"]
env = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}

[backend]
type = "local"
workers = 2

[supervision]
progress_timeout = {PROGRESS_TIMEOUT}
heartbeat_interval = 0.5

[restart]
max_restarts = 1000
backoff = 0.5
""")
    return path


def training_now(v: dict[str, Any]) -> bool:
    return v["state"] == "running" and all(
        t["state"] == "running" and t["attempt"] == v["attempt"] and t["step"] > 0 and t["pid"]
        for t in v["tasks"]
    )


def training(home: Path, job: str) -> dict[str, Any] | None:
    """The job's view once every task of its current attempt has stepped."""
    v = view(home, job)
    return v if training_now(v) else None


def inject(home: Path, v: dict[str, Any], kind: str, task: int, supervisor: list[int]) -> None:
    t = v["tasks"][task]
    for pid in (t["pid"], t["agent_pid"]):  # only the job's own processes are ever signalled
        if not (isinstance(pid, int) and pid > 1 and runs_in_job(pid, v["id"])):
            raise SystemExit(f"chaos: pid {pid} is not a live process of {v['id']}: not signalled")
    if kind in ("supervisor_kill", "supervisor_stall"):
        sup = v["supervisor"]["pid"]
        cmd = Path(f"/proc/{sup}/cmdline").read_bytes() if sup and sup > 1 else b""
        if v["id"].encode() not in cmd or b"orchestrator" not in cmd:
            raise SystemExit(f"chaos: pid {sup} is not the supervisor of {v['id']}")
    if kind == "trainer_kill":
        os.kill(t["pid"], signal.SIGKILL)
    elif kind == "agent_kill":
        os.kill(t["agent_pid"], signal.SIGKILL)
    elif kind == "trainer_hang":
        os.kill(t["pid"], signal.SIGSTOP)
    elif kind == "preemption":
        os.kill(t["pid"], signal.SIGTERM)
    elif kind == "supervisor_stall":
        pid = v["supervisor"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.0 + 3.0 * (task + 1) / len(v["tasks"]))  # 1-4 s, from the drawn task
        os.kill(pid, signal.SIGCONT)
    elif kind == "supervisor_kill":
        os.kill(v["supervisor"]["pid"], signal.SIGKILL)
        time.sleep(0.5)
        env = {**os.environ, "ORCHESTRATE_HOME": str(home)}
        attached = subprocess.Popen(
            [PY, "-m", "orchestrator", "attach", v["id"], "--plain"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
        supervisor.append(attached.pid)


def check_fault(home: Path, fault: Fault, before: dict[str, Any]) -> None:
    """After a fault: the group was seen failing within its bound, then resumed from the last
    completed epoch or later; a preemption spent no budget."""
    if fault.kind == "supervisor_kill":
        back = wait(lambda: view(home, fault.job)["supervisor"]["alive"], 60)
        if not back:
            fault.violations.append("no supervisor after attach")
        return
    if fault.kind == "supervisor_stall":
        time.sleep(HOST_TIMEOUT + KEEPALIVE)  # long enough for a wrong verdict to show
        after = view(home, fault.job)
        if after["attempt"] != before["attempt"] or after["state"] != "running":
            fault.violations.append(
                f"a {fault.kind} changed the job: {after['state']}, attempt {after['attempt']}"
                f" ({after['last_cause']})"
            )
        return
    gone = before["tasks"][fault.task]["pid" if fault.kind != "agent_kill" else "agent_pid"]

    def resumed_view() -> dict[str, Any] | None:
        v = view(home, fault.job)
        late = time.time() - fault.at > HOST_TIMEOUT + KEEPALIVE
        for t in v["tasks"]:  # a dead process shown running well after its death: a lie
            shown = t["state"] == "running" and gone in (t["pid"], t["agent_pid"])
            if late and shown and fault.kind != "trainer_hang":
                fault.violations.append(f"status shows pid {gone} running after its death")
        if v["state"] == "running" and v["attempt"] > before["attempt"] and training_now(v):
            return v
        return None

    resumed = wait(resumed_view, 180)
    if not resumed:
        fault.violations.append("the job did not resume within 180 s")
        return
    failures = [e for e in resumed["events"] if e["kind"] == "failure" and e["ts"] >= fault.at]
    if failures:
        fault.detected_s = round(failures[0]["ts"] - fault.at, 3)
        bound = BOUNDS[fault.kind]
        if fault.detected_s > bound:
            fault.violations.append(f"seen after {fault.detected_s:.2f} s (bound {bound:g} s)")
    else:
        fault.violations.append("no failure event")
    firsts = [t["first_step_at"] for t in resumed["tasks"] if t["first_step_at"]]
    fault.recovered_s = round(max(firsts) - fault.at, 3) if firsts else None
    fault.resumed_at_epoch = min(t["initial_epoch"] for t in resumed["tasks"])
    if fault.resumed_at_epoch < fault.epoch_before:
        fault.violations.append(
            f"resumed at epoch {fault.resumed_at_epoch}, below the last completed "
            f"{fault.epoch_before}"
        )
    spent = resumed["restarts"] - resumed["preemptions"]
    spent_before = before["restarts"] - before["preemptions"]
    if fault.kind == "preemption" and spent != spent_before:
        fault.violations.append("a preemption spent the restart budget")


def strangers(count: int) -> list[subprocess.Popen[bytes]]:
    """Plain processes of this user beside the job: no fault of ours may touch them."""
    return [subprocess.Popen(["sleep", "3600"], start_new_session=True) for _ in range(count)]


def run_job(home: Path, root: Path, rng: random.Random, n: int, faults: list[Fault]) -> list[str]:
    name = f"chaos{len(faults)}"
    path = write_config(root, name, epochs=300)  # ended by a stop after its faults
    bystanders = strangers(3)
    out = cli(home, "launch", "--detach", "--plain", str(path), timeout=300)
    if out.returncode != 0:
        return [f"launch failed: {out.stderr.strip()[-300:]}"]
    job = json.loads(cli(home, "status", "--json").stdout)["jobs"][0]["id"]  # the newest
    supervisors: list[int] = []
    problems: list[str] = []
    try:
        for _ in range(n):
            before = wait(lambda: training(home, job), 240)
            if not before:
                problems.append(f"{job}: not training before a fault")
                break
            kind = rng.choice(KINDS)
            task = rng.randrange(len(before["tasks"]))
            epoch = max(0, min(t["epoch"] for t in before["tasks"]) - 1)
            fault = Fault(job, kind, task, time.time(), epoch_before=epoch)
            inject(home, before, kind, task, supervisors)
            check_fault(home, fault, before)
            faults.append(fault)
            said = "; ".join(fault.violations) or "ok"
            print(
                f"fault {len(faults)}: {kind} worker-{task} of {job}: detected "
                f"{fault.detected_s} s, recovered {fault.recovered_s} s, {said}",
                flush=True,
            )
            if fault.violations and "did not resume" in said:
                break
    finally:
        stopped = cli(home, "stop", job, timeout=300)
        final = view(home, job)
        if final["state"] not in ("succeeded", "stopped"):
            problems.append(f"{job}: ended {final['state']} ({final['last_cause']})")
        if stopped.returncode != 0 and final["state"] != "succeeded":
            problems.append(f"{job}: stop exited {stopped.returncode}: {stopped.stderr.strip()}")
        for t in final["tasks"]:
            if t["state"] == "stopped" and t["pid"] and runs_in_job(t["pid"], job):
                problems.append(f"{job}: worker-{t['index']} shown stopped, {t['pid']} runs")
        left = wait(lambda: not job_processes(job), 15)
        if not left:
            problems.append(f"{job}: processes left 15 s after the end: {job_processes(job)}")
        for proc in bystanders:
            if proc.poll() is not None:
                problems.append(f"a stranger (pid {proc.pid}) was signalled")
            proc.kill()
            proc.wait()
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="local", choices=["local"])
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--per-job", type=int, default=5)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(datetime.date.today().strftime("%Y%m%d"))
    if args.quick:
        args.faults, args.per_job = 10, 5
    rng = random.Random(seed)
    print(f"chaos: seed {seed}, {args.faults} faults on the {args.backend} backend", flush=True)
    faults: list[Fault] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        root = Path(tmp)
        home = root / "home"
        while len(faults) < args.faults:
            n = min(args.per_job, args.faults - len(faults))
            before = len(faults)
            problems += run_job(home, root, rng, n, faults)
            if len(faults) == before:
                break  # a job that could not be faulted: said in problems
    violations = problems + [
        f"fault {i + 1}: {v}" for i, f in enumerate(faults) for v in f.violations
    ]
    recovered = sum(1 for f in faults if not f.violations)
    for line in problems:
        print(f"violation: {line}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "seed": seed, "backend": args.backend, "faults": [asdict(f) for f in faults],
            "violations": violations,
        }, indent=2))  # fmt: skip
    print(f"chaos: {len(faults)} faults, {recovered} recovered, {len(violations)} violations "
          f"(seed {seed})")  # fmt: skip
    sys.exit(0 if not violations else 1)


if __name__ == "__main__":
    main()
