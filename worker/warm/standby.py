"""A standby interpreter, the keeper's child (worker/warm/keeper.py): `bootstrap.py --standby`
imports TensorFlow under the task's environment and waits on its control socket; once
activated it is the trainer. Standard library only."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess

from worker.children import BOOTSTRAP, die_with_parent
from worker.warm.imports_ahead import ENV_WARM_IMPORTS

ENV_STANDBY = "ORCHESTRATE_STANDBY"  # in a standby's own environment: a warm trainer has it


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Child:
    """A standby interpreter (until activated: then the trainer), our child in its own session."""

    def __init__(
        self, python: str, env: dict[str, str], fingerprint: str, log: str, imports: list[str]
    ) -> None:
        self.fingerprint = fingerprint
        self.imports = imports  # what it was asked to import ahead
        ours, theirs = socket.socketpair()
        if imports:  # worker.warm.imports_ahead: what the standby imports besides TensorFlow
            env = {**env, ENV_WARM_IMPORTS: ",".join(imports)}
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [python, BOOTSTRAP, "--standby", str(theirs.fileno())],
                env={**env, ENV_STANDBY: "1"},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                preexec_fn=die_with_parent,  # the keeper gone: nothing of ours lives on
            )
        theirs.close()
        self.control = ours
        self.ready = False
        self.active = False
        self.pidfd = os.pidfd_open(self.proc.pid)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self) -> None:
        self.control.close()
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
