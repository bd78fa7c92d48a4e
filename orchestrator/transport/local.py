"""The local transport: the 'host' is this machine. Same contract as SSH, no network."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.errors import TransportError
from orchestrator.state.paths import user_umask
from orchestrator.transport import worker_package
from orchestrator.transport.base import CommandResult, ProcessRef
from orchestrator.transport.host_ops import HostOps
from worker import hostd, proctl
from worker.atomic import makedirs_private, write_bytes_atomic

# Questions about this machine's processes: answered the same from any of its interpreters
# (they read /proc and send signals), so in this process even where the job has its own.
IN_PROCESS_OPS = frozenset({"alive", "stop", "stop_job", "watch"})


class LocalTransport(HostOps):
    def __init__(self, host_label: str = "local", python: str = sys.executable) -> None:
        self.host_label = host_label
        self.python = python

    def worker_call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        if self.python == sys.executable or op in IN_PROCESS_OPS:  # no process needed
            if op == "watch":  # one machine: no partition to guard against, no contact marks
                args = {**args, "contact": []}
            try:
                return hostd.handle(op, args)
            except (OSError, ValueError, KeyError) as exc:
                raise TransportError(f"{self.host_label}: {op} failed: {exc}") from None
        code = "import json, sys; sys.path.insert(0, sys.argv[1]); " \
               "from worker.hostd import handle; " \
               "print(json.dumps(handle(sys.argv[2], json.loads(sys.argv[3]))))"  # fmt: skip
        argv = [self.python, "-c", code, self._copy(), op, json.dumps(args)]
        result = self.run(argv, timeout=timeout)
        if not result.ok:
            raise TransportError(f"{self.host_label}: {op} failed: {result.tail()}")
        return json.loads(result.stdout)

    def worker_argv(self, program: str, *args: str) -> list[str]:
        return worker_package.program_argv(self.python, self._copy(), program, *args)

    def _copy(self) -> str:
        try:
            return worker_package.local_copy()
        except (OSError, ValueError) as exc:
            raise TransportError(
                f"{self.host_label}: cannot install the worker package: {exc}"
            ) from None

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                env=_merged_env(env),
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise TransportError(
                f"{self.host_label}: command timed out after {timeout:g}s: {argv[0]}"
            ) from None
        except OSError as exc:
            return CommandResult(self.host_label, tuple(argv), 127, b"", str(exc).encode())
        return CommandResult(
            self.host_label, tuple(argv), proc.returncode, proc.stdout, proc.stderr
        )

    def start_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        stdin_file: tuple[str, bytes] | None = None,
    ) -> ProcessRef:
        if stdin_file is not None:
            self.put_file(stdin_file[0], stdin_file[1], mode=0o600)
        makedirs_private(Path(log_path).parent)
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=_merged_env(env),
                    start_new_session=True,
                    umask=user_umask(),
                )
            except OSError as exc:
                raise TransportError(f"{self.host_label}: cannot start {argv[0]}: {exc}") from None
        ident = proctl.identity(proc.pid) or ""  # read before the reaper below can reap it
        # We are its parent: reap it when it exits so it never lingers as a zombie.
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
        return ProcessRef(proc.pid, ident)

    def put_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        target = Path(path)
        makedirs_private(target.parent)
        write_bytes_atomic(target, data, mode)

    def get_file(self, path: str, local_path: Path) -> None:
        local_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, local_path)  # the bytes only: the copy's mode is ours (private)

    def get_tree(self, path: str, local_dir: Path) -> int:
        if not os.path.isdir(path):
            return 0
        shutil.copytree(path, local_dir, dirs_exist_ok=True, copy_function=shutil.copyfile)
        return sum(len(files) for _, _, files in os.walk(local_dir))

    def read_file(self, path: str, offset: int = 0) -> bytes | None:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                return fh.read()
        except FileNotFoundError:
            return None

    def close(self) -> None:
        pass


def _merged_env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    if env is None:
        return None
    merged = dict(os.environ)
    merged.update(env)
    return merged
