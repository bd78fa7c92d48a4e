"""Which task waits for which leader, and the wait itself against real sockets."""

from __future__ import annotations

import socket
import threading
import time

from worker.leader_wait import (
    coordination_leader,
    leader_to_wait_for,
    split_address,
    wait_until_listening,
)

WORKERS = {"worker": {0: "10.0.0.1:2222", 1: "10.0.0.2:2222", 2: "10.0.0.3:2222"}}


def test_the_leader_is_tensorflows_ps_then_chief_then_worker_zero() -> None:
    assert coordination_leader(WORKERS) == ("worker", 0)
    assert coordination_leader({**WORKERS, "chief": {0: "c:1"}}) == ("chief", 0)
    assert coordination_leader({**WORKERS, "chief": {0: "c:1"}, "ps": {0: "p:1"}}) == ("ps", 0)
    assert coordination_leader({"evaluator": {0: "e:1"}}) is None


def test_only_the_other_tasks_wait_for_the_leaders_address() -> None:
    assert leader_to_wait_for(WORKERS, "worker", 0) is None
    assert leader_to_wait_for(WORKERS, "worker", 2) == ("10.0.0.1", 2222)
    with_chief = {**WORKERS, "chief": {0: "[fd00::1]:2000"}}
    assert leader_to_wait_for(with_chief, "worker", 0) == ("fd00::1", 2000)
    assert leader_to_wait_for(with_chief, "chief", 0) is None


def test_addresses_split_as_grpc_targets() -> None:
    assert split_address("host:2222") == ("host", 2222)
    assert split_address("grpc://host:2222") == ("host", 2222)
    assert split_address("[::1]:80") == ("::1", 80)
    assert split_address("host") is None
    assert split_address("host:port") is None
    assert split_address(":80") is None


def test_the_wait_returns_once_the_port_listens_and_gives_up_at_its_cap() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))  # bound, not yet listening: connections are refused
    port = server.getsockname()[1]
    listening_at: list[float] = []

    def listen_later() -> None:
        time.sleep(0.3)
        listening_at.append(time.monotonic())
        server.listen()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        assert wait_until_listening("127.0.0.1", port, cap=20.0)
        returned_at = time.monotonic()
        thread.join()
        assert listening_at and returned_at >= listening_at[0]  # not before it listened
    finally:
        thread.join()
        server.close()
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # never listens
    try:
        assert not wait_until_listening("127.0.0.1", refused.getsockname()[1], cap=0.1)
    finally:
        refused.close()
