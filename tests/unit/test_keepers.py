"""worker.warm.registry: what a keeper records of itself is read back only while its process is a
keeper of ours, cut to size, and garbage in its place (a trainer runs as the same user and may
write anything there) is removed, never believed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.conftest import wait_for
from worker.warm import registry


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path / f"orchestrate-{os.getuid()}" / "standby"


@pytest.fixture
def fake_keeper(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose arguments are a keeper's (`python .../worker/warm/keeper.py ...`), with a
    child."""
    proc = _program(tmp_path / "worker" / "warm")
    yield proc
    proc.kill()
    proc.wait()


def _program(where: Path) -> subprocess.Popen[bytes]:
    where.mkdir(parents=True, exist_ok=True)
    program = where / "keeper.py"
    program.write_text("import subprocess, sys, time\nsubprocess.Popen(['sleep', '60'])\n"
                       "time.sleep(60)\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, str(program), "job", "0"])
    wait_for(lambda: b"keeper.py" in Path(f"/proc/{proc.pid}/cmdline").read_bytes(), 10)
    return proc


def _entry(pid: int, **changes: object) -> registry.KeeperEntry:
    entry = registry.KeeperEntry(
        pid=pid, host=registry.this_host(), job="job-a", task=0, state="serving",
        fingerprint="f" * 32, standby=0, standby_ready=False, trainer=0, rss=1 << 20,
        kept_left=0.0, socket="",
    )  # fmt: skip
    return registry.KeeperEntry(**{**asdict(entry), **changes})


def test_an_entry_counts_only_while_its_process_is_a_keeper_of_ours(
    private_tmp: Path, fake_keeper: subprocess.Popen[bytes]
) -> None:
    elsewhere = _program(private_tmp.parent.parent / "not-ours")  # a keeper.py of another
    try:
        registry.record(_entry(fake_keeper.pid))
        registry.record(_entry(os.getpid()))  # alive, ours, but not a keeper
        registry.record(_entry(4_194_999))  # gone
        registry.record(_entry(elsewhere.pid))
        registry.record(_entry(4_194_998, host="another-host"))  # not ours to judge
        # The same name in another network namespace (one /tmp shared): another host too.
        registry.record(_entry(4_194_997, host=f"{socket.gethostname()}@net1"))
        assert [e.pid for e in registry.entries()] == [fake_keeper.pid]
    finally:
        elsewhere.kill()
        elsewhere.wait()
    assert {p.name for p in private_tmp.glob("keeper-*")} == {
        "keeper-4194997.json",
        "keeper-4194998.json",
        f"keeper-{fake_keeper.pid}.json",
    }


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xff not json",
        b"[1, 2, 3]",
        b'{"pid": "x"}',
        json.dumps({"pid": 1, "nothing": "else"}).encode(),
        b"{" + b" " * (registry.ENTRY_LIMIT + 10) + b"}",
    ],
)
def test_garbage_in_an_entry_is_removed(
    private_tmp: Path, fake_keeper: subprocess.Popen[bytes], garbage: bytes
) -> None:
    registry.directory()
    path = private_tmp / f"keeper-{fake_keeper.pid}.json"
    path.write_bytes(garbage)
    assert registry.entries() == []
    assert not path.exists()


def test_an_entry_under_another_keepers_name_is_removed(
    private_tmp: Path, fake_keeper: subprocess.Popen[bytes]
) -> None:
    registry.directory()
    forged = asdict(_entry(fake_keeper.pid))
    (private_tmp / "keeper-1.json").write_text(json.dumps(forged))
    assert registry.entries() == []


def test_long_strings_are_cut_and_a_claimed_trainer_must_be_the_keepers_child(
    private_tmp: Path, fake_keeper: subprocess.Popen[bytes]
) -> None:
    other = subprocess.Popen(["sleep", "60"])  # ours, alive, not the keeper's child
    try:
        registry.record(_entry(fake_keeper.pid, job="j" * 1000, trainer=other.pid))
        (entry,) = registry.entries()
        assert entry.job == "j" * 64
        assert registry.trainers_of("j" * 64) == []
        children = Path(f"/proc/{fake_keeper.pid}/task/{fake_keeper.pid}/children")
        child = int(wait_for(lambda: children.read_text().split(), 10)[0])  # type: ignore[index]
        registry.record(_entry(fake_keeper.pid, trainer=child))
        assert registry.trainers_of("job-a") == [child]
    finally:
        other.kill()
        other.wait()


def test_kept_memory_and_what_a_host_helper_answers(
    private_tmp: Path, fake_keeper: subprocess.Popen[bytes]
) -> None:
    registry.record(_entry(fake_keeper.pid, state="kept", job="", rss=300 << 20, kept_until=1e12))
    assert registry.kept_bytes() == 300 << 20
    assert registry.kept_bytes(but=fake_keeper.pid) == 0
    (entry,) = registry.entries()
    assert entry.kept_left > 1e6
    assert registry.parse(asdict(entry)) == entry  # the coordinator reads what a helper sent
    for bad in (None, [], {"pid": 1}, {**asdict(entry), "rss": "many"}):
        assert registry.parse(bad) is None
    assert "kept" in entry.describe() and "300 MB" in entry.describe()


def _socket_file(path: Path, age: float) -> None:
    """A socket file nobody listens on (a keeper killed before it removed its own), `age` s old."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
    then = time.time() - age
    os.utime(path, (then, then))


def test_sockets_no_live_keeper_serves_are_swept(
    private_tmp: Path, fake_keeper: subprocess.Popen[bytes]
) -> None:
    registry.directory()
    names = ["live", "dead", "other-host", "no-entry", "young", "not-a-socket"]
    paths = {name: private_tmp / f"{name}.sock" for name in names}
    for name in names[:-1]:
        _socket_file(paths[name], 30.0 if name == "young" else 3600.0)
    paths["not-a-socket"].write_text("a file, not a socket of a keeper")
    registry.record(_entry(fake_keeper.pid, socket=str(paths["live"])))
    registry.record(_entry(4_194_999, socket=str(paths["dead"])))  # its keeper is gone
    registry.record(_entry(4_194_998, host="another-host", socket=str(paths["other-host"])))
    removed = registry.sweep_sockets()
    assert sorted(removed) == ["dead.sock", "no-entry.sock"]
    assert {p.name for p in private_tmp.glob("*.sock")} == {
        "live.sock", "other-host.sock", "young.sock", "not-a-socket.sock"
    }  # fmt: skip
    assert not (private_tmp / "keeper-4194999.json").exists()
