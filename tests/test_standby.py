"""The warm standby's keeper on its own (worker/warm/keeper.py, worker/warm/activation.py): a standby made under
another environment is replaced, never used; an activated one runs the script with a fresh
__main__, its argv and exactly the activation's environment; the exit status reaches the agent;
a keeper without an agent ends its standby and itself. Two TensorFlow imports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

from tests.conftest import as_nobody, wait_for
from worker.agent import trainer_env
from worker.proctl import is_alive
from worker.spec import Phase, WorkerSpec
from worker.warm import registry
from worker.warm.activation import (
    KEEPER,
    KeeperLink,
    fingerprint,
    standby_env,
    verify_trainer,
    warm_start,
)
from worker.warm.imports_ahead import WARM_IMPORTS_FILE
from worker.warm.next_standby import AgentStandby
from worker.warm.registry import SOCKET_MIN_AGE, socket_path, spare_task
from worker.warm.spare import keep_standbys
from worker.warm.standby import ENV_STANDBY

SCRIPT = """
import json, os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))  # a preemption: checkpoint, then 42
print("seen " + json.dumps({"name": __name__, "argv": sys.argv, "x": os.environ.get("X"),
      "old": os.environ.get("OLD"), "cwd": os.getcwd(), "runs": globals().get("runs", 0) + 1,
      "tf": "tensorflow" in sys.modules}), flush=True)
runs = 1
if "--until-sigterm" in sys.argv:
    time.sleep(60)
sys.exit(3)
"""


def _leave(keeper: subprocess.Popen[bytes], link: KeeperLink | None) -> None:
    """The agent goes: the keeper ends (its standby with it) once its linger is over; killed
    with its session if it does not."""
    if link is not None:
        link.close()
    try:
        keeper.wait(timeout=30)
    finally:
        if keeper.poll() is None:
            os.killpg(keeper.pid, 9)
            keeper.wait()


def test_the_keeper_replaces_a_stale_standby_and_runs_a_fresh_script_in_a_matching_one(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    workdir = tmp_path / "work"
    workdir.mkdir()
    job = f"test-{os.getpid()}"
    keeper = subprocess.Popen(
        [sys.executable, KEEPER, job, "0", "1.0", str(tmp_path / "standby.log"), "0", "0"],
        start_new_session=True,
    )
    ready: list[int] = []
    sizes: list[int] = []
    got_ready = threading.Event()

    def on_standby(pid: int, rss: int) -> None:  # on the link's reader thread: no asserts here
        ready.append(pid)
        sizes.append(rss)
        got_ready.set()

    link = None
    try:
        link = wait_for(lambda: KeeperLink.connect(socket_path(job, 0), on_standby)[0], 10)
        assert isinstance(link, KeeperLink)
        base = {"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "3", "OLD": "1"}
        old_print = fingerprint(base, sys.executable, {"OLD": "1"})
        prepare = {"op": "prepare", "python": sys.executable, "env": standby_env(base)}
        assert link.request({**prepare, "fingerprint": old_print})["ok"]
        assert got_ready.wait(120)
        first = ready[0]
        assert sizes[0] > 50 << 20  # TensorFlow is in there

        # Another environment: refused, and that standby is gone (replaced, never used).
        new_env = {**base, "X": "1"}
        del new_env["OLD"]
        new_print = fingerprint(new_env, sys.executable, {"X": "1"})
        assert new_print != old_print
        order = {"op": "activate", "env": new_env, "target": [str(script), "--flag"],
                 "cwd": str(workdir), "log": str(tmp_path / "task.log"), "job_id": job,
                 "task_index": 0}  # fmt: skip
        reply = link.request({**order, "fingerprint": new_print})
        assert reply == {"ok": False, "reason": "the environment or Python changed"}
        wait_for(lambda: not is_alive(first), 10)

        got_ready.clear()
        assert link.request({**prepare, "env": standby_env(new_env), "fingerprint": new_print})
        assert got_ready.wait(120)
        reply = link.request({**order, "fingerprint": new_print})
        assert reply == {"ok": True, "pid": ready[1]}
        assert link.exited.wait(60) and link.exit_code == 3  # the script's own exit code
        text = (tmp_path / "task.log").read_text()
        seen = json.loads(text[text.index("seen ") + 5 :].splitlines()[0])
        assert seen == {"name": "__main__", "argv": [str(script), "--flag"], "x": "1",
                        "old": None, "cwd": str(workdir), "runs": 1, "tf": True}  # fmt: skip

        # Stopped while a trainer runs (on Slurm a preemption signals every step, the keepers'
        # too): the trainer is its agent's, and ends its own way (42: it checkpointed); the
        # keeper passes that on, then ends.
        got_ready.clear()
        assert link.request({**prepare, "env": standby_env(new_env), "fingerprint": new_print})
        assert got_ready.wait(120)
        link.exited.clear()
        running = {**order, "target": [str(script), "--until-sigterm"], "fingerprint": new_print}
        assert link.request(running) == {"ok": True, "pid": ready[2]}
        wait_for(lambda: (tmp_path / "task.log").read_text().count("seen ") == 2, 60)
        keeper.terminate()
        assert not link.exited.wait(1.0) and keeper.poll() is None and is_alive(ready[2])
        assert verify_trainer(ready[2], keeper.pid) == ""  # the keeper's own, checked first
        os.kill(ready[2], signal.SIGTERM)  # Slurm's own SIGTERM to the trainer
        assert link.exited.wait(30) and link.exit_code == 42
        keeper.wait(timeout=30)
    finally:
        _leave(keeper, link)
    assert keeper.returncode == 0
    assert not any(is_alive(p) for p in ready)


def test_a_standby_that_dies_importing_a_library_ahead_is_replaced_without_the_list(
    tmp_path: Path,
) -> None:
    """A library imported ahead (worker.warm.imports_ahead) that kills the interpreter: the keeper's
    replacement standby imports TensorFlow alone, and becomes ready."""
    site = tmp_path / "lib" / "site-packages"  # a library directory: its names are imported ahead
    site.mkdir(parents=True)
    tally = tmp_path / "imported"
    (site / "deadly.py").write_text(
        f"import os\nwith open({str(tally)!r}, 'a') as fh:\n    fh.write('x')\nos._exit(7)\n"
    )
    job = f"test-deadly-{os.getpid()}"
    keeper = subprocess.Popen(
        [sys.executable, KEEPER, job, "0", "1.0", str(tmp_path / "standby.log"), "0", "0"],
        start_new_session=True,
    )
    ready: list[int] = []
    link = None
    try:
        link = wait_for(
            lambda: KeeperLink.connect(socket_path(job, 0), lambda pid, rss: ready.append(pid))[0],
            10,
        )
        assert isinstance(link, KeeperLink)
        env = {"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(site)}
        reply = link.request({"op": "prepare", "python": sys.executable, "env": standby_env(env),
                              "fingerprint": fingerprint(env, sys.executable, {}),
                              "imports": ["json", "deadly"]})  # fmt: skip
        assert reply["ok"], reply
        assert wait_for(lambda: ready, 180)
        assert tally.read_text() == "x"  # the first standby died of it; the replacement skipped it
        assert len(ready) == 1 and is_alive(ready[0])
    finally:
        _leave(keeper, link)
    assert not any(is_alive(p) for p in ready)


# --- another user on the host: the keeper's socket cannot be taken, nor anything sent to it ----

SQUATTER = """
import os, socket, sys, time
# Bind every name it can see: the keeper's old abstract name, and a socket file in the private
# directory's place (possible only where it made that directory itself).
names = ["\\0orchestrate-standby-0-" + sys.argv[1] + "-0"]
bound, got = [], []
for name in names + sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(name)
        s.listen(4)
        bound.append(s)
    except OSError as exc:
        print("refused", name.replace("\\0", "@"), exc.errno, flush=True)
print("bound", len(bound), flush=True)
deadline = time.time() + float(os.environ.get("SQUAT_FOR", "20"))
for s in bound:
    s.settimeout(0.1)
while time.time() < deadline:
    for s in bound:
        try:
            conn, _ = s.accept()
        except OSError:
            continue
        conn.settimeout(1.0)
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        print("received", len(data), data[:200], flush=True)
        conn.sendall(b'{"ok": true, "pid": 1}\\n')
"""


def _keeper(job: str, tmp: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, KEEPER, job, "0", "30", str(log), "0", "0"],
        env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True,
        stdout=open(log, "ab"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def test_a_squatter_binding_every_name_it_sees_gets_nothing_and_the_keeper_is_found(
    shared_tmp: Path, tmp_path: Path
) -> None:
    job = f"sq-{os.getpid()}"
    env = {"PATH": os.environ["PATH"], "SQUAT_FOR": "8"}
    # It tries the private directory's place too: it cannot even look inside.
    theirs = str(shared_tmp / f"orchestrate-{os.getuid()}" / "standby" / f"{job}-0.sock")
    keeper = _keeper(job, shared_tmp, tmp_path / "standby.log")
    squatter = None
    link = None
    try:
        wait_for(lambda: (shared_tmp / f"orchestrate-{os.getuid()}").is_dir(), 10)
        squatter = as_nobody([sys.executable, "-c", SQUATTER, job, theirs], env)
        link = wait_for(
            lambda: KeeperLink.connect(socket_path(job, 0), lambda pid, rss: None)[0], 10
        )
        assert isinstance(link, KeeperLink) and link.keeper_pid == keeper.pid  # the real one
        out, _ = squatter.communicate(timeout=30)
    finally:
        if link is not None:
            link.close()
        for proc in (keeper, squatter):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "bound 1" in out, out  # the abstract name: taken, and no longer ours to care about
    assert "refused" in out and "received" not in out, out  # no connection reached it


def test_a_private_directory_made_by_another_user_is_refused_and_nothing_is_sent(
    shared_tmp: Path, tmp_path: Path
) -> None:
    job = f"sq-{os.getpid()}"
    env = {"PATH": os.environ["PATH"], "SQUAT_FOR": "8"}
    # The other user was first: it made our private directory, and listens where our keeper's
    # socket would be.
    base = shared_tmp / f"orchestrate-{os.getuid()}"
    make = "import os, sys; os.makedirs(sys.argv[1] + '/standby', mode=0o777); os.chmod(sys.argv[1], 0o777); os.chmod(sys.argv[1] + '/standby', 0o777)"
    assert as_nobody([sys.executable, "-c", make, str(base)], env).wait(10) == 0
    squatter = as_nobody(
        [sys.executable, "-c", SQUATTER, job, str(base / "standby" / f"{job}-0.sock")], env
    )
    try:
        assert (
            squatter.stdout is not None
            and "bound 2" in squatter.stdout.readline() + squatter.stdout.readline()
        )
        log = tmp_path / "standby.log"
        keeper = _keeper(job, shared_tmp, log)
        assert keeper.wait(30) == 3  # it says why, and serves nothing
        assert "cannot serve warm restarts" in log.read_text() and "uid 65534" in log.read_text()
        # The agent's way in: it starts cold and says why.
        trainer, link, problem = warm_start(job, 0, {"fingerprint": "f"}, lambda p, r: None, True)
        assert trainer is None and link is None and "belongs to uid 65534" in problem, problem
        out, _ = squatter.communicate(timeout=30)
    finally:
        if squatter.poll() is None:
            squatter.kill()
            squatter.wait()
    assert "received" not in out, out  # not a byte of the job's environment reached it


def test_a_pid_the_keeper_names_is_signalled_only_if_it_is_its_child_and_a_standby() -> None:
    child = subprocess.Popen(["sleep", "30"], env={**os.environ, ENV_STANDBY: "1"})
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        me = os.getpid()
        assert verify_trainer(child.pid, me) == ""
        for pid in (1, 0, -1, "1", None, True, 2.0):
            assert verify_trainer(pid, me).startswith("the keeper named pid"), pid
        assert "not a standby" in verify_trainer(stranger.pid, me)
        assert "not its child" in verify_trainer(child.pid, me + 1)
        assert "gone" in verify_trainer(4_194_999, me)
    finally:
        for proc in (child, stranger):
            proc.kill()
            proc.wait()


def test_a_standby_caught_in_the_middle_of_an_exec_is_still_a_standby() -> None:
    """A warm trainer that starts over cold execs itself, maybe while the agent is checking the
    pid the keeper named: for a moment in each exec the kernel shows no environment at all. A
    process that does nothing but exec itself, under the standby's mark, passes every check."""
    script = 'i=$1; [ "$i" -gt 0 ] && exec sh -c "$0" "$0" $((i - 1)); exec sleep 30'
    child = subprocess.Popen(
        ["sh", "-c", script, script, "100000"], env={**os.environ, ENV_STANDBY: "1"}
    )
    try:
        problems = [verify_trainer(child.pid, os.getpid()) for _ in range(2000)]
        argv = wait_for(
            lambda: Path(f"/proc/{child.pid}/cmdline").read_bytes().split(b"\0")[:-1], 5
        )
        assert child.poll() is None and int(argv[-1]) > 0  # it was exec-ing all along
        assert set(problems) == {""}, {p for p in problems if p}
    finally:
        child.kill()
        child.wait()


def test_a_second_keeper_for_a_task_says_the_name_is_served_and_leaves(
    shared_tmp: Path, tmp_path: Path
) -> None:
    job = f"two-{os.getpid()}"
    first = _keeper(job, shared_tmp, tmp_path / "first.log")
    try:
        wait_for(lambda: KeeperLink.connect(socket_path(job, 0), lambda pid, rss: None)[0], 10)
        second = _keeper(job, shared_tmp, tmp_path / "second.log")
        assert second.wait(30) == 0
        said = (tmp_path / "second.log").read_text()
        assert "[orchestrate] keeper: not started:" in said and "is served already" in said
        assert first.poll() is None  # the first one serves on
    finally:
        first.kill()
        first.wait()


def test_a_killed_keepers_socket_is_swept_as_the_next_keeper_starts(
    shared_tmp: Path, tmp_path: Path
) -> None:
    """SIGKILL leaves a keeper no time to remove its socket: the next keeper here removes it
    once it is older than a keeper's start (keepers.SOCKET_MIN_AGE), and keeps its own."""
    killed, job = f"killed-{os.getpid()}", f"next-{os.getpid()}"

    def reachable(name: str) -> bool:
        link = KeeperLink.connect(socket_path(name, 0), lambda pid, rss: None)[0]
        if link is not None:
            link.close()
        return link is not None

    first = _keeper(killed, shared_tmp, tmp_path / "first.log")
    second = None
    try:
        wait_for(lambda: reachable(killed), 10)
        first.kill()
        first.wait()
        left = Path(socket_path(killed, 0))
        assert left.exists()  # nothing removed it
        then = left.stat().st_mtime - 2 * SOCKET_MIN_AGE
        os.utime(left, (then, then))
        second = _keeper(job, shared_tmp, tmp_path / "second.log")
        wait_for(lambda: reachable(job), 10)
        wait_for(lambda: not left.exists(), 10)
        assert Path(socket_path(job, 0)).exists()
    finally:
        for keeper in (first, second):
            if keeper is not None and keeper.poll() is None:
                keeper.terminate()  # a keeper that ends removes its own socket
                keeper.wait(timeout=30)
    assert not Path(socket_path(job, 0)).exists()


def test_a_spare_hosts_standby_is_remade_once_the_imports_are_known_and_a_task_moved_there_starts_in_it(
    tmp_path: Path,
) -> None:
    """worker/warm/spare.py as the supervisor's visits run it: a keeper named by the spare slot,
    its standby remade when a trainer has since recorded what it imports (and only then), and
    the agent of a task moved to this host takes that standby (the keeper becomes the task's).
    Two TensorFlow imports."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    job = f"spare-{os.getpid()}"
    spec = WorkerSpec(
        job_id=job, task_index=0, host_label="spare-host", tf_config={},
        argv=[sys.executable, str(script)], workdir=str(tmp_path), shared_dir=str(tmp_path),
        warm_restart=True, warm_imports=True, standby_linger=60.0,
    )  # fmt: skip
    task_dir = Path(spec.layout.task_dir(0))
    task_dir.mkdir(parents=True)

    def spare_standby() -> int:
        """The spare keeper's ready standby's pid (0 until there is one)."""
        ours = [e for e in registry.entries() if e.job == job and e.task == spare_task(0)]
        return ours[0].standby if ours and ours[0].standby_ready else 0

    notes: list[str] = []
    try:
        assert keep_standbys([spec]) == {"slots": 1, "notes": []}
        first = wait_for(spare_standby, 120)
        assert keep_standbys([spec])["notes"] == [] and spare_standby() == first  # a visit
        (task_dir / WARM_IMPORTS_FILE).write_text(json.dumps({"modules": ["json.decoder"]}))
        assert keep_standbys([spec])["notes"] == []  # the list is known: one that imports it
        second = wait_for(lambda: spare_standby() not in (0, first) and spare_standby(), 120)
        assert second and not is_alive(first)
        keep_standbys([spec])
        assert spare_standby() == second
        # A task whose environment differs (another GPU) leaves it for one that matches.
        other = wait_for(lambda: KeeperLink.connect(socket_path(job, spare_task(0)), print)[0], 10)
        assert isinstance(other, KeeperLink)
        reply = other.request({"op": "activate", "fingerprint": "another", "job_id": job,
                               "task_index": 5, "env": {}, "target": [], "cwd": "/", "log": "/"})  # fmt: skip
        assert reply == {"ok": False, "reason": "a standby made for another environment"}
        other.close()
        assert is_alive(second) and spare_standby() == second

        moved = replace(spec, attempt=1, host_label="spare-host")
        standby = AgentStandby(moved, trainer_env(moved), notes.append, threading.Event(),
                               lambda: Phase.NONE)  # fmt: skip
        trainer = standby.warm_start(str(tmp_path / "task.log"))
        assert trainer is not None and trainer.pid == second, notes
        assert trainer.wait(60) == 3
        assert [e.task for e in registry.entries() if e.job == job] == [0]  # the task's now
        assert "warm start" in notes[-1]
        standby.close()
    finally:
        registry.release(job)
    assert wait_for(lambda: not [e for e in registry.entries() if e.job == job], 30)
