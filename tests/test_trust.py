"""What a shared host throws at us, as a hostile or unlucky user would: host clocks minutes off
the coordinator's, and trainers that write garbage where we read. Real agents and supervisor,
the stand-in trainer (no TensorFlow)."""

from __future__ import annotations

import os
import re
import signal
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import (
    FAKE,
    CliResult,
    fake_job,
    job_processes,
    launch_detached,
    wait_for,
    wait_for_end,
)


def _events(run_dir: Path) -> list[object]:
    from tensorboard.compat.proto import event_pb2

    events = []
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        while data:
            (length,) = struct.unpack("<Q", data[:8])
            events.append(event_pb2.Event.FromString(data[12 : 12 + length]))
            data = data[16 + length :]
    return events


@pytest.mark.parametrize("offset", [-120, 120], ids=["behind", "ahead"])
def test_a_host_clock_two_minutes_off_changes_nothing(
    offset: int, tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """The agents and trainers see a wall clock `offset` seconds off the coordinator's (a
    sitecustomize on their PYTHONPATH): heartbeats go on, the TensorBoard steps count from the
    job's launch and never go negative, the samples kept for the report are on our clock."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import sys, time\n"
        "if any(a.endswith(('/worker', 'bootstrap.py', 'fake_trainer.py', 'standby.py')) "
        "for a in sys.orig_argv):\n"
        "    _real = time.time\n"
        f"    time.time = lambda: _real() + {offset}\n"
    )
    config = tmp_path / "cluster.toml"
    config.write_text(fake_job(tmp_path, ["--mode", "sleep"], extra="heartbeat_timeout = 3.0"))
    env = {"PYTHONPATH": f"{hook}:{Path(__file__).resolve().parent.parent}"}
    job_id = launch_detached(cli, config, reap_pids, env=env)
    shared = tmp_path / "shared" / job_id
    runs = [shared / "tensorboard" / f"worker-{i}" / "resources" for i in (0, 1)]
    # Several heartbeats with samples on each task (a negative step used to hang the agent
    # in the event writer: its heartbeats stopped and heartbeat_timeout failed the job).
    wait_for(lambda: all(len(_events(run)) >= 6 for run in runs), 60)
    job = cli("status", job_id, "--json")
    assert '"state": "running"' in job.out, job.out
    assert cli("stop", job_id).code == 0
    for run in runs:
        steps = [e.step for e in _events(run)[1:]]  # type: ignore[attr-defined]
        assert steps == sorted(steps) and steps[0] >= 0 and steps[-1] < 600, steps
    events = cli("status", job_id, "--json").out
    assert "no heartbeat" not in events and '"state": "stopped"' in events
    assert job_processes(job_id) == []


def test_a_negative_tensorboard_step_is_written_as_protobuf_does() -> None:
    """Regression: a negative step (a clock behind) looped forever in _varint."""
    import threading

    from worker import tb_events

    done: list[bytes] = []
    worker = threading.Thread(target=lambda: done.append(tb_events._varint(-1)), daemon=True)
    worker.start()
    worker.join(10)
    assert done == [b"\xff" * 9 + b"\x01"]  # int64 -1: ten bytes, two's complement
    from tensorboard.compat.proto import event_pb2

    record = tb_events.scalars_event(1.0, -5, {"x": 1.0})
    assert event_pb2.Event.FromString(record).step == -5


HOSTILE = Path(__file__).resolve().parent / "fixtures" / "hostile_trainer.py"


def _vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_garbage_progress_and_a_60_mb_line_neither_crash_nor_bloat_the_supervisor(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text(fake_job(tmp_path, [], workers=1).replace(str(FAKE), str(HOSTILE)))
    job_id = launch_detached(cli, config, reap_pids, env={"LINGER": "4"})
    supervisor = reap_pids[-1]
    copy = tmp_path / "home" / "jobs" / job_id / "logs" / "worker-0.log"

    def after_long_line() -> bool:
        return (
            copy.exists()
            and copy.stat().st_size > 60 << 20
            and b"after the long line" in (copy.read_bytes()[-200:])
        )

    wait_for(after_long_line, 120)
    peak = _vm_hwm_mb(supervisor)  # it holds at most 64 KiB of a line, not the line
    end = wait_for_end(cli, job_id, 60)
    assert end["state"] == "succeeded", end
    assert all(t["state"] == "succeeded" for t in end["tasks"]), end["tasks"]
    task = end["tasks"][0]
    assert (task["epoch"], task["step"], task["loss"]) == (3, 10, 0.5)  # the last good one
    assert peak < 150, peak
    shared = tmp_path / "shared" / job_id / "logs" / "worker-0.log"
    assert copy.read_bytes() == shared.read_bytes()  # the durable copy: byte for byte
    # The megabyte progress file was not read whole, and the agent said so.
    agent_log = (tmp_path / "shared" / job_id / "tasks" / "0" / "agent.log").read_text()
    assert "progress.json is over 65536 bytes: ignored while it is" in agent_log, agent_log
    assert job_processes(job_id) == []


def _in_a_terminal(argv: list[str], env: dict[str, str]) -> bytes:
    """Run argv with a pseudo-terminal as its stdout and stderr; everything it wrote."""
    import os
    import pty
    import subprocess

    main, sub = pty.openpty()
    proc = subprocess.Popen(argv, stdout=sub, stderr=sub, stdin=subprocess.DEVNULL, env=env)
    os.close(sub)
    out = b""
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not data:
            break
        out += data
    os.close(main)
    assert proc.wait(120) == 0, out[-2000:]
    return out


def test_what_a_trainer_prints_cannot_drive_the_terminal(
    tmp_path: Path, cli: Callable[..., CliResult], home: Path
) -> None:
    import os
    import sys

    config = tmp_path / "cluster.toml"
    config.write_text(fake_job(tmp_path, [], workers=1).replace(str(FAKE), str(HOSTILE)))
    env = {**os.environ, "ORCHESTRATE_HOME": str(home), "LONG_LINE_BYTES": "100000",
           "LINGER": "0", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}  # fmt: skip
    launched = _in_a_terminal([sys.executable, "-m", "orchestrator", "launch", "--plain",
                               str(config)], env)  # fmt: skip
    job_id = cli("status", "--json").out.split('"id": "')[1].split('"')[0]
    logs = _in_a_terminal([sys.executable, "-m", "orchestrator", "logs", job_id], env)
    for out in (launched, logs):
        assert b"\x1b]" not in out and b"\x1b[2J" not in out and b"\x07" not in out
        assert b"\\x1b]0;pwned\\x07title" in out  # shown, escaped
        assert b"benign\\rorchestrate: job forged succeeded" in out  # the \r is visible
    assert b"y" * 1000 + b" [... line cut at 64 KiB]" in launched
    # Off a terminal the lines are exactly the task's, and the copy is byte for byte the log.
    piped = cli("logs", job_id).out
    assert "\x1b]0;pwned\x07title" in piped and "orchestrate: job forged" in piped
    shared = tmp_path / "shared" / job_id / "logs" / "worker-0.log"
    copy = home / "jobs" / job_id / "logs" / "worker-0.log"
    assert copy.read_bytes() == shared.read_bytes()


def test_the_contact_marks_never_follow_a_link_nor_use_a_directory_another_user_made(
    shared_tmp: Path,
) -> None:
    import os

    from tests.conftest import as_nobody
    from worker import contact
    from worker.private_dir import UnsafeDirectory

    target = shared_tmp / "victim"
    base = shared_tmp / f"orchestrate-{os.getuid()}"
    # Another user made our directory first (world-writable) and planted a link where the next
    # agent's mark goes.
    plant = (
        "import os, sys; d = sys.argv[1] + '/contact'; os.makedirs(d, mode=0o777); "
        "os.chmod(sys.argv[1], 0o777); os.chmod(d, 0o777); os.symlink(sys.argv[2], d + '/4242')"
    )
    assert as_nobody([sys.executable, "-c", plant, str(base), str(target)], {}).wait(10) == 0
    contact.touch([4242])
    assert not target.exists()  # nothing created where the link points
    with pytest.raises(UnsafeDirectory, match="belongs to uid 65534"):
        contact.contact_dir()
    assert contact.contact_age(4242) is None
    # Our own directory, made as it should be: a link planted in it (by us, say a script of
    # ours gone wrong) is still not followed.
    import shutil

    shutil.rmtree(base)
    contact.touch([1])
    own = Path(contact.contact_dir())
    assert (base.stat().st_mode & 0o777, own.stat().st_mode & 0o777) == (0o700, 0o700)
    (own / "4242").symlink_to(target)
    contact.touch([4242])
    assert not target.exists()


# --- races between our own commands ------------------------------------------------------------


CLAIM = """
import sys, time
from pathlib import Path
from orchestrator.state.states import JobState
from orchestrator.state.job_state import JobStateMachine, SupervisionTaken
from orchestrator.state.store import Store
store = Store(Path(sys.argv[1]))
machine = JobStateMachine(store, sys.argv[2])
print("ready", flush=True)
start = float(sys.stdin.readline())
time.sleep(max(0.0, start - time.time()))
try:
    machine.claim(JobState.LAUNCHING, (int(sys.argv[3]), "me", "here"), (None, ""))
    print("claimed", flush=True)
except SupervisionTaken as exc:
    print("refused", exc, flush=True)
"""


def test_two_supervisors_claiming_one_job_at_once_leave_one(tmp_path: Path) -> None:
    """Regression: `attach` on a job a launch had just registered gave two supervisors."""
    import subprocess
    import time

    from orchestrator.config import load_config
    from orchestrator.state.job_records import register_job
    from orchestrator.state.store import Store
    from tests.conftest import REPO

    config = tmp_path / "cluster.toml"
    config.write_text(fake_job(tmp_path, ["--mode", "ok"]))
    db = tmp_path / "state.db"
    store = Store(db)
    job = register_job(store, load_config(config), str(config))
    for _ in range(5):
        procs = [
            subprocess.Popen([sys.executable, "-c", CLAIM, str(db), job.id, str(1000 + i)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
            for i in range(2)
        ]  # fmt: skip
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        start = time.time() + 0.2
        outputs = [proc.communicate(f"{start}\n", timeout=60)[0] for proc in procs]
        assert sorted(out.split()[0] for out in outputs) == ["claimed", "refused"], outputs
        refused = next(out for out in outputs if out.startswith("refused"))
        assert "supervised by pid 100" in refused and "\n" not in refused.strip()
        store.update_job(job.id, state="pending", supervisor_pid=None, supervisor_ident="")
    store.close()


def test_attach_refuses_a_job_its_launch_is_still_starting(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    from orchestrator.config import load_config
    from orchestrator.state.job_records import register_job
    from orchestrator.state.store import Store

    config = tmp_path / "cluster.toml"
    config.write_text(fake_job(tmp_path, ["--mode", "ok"]))
    job = register_job(Store(), load_config(config), str(config))  # PENDING: as a launch leaves it
    result = cli("attach", job.id)
    assert result.code == 2 and result.err.strip() == (
        f"error: job {job.id} is pending: its launch is starting it; nothing to attach to"
    )
    assert Store().get_job(job.id).supervisor_pid is None  # nothing claimed, nothing started


def test_status_does_not_claim_tasks_run_when_everything_was_killed(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """Regression: after the supervisor, agents and trainers were all SIGKILLed, status said
    `running (supervisor gone)` with tasks `running 2/2`."""
    import signal

    from tests.conftest import job_view

    config = tmp_path / "cluster.toml"
    config.write_text(fake_job(tmp_path, ["--mode", "sleep"]))
    job_id = launch_detached(cli, config, reap_pids)
    job = wait_for(
        lambda: (
            (j := job_view(cli, job_id)) and all(t["state"] == "running" for t in j["tasks"]) and j
        ),
        60,
    )
    assert isinstance(job, dict)
    from tests.conftest import signal_job_process, signal_supervisor

    signal_supervisor(job["supervisor"]["pid"], job_id, signal.SIGKILL)  # first: it sees nothing
    for pid in job_processes(job_id):  # (a trainer dies with its agent: maybe gone already)
        signal_job_process(pid, job_id, signal.SIGKILL, gone_ok=True)
    wait_for(lambda: not job_processes(job_id), 20)
    view = job_view(cli, job_id)
    assert view["supervisor"]["alive"] is False
    assert [t["unsupervised"] for t in view["tasks"]] == ["gone", "gone"]
    text = cli("status", job_id).out
    assert " 0/2 " in text, text  # RUNNING: none confirmed
    assert text.count("running (agent gone)") == 2, text


def test_a_worker_that_fails_on_its_own_after_the_chief_succeeded_is_failed(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """Regression: shown `stopped (7)`. The job succeeds (the chief exited 0); the worker's
    own end is a failure."""
    from tests.conftest import job_view

    config = tmp_path / "cluster.toml"
    config.write_text(fake_job(tmp_path, ["--mode", "ok", "--task-1", "after-chief:7"]))
    # It ends 50 ms after the chief: while the supervisor is deciding the success, before the
    # stop of the stragglers reaches it.
    result = cli("launch", str(config), env={"AFTER_CHIEF_DELAY": "0.05"})
    assert result.code == 0, result
    job = job_view(cli, cli("status", "--json").out.split('"id": "')[1].split('"')[0])
    assert job["state"] == "succeeded"
    assert [(t["state"], t["exit_code"]) for t in job["tasks"]] == [
        ("succeeded", 0),
        ("failed", 7),
    ], job["tasks"]


# --- logs: what a user asks must not hang the command --------------------------------------------


def test_a_backtracking_grep_is_stopped_and_said(
    tmp_path: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: `logs --grep '(a+)+$'` ran for 20 s on one 31-character line."""
    import time

    from orchestrator.logs import log_query

    monkeypatch.setattr(log_query, "GREP_BUDGET", 1.0)
    grep = log_query.Grep("(a+)+$")
    started = time.monotonic()
    with pytest.raises(log_query.UsageError, match=r"matching took over 1s .* simplify it"):
        grep.matching(["a" * 40 + "!"])
    assert time.monotonic() - started < 30  # order: stopped long before the match would end
    assert log_query.Grep("a+$").matching(["xaa", "b"]) == {0}


def test_a_task_range_beyond_the_job_is_refused_before_it_is_built(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """Regression: `logs --task 0-99999999999` ran out of memory."""
    config = tmp_path / "cluster.toml"
    config.write_text(fake_job(tmp_path, ["--mode", "ok"]))
    assert cli("launch", str(config)).code == 0
    job_id = cli("status", "--json").out.split('"id": "')[1].split('"')[0]
    for spec, said in (("0-99999999999", "no task 2 (tasks: 0..1)"),
                       ("1-0", "1-0 is empty"), ("5", "no task 5")):  # fmt: skip
        result = cli("logs", job_id, "--task", spec, timeout=30)
        assert result.code == 2 and said in result.err and len(result.err.splitlines()) == 1
    assert "[worker-1 local]" in cli("logs", job_id, "--task", "0-1").out


def test_the_users_own_tf_use_legacy_keras_is_respected() -> None:
    """tf-keras (TF_USE_LEGACY_KERAS=1) is the default: Keras 3's fit fails under MWMS; a value
    in [entrypoint].env is the user's, and stands."""
    from worker.agent import trainer_env
    from worker.spec import WorkerSpec

    def spec(env: dict[str, str]) -> WorkerSpec:
        return WorkerSpec(job_id="j", task_index=0, host_label="h", tf_config={},
                          argv=["python"], env=env, workdir="/", shared_dir="/s")  # fmt: skip

    assert trainer_env(spec({}))["TF_USE_LEGACY_KERAS"] == "1"
    assert trainer_env(spec({"TF_USE_LEGACY_KERAS": "0"}))["TF_USE_LEGACY_KERAS"] == "0"


def _garbage(rng: object, depth: int = 0) -> object:
    import random

    assert isinstance(rng, random.Random)
    kinds = ["int", "big", "neg", "float", "nan", "inf", "str", "bool", "none"]
    if depth < 3:
        kinds += ["list", "dict"]
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(0, 10**6)
    if kind == "big":
        return rng.randint(2**63, 2**200)
    if kind == "neg":
        return -rng.randint(1, 2**70)
    if kind == "float":
        return rng.uniform(-1e308, 1e308)
    if kind == "nan":
        return float("nan")
    if kind == "inf":
        return rng.choice([float("inf"), float("-inf")])
    if kind == "str":
        return "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 20)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "list":
        return [_garbage(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["step", "epoch", "loss", "phase", "metrics", "gpus", "index", "seq", "agent_pid",
            "state", "trainer_pid", "exit_code", "progress", "resources", "message", "at",
            "listening"]  # fmt: skip
    return {rng.choice(keys): _garbage(rng, depth + 1) for _ in range(rng.randint(0, 6))}


def test_statuses_and_progress_of_garbage_parse_to_bounded_values_or_a_clean_refusal() -> None:
    """2,000 seeded garbage documents where a status or a progress file is read: each either
    parses to typed, bounded values that the store takes, or is refused with ValueError."""
    import json
    import math
    import random
    import sqlite3

    from worker.spec import Progress, TaskStatus

    rng = random.Random(26)
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (step INTEGER, epoch INTEGER, loss REAL, pid INTEGER, code INTEGER)")
    parsed = refused = 0
    for _ in range(2000):
        doc = _garbage(rng)
        if rng.random() < 0.5:  # a status of the right shape, garbage inside
            doc = {
                "state": "running",
                "seq": rng.randint(0, 9),
                "agent_pid": rng.randint(2, 99),
                **{
                    k: _garbage(rng, 1)
                    for k in ("progress", "resources", "trainer_pid", "exit_code", "message")
                },
            }
        raw = json.dumps(doc)
        try:
            status = TaskStatus.from_json(raw)
        except ValueError:
            refused += 1
            status = None
        progress = status.progress if status else Progress.from_dict(doc)
        for value in (progress.step, progress.epoch, progress.epochs, progress.epoch_step):
            assert isinstance(value, int) and 0 <= value <= 2**53
        for real in (progress.loss, progress.steps_per_sec):
            assert real is None or (isinstance(real, float) and math.isfinite(real))
        assert all(isinstance(k, str) and math.isfinite(v) for k, v in progress.metrics.items())
        listening = progress.listening  # shown in `status` as it is: printable, bounded
        assert isinstance(listening, str) and len(listening) <= 256 and listening.isprintable()
        if status is not None:
            parsed += 1
            db.execute(
                "INSERT INTO t VALUES (?, ?, ?, ?, ?)",
                (progress.step, progress.epoch, progress.loss, status.trainer_pid,
                 status.exit_code),
            )  # fmt: skip
            assert len(status.message) <= 2000
    assert parsed > 200 and refused > 200, (parsed, refused)
    long = Progress.from_dict({"listening": "\x1b[2J" + "h" * 300 + ":1\n"}).listening
    assert long == "[2J" + "h" * 252  # cut at 256, the escape character dropped


def test_any_bytes_printed_are_escaped_on_a_terminal_and_kept_exactly_in_the_copy(
    tmp_path: Path,
) -> None:
    """Seeded random output, all 256 byte values, lines up to 200 KiB, through the tailer and
    the sink: the copy equals the input; what a terminal gets has no control character."""
    import io
    import random

    from orchestrator.logs.logstream import MAX_LINE, LineSink, LogTailer

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    rng = random.Random(7)
    data = b"".join(
        bytes(rng.randint(0, 255) for _ in range(rng.choice([0, 1, 10, 100, 5000])))
        + b"y" * rng.choice([0, 0, 0, 200_000])
        + b"\n"
        for _ in range(300)
    )

    class Drained:
        def read_file(self, path: str, offset: int = 0) -> bytes:
            return b""  # everything was fed already

    tailer = LogTailer(Drained(), "x")  # type: ignore[arg-type]
    screen = Terminal()
    sink = LineSink(tmp_path, screen)
    for start in range(0, len(data), 65_536):
        sink.task_lines(0, "h", tailer.feed(data[start : start + 65_536]))
    sink.task_lines(0, "h", tailer.flush())
    sink.close()
    assert (tmp_path / "worker-0.log").read_bytes() == data
    # Our own colour codes around each prefix are the only escapes a terminal may get.
    shown = re.sub("\x1b\\[[0-9]+m", "", screen.getvalue())
    assert not [c for c in shown if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
    assert max(len(line) for line in shown.splitlines()) < 4 * MAX_LINE + 100


def test_an_internal_error_while_supervising_leaves_no_task_row_running(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """Regression: a value the store refused (SQLite's OverflowError on a trainer's huge step)
    crashed the supervisor, and the failed job kept a task `running` with a pid long gone."""
    import textwrap

    from tests.conftest import REPO, job_view

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import sys
            if "launch" in sys.orig_argv:
                from orchestrator.state.store import Store
                real = Store.record_round
                seen = []
                def refusing(self, job_id, updates, *args, **kwargs):
                    # Once the tasks train, refuse a round of progress, as SQLite refused a
                    # trainer's 2**64 step; a stop's own writes (states only) still go in.
                    if any("heartbeat_at" in v for v in updates.values()):
                        seen.append(1)
                        if len(seen) > 3:
                            raise OverflowError("Python int too large to convert to SQLite INTEGER")
                    return real(self, job_id, updates, *args, **kwargs)
                Store.record_round = refusing
            """
        )
    )
    config = tmp_path / "cluster.toml"
    config.write_text(fake_job(tmp_path, ["--mode", "sleep"]))
    result = cli("launch", str(config), env={"PYTHONPATH": f"{hook}:{REPO}"}, timeout=120)
    assert result.code == 1, result
    job = job_view(cli, cli("status", "--json").out.split('"id": "')[1].split('"')[0])
    assert job["state"] == "failed" and "internal error: OverflowError" in job["last_cause"]
    assert all(t["state"] in ("stopped", "lost") for t in job["tasks"]), job["tasks"]
    assert job_processes(job["id"]) == []


def test_a_sample_survives_its_own_round_trip_through_the_store() -> None:
    """Regression: Resources.to_dict() keeps `gpus` a tuple; from_dict dropped it, and the
    status table showed no GPU while --json did."""
    from worker.spec import GpuSample, Resources

    sample = Resources(at=1.0, cpu_percent=50.0, gpus=(GpuSample(0, 87.0, 1, 143771),))
    assert Resources.from_dict(sample.to_dict()) == sample


def test_a_group_stop_signals_only_what_it_checked_through_a_pidfd() -> None:
    import subprocess

    from worker import proctl

    stranger = subprocess.Popen(["sleep", "30"])  # not in the group: the check says so
    try:
        proctl._signal_checked(stranger.pid, signal.SIGKILL, lambda: False)
        proctl._signal_checked(1, signal.SIGKILL, lambda: True)  # never pid <= 1
        assert stranger.poll() is None
        assert not proctl._in_group(stranger.pid, os.getpid() + 10**6, "")
        proctl._signal_checked(stranger.pid, signal.SIGKILL, lambda: True)
        assert stranger.wait(10) == -signal.SIGKILL
    finally:
        if stranger.poll() is None:
            stranger.kill()
            stranger.wait()


def test_stop_finds_and_signals_no_process_of_another_user_that_carries_the_jobs_id() -> None:
    """Root may read every user's environment; another user's process that names our job's id
    is still theirs: never found, never signalled (through its group or alone)."""
    import time

    from tests.conftest import as_nobody, wait_for
    from worker import proctl

    job = f"theirs-{os.getpid()}-{time.monotonic_ns()}"
    squatter = as_nobody(["env", f"ORCHESTRATE_JOB_ID={job}", "sleep", "60"], {})
    try:
        wait_for(lambda: b"sleep" in Path(f"/proc/{squatter.pid}/cmdline").read_bytes(), 10)
        assert proctl.find_job(job) == []
        assert not proctl.is_job_process(squatter.pid, job)
        assert proctl.stop_job(job, grace=0.2) == []
        assert squatter.poll() is None  # still running
    finally:
        squatter.kill()  # our own child, by its Popen
        squatter.wait(10)
