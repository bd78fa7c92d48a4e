"""The transport contract. The same assertions run against every transport: the local one here,
the SSH one against the namespaced test bed (see test_ssh.py, which reuses these checks)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.errors import TransportError
from orchestrator.transport.base import ProcessRef, Transport, Watching
from orchestrator.transport.local import LocalTransport
from worker import proctl

NASTY = ["; echo pwned", "$(touch /tmp/x)", "`id`", "it's", 'say "hi"', "back\\slash", "a b  c", ""]
PY = sys.executable


def check_argv_and_env_arrive_byte_for_byte(t: Transport, python: str) -> None:
    code = "import os, sys, json; print(json.dumps([sys.argv[1:], os.environ['NASTY']]))"
    result = t.run([python, "-c", code, *NASTY], env={"NASTY": " ; $(x) ' \" \\ `y`"})
    assert result.ok, result.tail()
    import json

    argv, env = json.loads(result.stdout)
    assert argv == NASTY
    assert env == " ; $(x) ' \" \\ `y`"


def check_stdin_exit_code_and_stderr(t: Transport, python: str) -> None:
    code = (
        "import sys; d=sys.stdin.buffer.read(); sys.stdout.buffer.write(d[::-1]); "
        "sys.stderr.write('oops'); sys.exit(3)"
    )
    result = t.run([python, "-c", code], stdin=b"abc\x00\xff")
    assert result.exit_code == 3 and not result.ok
    assert result.stdout == b"\xff\x00cba"
    assert result.stderr == b"oops" and result.tail() == "oops"


def check_timeout_raises(t: Transport, python: str) -> None:
    start = time.monotonic()
    with pytest.raises(TransportError, match="timed out"):
        t.run([python, "-c", "import time; time.sleep(60)"], timeout=1.0)
    assert time.monotonic() - start < 60  # order: raised before the command's own end


def check_files(t: Transport, remote_dir: str, local_dir: Path) -> None:
    path = f"{remote_dir}/deep/er/spec.json"
    t.put_file(path, b"secret\n", mode=0o600)
    assert t.read_file(path) == b"secret\n"
    assert t.read_file(path, offset=3) == b"ret\n"
    assert t.read_file(path, offset=7) == b""
    assert t.read_file(f"{remote_dir}/missing") is None
    t.get_file(path, local_dir / "copy.json")
    assert (local_dir / "copy.json").read_bytes() == b"secret\n"
    mode = t.run(["stat", "-c", "%a", path]).stdout.strip()
    assert mode == b"600"
    assert t.get_tree(f"{remote_dir}/deep", local_dir / "tree") == 1
    assert (local_dir / "tree" / "er" / "spec.json").read_bytes() == b"secret\n"
    # A tick's reads in one call: files from offsets (binary safe), a missing one is None.
    t.put_file(f"{remote_dir}/bin", bytes(range(256)))
    seen = t.observe(None, [(path, 3), (f"{remote_dir}/missing", 0), (f"{remote_dir}/bin", 250)])
    assert (seen.alive, seen.files) == (None, (b"ret\n", None, bytes(range(250, 256))))


def _status(state: str, seq: int, step: int = 0, phase: str = "training") -> bytes:
    progress = {"phase": phase, "step": step}
    return json.dumps({"state": state, "seq": seq, "agent_pid": 1, "progress": progress}).encode()


def check_watch_holds_a_quiet_host_and_answers_a_death_at_once(
    t: Transport, python: str, remote_dir: str
) -> None:
    """The long poll: a host with nothing urgent answers after the keep-alive (log
    lines and heartbeats ride on it); an agent that dies, or a status whose state changes, is
    answered at once, well within one keep-alive."""
    log, status = f"{remote_dir}/w.log", f"{remote_dir}/w.status"
    t.put_file(status, _status("running", seq=1, step=5))
    proc = t.start_detached([python, "-c", "import time; time.sleep(60)"], log_path=log)
    try:
        first = t.observe([proc], [(log, 0)], timeout=10,
                          watching=Watching(None, ((status, None),), 5.0, 0.05))  # fmt: skip
        assert first.urgent and first.alive == {proc.pid}  # nothing known yet: at once
        assert first.statuses == (_status("running", seq=1, step=5),)
        known = Watching(frozenset({proc.pid}), ((status, first.keys[0]),), 1.5, 0.05)

        # Quiet but for a heartbeat and a line: held for the keep-alive, then both carried.
        def heartbeat() -> None:
            time.sleep(0.3)
            t.put_file(status, _status("running", seq=2, step=9))
            t.run([python, "-c", f"open({log!r}, 'a').write('a line\\n')"])

        beat = threading.Thread(target=heartbeat)
        started = time.monotonic()
        beat.start()
        quiet = t.observe([proc], [(log, 0)], timeout=10, watching=known)
        held = time.monotonic() - started
        beat.join()
        # Held until the keep-alive (not answered at the heartbeat), and answered then, not at
        # the call's timeout.
        assert known.wait * 0.9 <= held < 10, held  # order: after the keep-alive, before timeout
        assert not quiet.urgent and quiet.keys == first.keys
        assert quiet.files == (b"a line\n",) and b'"seq": 2' in (quiet.statuses[0] or b"")

        # A death on the quiet host: answered at once, before the 8 s keep-alive ends.
        known = dataclasses.replace(known, wait=8.0)
        killer = threading.Timer(0.5, lambda: t.stop_process_group(proc, 0.5))
        started = time.monotonic()
        killer.start()
        dead = t.observe([proc], [(log, 8)], timeout=20, watching=known)
        killer.join()
        assert dead.urgent and dead.alive == set()
        assert time.monotonic() - started < known.wait * 0.9  # order: before the keep-alive

        # A new state (here an exit code), with the agent still there: at once as well.
        t.put_file(status, _status("running", seq=3, step=9))
        known = Watching(frozenset(), ((status, first.keys[0]),), 8.0, 0.05)
        writer = threading.Timer(0.5, lambda: t.put_file(status, _status("failed", seq=4, step=9)))
        started = time.monotonic()
        writer.start()
        failed = t.observe([proc], [(log, 8)], timeout=20, watching=known)
        writer.join()
        assert failed.urgent and failed.keys != first.keys
        assert time.monotonic() - started < known.wait * 0.9  # order: before the keep-alive
    finally:
        t.stop_process_group(proc, 0.5)


def check_observe_liveness(t: Transport, python: str, remote_dir: str) -> None:
    """observe() checks liveness before it reads (an exited agent's final status is seen)."""
    log = f"{remote_dir}/o.log"
    proc = t.start_detached([python, "-c", "import time; time.sleep(60)"], log_path=log)
    pid = proc.pid
    try:
        never = ProcessRef(4_194_999)  # above Linux's largest pid_max (2**22): no such process
        impostor = ProcessRef(pid, proc.ident + "0")  # the pid, held by another process
        seen = t.observe([proc, never], [(log, 0)])
        assert seen.alive == {pid} and seen.files == (b"",)
        assert t.observe([impostor], []).alive == set()
    finally:
        assert t.stop_process_group(proc, 1.0)
    assert t.observe([proc], []).alive == set()


def check_detached_start_and_group_stop(t: Transport, python: str, remote_dir: str) -> None:
    # A parent that ignores SIGTERM with a child that also ignores it: only SIGKILL ends them.
    code = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import signal,time; "
        'signal.signal(signal.SIGTERM, signal.SIG_IGN); print("child up", flush=True); '
        "time.sleep(300)']); time.sleep(300)"
    )
    log = f"{remote_dir}/detached.log"
    proc = t.start_detached([python, "-c", code], log_path=log)
    pid = proc.pid
    assert proc.ident  # its identity came back with it
    assert t.alive_pids([proc]) == {pid}  # returned while the command runs, not at its end
    deadline = time.monotonic() + 20
    while b"child up" not in (t.read_file(log) or b"") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert b"child up" in (t.read_file(log) or b"")
    assert t.alive_pids([proc]) == {pid}
    # Another identity for the same pid (a reused pid) is never signalled: reported gone.
    assert t.stop_process_group(ProcessRef(pid, proc.ident + "0"), grace=0.5) is True
    assert t.alive_pids([proc]) == {pid}
    assert t.stop_process_group(proc, grace=0.5) is True
    assert t.alive_pids([proc]) == set()


@pytest.fixture
def local() -> LocalTransport:
    return LocalTransport()


def test_local_argv_and_env(local: LocalTransport) -> None:
    check_argv_and_env_arrive_byte_for_byte(local, PY)


def test_local_stdin_exit_code(local: LocalTransport) -> None:
    check_stdin_exit_code_and_stderr(local, PY)


def test_local_timeout(local: LocalTransport) -> None:
    check_timeout_raises(local, PY)


def test_local_files(local: LocalTransport, tmp_path: Path) -> None:
    check_files(local, str(tmp_path / "remote"), tmp_path / "local")


def test_local_observe_liveness(local: LocalTransport, tmp_path: Path) -> None:
    check_observe_liveness(local, PY, str(tmp_path))


def test_local_watch_holds_a_quiet_host_and_answers_a_death_at_once(
    local: LocalTransport, tmp_path: Path
) -> None:
    check_watch_holds_a_quiet_host_and_answers_a_death_at_once(local, PY, str(tmp_path))


def test_local_detached_and_stop(local: LocalTransport, tmp_path: Path) -> None:
    check_detached_start_and_group_stop(local, PY, str(tmp_path))


def test_detached_process_is_its_own_session(local: LocalTransport, tmp_path: Path) -> None:
    proc = local.start_detached(
        [PY, "-c", "import time; time.sleep(60)"], log_path=str(tmp_path / "l")
    )
    pid = proc.pid
    try:
        assert os.getsid(pid) == pid and os.getpgid(pid) == pid
        assert stat.S_ISREG(os.stat(tmp_path / "l").st_mode)
    finally:
        assert local.stop_process_group(proc, grace=2)


def test_zombies_are_not_alive() -> None:
    import subprocess

    child = subprocess.Popen([PY, "-c", "pass"])
    # Exited but not yet reaped: a zombie (waitid with WNOWAIT waits for the exit, reaps nothing).
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert proctl.alive([child.pid]) == set()
    child.wait()


def test_refuses_to_signal_init_or_everything() -> None:
    for pgid in (0, 1, -1):
        with pytest.raises(ValueError):
            proctl.stop_group(pgid, 0.1)
