"""The worker package shipped to hosts (worker.ship): one copy per digest, installed atomically
in a directory of ours alone (tests/test_shipping.py has those with processes)."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import threading
import zlib
from pathlib import Path

import pytest

from orchestrator.transport import worker_package
from worker import ship

FILES = [("worker/__init__.py", b"X = 1\n"), ("worker/sub/mod.py", b"Y = 2\n")]


def test_the_payload_is_the_same_bytes_every_time_and_unpacks_to_its_files() -> None:
    assert ship.pack(FILES) == ship.pack(list(FILES))
    assert ship.unpack(ship.pack(FILES)) == FILES
    assert ship.digest_of(FILES) != ship.digest_of([(FILES[0][0], b"X = 2\n"), FILES[1]])


def test_this_package_is_every_py_file_of_worker_and_no_cache() -> None:
    names = [name for name, _ in worker_package._files()]
    assert "worker/agent.py" in names and "worker/__main__.py" in names
    assert "worker/examples/digits.py" in names
    assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]
    assert ship.unpack(worker_package.payload()) == list(worker_package._files())


@pytest.mark.parametrize(
    "name", ["../evil.py", "/etc/evil.py", "worker/../../evil.py", "other/x.py", "worker//x.py"]
)
def test_a_payload_with_an_entry_outside_the_package_is_refused(name: str) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ValueError, match="unexpected entry"):
        ship.unpack(zlib.compress(raw.getvalue()))


def test_a_payload_with_a_link_is_refused() -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("worker/x.py")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(ValueError, match="unexpected entry"):
        ship.unpack(zlib.compress(raw.getvalue()))


def test_install_puts_a_private_copy_in_place_and_finds_it_again(tmp_path: Path) -> None:
    root = tmp_path / "cache" / "orchestrate"
    digest = ship.digest_of(FILES)
    copy = Path(ship.install(str(root), digest, ship.pack(FILES)))
    assert copy == root / f"worker-{digest}"
    assert (copy / "worker" / "sub" / "mod.py").read_bytes() == b"Y = 2\n"
    assert oct((copy / "worker" / "sub" / "mod.py").stat().st_mode & 0o777) == "0o600"
    for directory in (root, copy, copy / "worker"):
        assert oct(directory.stat().st_mode & 0o777) == "0o700", directory
    assert ship.installed(str(root), digest) == str(copy)
    assert [p.name for p in root.iterdir()] == [copy.name]  # no staging left


def test_the_copy_has_its_bytecode_so_no_start_compiles_it_again(tmp_path: Path) -> None:
    """Python loads a copy's modules from what the install compiled, even where it may write
    no cache of its own (PYTHONDONTWRITEBYTECODE, as CI machines often set)."""
    copy = Path(ship.install(str(tmp_path), ship.digest_of(FILES), ship.pack(FILES)))
    program = "import sys; sys.dont_write_bytecode = True; import worker.sub.mod as m; print(m.__cached__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    out = subprocess.run([sys.executable, "-c", program], cwd=copy, env=env, capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    cached = Path(out)
    assert cached.parent == copy / "worker" / "sub" / "__pycache__" and cached.exists()
    assert importlib.util.source_from_cache(str(cached)) == str(copy / "worker" / "sub" / "mod.py")


def test_a_payload_that_is_not_its_digest_installs_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not match its digest"):
        ship.install(str(tmp_path), "0" * 20, ship.pack(FILES))
    assert list(tmp_path.iterdir()) == []


def test_installs_racing_for_the_same_copy_all_end_with_it(tmp_path: Path) -> None:
    digest, payload = ship.digest_of(FILES), ship.pack(FILES)
    results: list[str] = []
    errors: list[BaseException] = []

    def install() -> None:
        try:
            results.append(ship.install(str(tmp_path), digest, payload))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=install) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(results)) == 1 and len(results) == 8
    assert [p.name for p in tmp_path.iterdir()] == [f"worker-{digest}"]


@pytest.mark.parametrize("how", ["open to others", "a link"])
def test_a_cache_that_is_not_ours_alone_is_never_used(tmp_path: Path, how: str) -> None:
    digest, payload = ship.digest_of(FILES), ship.pack(FILES)
    root = tmp_path / "orchestrate"
    if how == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        root.symlink_to(tmp_path / "elsewhere")
    else:
        root.mkdir()
        root.chmod(0o777)
    with pytest.raises(ship.UnsafeCache):
        ship.install(str(root), digest, payload)
    with pytest.raises(ship.UnsafeCache):
        ship.installed(str(root), digest)


def test_find_passes_over_an_unsafe_cache_and_install_somewhere_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a" / "orchestrate", tmp_path / "b" / "cache"
    monkeypatch.setattr(ship, "cache_roots", lambda: [str(first), str(second)])
    first.mkdir(parents=True)
    first.chmod(0o777)
    digest = ship.digest_of(FILES)
    assert ship.find(digest) is None
    copy = ship.install_somewhere(digest, ship.pack(FILES))
    assert copy.startswith(str(second)) and ship.find(digest) == copy


def test_a_cache_whose_parent_others_may_write_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever may write in a cache's parent could swap the cache between check and use."""
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    private.mkdir(mode=0o700)
    monkeypatch.setattr(
        ship, "cache_roots", lambda: [str(shared / "orchestrate"), str(private / "orchestrate")]
    )
    digest = ship.digest_of(FILES)
    copy = ship.install_somewhere(digest, ship.pack(FILES))
    assert copy.startswith(str(private)) and not (shared / "orchestrate").exists()
    # A copy someone left in the open place is not found either.
    ship.install(str(shared / "orchestrate"), digest, ship.pack(FILES))
    assert ship.find(digest) == copy


def test_a_parent_that_is_a_link_counts_only_where_others_cannot_write(tmp_path: Path) -> None:
    """~/.cache may be the user's link to another disk; /tmp/orchestrate-UID as a link may be
    another user's, pointed at a directory of ours until we have checked, then elsewhere."""
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    for where, mode in (("open", 0o1777), ("home", 0o755)):
        place = tmp_path / where
        place.mkdir()
        place.chmod(mode)
        (place / "link").symlink_to(target)
    with pytest.raises(ship.UnsafeCache, match="is a link in a directory others may write"):
        ship.check_parent(str(tmp_path / "open" / "link" / "orchestrate"))
    ship.check_parent(str(tmp_path / "home" / "link" / "orchestrate"))
    # What runs from a copy never goes through the link again.
    digest = ship.digest_of(FILES)
    copy = ship.install(str(tmp_path / "home" / "link" / "orchestrate"), digest, ship.pack(FILES))
    assert copy == str(target / "orchestrate" / f"worker-{digest}")


# --- a copy is hashed again at every use -----------------------------------------------------
def _break(copy: Path, how: str) -> None:
    package = copy / "worker"
    if how == "an edited module":
        (package / "sub" / "mod.py").write_bytes(b"Y = 'not what was shipped'\n")
    elif how == "a module added":
        (package / "extra.py").write_bytes(b"\n")
    elif how == "a module removed":
        (package / "sub" / "mod.py").unlink()
    elif how == "an extension module that shadows a source":  # loaded before mod.py
        (package / "sub" / "mod.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    elif how == "a module that is a link":
        (package / "sub" / "mod.py").unlink()
        (copy.parent / "elsewhere.py").write_bytes(b"Y = 2\n")  # even the same bytes
        (package / "sub" / "mod.py").symlink_to(copy.parent / "elsewhere.py")
    elif how == "a file beside the package":  # on sys.path too: sitecustomize runs at start
        (copy / "sitecustomize.py").write_bytes(b"\n")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "an edited module",
        "a module added",
        "a module removed",
        "an extension module that shadows a source",
        "a module that is a link",
        "a file beside the package",
    ],
)
def test_a_copy_changed_after_install_is_removed_at_its_next_use_and_installed_again(
    tmp_path: Path, how: str
) -> None:
    root = tmp_path / "orchestrate"
    digest, payload = ship.digest_of(FILES), ship.pack(FILES)
    copy = Path(ship.install(str(root), digest, payload))
    _break(copy, how)
    assert ship.installed(str(root), digest) is None
    assert not copy.exists()
    assert [p.name for p in root.iterdir() if p.name.startswith(".tmp-")] == []  # none left
    assert ship.install(str(root), digest, payload) == str(copy)
    assert ship.installed(str(root), digest) == str(copy)
    assert (copy / "worker" / "sub" / "mod.py").read_bytes() == b"Y = 2\n"


def test_bytecode_a_python_wrote_in_a_copy_is_no_change(tmp_path: Path) -> None:
    """Caches another interpreter writes beside the copy's own are Python's (it checks them
    against the sources), not a change to the package."""
    digest = ship.digest_of(FILES)
    copy = Path(ship.install(str(tmp_path), digest, ship.pack(FILES)))
    (copy / "worker" / "sub" / "__pycache__" / "mod.cpython-399.pyc").write_bytes(b"x")
    assert ship.installed(str(tmp_path), digest) == str(copy)


def test_install_over_a_broken_copy_replaces_it(tmp_path: Path) -> None:
    digest, payload = ship.digest_of(FILES), ship.pack(FILES)
    copy = Path(ship.install(str(tmp_path), digest, payload))
    _break(copy, "an edited module")
    assert ship.install(str(tmp_path), digest, payload) == str(copy)
    assert (copy / "worker" / "sub" / "mod.py").read_bytes() == b"Y = 2\n"


def test_uses_racing_over_a_broken_copy_all_end_with_a_whole_one(tmp_path: Path) -> None:
    digest, payload = ship.digest_of(FILES), ship.pack(FILES)
    copy = Path(ship.install(str(tmp_path), digest, payload))
    _break(copy, "an edited module")
    results: list[str] = []
    errors: list[BaseException] = []

    def use() -> None:
        try:
            results.append(
                ship.installed(str(tmp_path), digest)
                or ship.install(str(tmp_path), digest, payload)
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and set(results) == {str(copy)}
    assert ship.intact(str(copy), digest)
    assert [p.name for p in tmp_path.iterdir()] == [copy.name]


def test_this_packages_copy_with_an_edited_spec_runs_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local cache (local_copy) and a Slurm job's shared directory (copy_under) alike:
    an edit made to a copy after its install is found at the next use and undone."""
    monkeypatch.setattr(ship, "cache_roots", lambda: [str(tmp_path / "cache" / "orchestrate")])
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    shipped = dict(worker_package._files())["worker/spec.py"]
    for use in (
        worker_package.local_copy,
        lambda: worker_package.copy_under(str(shared / ".orchestrate")),
    ):
        copy = Path(use())
        (copy / "worker" / "spec.py").write_bytes(shipped + b"\nraise SystemExit('edited')\n")
        assert use() == str(copy)
        assert (copy / "worker" / "spec.py").read_bytes() == shipped


# --- a Slurm job's copies: shared_dir is ours alone ------------------------------------------
@pytest.mark.parametrize("mode", [0o770, 0o775, 0o757, 0o1777], ids=oct)
def test_copy_under_refuses_a_shared_dir_others_may_write(tmp_path: Path, mode: int) -> None:
    """Whoever may write in shared_dir could swap `.orchestrate` after the check, and every
    task of the step would run their code as the job's user: one line, naming the fix."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(ship.UnsafeCache) as refused:
        worker_package.copy_under(str(shared / ".orchestrate"))
    message = str(refused.value)
    assert "\n" not in message and f"chmod g-w,o-w {shared}" in message
    assert message.startswith(f"{shared} is not ours alone"), message
    assert list(shared.iterdir()) == []
    shared.chmod(0o755)  # closed to others' writes: the copy goes there
    copy = worker_package.copy_under(str(shared / ".orchestrate"))
    assert copy == str(shared / ".orchestrate" / f"worker-{worker_package.digest()}")


def test_copy_under_refuses_a_shared_dir_that_is_a_link_others_may_repoint(
    tmp_path: Path,
) -> None:
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o1777)
    (tmp_path / "target").mkdir(mode=0o700)
    (tmp_path / "open" / "shared").symlink_to(tmp_path / "target")
    with pytest.raises(ship.UnsafeCache, match="is a link in a directory others may write"):
        worker_package.copy_under(str(tmp_path / "open" / "shared" / ".orchestrate"))
    assert list((tmp_path / "target").iterdir()) == []
