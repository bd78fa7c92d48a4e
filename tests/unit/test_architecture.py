"""Rules the code keeps about its own shape (pure: reads the source files)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("orchestrator", "worker")
MAX_LINES = 400
BACKEND_TYPES = {
    "LocalBackend", "SshBackend", "SlurmBackend",  # cluster.toml's sections
    "LocalHosts", "SshHosts", "SlurmHosts", "AgentHosts",  # the backends themselves
}  # fmt: skip
BACKEND_NAMES = {"local", "ssh", "slurm"}
BACKEND_ROOMS = ("orchestrator/backends/", "orchestrator/config/")


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every module of ours this file imports, at any depth (a lazy import inside a function
    is still an edge), but not those imported only for type checking."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found.update(n for n in names if n in known)
    return found


def test_no_module_is_over_400_lines() -> None:
    long = [
        f"{p.relative_to(REPO)}: {n}"
        for p in sources()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert long == []


def test_the_import_graph_has_no_cycle() -> None:
    paths = {module_name(p): p for p in sources()}
    known = set(paths)
    graph = {name: imported_modules(path, known) - {name} for name, path in paths.items()}
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    # A package's __init__ and its own modules are one room: importing orchestrator.backends.x
    # runs orchestrator/backends/__init__.py first, which may import x lazily.
    assert [c for c in cycles if not _package_and_member(c)] == []


def _package_and_member(cycle: str) -> bool:
    mods = cycle.split(" -> ")
    return len(set(mods)) == 2 and any(a.startswith(b + ".") for a in mods for b in mods)


def test_no_code_outside_the_backends_asks_which_backend_it_holds() -> None:
    """A backend owns its lifecycle in its own module; the rest reads its capabilities."""
    asks = []
    for path in sources():
        rel = str(path.relative_to(REPO))
        if rel.startswith(BACKEND_ROOMS):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance":
                names = set(re.findall(r"\w+", ast.unparse(node.args[1])))
                if names & BACKEND_TYPES:
                    asks.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Compare):  # job.backend == "local", cfg.backend.type != ...
                text = ast.unparse(node)
                named = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                if named & BACKEND_NAMES and re.search(r"backend|\.(type|kind)\b", text):
                    asks.append(f"{rel}:{node.lineno}: {text}")
    assert asks == []


def test_the_coordinator_never_imports_tensorflow() -> None:
    """Only the training process imports TensorFlow: the CLI starts fast without it."""
    heavy = []
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                if any(n.split(".")[0] in ("tensorflow", "keras", "tf_keras") for n in names):
                    heavy.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert heavy == []


def test_only_the_job_state_machine_writes_a_jobs_state_or_cause() -> None:
    writes = []
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel in ("orchestrator/state/job_state.py", "orchestrator/state/store.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("update_job", "claim_job")
                and (
                    node.func.attr == "claim_job"
                    or {k.arg for k in node.keywords} & {"state", "last_cause", None}
                )
            ):
                writes.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert writes == []


# orchestrator/'s folders, lowest first: a module imports only from its own folder or below.
LAYERS = (
    ("errors",),
    ("config",),
    ("planning",),
    ("state",),
    ("transport",),
    ("logs",),
    ("backends",),
    ("supervision",),
    ("commands", "api"),  # the Python API and the CLI over it: one layer
    ("__main__",),
)


def _layer(module: str) -> int:
    folder = module.split(".")[1]
    return next(i for i, names in enumerate(LAYERS) if folder in names)


def test_every_module_is_in_a_folder_of_a_layer_and_no_import_runs_up() -> None:
    paths = {module_name(p): p for p in sources()}
    known = set(paths)
    ours = {n for n in paths if n.startswith("orchestrator.")}
    unplaced = [n for n in ours if not any(n.split(".")[1] in names for names in LAYERS)]
    assert unplaced == []
    upward = [
        f"{name} -> {imported}"
        for name in sorted(ours)
        for imported in sorted(imported_modules(paths[name], known))
        if imported in ours and _layer(imported) > _layer(name)
    ]
    assert upward == []


def _mapped(section: str, package: str) -> set[str]:
    """The modules a section of docs/architecture.md's map names (first cells of its table; a
    folder named with a trailing / stands for every module in it)."""
    named: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        for item in re.findall(r"`([\w/.]+)`", line.split(" | ")[0]):
            if item.endswith("/"):
                folder = REPO / package / item
                named |= {
                    str(p.relative_to(REPO / package))
                    for p in folder.rglob("*.py")
                    if p.name != "__init__.py"
                }
                named.add(item)
            else:
                named.add(item)
    return named


def test_the_architecture_map_names_every_module_and_only_those() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    for package in PACKAGES:
        heading = f"### `{package}/`"
        assert heading in text, heading
        section = text.split(heading, 1)[1].split("\n### ", 1)[0]
        named = _mapped(section, package)
        modules = {
            str(p.relative_to(REPO / package))
            for p in (REPO / package).rglob("*.py")
            if p.name != "__init__.py"
        }
        folders = {n for n in named if n.endswith("/")}
        assert sorted(modules - named) == [], f"{package}/ modules missing from the map"
        assert sorted(n for n in named - modules - folders) == [], f"{package}/: named, absent"


WATCH_FIELDS = (
    "seq", "seq_changed", "step", "step_changed", "first_step", "last", "host_ok", "host_error",
    "seen", "raw_status", "status", "resources_kept", "started",
)  # fmt: skip
# The ingest writes an attempt's Watch; attempt_control makes it (an adopted attempt's tasks
# may be past their first step); attempt.py reads it for everyone else.
WATCH_ROOMS = ("ingest.py", "attempt.py", "attempt_control.py")


def test_only_the_ingest_touches_a_watchs_fields_and_the_rest_ask_it() -> None:
    reads = []
    pattern = re.compile(r"\bwatch\.(" + "|".join(WATCH_FIELDS) + r")\b")
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        if path.parent.name == "supervision" and path.name in WATCH_ROOMS:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                reads.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert reads == []


def test_a_task_is_named_by_its_backend_handle_and_only_the_backends_read_it() -> None:
    """How a backend finds a task (an agent's pid and identity, a Slurm step) stays behind the
    seam: outside backends/ (and the transport that carries process questions), no code names a
    process reference or reads a handle's `ref`, but the one line that records it as given."""
    found = []
    pattern = re.compile(r"\bProcessRef\b|\bagent_process\b|\bagent_handle\b|\.ref\b")
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel.startswith(("orchestrator/backends/", "orchestrator/transport/")):
            continue
        for line in path.read_text().splitlines():
            code = line.split("#")[0].strip()
            if pattern.search(code):
                found.append(f"{rel}: {code}")
    assert found == ['orchestrator/supervision/attempt_control.py: "agent": agent.ref,']


def test_a_transport_implements_the_channel_and_never_the_host_operations_again() -> None:
    """HostOps builds observe, liveness, stops and stacks once over the host helper; each
    transport only carries the messages (transport.base.HostChannel)."""
    from orchestrator.transport.base import HostChannel, Transport
    from orchestrator.transport.host_ops import HostOps

    built_once = {n for n in vars(Transport) if not n.startswith("_")} - set(vars(HostChannel))
    assert built_once == {"alive_pids", "observe", "stop_process_group", "ask_stacks", "stop_job"}
    assert built_once <= set(vars(HostOps))
    again = []
    for path in sorted((REPO / "orchestrator" / "transport").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name != "HostOps":
                bases = {ast.unparse(b) for b in node.bases}
                if "HostOps" in bases:
                    defined = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                    again += [f"{path.name}: {node.name}.{n}" for n in defined & built_once]
    assert again == []
