"""The bootstrap is invisible to the script it runs: the same script, run directly and through
worker/bootstrap.py, sees the same argv, __main__, __file__, sys.path[0], stdin and signal
handlers, and ends with the same exit code and the same stderr (tracebacks included). No
TensorFlow here: these are plain Python scripts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from worker.agent import BOOTSTRAP
from worker.instrument import PostImportFinder

PROBE = '''
"""probe doc"""
import json, os, signal, sys
import __main__

def fail():
    raise ValueError("boom")

report = {
    "argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
    "main_is_me": __main__.__dict__ is globals(), "spec": repr(__spec__) if __spec__ is None
    else __spec__.name, "package": __package__, "doc": __doc__,
    "sigterm": str(signal.getsignal(signal.SIGTERM)), "sigint": str(signal.getsignal(signal.SIGINT)),
    "stdin": sys.stdin.read(), "loader": type(__loader__).__name__, "builtins": type(__builtins__).__name__,
}
print(json.dumps(report, sort_keys=True), flush=True)
mode = os.environ.get("MODE", "")
if mode == "raise":
    fail()
if mode == "exit":
    sys.exit(7)
if mode == "exit-message":
    sys.exit("bye")
if mode == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
if mode == "interrupt":
    raise KeyboardInterrupt
'''


def run(argv: list[str], cwd: Path, mode: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, *argv],
        input="to stdin\n",
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"MODE": mode, "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "probe.py").write_text(PROBE)
    return tmp_path


@pytest.mark.parametrize("mode", ["", "raise", "exit", "exit-message", "sigterm", "interrupt"])
@pytest.mark.parametrize("target", [["probe.py", "a", "--b"], ["-m", "pkg.probe", "a", "--b"]])
def test_a_script_sees_no_difference(probe_dir: Path, target: list[str], mode: str) -> None:
    direct = run(target, probe_dir, mode)
    through = run([BOOTSTRAP, *target], probe_dir, mode)
    assert through == direct
    report = json.loads(direct[1])
    assert report["stdin"] == "to stdin\n" and report["main_is_me"]
    assert {"": 0, "raise": 1, "exit": 7, "exit-message": 1, "sigterm": -15,
            "interrupt": -2}[mode] == direct[0]  # fmt: skip
    if mode == "raise":
        assert (
            "bootstrap" not in through[2] and 'in fail\n    raise ValueError("boom")' in through[2]
        )


def test_relative_script_from_another_directory(probe_dir: Path) -> None:
    sub = probe_dir / "pkg"
    assert run([BOOTSTRAP, "../probe.py", "x"], sub, "") == run(["../probe.py", "x"], sub, "")


def test_the_scripts_own_worker_module_wins(tmp_path: Path) -> None:
    """A script next to a `worker.py` of its own imports that one, as it would without us."""
    (tmp_path / "worker.py").write_text("WHO = 'the user'\n")
    (tmp_path / "train.py").write_text("import worker\nprint(worker.WHO)\n")
    code, out, err = run([BOOTSTRAP, "train.py"], tmp_path, "")
    assert (code, out) == (0, "the user\n"), err


def test_post_import_hook_runs_once_after_the_real_load_not_on_a_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "watched_mod.py").write_text(
        textwrap.dedent(
            """
            VALUE = 41
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    finder = PostImportFinder({"watched_mod": lambda module: seen.append(module.VALUE)})
    finder.install()
    try:
        assert importlib.util.find_spec("watched_mod") is not None  # a probe: loads nothing
        assert seen == []
        import watched_mod  # type: ignore[import-not-found]

        assert seen == [41]
        assert type(watched_mod.__loader__).__name__ == "SourceFileLoader"  # the real one
        importlib.reload(watched_mod)
        assert seen == [41]
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("watched_mod", None)
