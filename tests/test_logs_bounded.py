"""`orchestrate logs` and `Job.logs` on big and hostile durable copies: the last lines are read
from the end, everything else is streamed in bounded batches (memory stays far below the
copy's size), and piped output is the task's bytes exactly. The jobs are store records with
copies written directly: no trainer runs."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.api import Job
from orchestrator.state.paths import log_copies_dir
from orchestrator.state.states import JobState, TaskState
from orchestrator.state.store import JobRecord, Store, TaskRecord
from tests.conftest import REPO

LINE = b"x" * 999 + b"\n"  # 1000 bytes
LONG = 24 << 20  # one line without a break: held at most 64 KiB of it

# Runs `orchestrate ARGS`, then writes its own peak RSS (KiB) to the file named first. VmHWM,
# not ru_maxrss: that one keeps the peak of the test process the child was forked from.
_MEASURED = """
import runpy, sys
out, sys.argv = sys.argv[1], ["orchestrate", *sys.argv[2:]]
try:
    runpy.run_module("orchestrator", run_name="__main__", alter_sys=True)
finally:
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    with open(out, "w") as fh:
        fh.write(status.split()[0])
"""


def _job(
    name: str,
    copies: dict[int, bytes],
    times: dict[int, bytes] | None = None,
    state: JobState = JobState.SUCCEEDED,
) -> str:
    """A job of len(copies) tasks whose durable copies (and times) are these."""
    now = time.time()
    store = Store()
    store.create_job(
        JobRecord(name, name, state, "local", "c.toml", "{}", "/x", now, now, now),
        [
            TaskRecord(name, i, "worker", 0, "local", f"127.0.0.1:{4000 + i}", TaskState.SUCCEEDED)
            for i in copies
        ],
    )
    logs = log_copies_dir(name)
    logs.mkdir(parents=True)
    for i, data in copies.items():
        (logs / f"worker-{i}.log").write_bytes(data)
    for i, data in (times or {}).items():
        (logs / f"worker-{i}.times").write_bytes(data)
    return name


def _big_job() -> tuple[str, Path]:
    """One task, ~64 MB: 40,000 1 KB lines, a 24 MB line, then five short ones; its times
    file marks each of the four writes."""
    logs = log_copies_dir("big")
    _job("big", {0: b""})
    copy = logs / "worker-0.log"
    marks = []
    with open(copy, "wb") as fh:
        for part in (LINE * 20_000, LINE * 20_000, b"y" * LONG + b"\n"):
            fh.write(part)
            marks.append(f"{time.time():.3f} {fh.tell()}\n")
        fh.write(b"".join(b"last %d\n" % n for n in range(5)))
        marks.append(f"{time.time():.3f} {fh.tell()}\n")
    (logs / "worker-0.times").write_text("".join(marks))
    return "big", copy


def _peak_kib(home: Path, tmp_path: Path, *args: str) -> tuple[int, bytes]:
    """Run `orchestrate ARGS` with stdout to a file; its peak RSS (KiB) and what it wrote."""
    rss, out = tmp_path / "rss", tmp_path / "out"
    with open(out, "wb") as sink:
        proc = subprocess.run(
            [sys.executable, "-c", _MEASURED, str(rss), *args],
            stdout=sink,
            stderr=subprocess.PIPE,
            env={**os.environ, "ORCHESTRATE_HOME": str(home)},
            cwd=REPO,
            timeout=240,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(rss.read_text()), out.read_bytes() if out.stat().st_size < 1 << 20 else b""


def test_tail_and_full_logs_of_a_64_mb_copy_stay_far_below_its_size(
    home: Path, tmp_path: Path
) -> None:
    """Regression: `logs --tail 5` read the whole copy (531 MB RSS for a 100 MB log) and a
    full `logs` held every line (745 MB)."""
    _job("small", {0: b"hello\n"})
    baseline, _ = _peak_kib(home, tmp_path, "logs", "small")
    job, copy = _big_job()
    size_kib = copy.stat().st_size // 1024
    tail_kib, tail = _peak_kib(home, tmp_path, "logs", job, "--tail", "5")
    assert tail == b"".join(b"[worker-0 local] last %d\n" % n for n in range(5))
    full_kib, _ = _peak_kib(home, tmp_path, "logs", job)
    written = (tmp_path / "out").stat().st_size  # every byte, the 24 MB line whole
    assert written == copy.stat().st_size + 40_006 * len(b"[worker-0 local] ")
    grep_kib, grepped = _peak_kib(home, tmp_path, "logs", job, "--grep", "^last [34]$")
    assert grepped == b"[worker-0 local] last 3\n[worker-0 local] last 4\n"
    api_tail = [r.text for r in Job(job).logs(tail=2)]
    assert api_tail == ["last 3", "last 4"]
    over = {"tail": tail_kib - baseline, "full": full_kib - baseline, "grep": grep_kib - baseline}
    print(f"peak RSS over {baseline} KiB: {over} KiB; the copy: {size_kib} KiB")
    assert all(kib < size_kib * 0.25 for kib in over.values()), (over, size_kib)


def _run_bytes(home: Path, *args: str) -> bytes:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        env={**os.environ, "ORCHESTRATE_HOME": str(home)},
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


HOSTILE = b"ok \xff\xfe bad \xc3(\n\x1b]0;title\x07 and \r over\nno newline \xe2\x82"


def test_piped_logs_are_the_tasks_bytes_exactly_and_json_stays_valid(home: Path) -> None:
    """Regression: piped `logs` wrote U+FFFD for invalid UTF-8."""
    job = _job("hostile", {0: HOSTILE})
    expected = b"".join(b"[worker-0 local] " + ln + b"\n" for ln in HOSTILE.split(b"\n"))
    assert _run_bytes(home, "logs", job) == expected
    assert _run_bytes(home, "logs", job, "--tail", "2") == b"".join(expected.split(b"\n", 1)[1:])
    alone = _run_bytes(home, "logs", job, "--task", "0", "--grep", "bad")
    assert alone == b"ok \xff\xfe bad \xc3(\n"
    records = json.loads(_run_bytes(home, "logs", job, "--json"))["lines"]
    assert [r["text"] for r in records] == [
        ln.decode(errors="replace") for ln in HOSTILE.split(b"\n")
    ]
    assert [r.text for r in Job(job).logs()] == [r["text"] for r in records]


def _interleaved() -> str:
    """Two tasks whose batches alternate in time, a long line, a line without its time (past
    the last mark) and one without its newline."""
    copies: dict[int, bytes] = {0: b"", 1: b""}
    times: dict[int, bytes] = {0: b"", 1: b""}
    for batch in range(30):
        task = (batch + 1) % 2  # task 0 writes the last batch
        lines = b"".join(b"t%d b%02d n%d %s\n" % (task, batch, n, b"z" * n) for n in range(3))
        if batch == 18:
            lines += b"L" * (200 << 10) + b" end\n"  # over 64 KiB: piped whole
        copies[task] += lines
        times[task] += b"%.3f %d\n" % (time.time() - 600 + batch * 20, len(copies[task]))
    copies[0] += b"unmarked\npartial"
    job = _job("mixed", copies, times)
    # Attempt 1 starts at a line of task 0 and inside a line of task 1 (that one is not its).
    for task, at in ((0, copies[0].index(b"t0 b15 n0")), (1, copies[1].index(b"b16 n1"))):
        (log_copies_dir(job) / f"worker-{task}.attempts").write_text(f"0 0\n1 {at}\n")
    return job


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--timestamps"],
        ["--grep", "n[02]"],
        ["--since", "5m"],
        ["--task", "1"],
        ["--task", "0", "--grep", "b1"],
        ["--json"],
        ["--attempt", "0"],
        ["--attempt", "1", "--timestamps"],
    ],
)
def test_the_last_lines_read_from_the_end_are_the_last_of_the_whole(
    home: Path, extra: list[str]
) -> None:
    job = _interleaved()

    def lines(*args: str) -> list:  # --json: the document's lines
        out = _run_bytes(home, "logs", job, *args, *extra)
        return json.loads(out)["lines"] if "--json" in extra else out.split(b"\n")[:-1]

    whole = lines()
    assert len(whole) > 7
    for n in (1, 7, len(whole), len(whole) + 5):
        assert lines("--tail", str(n)) == whole[-n:], (n, extra)
    assert lines("--tail", "0") == []


def test_the_api_tail_is_the_end_of_the_whole_and_a_long_line_is_cut(home: Path) -> None:
    job = _interleaved()
    whole = Job(job).logs()
    assert [r.task for r in whole[:6]] == [1, 1, 1, 0, 0, 0]  # in arrival order
    # Lines past a task's last mark have no time: they come after its marked ones.
    assert [(r.text, r.time) for r in whole[-2:]] == [("unmarked", None), ("partial", None)]
    for n in (1, 5, 40, 500):
        assert Job(job).logs(tail=n) == whole[-n:]
    assert Job(job).logs(tail=3, grep="n1") == [r for r in whole if "n1" in r.text][-3:]
    cut = [r.text for r in whole if r.text.startswith("LLL")]
    assert cut == ["L" * (64 << 10) + " [... line cut at 64 KiB]"]
    # Piped and in JSON the long line is whole.
    piped = _run_bytes(home, "logs", job, "--task", "1", "--grep", "^LLL")
    assert piped == b"L" * (200 << 10) + b" end\n"
    (record,) = json.loads(_run_bytes(home, "logs", job, "--json", "--grep", "^L"))["lines"]
    assert record["text"] == "L" * (200 << 10) + " end"


def _read_until(proc: subprocess.Popen[bytes], want: bytes, seconds: float = 30) -> bytes:
    assert proc.stdout is not None
    got, deadline = b"", time.monotonic() + seconds
    while not got.endswith(want):
        left = deadline - time.monotonic()
        assert left > 0 and select.select([proc.stdout], [], [], left)[0], got
        data = os.read(proc.stdout.fileno(), 65536)
        assert data, got
        got += data
    return got


def test_follow_goes_on_after_the_last_lines_and_waits_for_each_lines_time(home: Path) -> None:
    job = _job("live", {0: b"a\nb\nc\n"}, {0: b"%.3f 6\n" % time.time()}, JobState.RUNNING)
    copy, times = log_copies_dir(job) / "worker-0.log", log_copies_dir(job) / "worker-0.times"
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "logs", job, "--follow", "--tail", "2"],
        stdout=subprocess.PIPE,
        env={**os.environ, "ORCHESTRATE_HOME": str(home)},
        cwd=REPO,
    )
    try:
        assert _read_until(proc, b"c\n") == b"[worker-0 local] b\n[worker-0 local] c\n"
        with open(copy, "ab") as fh:
            fh.write(b"d\n\xffe")
        time.sleep(1.0)  # a few rounds: "d" has no time yet, so it waits
        assert not select.select([proc.stdout], [], [], 0)[0]
        with open(times, "ab") as fh:
            fh.write(b"%.3f 8\n" % time.time())
        assert _read_until(proc, b"d\n") == b"[worker-0 local] d\n"
        Store().update_job(job, state=JobState.SUCCEEDED)
        assert _read_until(proc, b"\n") == b"[worker-0 local] \xffe\n"  # the end: all of it
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_reader_that_stops_early_is_not_a_failure(home: Path) -> None:
    """`logs | head`: the rest is not written, quietly, and the exit status is 0."""
    job = _interleaved()  # over 200 KiB: more than a pipe holds
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "logs", job],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "ORCHESTRATE_HOME": str(home)},
        cwd=REPO,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"[worker-1 local] t1 b00 n0 \n"
    proc.stdout.close()
    assert proc.wait(30) == 0
    assert proc.stderr.read() == b""


def test_a_damaged_attempts_file_is_named_in_one_line(tmp_path: Path) -> None:
    from orchestrator.errors import OrchestrateError
    from orchestrator.logs.log_query import attempt_span

    log = tmp_path / "worker-0.log"
    log.write_bytes(b"line\n")
    (tmp_path / "worker-0.attempts").write_bytes(b"0 0\n1 \xff garbage\n")
    with pytest.raises(
        OrchestrateError, match=r"worker-0\.attempts: line 2 is not `ATTEMPT OFFSET`"
    ):
        attempt_span(log, 0)
    (tmp_path / "worker-0.attempts").write_bytes(b"0 0\n1 3\n")
    assert attempt_span(log, 0) == (0, 3)
