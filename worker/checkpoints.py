"""The checkpoints a job wrote, found on a host: TensorFlow checkpoints (a prefix's `.index`
and its `.data-NNNNN-of-MMMMM` shards), as BackupAndRestore and tf.train.CheckpointManager
write them. Found without TensorFlow (size, age on this host's clock, the number a manager
gives it, whether its directory's `checkpoint` file names it the latest); verified in a
process of the host's Python that imports TensorFlow: the index read, every variable's bytes
against the shards', and the epoch and step it holds where it holds them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

MAX_DEPTH = 8  # directories below a root that are searched
MAX_FOUND = 500  # checkpoints reported at most (the newest)
SKIPPED = {"__pycache__", "node_modules", "site-packages"}
MAX_ENTRIES = 200_000  # files and directories looked at under one root, at most
VERIFY_TIMEOUT = 600.0  # seconds for TensorFlow's import and every checkpoint's read
SHARD = re.compile(r"\.data-(\d{5})-of-(\d{5})$")
NUMBER = re.compile(r"-(\d+)$")
LATEST = re.compile(r'^model_checkpoint_path:\s*"(.*)"\s*$', re.MULTILINE)


def find(roots: list[str], own: str = "") -> list[dict[str, Any]]:
    """Every checkpoint under these directories, newest first. `own`: the job's directory
    on the shared filesystem: the other jobs' beside it (with their `tasks/`) are not its."""
    now = time.time()
    found: dict[str, dict[str, Any]] = {}
    for root in roots:
        for prefix in _prefixes(root, own):
            if prefix not in found:
                found[prefix] = _describe(prefix, now)
    newest = sorted(found.values(), key=lambda c: c["age_s"])
    return newest[:MAX_FOUND]


def _prefixes(root: str, own: str = "") -> list[str]:
    prefixes: list[str] = []
    base_depth = root.rstrip("/").count("/")
    seen = 0
    for directory, subdirs, files in os.walk(root, followlinks=False):
        seen += len(files) + len(subdirs)
        if seen > MAX_ENTRIES:  # a tree a trainer filled without end: what was found so far
            break
        # Not a virtual environment's, a repository's or a cache's insides.
        subdirs[:] = [d for d in subdirs if not d.startswith(".") and d not in SKIPPED]
        if own and directory == os.path.dirname(own):  # the shared directory: other jobs'
            subdirs[:] = [d for d in subdirs if os.path.join(directory, d) == own
                          or not os.path.isdir(os.path.join(directory, d, "tasks"))]  # fmt: skip
        if directory.count("/") - base_depth >= MAX_DEPTH:
            subdirs.clear()
        prefixes += [os.path.join(directory, f[: -len(".index")]) for f in files
                     if f.endswith(".index")]  # fmt: skip
    return prefixes


def _describe(prefix: str, now: float) -> dict[str, Any]:
    directory, name = os.path.split(prefix)
    shards: list[str] = []
    expected = 1
    try:
        for entry in os.scandir(directory):
            if entry.name.startswith(name + ".data-"):
                match = SHARD.search(entry.name)
                if match:
                    shards.append(entry.path)
                    expected = int(match.group(2))
    except OSError:
        pass
    files = [prefix + ".index", *shards]
    sizes, times = [], []
    for path in files:
        try:
            info = os.stat(path)
        except OSError:
            continue
        sizes.append(info.st_size)
        times.append(info.st_mtime)
    number = NUMBER.search(name)
    return {
        "prefix": prefix,
        "number": int(number.group(1)) if number else None,
        "bytes": sum(sizes),
        # On this host's clock, against its own now: no clocks need agree.
        "age_s": round(now - max(times), 1) if times else None,
        "shards": len(shards),
        "shards_expected": expected,
        "latest": _latest_in(directory) == prefix,
    }


def _latest_in(directory: str) -> str | None:
    """The prefix a directory's `checkpoint` file names the latest (CheckpointManager's)."""
    try:
        with open(os.path.join(directory, "checkpoint")) as f:
            text = f.read(65536)
    except (OSError, UnicodeDecodeError):
        return None
    match = LATEST.search(text)
    if not match:
        return None
    path = match.group(1)
    return path if os.path.isabs(path) else os.path.join(directory, path)


VERIFY_CODE = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
V = "/.ATTRIBUTES/VARIABLE_VALUE"
EPOCH = "ckpt_saved_epoch" + V  # BackupAndRestore's (tf-keras: _ckpt_saved_epoch)
STEPS = tuple(s + V for s in ("optimizer/iter", "optimizer/_iterations",
                               "optimizer/iterations", "/step", "global_step"))
out = []
for prefix, data_bytes in json.loads(sys.stdin.read()):
    seen = {"prefix": prefix, "ok": False, "problem": None, "variables": None,
            "epoch": None, "step": None}
    if not os.path.exists(prefix + ".index"):  # replaced by a newer one meanwhile
        seen.update(ok=None, problem="gone")
        out.append(seen)
        continue
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
        wanted = sum(int(np.prod(shapes[n] or [1])) * dtypes[n].size for n in shapes
                     if dtypes[n] != tf.string)
        seen["variables"] = len(shapes)
        if data_bytes < wanted:
            seen["problem"] = f"truncated: {data_bytes} bytes of data, its variables need {wanted}"
        else:
            for name in shapes:
                if name.endswith(EPOCH) or name == EPOCH:
                    seen["epoch"] = int(np.asarray(reader.get_tensor(name)).reshape(-1)[0]) + 1
                elif (name.endswith(STEPS) or name == "step" + V) and not shapes[name]:
                    seen["step"] = int(reader.get_tensor(name))
            seen["ok"] = True
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        seen["problem"] = "unreadable: " + first[:300]
    out.append(seen)
print(json.dumps(out))
"""


def verify(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each checkpoint's verdict, read by TensorFlow in a process of its own (this Python's):
    {prefix: {ok, problem, variables, epoch, step}}. A checkpoint whose shards are missing is
    refused without it; when TensorFlow cannot start here, every verdict says why."""
    verdicts: dict[str, dict[str, Any]] = {}
    asked = []
    for c in found:
        if c["shards"] < c["shards_expected"]:
            missing = f"incomplete: {c['shards']} of {c['shards_expected']} data shard(s)"
            verdicts[c["prefix"]] = {"ok": False, "variables": None, "epoch": None,
                                     "step": None, "problem": missing}  # fmt: skip
        else:
            asked.append([c["prefix"], c["bytes"] - _size(c["prefix"] + ".index")])
    if not asked:
        return verdicts
    try:
        ran = subprocess.run([sys.executable, "-c", VERIFY_CODE], input=json.dumps(asked),
                             capture_output=True, text=True, timeout=VERIFY_TIMEOUT)  # fmt: skip
        answers = json.loads(ran.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        why = "not verified: TensorFlow could not read them here"
        return {**verdicts, **{p: {"ok": None, "problem": why, "variables": None, "epoch": None,
                                   "step": None} for p, _ in asked}}  # fmt: skip
    for answer in answers:
        verdicts[answer.pop("prefix")] = answer
    return verdicts


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def checkpoints(roots: list[str], check: bool, own: str = "") -> list[dict[str, Any]]:
    """The host helper's `checkpoints` operation: found, and verified when asked."""
    found = find([r for r in roots if os.path.isdir(r)], own)
    if check and found:
        verdicts = verify(found)
        for c in found:
            c.update(verdicts.get(c["prefix"], {}))
        # A running job's manager replaces its checkpoints: one gone meanwhile is not one.
        found = [c for c in found if c.get("problem") != "gone"]
    return found
