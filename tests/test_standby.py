"""The warm standby's keeper on its own (worker/standby.py, worker/warm.py): a standby made under
another environment is replaced, never used; an activated one runs the script with a fresh
__main__, its argv and exactly the activation's environment; the exit status reaches the agent;
a keeper without an agent ends its standby and itself. Two TensorFlow imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.conftest import wait_for
from worker.proctl import is_alive
from worker.standby import socket_name
from worker.warm import STANDBY, KeeperLink, fingerprint, standby_env

SCRIPT = """
import json, os, sys
print("seen " + json.dumps({"name": __name__, "argv": sys.argv, "x": os.environ.get("X"),
      "old": os.environ.get("OLD"), "cwd": os.getcwd(), "runs": globals().get("runs", 0) + 1,
      "tf": "tensorflow" in sys.modules}), flush=True)
runs = 1
sys.exit(3)
"""


def test_the_keeper_replaces_a_stale_standby_and_runs_a_fresh_script_in_a_matching_one(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    workdir = tmp_path / "work"
    workdir.mkdir()
    job = f"test-{os.getpid()}"
    keeper = subprocess.Popen(
        [sys.executable, STANDBY, job, "0", "1.0", str(tmp_path / "standby.log")],
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
        link = wait_for(lambda: KeeperLink.connect(socket_name(job, 0), on_standby), 10)
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
                 "cwd": str(workdir), "log": str(tmp_path / "task.log")}  # fmt: skip
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
    finally:
        if link is not None:
            link.close()
        # No agent: the keeper ends (its standby with it) once its linger is over.
        try:
            keeper.wait(timeout=30)
        finally:
            if keeper.poll() is None:
                os.killpg(keeper.pid, 9)
                keeper.wait()
    assert keeper.returncode == 0
    assert not any(is_alive(p) for p in ready)
