"""Pure: what `orchestrate check` tries (every host to every task port of the plan) and what it
prints (a host-by-host grid, the failing pairs by name, each host's interface). No I/O; the
checking itself is cluster_check.py's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.planning.plan import LaunchPlan

NAMED_IN_SUMMARY = 5  # failing pairs named in the one-line summary; the grid names them all


@dataclass(frozen=True)
class Target:
    """One task's port, as its peers will reach it (the plan's address, as in TF_CONFIG)."""

    task: str  # "worker-2"
    host_index: int
    host_label: str
    address: str
    port: int


@dataclass(frozen=True)
class Pair:
    """One host's try at one task port: error "" when it reached the check's listener."""

    source: int  # host index
    source_label: str
    target: Target
    error: str = ""

    def describe(self) -> str:
        t = self.target
        return f"{self.source_label} -> {t.host_label}:{t.port} ({t.task})"


@dataclass(frozen=True)
class Route:
    """How a host would reach one peer: its source address and interface, or why it cannot."""

    peer: str  # the peer's host label
    source: str = ""
    interface: str = ""
    error: str = ""


@dataclass(frozen=True)
class PortCheck:
    hosts: tuple[int, ...]  # in cluster.toml order
    labels: Mapping[int, str]
    pairs: tuple[Pair, ...]
    routes: Mapping[int, tuple[Route, ...] | str] = field(default_factory=dict)  # str: error

    @property
    def failures(self) -> list[Pair]:
        return [p for p in self.pairs if p.error]

    @property
    def ok(self) -> bool:
        return not self.failures


def targets(plan: LaunchPlan) -> list[Target]:
    """Every task port of a plan whose ports are known (fixed or probed)."""
    found = []
    for task in plan.tasks:
        if task.port is None:
            raise ValueError(f"{task.name} has no port yet: probe the hosts first")
        found.append(Target(task.name, task.host_index, task.host_label, task.address, task.port))
    return found


def hosts_of(found: Sequence[Target]) -> dict[int, str]:
    """The hosts that hold these targets, in order, with their labels."""
    return {t.host_index: t.host_label for t in sorted(found, key=lambda t: t.host_index)}


def ports_on(found: Sequence[Target], host: int) -> list[int]:
    return [t.port for t in found if t.host_index == host]


def route_peers(found: Sequence[Target]) -> dict[int, list[tuple[str, str]]]:
    """Per host, the peers whose route it reports: (label, address) of every other host; a
    lone host reports the route to its own address (loopback for the local backend)."""
    addresses = {t.host_index: (t.host_label, t.address) for t in found}
    return {
        h: [peer for p, peer in addresses.items() if p != h] or [addresses[h]] for h in addresses
    }


def not_listening(
    found: Sequence[Target], listened: Mapping[int, Sequence[str] | str]
) -> dict[int, str]:
    """Target index -> why no listener of the check holds it. `listened` maps a host to its
    listen answer (per port of ports_on(found, host): "" bound, else why not) or to the error
    of the whole call."""
    missing: dict[int, str] = {}
    seen: dict[int, int] = {}
    for i, t in enumerate(found):
        n = seen.get(t.host_index, 0)
        seen[t.host_index] = n + 1
        answer = listened.get(t.host_index, "not asked")
        if isinstance(answer, str):
            missing[i] = f"cannot listen on {t.host_label}: {answer}"
        elif n >= len(answer) or answer[n]:
            why = answer[n] if n < len(answer) else "no answer"
            missing[i] = f"cannot listen there: {why}"
    return missing


def tried(found: Sequence[Target], missing: Mapping[int, str]) -> list[Target]:
    """The targets each host is asked to connect to: those with a listener."""
    return [t for i, t in enumerate(found) if i not in missing]


def pairs(
    found: Sequence[Target],
    missing: Mapping[int, str],
    connected: Mapping[int, Sequence[str] | str],
) -> tuple[Pair, ...]:
    """Every host's outcome for every target. `connected` maps a host to its connect answer
    (per target of tried(found, missing): "" reached, else why not) or to the error of the
    whole call."""
    labels = hosts_of(found)
    result = []
    for source, label in labels.items():
        answer = connected.get(source, "not asked")
        answers = iter(answer) if not isinstance(answer, str) else iter(())
        for i, t in enumerate(found):
            if i in missing:
                error = missing[i]
            elif isinstance(answer, str):
                error = f"{label} could not try: {answer}"
            else:
                error = next(answers, "no answer")
            result.append(Pair(source, label, t, error))
    return tuple(result)


def cell(check: PortCheck, source: int, dest: int) -> str:
    outcomes = [p.error for p in check.pairs if p.source == source and p.target.host_index == dest]
    if not outcomes:
        return "-"
    return "FAIL" if any(outcomes) else "ok"


def grid(check: PortCheck) -> list[str]:
    """Rows: the host connecting; columns: the host whose task ports it connects to."""
    labels = [check.labels[h] for h in check.hosts]
    corner = "from \\ to"
    first = max([len(corner), *map(len, labels)])
    width = max([4, *map(len, labels)])
    rows = [corner.ljust(first) + "".join("  " + label.ljust(width) for label in labels)]
    for s in check.hosts:
        cells = "".join("  " + cell(check, s, d).ljust(width) for d in check.hosts)
        rows.append(check.labels[s].ljust(first) + cells)
    return [row.rstrip() for row in rows]


def interface_line(label: str, routes: Sequence[Route] | str) -> str:
    """`h0: 10.0.0.5 via eth0`; where peers differ, each way with the peers it serves."""
    if isinstance(routes, str):
        return f"{label}: unknown ({routes})"
    ways: dict[str, list[str]] = {}
    for r in routes:
        way = f"no route: {r.error}" if r.error else f"{r.source} via {r.interface or '?'}"
        ways.setdefault(way, []).append(r.peer)
    if len(ways) == 1 and not any(r.error for r in routes):
        return f"{label}: {next(iter(ways))}"
    return f"{label}: " + "; ".join(f"{way} (to {', '.join(peers)})" for way, peers in ways.items())


def render(check: PortCheck) -> str:
    ports = len({(p.target.host_index, p.target.port) for p in check.pairs})
    lines = [f"port check: {len(check.hosts)} host(s), {ports} task port(s), each from every host"]
    lines += ["", *grid(check)]
    if check.failures:
        lines += ["", "failing pairs:"]
        lines += [f"  {p.describe()}: {p.error}" for p in check.failures]
    if check.routes:
        lines += ["", "interfaces:"]
        lines += [
            "  " + interface_line(check.labels[h], check.routes[h])
            for h in check.hosts
            if h in check.routes
        ]
    return "\n".join(lines)


def summary(check: PortCheck) -> str:
    """One line naming the failing pairs (the first few; the grid names them all)."""
    failures = check.failures
    named = "; ".join(f"{p.describe()}: {p.error}" for p in failures[:NAMED_IN_SUMMARY])
    more = len(failures) - NAMED_IN_SUMMARY
    if more > 0:
        named += f"; and {more} more"
    return f"port check failed for {len(failures)} of {len(check.pairs)} pair(s): {named}"


def parse_routes(peers: Sequence[tuple[str, str]], answer: Sequence[object]) -> tuple[Route, ...]:
    """A host's `route` answer (one dict per peer) as Routes."""
    routes = []
    for (label, _), item in zip(peers, answer, strict=False):
        data = item if isinstance(item, dict) else {}
        routes.append(
            Route(
                label,
                source=str(data.get("source", "")),
                interface=str(data.get("interface", "")),
                error=str(data.get("error", "")),
            )
        )
    return tuple(routes)
