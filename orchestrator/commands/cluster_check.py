"""`orchestrate check` (I/O): the launch's preflight, then every host tries a TCP connection to
every task port of the plan while each host holds listeners on its own, and says which address
and interface it would use to reach its peers. Starts no task, registers no job, and leaves
nothing on a host: the listeners are closed (and close themselves after a while, and when the
helper's connection ends), the preflight's token directory is removed.

What to try and how to print it is port_check.py's (pure); the host side is worker.netcheck,
through the host helper (worker.hostd)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable
from typing import Any

from orchestrator.backends import open_backend
from orchestrator.backends.preflight import preflight
from orchestrator.config import ClusterConfig
from orchestrator.errors import OrchestrateError, UsageError
from orchestrator.planning import port_check
from orchestrator.planning.plan import LaunchPlan, plan_on_hosts
from orchestrator.transport.fanout import each

CONNECT_TIMEOUT = 3.0  # seconds for one TCP connection (all of a host's are tried at once)
CONNECT_THREADS = 64  # worker.netcheck.CONNECT_THREADS: tries at once on one host
CALL_MARGIN = 30.0  # seconds a helper call may take beyond its own work

HostCall = Callable[[int, str, dict[str, Any], float], Any]


def run_check(
    config: ClusterConfig, say: Callable[[str], None] = lambda line: None
) -> port_check.PortCheck:
    """Preflight every host a job starts on (PreflightError naming them when any fails), plan
    the ports as a launch would (fixed, or probed free), and check every host -> task port.
    `say` hears of what the preflight did on a host (an image it pulled)."""
    key = f"check-{secrets.token_hex(4)}"
    backend = open_backend(config)
    try:
        if not backend.capabilities.hosts_known_before_launch:
            kind = backend.kind.capitalize()
            raise UsageError(
                f"check needs the hosts before the job: a {kind} job's nodes are known only "
                "once its allocation starts (see `orchestrate launch --dry-run`)"
            )
        reports = preflight(
            config,
            backend,
            key,
            on_answer=lambda r, _: (
                say(f"{r.host_label}: {r.image_pulled}") if r.image_pulled else None
            ),
        )
        counts = {h: len(r.gpu.gpus) for h, r in reports.items() if r.gpu is not None}
        plan = plan_on_hosts(config, {h: r.ports for h, r in reports.items()}, counts)
        return check_ports(backend.lasting_call, plan, key)
    finally:
        backend.close()


def check_ports(call: HostCall, plan: LaunchPlan, key: str) -> port_check.PortCheck:
    """Listen on every task port (each on its own host), connect from every host to every one
    of them, ask each host for its routes to its peers, and close the listeners."""
    found = port_check.targets(plan)
    labels = port_check.hosts_of(found)
    hosts = tuple(labels)
    token = secrets.token_hex(8)
    connect_limit = CONNECT_TIMEOUT * -(-len(found) // CONNECT_THREADS) + CALL_MARGIN
    hold = connect_limit + 2 * CALL_MARGIN  # the listeners' own deadline, should we vanish

    def listen(h: int) -> Any:
        args = {"key": key, "ports": port_check.ports_on(found, h), "token": token, "hold": hold}
        return call(h, "listen", args, CALL_MARGIN)

    listened = each(hosts, listen)
    try:
        answers: dict[int, Any] = dict(listened.succeeded)
        answers.update({h: listened.reason(h, labels[h]) for h in listened.failed})
        missing = port_check.not_listening(found, answers)
        tried = [[t.address, t.port] for t in port_check.tried(found, missing)]
        peers = port_check.route_peers(found)

        def probe(h: int) -> tuple[Any, Any]:
            args = {"targets": tried, "token": token, "timeout": CONNECT_TIMEOUT}
            connected = _or_error(lambda: call(h, "connect", args, connect_limit), labels[h])
            routes = _or_error(
                lambda: call(h, "route", {"peers": [a for _, a in peers[h]]}, CALL_MARGIN),
                labels[h],
            )
            if not isinstance(routes, str):
                routes = port_check.parse_routes(peers[h], routes)
            return connected, routes

        probed = each(hosts, probe)
    finally:
        _close_listeners(call, hosts, key)
    connected = {h: c for h, (c, _) in probed.succeeded.items()}
    return port_check.PortCheck(
        hosts=hosts,
        labels=labels,
        pairs=port_check.pairs(found, missing, connected),
        routes={h: r for h, (_, r) in probed.succeeded.items()},
    )


def _or_error(work: Callable[[], Any], label: str) -> Any:
    """The call's answer, or why it failed (without the host's label)."""
    try:
        return work()
    except OrchestrateError as exc:
        return str(exc).removeprefix(f"{label}: ")


def _close_listeners(call: HostCall, hosts: tuple[int, ...], key: str) -> None:
    """Every host, whether or not its listen answered (it may have bound and lost the reply).
    A host that cannot be told closes them itself, at the listeners' deadline."""

    def unlisten(h: int) -> None:
        with contextlib.suppress(OrchestrateError):
            call(h, "unlisten", {"key": key}, CALL_MARGIN)

    each(hosts, unlisten)
