"""What a person sees: the live console of `orchestrate launch` in a real terminal (tmux,
capture-pane), output off a terminal unchanged, `status --watch`, and `logs` with
--timestamps/--since/--grep/--task. The pure parts (labels, folding, the phase clock, the log
reader) are unit-tested first."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.commands.console import LineFolder, PhaseClock, activity, fold_label
from orchestrator.errors import UsageError
from orchestrator.logs.log_query import Grep, TimedLog, parse_since, parse_tasks, select, stamp
from orchestrator.logs.logstream import LineSink
from orchestrator.state.states import TaskState
from orchestrator.state.store import TaskRecord
from tests.conftest import (
    IN_CI,
    REPO,
    CliResult,
    fake_job,
    launch_detached,
    status_json,
    two_worker_config,
    wait_for,
    wait_for_end,
)
from worker.spec import Phase

PLAIN_FIT = REPO / "tests" / "fixtures" / "plain_fit.py"


def _task(idx: int = 0, state: TaskState = TaskState.RUNNING, phase: Phase = Phase.NONE,
          attempt: int = 0, exit_code: int | None = None) -> TaskRecord:  # fmt: skip
    return TaskRecord("j", idx, "worker", 0, "local", "127.0.0.1:1", state, attempt,
                      exit_code=exit_code, phase=phase)  # fmt: skip


# --- pure parts ---------------------------------------------------------------------------
def test_activity_names_the_phase_while_running_and_the_state_once_ended() -> None:
    assert activity(_task(state=TaskState.PENDING)) == "connecting"
    assert activity(_task(state=TaskState.STARTING)) == "starting"
    assert activity(_task(phase=Phase.STARTING)) == "importing TensorFlow"
    assert activity(_task(phase=Phase.JOINING)) == "waiting for peers"
    assert activity(_task(phase=Phase.TRAINING)) == "training"
    assert activity(_task(phase=Phase.FINISHED)) == "saving"
    assert activity(_task(state=TaskState.FAILED, phase=Phase.TRAINING, exit_code=137)) == (
        "failed (137)"
    )


def test_the_phase_clock_times_each_startup_phase_and_fills_skipped_ones() -> None:
    clock = PhaseClock()
    clock.observe([_task(phase=Phase.NONE)], 100.0)
    clock.observe([_task(phase=Phase.STARTING)], 100.5)
    clock.observe([_task(phase=Phase.JOINING)], 103.5)  # IMPORTED passed between two looks
    clock.observe([_task(phase=Phase.JOINED)], 104.0)
    clock.observe([_task(phase=Phase.TRAINING)], 105.0)
    assert clock.timeline(_task()) == "start 0.5s · import 3.0s · peers 0.5s · 1st step 1.0s"
    # A restart is a new attempt: its own timeline.
    clock.observe([_task(phase=Phase.STARTING, attempt=1)], 200.0)
    assert clock.timeline(_task(attempt=1)) == "start 0.0s"


def test_identical_lines_from_several_tasks_fold_in_arrival_order() -> None:
    folder = LineFolder(window=0.5)
    folder.width = 3
    folder.add(0, "n0", "Epoch 1/3", 10.0)
    folder.add(0, "n0", "only mine", 10.0)
    folder.add(1, "n1", "Epoch 1/3", 10.1)
    assert folder.due(10.2) == []  # the first line waits for worker-2
    folder.add(2, "n2", "Epoch 1/3", 10.2)
    assert folder.due(10.2) == [([0, 1, 2], "n0", "Epoch 1/3")]  # complete: at once
    assert folder.due(10.3) == []
    assert folder.due(10.6) == [([0], "n0", "only mine")]
    assert fold_label([0, 1, 2, 3], "n0") == "[worker-0..3]"
    assert fold_label([0, 2], "n0") == "[worker-0,2]"
    assert fold_label([2], "n1") == "[worker-2 n1]"


def test_a_line_a_task_repeats_is_not_folded_into_itself() -> None:
    folder = LineFolder(window=0.5)
    folder.width = 2
    folder.add(0, "h", "", 1.0)
    folder.add(0, "h", "", 1.0)
    folder.add(1, "h", "", 1.0)
    assert folder.due(1.0, everything=True) == [([0, 1], "h", ""), ([0], "h", "")]


def test_since_and_task_lists_parse_or_fail_in_one_line() -> None:
    now = 1_000_000.0
    assert parse_since("90s", now) == now - 90
    assert parse_since("5m", now) == now - 300
    assert parse_since("2h", now) == now - 7200
    assert parse_since("1h30m", now) == now - 5400  # kubectl's form
    assert parse_since("1d2h3m4s", now) == now - 93784
    # A time is UTC, as --timestamps prints it, whatever this machine's zone.
    assert parse_since("2026-12-03T11:40:00", now) == 1796298000.0
    assert parse_since("2026-12-03T12:40:00+01:00", now) == 1796298000.0
    assert parse_since("11:40", 1796298000.0 + 3600) == 1796298000.0
    with pytest.raises(UsageError, match="--since '1h30'"):
        parse_since("1h30", now)
    with pytest.raises(UsageError, match="--since 'yesterday'"):
        parse_since("yesterday", now)
    assert parse_tasks("0,2", 4) == [0, 2]
    assert parse_tasks("1-3", 4) == [1, 2, 3]
    with pytest.raises(UsageError, match="no task 4"):
        parse_tasks("0,4", 4)
    with pytest.raises(UsageError, match="like 0,2"):
        parse_tasks("a", 4)


def test_the_durable_copy_stays_byte_identical_and_its_lines_get_their_arrival_time(
    tmp_path: Path,
) -> None:
    sink = LineSink(tmp_path, None)
    before = time.time()
    sink.task_lines(0, "h", [b"first", b"second"])
    sink.task_lines(0, "h", [b"third"])
    sink.close()
    assert (tmp_path / "worker-0.log").read_bytes() == b"first\nsecond\nthird\n"
    lines = TimedLog(tmp_path / "worker-0.log").read()
    assert [ln.text for ln in lines] == ["first", "second", "third"]
    now = time.time()
    stamps = [ln.ts for ln in lines]
    assert all(ts is not None and before - 0.001 <= ts <= now + 0.001 for ts in stamps)  # order:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp(lines[0].ts))
    assert select(lines, None, Grep("ir")) == [lines[0], lines[2]]
    assert select(lines, time.time() + 1, None) == []


def test_following_returns_only_lines_whose_time_is_written(tmp_path: Path) -> None:
    log = tmp_path / "worker-0.log"
    log.write_bytes(b"a\nb\npartial")
    (tmp_path / "worker-0.times").write_bytes(b"5.0 2\n")  # only "a\n" has its time so far
    reader = TimedLog(log)
    assert [(ln.ts, ln.text) for ln in reader.read()] == [(5.0, "a")]
    with open(tmp_path / "worker-0.times", "ab") as fh:
        fh.write(b"6.0 11\n")
    assert [(ln.ts, ln.text) for ln in reader.read()] == [(6.0, "b")]
    assert [(ln.ts, ln.text) for ln in reader.read(final=True)] == [(6.0, "partial")]


# --- logs, off a terminal ----------------------------------------------------------------
def test_logs_timestamps_since_grep_and_task_lists(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, ["--mode", "count:3"], workers=3))
    result = cli("launch", str(path), timeout=60)
    assert result.code == 0, result
    job = status_json(cli)["jobs"][0]["id"]
    stamped = cli("logs", job, "--timestamps", "--task", "0,2")
    assert stamped.code == 0, stamped
    lines = stamped.out.splitlines()
    assert lines and all(
        re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[worker-[02] local\] ", ln)
        for ln in lines
    ), stamped.out
    assert "[worker-1 " not in stamped.out
    assert any(ln.endswith("[worker-2 local] line 00002 xx") for ln in lines), stamped.out
    grep = cli("logs", job, "--grep", r"line 0000[12] ")
    assert sorted(grep.out.splitlines()) == sorted(
        f"[worker-{i} local] line 0000{n} {'x' * n}" for i in range(3) for n in (1, 2)
    ), grep.out
    assert cli("logs", job, "--since", "1h").out == cli("logs", job).out
    assert cli("logs", job, "--since", "0s").out == ""
    bad = cli("logs", job, "--task", "7")
    assert bad.code != 0 and bad.err.strip() == "error: --task '7': no task 7 (tasks: 0..2)"
    assert "Traceback" not in bad.err


def test_logs_by_attempt_the_last_lines_and_json_lines(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    path = tmp_path / "c.toml"
    restart = "[restart]\nmax_restarts = 2\nbackoff = 0.1\n"
    path.write_text(fake_job(tmp_path, ["--mode", "fail-first:3"], workers=2, extra=restart))
    assert cli("launch", str(path), timeout=90).code == 0
    job = status_json(cli)["jobs"][0]["id"]
    whole = cli("logs", job).out.splitlines()
    # Each attempt's lines, and only those: the agent's note says which attempt wrote it.
    for number, other in ((0, 1), (1, 0)):
        shown = cli("logs", job, "--attempt", str(number))
        assert shown.code == 0, shown
        assert {f"[worker-{i} local] [orchestrate] attempt {number}: worker-{i} on local starting"
                for i in (0, 1)} <= set(shown.out.splitlines()), shown.out  # fmt: skip
        assert f"attempt {other}:" not in shown.out
        assert set(shown.out.splitlines()) < set(whole)
    attempts = [cli("logs", job, "--attempt", n, "--task", "1").out for n in ("0", "1")]
    assert "".join(attempts) == cli("logs", job, "--task", "1").out  # nothing lost between
    missing = cli("logs", job, "--attempt", "5")
    assert missing.code == 2 and missing.err == (
        "error: --attempt 5: worker-0 has no such attempt (its attempts: 0, 1)\n"
    ), missing
    assert cli("logs", job, "--tail", "3").out.splitlines() == whole[-3:]
    assert cli("logs", job, "--tail", "0").out == ""
    assert cli("logs", job, "--since", "1h30m").out.splitlines() == whole
    document = json.loads(cli("logs", job, "--json").out)  # one document, its lines
    assert (document["schema_version"], document["job"]) == (1, job)
    records = document["lines"]
    followed = cli("logs", job, "--json", "--follow").out  # a stream: one object a line
    assert [json.loads(ln) for ln in followed.splitlines()] == records
    assert [f"[worker-{r['task']} {r['host']}] {r['text']}" for r in records] == whole
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]{12}Z", r["time"]) for r in records)


def test_output_off_a_terminal_is_the_plain_prefixed_lines(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, ["--mode", "count:2"]))
    result = cli("launch", str(path), timeout=60)
    assert result.code == 0, result
    assert "\x1b" not in result.out and "╭" not in result.out
    for line in result.out.splitlines():
        assert re.match(r"(\[worker-[01] local\] |orchestrate: )", line), line
    # Both tasks print the same lines: off a terminal nothing is folded.
    for i in (0, 1):
        assert f"[worker-{i} local] line 00001 x" in result.out


# --- in a real terminal ------------------------------------------------------------------
class Terminal:
    """A tmux session on its own server socket, torn down at the end."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.socket = f"orchestrate-test-{os.getpid()}-{time.monotonic_ns()}"
        self.env = env
        self.tmp_path = tmp_path

    def run(self, argv: list[str], width: int = 180, height: int = 50) -> None:
        script = self.tmp_path / f"term-{time.monotonic_ns()}.sh"
        exports = "".join(f"export {k}={json.dumps(v)}\n" for k, v in self.env.items())
        script.write_text(
            f"{exports}unset COLUMNS LINES\ncd {REPO}\n{' '.join(map(json.dumps, argv))}\necho EXIT=$?\nsleep 600\n"
        )
        subprocess.run(["tmux", "-L", self.socket, "new-session", "-d", "-s", "t",
                        "-x", str(width), "-y", str(height), "bash", str(script)],
                       check=True)  # fmt: skip

    def screen(self) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "capture-pane", "-p", "-t", "t"],
                              capture_output=True, text=True, check=False).stdout  # fmt: skip

    def history(self) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, "capture-pane", "-p", "-t", "t", "-S", "-2000"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], check=False,
                       capture_output=True)  # fmt: skip


@pytest.fixture
def terminal(tmp_path: Path, home: Path) -> Iterator[Terminal]:
    if shutil.which("tmux") is None:
        if IN_CI:
            pytest.fail("tmux is missing under CI (.ci/run installs it)")
        pytest.skip("tmux is not installed: the live console needs a real terminal to test")
    term = Terminal(tmp_path, {"ORCHESTRATE_HOME": str(home), "PATH": os.environ["PATH"],
                               "TERM": "xterm-256color"})  # fmt: skip
    try:
        yield term
    finally:
        term.close()


def _orchestrate(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args]


PHASE_ROW = re.compile(r"│ worker-(\d)\s+local\s+(.+?)\s{2,}")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_launch_on_a_terminal_shows_a_live_panel_whose_phases_change(
    tmp_path: Path, terminal: Terminal, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """Real TensorFlow, a script that imports nothing of ours, in a real terminal; meanwhile
    `status --json` from another process sees the training go on (the panel's own store
    connection once hid every later write from other processes)."""
    backup = tmp_path / "shared" / "backup"
    entry = (
        f'script = "{PLAIN_FIT}"\n'
        f'args = ["--epochs", "8", "--step-delay", "0.04", "--backup-dir", "{backup}"]\n'
        'env = { TF_CPP_MIN_LOG_LEVEL = "2" }'
    )
    path = two_worker_config(tmp_path, "console", entry)
    terminal.run(_orchestrate("launch", str(path)))
    seen: list[str] = []  # worker-0's phases, in the order the screen showed them
    steps_seen: list[int] = []  # the steps `status --json` showed while the job ran
    last_status = [0.0]

    def finished() -> bool:
        screen = terminal.screen()
        for match in PHASE_ROW.finditer(screen):
            if match.group(1) == "0" and (not seen or seen[-1] != match.group(2)):
                seen.append(match.group(2))
        if time.monotonic() - last_status[0] > 1.0:
            last_status[0] = time.monotonic()
            for job in status_json(cli)["jobs"]:
                if job["state"] == "running":
                    steps_seen.append(min(t["step"] for t in job["tasks"]))
        return "EXIT=" in screen

    try:
        wait_for(finished, 300, interval=0.25)
    finally:
        for job in status_json(cli)["jobs"]:
            reap_pids.append(job["supervisor"]["pid"] or 0)
    screen = terminal.history()
    assert "EXIT=0" in screen, screen
    assert seen[-1] == "succeeded", (seen, screen)
    # Another terminal saw the steps grow during training, not only the end.
    assert len({s for s in steps_seen if s > 0}) >= 2, steps_seen
    # The panel went through the startup phases to training, in order.
    order = ["importing TensorFlow", "waiting for peers", "training", "succeeded"]
    shown = [p for p in seen if p in order]
    assert shown == sorted(set(shown), key=order.index), seen
    assert {"training", "succeeded"} <= set(shown) and len(shown) >= 3, seen
    assert re.search(r"preflight: local ok in \d+\.\ds \(Python 3", screen), screen
    assert re.search(r"start \d+\.\ds · import \d+\.\ds · peers \d+\.\ds · 1st step", screen)
    # Identical lines that both tasks print together are folded into one.
    assert re.search(r"^\[worker-0\.\.1\] Epoch \d/8", screen, re.M), screen


def test_plain_on_a_terminal_and_status_watch(
    tmp_path: Path, terminal: Terminal, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, ["--mode", "count:2"]))
    terminal.run(_orchestrate("launch", "--plain", str(path)))
    wait_for(lambda: "EXIT=" in terminal.screen(), 60)
    screen = terminal.screen()
    assert "EXIT=0" in screen and "╭" not in screen, screen
    assert "[worker-0 local] line 00001 x" in screen and "[worker-1 local] line 00001 x" in screen
    terminal.close()

    path.write_text(fake_job(tmp_path, ["--mode", "sleep"]))
    job = launch_detached(cli, path, reap_pids)
    terminal.run(_orchestrate("status", job, "--watch", "--interval", "0.3"))
    clock = re.compile(r"^(\d\d:\d\d:\d\d) JOB", re.M)
    first = wait_for(lambda: clock.search(terminal.screen()), 30)
    assert first is not None
    # Redrawn in place: the clock moves on and the table is on screen once.
    wait_for(lambda: (m := clock.search(terminal.screen())) and m.group(1) != first.group(1), 10)
    assert terminal.screen().count("worker-0  local") == 1
    assert cli("stop", job).code == 0
    wait_for(lambda: "EXIT=4" in terminal.screen(), 30)  # --watch ends with the job: stopped
    assert "stopped" in terminal.screen()
    wait_for_end(cli, job)


def test_a_tailer_taken_over_from_the_copy_goes_on_where_the_copy_ends_after_a_cut_line(
    tmp_path: Path,
) -> None:
    """An attempt that ends on a line without its newline (a trainer killed mid-write, or a
    write cut short by a full disk), then a supervisor that dies: the tailer of whoever takes
    over starts from the durable copy, which must stay byte for byte the host's log, or the
    new tailer starts a few bytes into the next line and loses it."""
    from orchestrator.logs.logstream import LogTailer
    from orchestrator.transport.local import LocalTransport

    host_log, copies = tmp_path / "host.log", tmp_path / "copies"
    sink = LineSink(copies, None)
    tailer = LogTailer.following(LocalTransport(), str(host_log), copies / "worker-0.log")
    host_log.write_bytes(b"attempt 0 starting\nnumbered 0000000a 1\nnumbered 0000000a 2")
    sink.task_lines(0, "h", tailer.poll())
    sink.task_lines(0, "h", tailer.flush())  # the attempt ends: its cut line goes out too
    with host_log.open("ab") as log:
        log.write(b"attempt 1 starting\nnumbered 0000000b 1\n")
    sink.task_lines(0, "h", tailer.poll())
    with host_log.open("ab") as log:  # written while no supervisor lives
        log.write(b"numbered 0000000b 2\nnumbered 0000000b 3\n")
    taken_over = LogTailer.following(LocalTransport(), str(host_log), copies / "worker-0.log")
    sink.task_lines(0, "h", taken_over.flush())
    sink.close()
    assert (copies / "worker-0.log").read_bytes() == host_log.read_bytes()
    assert b"\nnumbered 0000000b 2\n" in host_log.read_bytes()


# --- a reader that goes away -----------------------------------------------------------------
def _ended_job(cli: Callable[..., CliResult]) -> dict:
    [job] = status_json(cli)["jobs"]
    return wait_for_end(cli, job["id"])


def test_a_closed_pipe_never_fails_the_job(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """`launch | head -1`: the job goes on to its own end, the launch exits with the job's
    code, and the job's events say the output went away."""
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, ["--mode", "count:300"]))
    launch = shlex.join([sys.executable, "-m", "orchestrator", "launch", str(path)])
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {launch} | head -1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    job = _ended_job(cli)
    reap_pids.append(job["supervisor"]["pid"] or 0)
    assert done.returncode == 0, done
    assert done.stdout.startswith("orchestrate: ") and done.stdout.count("\n") == 1, done
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done
    assert job["state"] == "succeeded", job
    assert [e for e in cli("status", job["id"]).out.splitlines() if "output_lost" in e]


def test_a_closed_terminal_never_fails_the_job(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """The live panel's terminal closes under it (EIO on every write; no SIGHUP here: the
    terminal is not the launch's controlling one): the job goes on to its own end."""
    path = tmp_path / "c.toml"
    path.write_text(fake_job(tmp_path, ["--mode", "ok-after:3"]))
    controller, terminal = os.openpty()
    launch = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", str(path)],
                              cwd=REPO, stdin=subprocess.DEVNULL, stdout=terminal,
                              stderr=subprocess.PIPE, start_new_session=True,
                              env={**os.environ, "TERM": "xterm-256color"})  # fmt: skip
    reap_pids.append(launch.pid)
    os.close(terminal)
    try:
        seen = b""
        while b"running" not in seen:  # the job's tasks started: then the terminal goes
            seen += os.read(controller, 4096)
    finally:
        os.close(controller)
    _, err = launch.communicate(timeout=120)
    job = _ended_job(cli)
    assert launch.returncode == 0, err
    assert b"Traceback" not in err and b"Exception" not in err, err
    assert job["state"] == "succeeded", job
    assert [e for e in cli("status", job["id"]).out.splitlines() if "output_lost" in e]
