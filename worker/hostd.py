"""The host helper: `python -m worker.hostd`, one per host per coordinator connection.

The coordinator starts it once over SSH, from the copy of the worker package it shipped there
(worker.ship), and then sends it requests as JSON lines on stdin; it answers with JSON lines on
stdout. Each request then costs one round trip, with no login shell start-up and no
interpreter start-up on the host (about 80 ms and 40 ms per command otherwise).
Requests run in threads, so a slow `stop` does not hold up a `probe`. Standard library only.
Before each `start` the copy is hashed again (worker.ship.keep_if_intact): one edited since its
install is removed, the start refused naming it, and the helper exits, so that the host's next
helper installs the copy afresh.

Operations (`handle`): probe, read_tokens, alive, watch (worker.host_watch), stop, stop_job,
start, remove; and for `orchestrate check` (worker.netcheck): listen, unlisten, connect, route.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from worker import contact, host_watch, probe, proctl
from worker.atomic import makedirs_private, write_bytes_atomic


def start(argv: list[str], log_path: str, env: dict[str, str] | None = None,
          file: tuple[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Write the file (its bytes as a latin-1 string, mode 0600), then start argv in a new
    session, standard streams detached, output appended to log_path. Returns its pid (which is
    also its process group) and identity."""
    if file is not None:
        path, data = file
        makedirs_private(os.path.dirname(path))
        write_bytes_atomic(path, data.encode("latin-1"), mode=0o600)
    makedirs_private(os.path.dirname(log_path))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    ident = proctl.identity(proc.pid) or ""  # read before the reaper can reap it
    threading.Thread(target=proc.wait, daemon=True).start()  # reap it; it outlives us if need be
    return {"pid": proc.pid, "ident": ident}


class CopyChanged(RuntimeError):
    """The copy this helper runs from is no longer the package it was installed as."""


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def handle(op: str, args: dict[str, Any]) -> Any:
    if op == "probe":
        return probe.probe(args["shared_dir"], args["ports"], args.get("token_file"),
                           args.get("token", ""), args.get("gpu"))  # fmt: skip
    if op == "read_tokens":
        return probe.read_tokens(args["paths"])
    if op == "alive":
        return sorted(proctl.alive(args["pids"], args.get("idents")))
    if op == "watch":
        contact.touch(args.get("contact", []))
        seen = host_watch.watch(
            args.get("pids"),
            args.get("idents"),
            args.get("known_alive"),
            [(p, int(o)) for p, o in args["logs"]],
            [(p, k) for p, k in args.get("statuses", [])],
            float(args.get("wait", 0.0)),
            float(args.get("step", host_watch.STEP)),
            int(args.get("limit", host_watch.READ_LIMIT)),
        )
        return {
            "alive": None if seen.alive is None else sorted(seen.alive),
            "logs": [_b64(d) for d in seen.logs],
            "statuses": [_b64(d) for d in seen.statuses],
            "keys": seen.keys,
            "urgent": seen.urgent,
        }
    if op == "stop":
        return proctl.stop_group(int(args["pgid"]), float(args["grace"]), args.get("ident", ""))
    if op == "ask_stacks":  # our agent, checked by identity, takes its trainer's stacks
        from worker.stacks import ASK_AGENT

        pid, ident = int(args["pid"]), str(args["ident"])
        if pid <= 1 or not ident or not proctl.is_same(pid, ident):
            return False
        os.kill(pid, ASK_AGENT)
        return True
    if op == "stop_job":
        return proctl.stop_job(str(args["job_id"]), float(args["grace"]))
    if op == "standbys":  # this user's standby keepers here (worker.warm.registry)
        from dataclasses import asdict

        from worker.warm import registry

        if args["action"] == "release":
            return registry.release(str(args["job_id"]))
        if args["action"] == "clear":
            return registry.clear()
        return [asdict(entry) for entry in registry.entries()]
    if op == "remove":  # a directory tree we made (preflight tokens)
        shutil.rmtree(args["path"], ignore_errors=True)
        return True
    if op == "start":
        file = args.get("file")
        return start(args["argv"], args["log_path"], args.get("env"),
                     tuple(file) if file else None)  # fmt: skip
    if op == "checkpoints":  # a job's checkpoints, verified by this Python's TensorFlow
        from worker import checkpoints

        return checkpoints.checkpoints(
            [str(r) for r in args["roots"]], bool(args["verify"]), str(args.get("own", ""))
        )
    if op in ("listen", "unlisten", "connect", "route"):  # imported when asked, not at start
        from worker import netcheck

        return netcheck.handle(op, args)
    raise ValueError(f"unknown operation {op!r}")


def serve(
    stdin: Any = None, stdout: Any = None, copy_intact: Callable[[], bool] | None = None
) -> int:
    """`copy_intact`: whether the copy this helper runs from is still as installed (None: not
    run from a shipped copy); given by worker.ship, which this module does not import."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    lock = threading.Lock()
    # Where this helper's worker package is: agents are started from the same copy.
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

    def answer(request: dict[str, Any]) -> None:
        changed = False
        try:
            if request["op"] == "start" and copy_intact is not None and not copy_intact():
                changed = True
                raise CopyChanged(
                    f"the worker package's copy {root} changed after it was installed (it no "
                    "longer matches its digest): removed; the host's next helper installs it again"
                )
            reply = {
                "id": request["id"],
                "ok": True,
                "result": handle(request["op"], request["args"]),
            }
        except Exception as exc:
            reply = {"id": request.get("id"), "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(reply).encode() + b"\n"
        with lock:
            stdout.write(data)
            stdout.flush()
            if changed:  # nothing more runs from the copy that is gone: the channel closes
                os._exit(1)

    stdout.write(json.dumps({"ready": 1, "root": root}).encode() + b"\n")
    stdout.flush()
    for line in stdin:
        if not line.strip():
            continue
        threading.Thread(target=answer, args=(json.loads(line),), daemon=True).start()
    return 0  # stdin closed: the coordinator went away; started agents live on


if __name__ == "__main__":
    sys.exit(serve())
