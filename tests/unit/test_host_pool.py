"""The host pool's rules (pure), the config keys that drive it, and an agent's partition test."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.config import parse_config
from orchestrator.errors import ConfigError
from orchestrator.planning.plan import dry_run_plan
from orchestrator.state.host_pool import HostPool, HostRole, describe_hosts
from worker import contact


def pool() -> HostPool:
    return HostPool.initial(["h0", "h1", "h2", "s3"], spares={3})


def test_a_lost_member_stays_in_the_group_and_a_spare_takes_its_place() -> None:
    p = pool().unreachable(1, now=100.0)
    assert p.group() == (0, 1, 2)  # the group waits for it
    assert p.hosts[1].role == HostRole.LOST and p.lost_since(1) == 100.0
    assert p.unreachable(1, now=150.0).lost_since(1) == 100.0  # lost since it first was
    spare = p.spare_for(now=101.0)
    assert spare == 3
    p = p.replace(1, spare, now=101.0, quarantine=300.0)
    assert p.group() == (0, 2, 3)
    assert p.hosts[1].role == HostRole.QUARANTINED and p.hosts[1].until == 401.0
    assert p.spare_for(now=200.0) is None  # resting
    assert p.spare_for(now=401.0) == 1  # a spare again after its cool-down


def test_a_dropped_host_leaves_the_group_and_may_rejoin() -> None:
    p = pool().unreachable(2, now=1.0).drop(2)
    assert p.group() == (0, 1) and p.with_role(HostRole.OUT) == (2,)
    assert p.rejoin(2).group() == (0, 1, 2)


def test_failures_in_a_row_are_counted_per_host_and_reset_by_health() -> None:
    p = pool().failed(1).failed(1)
    assert p.hosts[1].failures == 2
    assert p.healthy((1,)).hosts[1].failures == 0


def test_the_pool_survives_the_store_and_status_says_what_each_host_does() -> None:
    p = pool().unreachable(1, now=100.0)
    again = HostPool.from_json(p.to_json())
    assert again == p
    notes = describe_hosts(again, now=140.0)
    assert "waiting for h1: unreachable for 40 s" in notes
    assert "s3: spare" in notes
    assert HostPool.from_json("") is None


def _ssh_config(hosts: list[dict[str, object]], restart: dict[str, object] | None = None) -> dict:
    return {
        "job": {"name": "j", "shared_dir": "/tmp/x"},
        "entrypoint": {"module": "m"},
        "backend": {"type": "ssh", "hosts": hosts},
        "restart": restart or {},
    }


def test_spares_get_no_task_until_they_replace_a_host() -> None:
    cfg = parse_config(
        _ssh_config([{"address": "a"}, {"address": "b", "spare": True}, {"address": "c"}])
    )
    from orchestrator.config.rules import check_semantics

    check_semantics(cfg, "cluster.toml")
    plan = dry_run_plan(cfg)
    assert [t.host_label for t in plan.tasks] == ["a", "c"]


@pytest.mark.parametrize(
    ("hosts", "restart", "message"),
    [
        ([{"address": "a", "spare": True}], {}, "backend.hosts: every host is a spare"),
        ([{"address": "a"}], {"min_workers": 2}, "restart.min_workers: 2 is more than the 1"),
        ([{"address": "a"}], {"regrow": True}, "restart.regrow: needs restart.min_workers"),
    ],
)
def test_elastic_and_spare_keys_are_checked_with_one_line_errors(
    hosts: list[dict[str, object]], restart: dict[str, object], message: str
) -> None:
    from orchestrator.config.rules import check_semantics

    with pytest.raises(ConfigError, match=message):
        check_semantics(parse_config(_ssh_config(hosts, restart)), "cluster.toml")


def test_an_agent_is_cut_off_only_when_the_coordinator_is_silent_and_no_peer_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the private directory's parent
    me = os.getpid()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        alive_peer = f"127.0.0.1:{listening.getsockname()[1]}"
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            refused_peer = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening
        assert contact.reachable(alive_peer) and contact.reachable(refused_peer)
        # A peer whose host does not answer at all: only namespaced tests may cut a link (the
        # SSH test bed does), so here the probe of that one peer says so.
        silent_peer = "silent:1"
        real = contact.reachable
        monkeypatch.setattr(contact, "reachable", lambda p, *a: p != silent_peer and real(p))
        assert not contact.cut_off(me, [silent_peer], 1.0)  # never contacted: nothing to lose
        contact.touch([me])
        assert not contact.cut_off(me, [silent_peer], 1.0)  # contacted just now
        old = time.time() - 10
        os.utime(contact.contact_path(me), (old, old))
        assert not contact.cut_off(me, [], 1.0)  # no peers: never
        assert not contact.cut_off(me, [silent_peer, alive_peer], 1.0)
        assert not contact.cut_off(me, [silent_peer, refused_peer], 1.0)  # its host answers
        assert contact.cut_off(me, [silent_peer], 1.0)
        assert not contact.cut_off(me, [silent_peer], 0.0)  # off
    contact.forget(me)
    assert contact.contact_age(me) is None
