"""What `--json` prints for validate, check, launch --dry-run, stop and resume: plain dicts
with documented fields (docs/commands-json.md), built from the same values the text shows."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from orchestrator.commands.json_document import dumps as dumps

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig
    from orchestrator.planning.plan import LaunchPlan
    from orchestrator.planning.port_check import PortCheck


def problems(message: str) -> dict[str, Any]:
    """A refusal: one entry per line of the error (a config may have several problems)."""
    return {"ok": False, "errors": message.splitlines()}


def validated(path: str, cfg: ClusterConfig, plan: LaunchPlan) -> dict[str, Any]:
    from orchestrator.commands.views import plan_size
    from orchestrator.planning.plan import per_gpu_hosts

    per_gpu = set(per_gpu_hosts(cfg))
    return {
        "ok": True,
        "summary": plan_size(cfg, plan),
        "config": path,
        "job": cfg.job.name,
        "backend": cfg.backend.type,
        "tasks": len(plan.tasks),
        "hosts": len({t.host_index for t in plan.tasks}),
        "tasks_counted_at_launch": bool(per_gpu & {t.host_index for t in plan.tasks}),
    }


def dry_run_plan_doc(cfg: ClusterConfig) -> dict[str, Any]:
    from orchestrator.planning.plan import dry_run_plan, per_gpu_hosts
    from orchestrator.planning.task_specs import container_argv, entrypoint_command

    plan = dry_run_plan(cfg)
    per_gpu = set(per_gpu_hosts(cfg))
    return {
        "job": cfg.job.name,
        "backend": cfg.backend.type,
        "shared_dir": str(cfg.job.shared_dir),
        "trainer": entrypoint_command(cfg, "<python>"),
        "instrumented": cfg.entrypoint.instrument,
        "tasks": [
            {
                "name": t.name,
                "index": t.index,
                "host": t.host_label,
                "address": t.address,
                "port": t.port,  # null: probed free on the host at launch
                "chief": t.is_chief,
                "gpus": list(t.gpus),
                "gpus_counted_at_launch": t.host_index in per_gpu,
                "tf_config": json.loads(plan.tf_config_json(t.index)),
                "container": container_argv(
                    cfg, t, os.getuid()
                ),  # null: the trainer runs on the host
            }
            for t in plan.tasks
        ],
    }


def port_check(check: PortCheck) -> dict[str, Any]:
    return {
        "ok": check.ok,
        "hosts": [check.labels[h] for h in check.hosts],
        "pairs": [
            {
                "from": p.source_label,
                "to": p.target.host_label,
                "task": p.target.task,
                "address": p.target.address,
                "port": p.target.port,
                "ok": not p.error,
                "error": p.error or None,
            }
            for p in check.pairs
        ],
    }


def job_state(job_id: str, state: str, **more: Any) -> dict[str, Any]:
    return {"job": job_id, "state": state, **more}
