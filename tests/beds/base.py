"""What the test beds share (ssh.py: SSH hosts; slurm.py: Slurm nodes): a bed is a bridge with a
gateway address and a network namespace per host or node, made under one directory whose state
file records it. `Bed` is that record and its life: `up` builds it (each bed's `build`),
recording its progress as it goes so that `down` can undo a half-built one; `down` empties and
removes the namespaces, stops the bed's own daemons, removes the bridge; `main` is the command
line. Also the helpers both beds use: their requirements, starting a daemon, waiting, and the
cluster.toml they write."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from tests.beds import netns

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Member:
    """A host or node of a bed: a network namespace of its own on the bed's bridge."""

    name: str
    namespace: str
    address: str
    veth: str  # the bridge-side end; `ip link set VETH down` cuts it off


class Progress:
    """An `up` under way: what it has made so far, written to the partial state file at every
    step, so that `down` can undo a half-built bed."""

    def __init__(self, path: Path, members: str, **fields: object) -> None:
        self.path, self.members = path, members
        self.state: dict[str, Any] = {**fields, members: []}
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.state, default=asdict))

    def __setitem__(self, key: str, value: object) -> None:
        self.state[key] = value
        self.save()

    def add_namespace(
        self, namespace: str, bridge: str, veth: str, peer: str, address: str, prefix: int = 24
    ) -> None:
        """Make a member's namespace, recorded before it is wired to the bridge."""
        netns.ip("netns", "add", namespace)
        self.state[self.members].append({"namespace": namespace})
        self.save()
        netns.wire(namespace, bridge, veth, peer, address, prefix)

    def record(self, member: Member) -> None:
        """The member whose namespace was added last, now running."""
        self.state[self.members][-1] = member
        self.save()


@dataclass(frozen=True)
class Bed:
    """A bed that is up, as its state file under `root` records it; a bed kind adds its hosts or
    nodes (the field named by `members`) and what its users need."""

    root: str
    token: str
    bridge: str
    gateway: str
    cluster_toml: str
    python: str

    state_file: ClassVar[str]  # under root; STATE_FILE.partial while `up` runs
    members: ClassVar[str]  # the field listing the hosts or nodes
    member_type: ClassVar[type[Member]]
    what: ClassVar[str]  # for messages: "test bed"
    bridge_prefix: ClassVar[str]  # + the bed's token: its bridge's name
    up_help: ClassVar[str]  # the command line's help for `up`

    @classmethod
    def load(cls, root: Path) -> Self:
        data = json.loads((root / cls.state_file).read_text())
        data[cls.members] = [cls.member_type(**m) for m in data[cls.members]]
        return cls(**data)

    @classmethod
    def missing_requirements(cls) -> str | None:
        """Why this bed cannot be made here, or None."""
        raise NotImplementedError

    @classmethod
    def prepare(cls, root: Path) -> None:
        """Make root ready for a new bed (an earlier one there is down already)."""
        root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def build(cls, count: int, root: Path, epochs: int, token: str, progress: Progress) -> Self:
        """Make the bridge, the members and the daemons, recording each in `progress`."""
        raise NotImplementedError

    @classmethod
    def stop_daemons(cls, state: dict[str, Any]) -> None:
        """Stop the bed's own daemons outside the namespaces (after the namespaces' processes)."""

    def describe(self, seconds: float) -> list[str]:
        """What `up` prints."""
        raise NotImplementedError

    @classmethod
    def up(cls, count: int, root: Path, epochs: int) -> Self:
        """Create `count` members under `root` (an earlier bed there is taken down first)."""
        reason = cls.missing_requirements()
        if reason:
            raise RuntimeError(f"cannot build the {cls.what}: {reason}")
        if _state_path(root, cls.state_file) is not None:
            cls.down(root)
        cls.prepare(root)
        token = secrets.token_hex(3)
        progress = Progress(
            root / (cls.state_file + ".partial"), cls.members,
            root=str(root), token=token, bridge=f"{cls.bridge_prefix}{token}",
        )  # fmt: skip
        try:
            bed = cls.build(count, root, epochs, token, progress)
            (root / cls.state_file).write_text(json.dumps(asdict(bed), indent=2))
            return bed
        except BaseException:
            cls.down(root)
            raise

    @classmethod
    def down(cls, root: Path) -> None:
        """Tear down what `up` made under root: every process in the members' namespaces (all
        started by the bed or through it), the namespaces, the bed's daemons, the bridge. Safe
        to call twice, and on a half-built bed."""
        path = _state_path(root, cls.state_file)
        if path is None:
            return
        state = json.loads(path.read_text())
        netns.remove([m["namespace"] for m in state.get(cls.members, [])], None)
        cls.stop_daemons(state)
        netns.remove([], state.get("bridge"))
        for name in (cls.state_file, cls.state_file + ".partial"):
            (root / name).unlink(missing_ok=True)

    @classmethod
    def main(
        cls, doc: str, prog: str, default_dir: Path, epochs: int, argv: Sequence[str] | None = None
    ) -> int:
        """The command line: `up N [--dir DIR] [--epochs E]`, `down [--dir DIR]`."""
        parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
        sub = parser.add_subparsers(dest="command", required=True)
        p_up = sub.add_parser("up", help=cls.up_help)
        p_up.add_argument("count", type=int)
        p_up.add_argument("--dir", type=Path, default=default_dir)
        p_up.add_argument("--epochs", type=int, default=epochs)
        p_down = sub.add_parser("down", help="remove them")
        p_down.add_argument("--dir", type=Path, default=default_dir)
        args = parser.parse_args(argv)
        if args.command == "up":
            started = time.monotonic()
            try:
                bed = cls.up(args.count, args.dir, args.epochs)
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            print("\n".join(bed.describe(time.monotonic() - started)))
            return 0
        cls.down(args.dir)
        print(f"removed the {cls.what} in {args.dir}")
        return 0


def _state_path(root: Path, state_file: str) -> Path | None:
    """The bed's state file, else the one a half-built bed left, else None."""
    for path in (root / state_file, root / (state_file + ".partial")):
        if path.exists():
            return path
    return None


def tool(name: str) -> str:
    """A daemon's or tool's path: on PATH, else in /usr/sbin."""
    return shutil.which(name) or f"/usr/sbin/{name}"


def missing(
    root_for: str, tools: Sequence[str], hint: str, found: Callable[[str], object] = shutil.which
) -> str | None:
    """Why the bed cannot run here: not root, or one of `tools` not `found` (`hint`: how to
    install them); None if neither."""
    if os.geteuid() != 0:
        return f"needs root ({root_for})"
    for name in tools:
        if not found(name):
            return f"needs {name} ({hint})"
    return None


def spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start a daemon in a session of its own, its output appended to log_path; its pid."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
            start_new_session=True,
        ).pid  # fmt: skip


def wait_until(ready: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll `ready` until it holds (True) or `timeout` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def wait_port(address: str, port: int, timeout: float) -> None:
    """Until address:port accepts a connection; the last OSError after `timeout` seconds."""
    failed: list[OSError] = []

    def accepts() -> bool:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return True
        except OSError as exc:
            failed.append(exc)
            return False

    if not wait_until(accepts, timeout):
        raise failed[-1]


def cluster_toml(comment: str, name: str, root: Path, epochs: int, backend: list[str]) -> str:
    """A bed's cluster.toml: the digits example on it, `backend` the lines of its [backend]."""
    return (
        "\n".join(
            [
                f"# {comment}",
                "[job]",
                f'name = "{name}"',
                f'shared_dir = "{root / "shared"}"',
                "",
                "[entrypoint]",
                'module = "worker.examples.digits"',
                f'args = ["--epochs", "{epochs}"]',
                'env = { TF_CPP_MIN_LOG_LEVEL = "2" }',
                f'workdir = "{REPO}"',
                "",
                "[backend]",
                *backend,
            ]
        )
        + "\n"
    )
