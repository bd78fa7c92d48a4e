"""A chaos job's life (scripts/chaos.py runs them one after another): its config, the faults
injected into it while it trains (each checked before it is sent: only the job's own processes
are ever signalled), the terminals that watch it meanwhile, and what is checked at its end."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from scripts.soak.beds import LocalBed, later
from scripts.soak.checks import (
    PROGRESS_TIMEOUT,
    RESTARTS,
    Cli,
    Fault,
    agent_pid,
    check_checkpoint_loads,
    check_fault,
    check_numbered_lines,
    job_processes,
    runs_in_job,
    training_now,
    wait,
)
from scripts.soak.webhook import MisbehavingWebhook
from tests.beds.checked_signal import is_supervisor_of, signal_checked, signal_supervisor

REPO = Path(__file__).resolve().parents[2]
PLAIN_FIT = REPO / "tests" / "fixtures" / "plain_fit.py"
OVERLAPPABLE = {"trainer_kill", "agent_kill", "preemption", "trainer_hang"}


def write_config(bed: LocalBed, root: Path, name: str, epochs: int, webhook: str = "") -> Path:
    shared = root / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}.toml"
    notify = f'[notify]\nwebhook = "{webhook}"\ntimeout = 1.0\n' if webhook else ""
    path.write_text(f"""
[job]
name = "{name}"
shared_dir = "{shared}"

[entrypoint]
script = "{PLAIN_FIT}"
args = ["--epochs", "{epochs}", "--backup-dir", "{shared}/backup-{name}", "--step-delay", "0.05"]
env = {{ TF_CPP_MIN_LOG_LEVEL = "2", NUMBERED_LINES = "{shared}/truth-{name}" }}
workdir = "{REPO}"

[backend]
{bed.backend_toml()}
[supervision]
progress_timeout = {PROGRESS_TIMEOUT}
heartbeat_interval = 0.5
{bed.supervision_toml()}
[restart]
max_restarts = 1000
backoff = 0.5
{bed.restart_toml()}
{notify}""")
    (shared / f"truth-{name}").mkdir(mode=0o777, exist_ok=True)
    return path


def signal_in_job(pid: object, job: str, sig: int) -> None:
    """Signal a process of the job, checked through a pidfd right before (runs_in_job)."""
    signal_checked(pid, sig, lambda p: runs_in_job(p, job), f"a process of {job}")


def check_pids(v: dict[str, Any], task: int, kind: str) -> None:
    """Only the job's own processes are ever signalled: each pid is checked right before."""
    t = v["tasks"][task]
    pid = agent_pid(t["agent"]) if kind == "agent_kill" else t["pid"]
    if not runs_in_job(pid, v["id"]):
        raise SystemExit(f"chaos: pid {pid} is not a live process of {v['id']}")
    if kind in ("supervisor_kill", "supervisor_stall"):
        sup = v["supervisor"]["pid"]
        if not (isinstance(sup, int) and sup > 1 and is_supervisor_of(sup, v["id"])):
            raise SystemExit(f"chaos: pid {sup} is not the supervisor of {v['id']}")


def inject(
    bed: LocalBed, cli: Cli, v: dict[str, Any], fault: Fault, supervisors: list[Any]
) -> None:
    kind, t = fault.kind, v["tasks"][fault.task]
    check_pids(v, fault.task, kind)
    signals = {"trainer_kill": signal.SIGKILL, "trainer_hang": signal.SIGSTOP,
               "preemption": signal.SIGTERM}  # fmt: skip
    if kind in signals:
        signal_in_job(t["pid"], v["id"], signals[kind])
    elif kind == "agent_kill":
        signal_in_job(agent_pid(t["agent"]), v["id"], signal.SIGKILL)
    elif kind == "supervisor_stall":
        pid = v["supervisor"]["pid"]
        signal_supervisor(pid, v["id"], signal.SIGSTOP)
        time.sleep(1.0 + 3.0 * (fault.task + 1) / len(v["tasks"]))  # 1-4 s, from the drawn task
        signal_supervisor(pid, v["id"], signal.SIGCONT)
    elif kind == "supervisor_kill":
        signal_supervisor(v["supervisor"]["pid"], v["id"], signal.SIGKILL)
        time.sleep(0.5)
        supervisors.append(cli.popen("attach", v["id"], "--plain"))
    elif kind == "attach_live":
        out = cli("attach", v["id"], "--plain", timeout=60)
        lines = out.stderr.strip().splitlines()
        if out.returncode == 0 or len(lines) != 1:
            fault.violations.append(f"attach beside a live supervisor: exit {out.returncode}, "
                                    f"{len(lines)} lines: {out.stderr.strip()[-200:]}")  # fmt: skip
        fault.what = lines[0][:120] if lines else ""
    elif kind != "stop_resume":
        fault.what = bed.inject(kind, v, fault.task)


def overlap(rng: random.Random, v: dict[str, Any], fault: Fault) -> None:
    """A second trainer kill, of another task, while the first fault is being handled."""
    others = [i for i in range(len(v["tasks"])) if i != fault.task]
    if fault.kind not in OVERLAPPABLE or not others or rng.random() >= 0.25:
        return
    other, delay = rng.choice(others), rng.uniform(0.2, 2.0)
    pid = v["tasks"][other]["pid"]
    fault.overlap = f"trainer_kill worker-{other} +{delay:.1f} s"

    def second() -> None:
        if runs_in_job(pid, v["id"]):  # still the job's, checked again through a pidfd
            with contextlib.suppress(AssertionError):  # it ended just now
                signal_in_job(pid, v["id"], signal.SIGKILL)

    later(delay, second)


def strangers() -> list[subprocess.Popen[bytes]]:
    """Plain processes beside the job, of this user and of another (nobody): no fault of ours
    may touch them."""
    mine = [subprocess.Popen(["sleep", "3600"], start_new_session=True) for _ in range(2)]
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "3600"]
    theirs = [subprocess.Popen(nobody, start_new_session=True)] if os.geteuid() == 0 else []
    return mine + theirs


class Watchers:
    """`status` and `logs` run all the while from other terminals: each must answer."""

    def __init__(self, cli: Cli, job: str) -> None:
        self.cli, self.job = cli, job
        self.problems: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(3.0):
            for args in (("status", self.job), ("logs", self.job, "--task", "0", "--since", "10s")):
                out = self.cli(*args, timeout=120)
                if out.returncode != 0 or "Traceback" in out.stderr:
                    self.problems.append(f"`{' '.join(args)}` exited {out.returncode}: "
                                         f"{out.stderr.strip()[-200:]}")  # fmt: skip

    def stop(self) -> list[str]:
        self.done.set()
        self.thread.join()
        return self.problems


def run_job(bed: LocalBed, cli: Cli, root: Path, rng: random.Random, n: int,
            faults: list[Fault], webhook: MisbehavingWebhook | None) -> list[str]:  # fmt: skip
    name = f"chaos{len(faults)}"
    url = webhook.url if webhook else ""
    path = write_config(bed, root, name, epochs=300, webhook=url)  # a stop ends it
    bystanders = strangers()
    out = cli("launch", "--detach", "--plain", str(path), timeout=600)
    if out.returncode != 0:
        for proc in bystanders:  # nothing of the job ran: they go as they came
            proc.kill()
            proc.wait()
        return [f"launch failed: {out.stderr.strip()[-300:]}"]
    job = json.loads(cli("status", "--json").stdout)["jobs"][0]["id"]  # the newest
    supervisors: list[Any] = []
    problems: list[str] = []
    watchers = Watchers(cli, job)
    try:
        for _ in range(n):
            before = wait(lambda: (v := cli.view(job)) and training_now(v) and v, 240)
            if not before:
                problems.append(f"{job}: not training before a fault")
                break
            kind = rng.choice(bed.kinds)
            task = rng.randrange(len(before["tasks"]))
            epoch = max(0, min(t["epoch"] for t in before["tasks"]) - 1)
            fault = Fault(bed.name, job, kind, task, time.time(), epoch_before=epoch)
            if kind in RESTARTS:
                overlap(rng, before, fault)
            inject(bed, cli, before, fault, supervisors)
            if fault.what.startswith("no "):  # nothing of that kind there yet: not a fault
                print(f"skipped: {kind} worker-{task}: {fault.what}", flush=True)
                continue
            check_fault(cli, fault, before)
            faults.append(fault)
            said = "; ".join(fault.violations) or "ok"
            extra = f" [{fault.what}]" if fault.what else ""
            extra += f" (+ {fault.overlap})" if fault.overlap else ""
            times = f"detected {fault.detected_s} s, recovered {fault.recovered_s} s"
            print(f"fault {len(faults)}: {kind} worker-{task} of {job}{extra}: {times}, {said}",
                  flush=True)  # fmt: skip
            if fault.violations and "did not train again" in said:
                break
    finally:
        problems += watchers.stop()
        faulted = any(f.job == job and f.violations for f in faults)
        problems += end_job(cli, job, root, name, keep=faulted)
        if webhook is not None:
            killed = any(f.job == job and f.kind == "supervisor_kill" for f in faults)
            problems += check_webhook(cli, job, webhook, killed)
        for proc in bystanders:
            if proc.poll() is not None:
                problems.append(f"a stranger (pid {proc.pid}) was signalled")
            proc.kill()
            proc.wait()
        for proc in supervisors:
            proc.wait()
    return problems


def check_webhook(cli: Cli, job: str, webhook: MisbehavingWebhook, killed: bool) -> list[str]:
    """Every event of the job reached the misbehaving webhook, on its second try: none was
    given up (`notify_failed`), none was left untried, the redirect was never followed. Only
    a supervisor SIGKILLed meanwhile (a fault) may have taken queued events with it."""
    ended = ("stopped", "succeeded", "failed")
    wait(lambda: any(d.event in ended and d.accepted for d in webhook.of_job(job)), 40)
    problems = [f"{job}: the webhook got a {m} (a redirect followed)" for m in webhook.followed]
    deliveries = webhook.of_job(job)
    if not any(d.event in ended and d.accepted for d in deliveries):
        problems.append(f"{job}: its end never reached the webhook")
    lost = [d.event for d in deliveries if not d.accepted]
    if lost and not killed:
        problems.append(f"{job}: events tried once, never again: {lost}")
    failed = [e["message"] for e in cli.view(job)["events"] if e["kind"] == "notify_failed"]
    if failed and not killed:
        problems.append(f"{job}: the notifier gave events up: {failed[:3]}")
    print(f"webhook: {len(deliveries)} events of {job}, {len(deliveries) - len(lost)} "
          f"delivered on their second try", flush=True)  # fmt: skip
    return problems


def end_job(cli: Cli, job: str, root: Path, name: str, keep: bool = False) -> list[str]:
    """Stop the job and check how it ended; its directory outlives the run when a line was
    lost or doubled, or when `keep` (a fault of the job broke an invariant)."""
    problems = []
    stopped = cli("stop", job, timeout=300)
    final = cli.view(job)
    if final["state"] not in ("succeeded", "stopped"):
        problems.append(f"{job}: ended {final['state']} ({final['last_cause']})")
    if stopped.returncode != 0 and final["state"] != "succeeded":
        problems.append(f"{job}: stop exited {stopped.returncode}: {stopped.stderr.strip()}")
    for t in final["tasks"]:
        if t["state"] == "stopped" and runs_in_job(t["pid"], job):
            problems.append(f"{job}: worker-{t['index']} shown stopped, {t['pid']} runs")
    if not wait(lambda: not job_processes(job), 15):
        problems.append(f"{job}: processes left 15 s after the end: {job_processes(job)}")
    lost_or_doubled = check_numbered_lines(cli, job, root / "shared" / f"truth-{name}")
    if lost_or_doubled or keep:  # the evidence outlives the run's directory: logs, events, truth
        kept = Path(tempfile.gettempdir()) / f"chaos-kept-{job}"
        with contextlib.suppress(OSError, shutil.Error):
            shutil.copytree(final["job_dir"], kept, dirs_exist_ok=True)
            shutil.copytree(root / "shared" / f"truth-{name}", kept / "truth", dirs_exist_ok=True)
            (kept / "status.json").write_text(json.dumps(final, indent=1))
            print(f"{job}: its logs, events and truth kept in {kept}", flush=True)
    problems += lost_or_doubled
    if max(t["epoch"] for t in final["tasks"]) >= 2:  # an epoch completed: its checkpoint
        problems += check_checkpoint_loads(root / "shared" / f"backup-{name}")
    return problems
