"""Preparing a standby: have a keeper (started if need be) import TensorFlow in a standby
interpreter, for the task's next attempt or, on a spare host, for a task it may take over."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from worker.container import image_of, keeper_in_image
from worker.spec import ENV_JOB_ID, WorkerSpec
from worker.warm import imports_ahead
from worker.warm.activation import KEEPER, KeeperLink, fingerprint, standby_env
from worker.warm.import_env import undone_reason
from worker.warm.registry import room_for_standby, socket_path, spare_task


def prepare_standby(
    spec: WorkerSpec,
    env: dict[str, str],
    keeper: KeeperLink | None,
    note: Callable[[str], None],
    ready: Callable[[int, int], None],
    spare_slot: int | None = None,
) -> KeeperLink | None:
    """Have the task's keeper (started if need be) import TensorFlow in a standby for the
    next attempt, under the trainer's environment `env`; returns the keeper (`note` says why
    there is no standby). On a spare host (`spare_slot`), the keeper is named by the slot
    (registry.spare_task) until the task that moves here takes its standby."""
    task_dir = str(spec.layout.task_dir(spec.task_index))
    name = spec.task_index if spare_slot is None else spare_task(spare_slot)
    log = f"{task_dir}/standby.log" if spare_slot is None else spare_log(spec, spare_slot)
    short = room_for_standby() or undone_reason(task_dir)
    if short:
        note(f"no warm standby on this host: {short}")
        return keeper
    if keeper is None:  # the task's keeper if it runs (a Slurm job's keeper step), else a new one
        try:
            keeper, problem = KeeperLink.connect(socket_path(spec.job_id, name), ready)
        except OSError as exc:
            keeper, problem = None, f"no private directory for the keeper's socket: {exc}"
        if keeper is None and not problem:
            keeper, problem = start_keeper(replace(spec, task_index=name), log, ready)
        if keeper is None:
            note(f"no warm standby: {problem}")
            return None
    python = spec.argv[0]
    ahead = imports_ahead.read(task_dir) if spec.warm_imports else []
    made_under = fingerprint(env, python, spec.env, image_of(spec))
    reply = keeper.request({"op": "prepare", "fingerprint": made_under,
                            "env": standby_env(env), "python": python, "imports": ahead,
                            "log": log})  # fmt: skip
    if not reply.get("ok"):
        note(f"no warm standby: {reply.get('reason', 'the keeper refused')}")
    return keeper


def spare_log(spec: WorkerSpec, slot: int) -> str:
    """Where a spare host's slot-th keeper and standby write, in the job's directory."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", spec.host_label)[:64]
    spares = spec.layout.root / "spares"
    os.makedirs(spares, mode=0o700, exist_ok=True)
    return str(spares / f"{host}-{slot}.log")


def start_keeper(
    spec: WorkerSpec, log: str, on_standby: Callable[[int, int], None]
) -> tuple[KeeperLink | None, str]:
    """Start the task's keeper (its own session: it outlives this agent, and it may serve the
    user's next job, so it carries no job id) and connect to it; (None, why) when it cannot be
    used. It is named by `spec.task_index` (a spare slot's, on a spare host)."""
    job_id, task_index = spec.job_id, spec.task_index
    argv = [sys.executable, KEEPER, job_id, str(task_index), str(spec.standby_linger), log,
            str(spec.keep_standbys), str(spec.keep_standbys_bytes)]  # fmt: skip
    if spec.container:  # in its own container of the image, its standbys too
        argv = keeper_in_image(spec, argv, str(Path(KEEPER).parents[2]))
    with open(log, "ab") as out:
        subprocess.Popen(
            argv,
            env={k: v for k, v in os.environ.items() if k != ENV_JOB_ID},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            link, problem = KeeperLink.connect(socket_path(job_id, task_index), on_standby)
        except OSError as exc:
            return None, f"no private directory for the keeper's socket: {exc}"
        if link is not None or problem:
            return link, problem
        time.sleep(0.05)
    return None, "its keeper did not start (see standby.log)"
