"""A plain MWMS script under the bootstrap connects to its coordination leader only once the
leader listens: no connection refused, so no gRPC reconnect backoff (up to 1 s) on a start.

The leader here is the test itself: a socket on worker 0's address that starts listening
only after worker 1 has long reached its rendezvous. The first connection it accepts must be
our probe (it sends nothing), the next TensorFlow's own (gRPC's HTTP/2 preface). Without the
wait, TensorFlow's refused first try would be retried, and its connection would come first."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from worker.agent import BOOTSTRAP

SCRIPT = """
import tensorflow as tf
print("IMPORTED", flush=True)
tf.distribute.MultiWorkerMirroredStrategy()  # blocks: the leader is the test's socket
"""


def _first_bytes(connection: socket.socket) -> bytes:
    connection.settimeout(30)
    with connection:
        return connection.recv(24)


def test_a_task_connects_to_its_leader_only_once_it_listens(tmp_path: Path) -> None:
    leader = socket.socket()
    leader.bind(("127.0.0.1", 0))  # reserved, refusing connections until it listens
    peer = socket.socket()
    peer.bind(("127.0.0.1", 0))
    cluster = {"worker": [f"127.0.0.1:{s.getsockname()[1]}" for s in (leader, peer)]}
    peer.close()  # worker 1's own server binds it
    script = tmp_path / "join.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "ORCHESTRATE_PROGRESS_FILE": str(tmp_path / "progress.json"),
    }
    proc = subprocess.Popen([sys.executable, BOOTSTRAP, str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("IMPORTED"):
                break
        assert lines and lines[-1].startswith("IMPORTED"), "".join(lines)[-3000:]
        # Long enough for TensorFlow to have tried (and been refused) without the wait.
        time.sleep(2.0)
        assert proc.poll() is None
        leader.listen(8)
        leader.settimeout(30)
        first = _first_bytes(leader.accept()[0])
        second = _first_bytes(leader.accept()[0])
    finally:
        proc.kill()
        proc.wait()
        leader.close()
    assert first == b""  # our probe: a TCP connect, closed
    assert second.startswith(b"PRI * HTTP/2.0")  # then TensorFlow's gRPC channel
