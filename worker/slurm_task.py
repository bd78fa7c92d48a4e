"""One task of an orchestrate Slurm step: `python -m worker.slurm_task STEP_DIR ATTEMPT`.

The coordinator starts one `srun` step per attempt, one of these per task. Each one:

1. runs the backend's `setup` commands (the node's first task only, when STEP_DIR/setup.json
   exists),
2. picks a port free on its own node and publishes itself as STEP_DIR/hello/PROCID.json: its
   node, hostname, port, pid, and the probe's versions and problems,
3. waits for the coordinator to write its spec (the shared directory's usual spec path, for
   this attempt): the coordinator writes it once every task has said hello, with TF_CONFIG built
   from all of them,
4. becomes the task's agent (worker.agent) in this same process, so Slurm's own bookkeeping of
   the task is the agent's.

It exits 0 once the agent has written the task's final status (the status file says how the
trainer ended), and non-zero only when it could not get that far: `srun --kill-on-bad-exit`
then ends the whole step, which the coordinator sees at once.

`python -m worker.slurm_task --keeper JOB_ROOT` is a task of the job's keeper step instead: it
becomes the warm-standby keeper (worker/warm/keeper.py) of the task with its SLURM_PROCID, on the
same node as that task in every attempt's step. Its step outlives the attempts' steps, so the
next attempt's agent finds a standby with TensorFlow imported. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from worker.atomic import write_json_atomic
from worker.probe import free_ports, probe
from worker.spec import JobLayout, WorkerSpec

SPEC_WAIT = 300.0  # seconds to wait for the coordinator's spec before giving up
# A keeper with no agent ends after this long; the keeper step is ended with the job before.
KEEPER_LINGER = 7 * 24 * 3600.0
KEEPER = str(Path(__file__).resolve().parent / "warm" / "keeper.py")
POLL = 0.05


def hello_path(step_dir: Path, procid: int) -> Path:
    return step_dir / "hello" / f"{procid}.json"


def run_setup(step_dir: Path) -> list[str]:
    """The setup commands (argv lists), in order; the problems met, if any."""
    try:
        commands = json.loads((step_dir / "setup.json").read_text())
    except FileNotFoundError:
        return []
    for argv in commands:
        try:
            done = subprocess.run(argv, capture_output=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [f"setup {argv!r} failed: {exc}"]
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).decode(errors="replace").strip()
            last = " | ".join(tail.splitlines()[-2:])
            return [f"setup {argv!r} exited {done.returncode}: {last}"]
    return []


def say_hello(step_dir: Path, shared_dir: str, procid: int, problems: list[str]) -> int:
    """Publish this task (a port picked free on this node, just now); return the port."""
    report = probe(shared_dir, 0, None, "")
    port = free_ports(1)[0]
    hello = {
        "procid": procid,
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "address": socket.gethostname(),
        "port": port,
        "pid": os.getpid(),
        "step": os.environ.get("SLURM_STEP_ID", ""),
        "python": report["python"],
        "tensorflow": report["tensorflow"],
        "protocol": report["protocol"],
        "problems": [*report["problems"], *problems],  # type: ignore[misc]
    }
    write_json_atomic(hello_path(step_dir, procid), hello)
    return port


def wait_for_spec(path: Path, attempt: int, timeout: float) -> WorkerSpec | None:
    """This attempt's spec, once the coordinator wrote it (an older one may be there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            spec = WorkerSpec.from_json(path.read_bytes())
        except (OSError, ValueError):
            spec = None
        if spec is not None and spec.attempt == attempt:
            return spec
        time.sleep(POLL)
    return None


def become_keeper(job_root: Path) -> None:
    """Exec this node's task's keeper (agents check a keeper by its program: warm/keeper.py).
    Nothing is kept past the job: the allocation is the job's alone."""
    procid = int(os.environ["SLURM_PROCID"])
    layout = JobLayout(job_root.parent.as_posix(), job_root.name)
    task_dir = Path(layout.task_dir(procid))
    task_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, KEEPER, job_root.name, str(procid), str(KEEPER_LINGER),
            str(task_dir / "standby.log"), "0", "0"]  # fmt: skip
    os.execv(sys.executable, argv)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--keeper":
        become_keeper(Path(args[1]))
    if len(args) != 2:
        print("usage: python -m worker.slurm_task STEP_DIR ATTEMPT", file=sys.stderr)
        return 2
    step_dir, attempt = Path(args[0]), int(args[1])
    procid = int(os.environ["SLURM_PROCID"])
    # STEP_DIR is SHARED/JOB/slurm/attempt-N: the job's layout is two levels up.
    job_root = step_dir.parent.parent
    layout = JobLayout(job_root.parent.as_posix(), job_root.name)
    problems = run_setup(step_dir) if os.environ.get("SLURM_LOCALID", "0") == "0" else []
    say_hello(step_dir, job_root.parent.as_posix(), procid, problems)
    spec = wait_for_spec(Path(layout.spec_path(procid)), attempt, SPEC_WAIT)
    if spec is None:
        print(f"[orchestrate] no spec for attempt {attempt} after {SPEC_WAIT:g}s", file=sys.stderr)
        return 3
    from worker.agent import Agent  # imported late: signals stay Slurm's until the agent runs
    from worker.proctl import HURRY

    Agent(spec).run()
    # The final status is written. A stop from now on (the coordinator stops the step as soon
    # as it reads that status) has nothing left to stop; it must not kill this process while
    # the interpreter exits (its handlers are the default again by then): Slurm would count a
    # task killed by a signal and end the whole step at once, the other agents unfinished.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, HURRY):
        signal.signal(sig, signal.SIG_IGN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
