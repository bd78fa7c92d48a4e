from __future__ import annotations

import json

import pytest

from orchestrator.config import parse_config
from orchestrator.planning.plan import build_plan, dry_run_plan, fixed_ports, task_slots


def _config(backend: dict, ports: dict | None = None):
    raw = {
        "job": {"name": "p", "shared_dir": "/shared"},
        "entrypoint": {"module": "m"},
        "backend": backend,
    }
    if ports:
        raw["ports"] = ports
    return parse_config(raw)


def test_local_two_workers_golden_tf_config() -> None:
    plan = build_plan(_config({"type": "local", "workers": 2}), [41001, 41002])
    assert plan.tf_config(0) == {
        "cluster": {"worker": ["127.0.0.1:41001", "127.0.0.1:41002"]},
        "task": {"type": "worker", "index": 0},
    }
    assert plan.tf_config_json(1) == (
        '{"cluster":{"worker":["127.0.0.1:41001","127.0.0.1:41002"]},'
        '"task":{"type":"worker","index":1}}'
    )
    assert plan.tasks[0].is_chief and not plan.tasks[1].is_chief


def test_ssh_hosts_in_file_order_with_slots_and_identical_cluster() -> None:
    cfg = _config(
        {
            "type": "ssh",
            "hosts": [
                {"address": "10.0.0.2", "name": "b", "slots": 2},
                {"address": "10.0.0.1", "name": "a"},
                {"address": "fd00::3"},
            ],
        },
        ports={"base": 20000},
    )
    slots = task_slots(cfg)
    assert [(s.host_label, s.slot) for s in slots] == [("b", 0), ("b", 1), ("a", 0), ("fd00::3", 0)]
    ports = fixed_ports(cfg, slots)
    assert ports == [20000, 20001, 20000, 20000]
    plan = build_plan(cfg, ports)
    expected = ["10.0.0.2:20000", "10.0.0.2:20001", "10.0.0.1:20000", "[fd00::3]:20000"]
    for i in range(4):
        tf_config = json.loads(plan.tf_config_json(i))
        assert tf_config["cluster"] == {"worker": expected}  # identical for every task
        assert tf_config["task"] == {"type": "worker", "index": i}


def test_auto_ports_stay_unresolved_in_dry_run() -> None:
    plan = dry_run_plan(_config({"type": "local", "workers": 3}))
    assert [t.endpoint for t in plan.tasks] == ["127.0.0.1:auto"] * 3


def test_port_count_and_collisions_are_rejected() -> None:
    cfg = _config({"type": "local", "workers": 2})
    with pytest.raises(ValueError, match="need 2 ports"):
        build_plan(cfg, [1])
    with pytest.raises(ValueError, match="share an address"):
        build_plan(cfg, [5000, 5000])
