"""What a chaos soak (scripts/chaos.py) asks of the job after each fault and at its end: the
fault seen within its bound, the job back from the last checkpoint with the budget spent as
documented, `status` never lying, every numbered line logged once, the checkpoint loadable, and
nothing of the job left."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.agents import agent_pid as agent_hosts_pid
from scripts.soak.beds import HOST_TIMEOUT, KEEPALIVE

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
PROGRESS_TIMEOUT = 6.0
# What each kind must do to the job: restart the group, leave it be, either (a link down for
# about host_timeout), or kinds of their own.
RESTARTS = {
    "trainer_kill", "agent_kill", "trainer_hang", "preemption", "host_reboot", "link_long",
    "slurm_preempt",
}  # fmt: skip
STEADY = {"supervisor_stall", "link_short", "sshd_kill", "attach_live"}
# A restart or none: a link down for about host_timeout; a keeper killed (its standby, maybe the
# trainer, go with it); a standby or a host helper killed (replaced, unseen by training).
# A shared_dir full for 3-6 s: a trainer whose print or checkpoint fails ends, maybe more than
# once while it lasts.
EITHER = {"link_about", "keeper_kill", "standby_kill", "helper_kill", "shared_full"}
PREEMPTIONS = {"preemption", "slurm_preempt"}  # a restart that spends no budget
RESTART_WAIT = re.compile(r", in ([0-9.]+)s, after: ")  # the supervisor's restart event
BOUNDS = {  # seconds from the fault to the supervisor's failure event
    "trainer_kill": 2.0,
    "agent_kill": 2.0,
    "preemption": 2.0,
    "trainer_hang": PROGRESS_TIMEOUT + 2.0,
    "host_reboot": HOST_TIMEOUT + 1.0,
    "link_long": HOST_TIMEOUT + 1.0,
    "link_about": HOST_TIMEOUT + 1.0,
    "keeper_kill": 2.0,
    "standby_kill": 2.0,
    "helper_kill": HOST_TIMEOUT + 1.0,
    "shared_full": 2.0,  # after the shared_dir has room again
}
SETTLE = {  # how long a steady kind is watched for a wrong verdict
    "supervisor_stall": HOST_TIMEOUT + KEEPALIVE,
    "link_short": 2.0 + HOST_TIMEOUT + KEEPALIVE,
    "sshd_kill": 2.0 + HOST_TIMEOUT + KEEPALIVE,
    "attach_live": 1.0,
}


@dataclass
class Fault:
    backend: str
    job: str
    kind: str
    task: int
    at: float  # wall clock of the injection (this machine's; the job's events are too)
    what: str = ""
    overlap: str = ""  # a second fault injected while this one was being handled
    detected_s: float | None = None
    recovered_s: float | None = None
    epoch_before: int = 0
    resumed_at_epoch: int | None = None
    budget_spent: int = 0
    backoff_s: float | None = None  # the restart's configured wait, reported apart
    warm: int | None = None  # tasks of the attempt that followed started in a warm standby
    tasks: int = 0
    import_wait_s: float | None = None  # the longest a warm start waited for its standby
    violations: list[str] = field(default_factory=list)


class Cli:
    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.env = {**os.environ, **env, "ORCHESTRATE_HOME": str(home)}

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, "-m", "orchestrator", *args], capture_output=True, text=True, env=self.env,
            timeout=timeout, cwd=REPO, check=False,
        )  # fmt: skip

    def popen(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [PY, "-m", "orchestrator", *args], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=self.env, cwd=REPO, start_new_session=True,
        )  # fmt: skip

    def view(self, job: str) -> dict[str, Any]:
        return dict(json.loads(self("status", job, "--json").stdout)["jobs"][0])


def wait(predicate: Any, timeout: float, interval: float = 1.0) -> Any:
    """Polls by `status` (a process each): gently, beside two trainers on a small machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def _serving(job: str) -> set[int]:
    """The keepers serving the job on any host here, and their warm trainers (a keeper's own
    record, worker.warm.registry): a warm trainer was a standby started before the job, and a keeper
    that keeps its standby for a next job serves none, though its arguments name the job."""
    from worker.warm.registry import entries

    found = [e for e in entries(every_host=True) if e.job == job]
    return {e.pid for e in found} | {e.trainer for e in found if e.trainer}


def job_processes(job: str) -> list[int]:
    """Every live process of the job: its id in the environment or the arguments (a keeper:
    only while it serves the job), or a warm trainer its keeper names."""
    needle = f"ORCHESTRATE_JOB_ID={job}".encode()
    serving = _serving(job)
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
        argv = cmdline.split(b"\0")
        if len(argv) > 1 and argv[1].endswith(b"/worker/warm/keeper.py"):
            ours = int(entry.name) in serving
        else:
            ours = needle in environ.split(b"\0") or job.encode() in cmdline
            ours = ours or int(entry.name) in serving
        if state != "Z" and ours:
            found.append(int(entry.name))
    return found


def runs_in_job(pid: Any, job: str) -> bool:
    """Whether pid is a live (not zombie) process carrying the job's id, or its warm trainer."""
    if not (isinstance(pid, int) and pid > 1):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    if ") Z " in stat:
        return False
    return f"ORCHESTRATE_JOB_ID={job}".encode() in environ.split(b"\0") or pid in _serving(job)


def agent_pid(ref: str | None) -> int | None:
    """The pid of the agent a task's stored handle names: an agent host's `pid/ident` (the
    ident `boot:start`), or a Slurm step task's `node:pid` (the bed's nodes share our pids)."""
    if ref and "/" not in ref and ":" in ref:
        pid = ref.rpartition(":")[2]
        return int(pid) if pid.isdigit() and int(pid) > 1 else None
    return agent_hosts_pid(ref)


def training_now(v: dict[str, Any]) -> bool:
    return v["state"] == "running" and all(
        t["state"] == "running" and t["attempt"] == v["attempt"] and t["step"] > 0 and t["pid"]
        for t in v["tasks"]
    )


def check_fault(cli: Cli, fault: Fault, before: dict[str, Any]) -> None:
    """After a fault: the verdict its kind calls for, within its bound, and training again from
    the last completed epoch or later, the restart budget spent as documented."""
    back = lambda: cli.view(fault.job)["supervisor"]["alive"]  # noqa: E731
    if fault.kind == "supervisor_kill" and not wait(back, 60):
        fault.violations.append("no supervisor after attach")
    if fault.kind in STEADY:
        time.sleep(SETTLE[fault.kind])  # long enough for a wrong verdict to show
        after = cli.view(fault.job)
        if after["attempt"] != before["attempt"] or after["state"] != "running":
            fault.violations.append(
                f"a {fault.kind} changed the job: {after['state']}, attempt {after['attempt']}"
                f" ({after['last_cause']})"
            )
        if (
            fault.kind == "attach_live"
            and after["supervisor"]["pid"] != before["supervisor"]["pid"]
        ):
            fault.violations.append("attach took over a job whose supervisor lives")
    if fault.kind not in RESTARTS | EITHER | {"stop_resume"}:
        if not wait(lambda: training_now(cli.view(fault.job)), 120):
            fault.violations.append(
                f"the job did not train again within 120 s: {where(cli, fault)}"
            )
        return
    task = before["tasks"][fault.task]
    gone = agent_pid(task["agent"]) if fault.kind == "agent_kill" else task["pid"]
    killed = fault.kind in ("trainer_kill", "agent_kill", "host_reboot")
    resumed_by_hand: list[object] = []

    def resumed_view() -> dict[str, Any] | None:
        v = cli.view(fault.job)
        late = time.time() - fault.at > HOST_TIMEOUT + KEEPALIVE + 0.5
        for t in v["tasks"]:  # a dead process shown running well after its death: a lie
            shown = t["state"] == "running" and gone in (t["pid"], agent_pid(t["agent"]))
            if late and killed and shown and not runs_in_job(gone, fault.job):
                fault.violations.append(f"status shows pid {gone} running after its death")
        if v["state"] == "failed" and fault.kind == "link_long" and not resumed_by_hand:
            # No spare was free and the host stayed away past host_wait: the job fails, naming it.
            host = before["tasks"][fault.task]["host"]
            if host not in (v["last_cause"] or ""):
                fault.violations.append(f"failed without naming {host}: {v['last_cause']}")
            resumed_by_hand.append(cli("resume", fault.job, "--detach", "--plain", timeout=300))
            fault.what += f"; failed ({v['last_cause']}), resumed"
        if v["state"] == "running" and v["attempt"] > before["attempt"] and training_now(v):
            return v
        if fault.kind in EITHER and time.time() - fault.at > 2 * HOST_TIMEOUT + 2:
            return v if training_now(v) else None  # no restart: training on
        return None

    if fault.kind == "stop_resume":
        stopped = cli("stop", fault.job, timeout=300)
        if stopped.returncode != 0 or cli.view(fault.job)["state"] != "stopped":
            fault.violations.append(f"stop did not stop: {stopped.stderr.strip()[-200:]}")
        resumed_by_hand.append(cli("resume", fault.job, "--detach", "--plain", timeout=300))
    resumed = wait(resumed_view, 180)
    if not resumed:
        fault.violations.append(f"the job did not train again within 180 s: {where(cli, fault)}")
        return
    if resumed["attempt"] == before["attempt"]:
        return  # an EITHER kind that needed no restart
    failures = [e for e in resumed["events"] if e["kind"] == "failure" and e["ts"] >= fault.at]
    if failures and fault.kind in BOUNDS:
        fault.detected_s = round(failures[0]["ts"] - fault.at, 3)
        bound = BOUNDS[fault.kind]
        if fault.kind == "shared_full":  # the agent's report waits for room to write it
            bound += float(fault.what.split(" for ")[1].split()[0])
        if fault.detected_s > bound:
            fault.violations.append(f"seen after {fault.detected_s:.2f} s (bound {bound:g} s)")
    elif failures:
        fault.detected_s = round(failures[0]["ts"] - fault.at, 3)
    elif fault.kind != "stop_resume":
        fault.violations.append("no failure event")
    firsts = [t["first_step_at"] for t in resumed["tasks"] if t["first_step_at"]]
    fault.recovered_s = round(max(firsts) - fault.at, 3) if firsts else None
    waits = [RESTART_WAIT.search(e["message"]) for e in resumed["events"]
             if e["kind"] == "restart" and e["ts"] >= fault.at]  # fmt: skip
    fault.backoff_s = sum(float(w[1]) for w in waits if w) if waits else None
    fault.resumed_at_epoch = min(t["initial_epoch"] for t in resumed["tasks"])
    starts = warm_starts(resumed)
    fault.tasks = len(resumed["tasks"])
    if starts is not None:
        waits = [w for w in starts if w is not None]
        fault.warm, fault.import_wait_s = len(waits), max(waits, default=None)
    if fault.resumed_at_epoch < fault.epoch_before:
        fault.violations.append(
            f"resumed at epoch {fault.resumed_at_epoch}, below the last completed "
            f"{fault.epoch_before}"
        )
    if fault.kind == "stop_resume" or resumed_by_hand:
        return  # a resume starts a fresh budget
    fault.budget_spent = (resumed["restarts"] - resumed["preemptions"]) - (
        before["restarts"] - before["preemptions"]
    )
    want = 0 if fault.kind in PREEMPTIONS else 1
    if fault.kind == "shared_full":
        return  # one restart per trainer that met the full disk: counted, not fixed
    if fault.overlap and fault.budget_spent not in (want, want + 1):
        fault.violations.append(
            f"spent {fault.budget_spent} restarts (overlapped: {want}-{want + 1})"
        )
    elif not fault.overlap and fault.budget_spent != want:
        fault.violations.append(f"spent {fault.budget_spent} restarts of the budget (want {want})")
    counted = resumed["preemptions"] > before["preemptions"]
    # Overlapped, the kill may be seen first: then it is a failure, and spends one restart.
    if fault.kind in PREEMPTIONS and not counted and not (fault.overlap and fault.budget_spent):
        fault.violations.append("a preemption was not counted as one")


ATTEMPT_LINE = re.compile(r"\[orchestrate\] attempt (\d+): ")
WAITED = re.compile(r"warm start: .*\(after ([0-9.]+)s waiting")


def warm_starts(view: dict[str, Any], timeout: float = 10.0) -> list[float | None] | None:
    """How each task of the view's attempt started, by its agent's own lines in the durable
    logs (copied a moment after they are written): the seconds a warm start waited for its
    standby's import (0.0: ready), None for a cold start; None: not all seen."""
    logs = Path(view["job_dir"]) / "logs"

    def said() -> list[float | None] | None:
        seen = []
        for t in view["tasks"]:
            try:
                text = (logs / f"{t['type']}-{t['index']}.log").read_bytes()[-2_000_000:]
            except OSError:
                return None
            parts = ATTEMPT_LINE.split(text.decode("utf-8", "replace"))
            # [before, n, text of attempt n, m, text of attempt m, ...]: this attempt's text
            mine = [parts[i + 1] for i in range(1, len(parts) - 1, 2)
                    if int(parts[i]) == view["attempt"]]  # fmt: skip
            if not mine or not ("warm start:" in mine[-1] or "cold start" in mine[-1]
                                or "no warm standby" in mine[-1]):  # fmt: skip
                return None
            waited = WAITED.search(mine[-1])
            warm = "warm start:" in mine[-1]
            seen.append((float(waited[1]) if waited else 0.0) if warm else None)
        return seen

    return wait(said, timeout, interval=0.5)  # type: ignore[no-any-return]


def where(cli: Cli, fault: Fault) -> str:
    """What the job looks like when it did not come back: for the record, to replay."""
    v = cli.view(fault.job)
    tasks = [(t["host"], t["state"], t["attempt"], t["step"]) for t in v["tasks"]]
    events = [f"{e['kind']}: {e['message'][:160]}" for e in v["events"][-6:]]
    return (f"{v['state']} attempt {v['attempt']} ({v['last_cause']}); tasks {tasks}; "
            f"hosts {v['host_notes']}; events {events}")  # fmt: skip


NUMBERED = re.compile(r"numbered ([0-9a-f]{8}) (\d+)\s*$")


def check_numbered_lines(cli: Cli, job: str, truth_dir: Path) -> list[str]:
    """Every line each run printed is in the durable copy once; only a run's last line may be
    missing (a kill between writing the truth and printing it)."""
    out = cli("logs", job, timeout=300)
    if out.returncode != 0:
        return [f"{job}: logs exited {out.returncode}: {out.stderr.strip()[-200:]}"]
    printed: dict[str, Counter[int]] = {}
    last: dict[str, str] = {}  # each run's last number as printed
    for line in out.stdout.splitlines():
        if m := NUMBERED.search(line):
            printed.setdefault(m.group(1), Counter())[int(m.group(2))] += 1
            last[m.group(1)] = m.group(2)
    problems = []
    for path in sorted(truth_dir.iterdir()):
        run = path.name.split("-", 1)[1]
        truth = [int(n) for n in path.read_text().split()]
        got = printed.pop(run, Counter())
        final = str(max(truth, default=0))
        if run in last and last[run] != final and final.startswith(last[run]):
            got[int(last[run])] -= 1  # the run's last line, cut short by a full disk ("39" -> "3")
            got += Counter()  # drops a count of 0
        doubled = sorted(n for n, c in got.items() if c > 1)
        missing = sorted(set(truth) - set(got) - {max(truth, default=0)})
        if doubled:
            problems.append(f"{job}: run {run} lines doubled in the logs: {doubled[:5]}")
        if missing:
            problems.append(f"{job}: run {run} lines missing from the logs: {missing[:5]} "
                            f"({len(missing)} of {len(truth)})")  # fmt: skip
    if printed:
        problems.append(f"{job}: lines of runs that wrote no truth: {sorted(printed)[:3]}")
    return problems


LOADS = """
import sys, tensorflow as tf
found = [p for p in sys.argv[1:] if tf.train.latest_checkpoint(p)]
sizes = [len(tf.train.load_checkpoint(tf.train.latest_checkpoint(p)).get_variable_to_shape_map())
         for p in found]
print(sizes)
sys.exit(0 if sizes and all(sizes) else 1)
"""


def check_checkpoint_loads(backup: Path) -> list[str]:
    """The last checkpoint the job wrote loads, with its variables."""
    dirs = sorted({str(p.parent) for p in backup.rglob("checkpoint")})
    if not dirs:
        return [f"no checkpoint under {backup}"]
    out = subprocess.run([PY, "-c", LOADS, *dirs], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})  # fmt: skip
    if out.returncode != 0:
        return [f"the checkpoint under {backup} does not load: {out.stderr.strip()[-300:]}"]
    return []
