"""worker.warm.imports_ahead: which modules a trainer records for its task's next standby, what the
agent accepts from that file (a trainer wrote it), and the standby's imports ahead. Stand-in
modules in a temporary "library directory": the real ones take seconds to import."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.warm import import_env, imports_ahead
from worker.warm.imports_ahead import MAX_JOINED, MAX_NAMES, WARM_IMPORTS_FILE, Recorder


def test_only_dotted_names_not_ours_each_once_and_bounded() -> None:
    given = ["sklearn.datasets", "sklearn.datasets", "os; rm -rf /", "../x", "a..b", 3, None,
             "tensorflow.python", "worker.agent", "__main__", "pandas", ""]  # fmt: skip
    assert imports_ahead.valid(given) == ["sklearn.datasets", "pandas"]
    assert len(imports_ahead.valid(f"m{i}" for i in range(MAX_NAMES + 10))) == MAX_NAMES
    long = [f"package_{i:05d}.module_with_a_long_name" for i in range(3000)]
    assert len(",".join(imports_ahead.valid(long))) <= MAX_JOINED


@pytest.mark.parametrize(
    "content",
    [b"", b"\xff\xfe garbage", b"[1, 2]", b'{"modules": "sklearn"}', b'{"modules": [' + b'"a",' * 70000 + b'"b"]}'],
    ids=["empty", "garbage", "not-an-object", "not-a-list", "too-big"],
)  # fmt: skip
def test_a_file_the_agent_cannot_trust_gives_nothing(tmp_path: Path, content: bytes) -> None:
    (tmp_path / WARM_IMPORTS_FILE).write_bytes(content)
    assert imports_ahead.read(str(tmp_path)) == []


def test_the_file_is_read_checked(tmp_path: Path) -> None:
    assert imports_ahead.read(str(tmp_path)) == []  # none yet
    data = {"modules": ["numpy", "evil name", "scipy.sparse"]}
    (tmp_path / WARM_IMPORTS_FILE).write_text(json.dumps(data))
    assert imports_ahead.read(str(tmp_path)) == ["numpy", "scipy.sparse"]


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A library directory on sys.path with three stand-in modules, and the script's helper
    module outside it (the script's own code)."""
    lib, own = tmp_path / "site-packages", tmp_path / "script"
    lib.mkdir()
    own.mkdir()
    (lib / "fake_plain.py").write_text(
        "import os\n\ndef configure():\n    os.environ['FAKE_LIB_SET'] = '2'\n"
    )
    (lib / "fake_sets_env.py").write_text("import os\nos.environ['FAKE_LIB_SET'] = '1'\n")
    (lib / "fake_broken.py").write_text("raise RuntimeError('cannot import here')\n")
    (own / "fake_script.py").write_text("")
    (own / "fake_elsewhere.py").write_text("VALUE = 1\n")  # on the path, not in a library
    monkeypatch.syspath_prepend(str(lib))
    monkeypatch.syspath_prepend(str(own))
    monkeypatch.setattr(imports_ahead, "library_dirs", lambda: (os.path.join(str(lib), ""),))
    environ = type(os.environ)
    monkeypatch.setattr(environ, "__setitem__", environ.__setitem__)  # restored afterwards
    monkeypatch.setattr(environ, "__delitem__", environ.__delitem__)
    monkeypatch.delenv("FAKE_LIB_SET", raising=False)
    monkeypatch.delenv("FAKE_SCRIPT_SET", raising=False)
    monkeypatch.setattr(imports_ahead, "imported", [])
    monkeypatch.setattr(imports_ahead, "_files", {})
    import fake_script  # type: ignore[import-not-found]  # noqa: F401

    yield tmp_path
    for name in ("fake_plain", "fake_sets_env", "fake_broken", "fake_script", "fake_elsewhere"):
        sys.modules.pop(name, None)


def _script_imports(name: str) -> None:
    exec(f"import {name}", {"__name__": "fake_script"})


def _script_runs(code: str) -> None:
    exec(code, {"__name__": "fake_script"})


def _recorded(tmp_path: Path) -> list[str]:
    return json.loads((tmp_path / WARM_IMPORTS_FILE).read_text())["modules"]


def test_the_script_s_library_imports_are_recorded_even_when_a_library_sets_variables(
    library: Path,
) -> None:
    """A library may set variables as it is imported (TensorFlow does), or when the script
    calls it (Keras, loaded lazily): it will again in a standby. Modules of the script's own
    are never recorded."""
    setitem = type(os.environ).__setitem__
    recorder = Recorder(str(library), frozenset({"TF_CONFIG"}))
    _script_imports("fake_plain")
    _script_runs("import fake_plain; fake_plain.configure()")
    _script_runs("import os; os.environ['TF_CONFIG'] = '{}'")  # read later: no matter
    _script_imports("fake_sets_env")
    recorder.record()
    assert _recorded(library) == ["fake_plain", "fake_sets_env"]
    assert type(os.environ).__setitem__ is setitem  # recorded: no more watching


@pytest.mark.parametrize(
    "code",
    ["os.environ['FAKE_SCRIPT_SET'] = '1'", "os.environ.setdefault('FAKE_SCRIPT_SET', '1')",
     "os.environ.update(FAKE_SCRIPT_SET='1')", "del os.environ['HOME']"],
    ids=["set", "setdefault", "update", "del"],
)  # fmt: skip
def test_nothing_is_recorded_when_the_script_set_a_variable_itself(
    library: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    monkeypatch.setenv("HOME", os.environ.get("HOME", "/"))  # put back afterwards
    recorder = Recorder(str(library), frozenset())
    _script_imports("fake_plain")
    _script_runs("import os; " + code)
    _script_imports("fake_sets_env")
    recorder.record()
    assert _recorded(library) == []
    reason = json.loads((library / WARM_IMPORTS_FILE).read_text())["not_recorded"]
    assert reason == "fake_script sets " + ("HOME" if "del" in code else "FAKE_SCRIPT_SET")


@pytest.mark.parametrize("used", [True, False], ids=["still-imported", "dropped-by-the-script"])
def test_a_standby_imports_ahead_what_it_can_and_its_trainer_records_what_it_still_uses(
    library: Path, monkeypatch: pytest.MonkeyPatch, used: bool
) -> None:
    imports_ahead.import_ahead(
        ["fake_broken", "fake_plain", "fake_script", "tensorflow", "fake_elsewhere"]
    )
    assert "fake_plain" in sys.modules and "fake_broken" not in sys.modules
    assert "fake_elsewhere" not in sys.modules  # found outside the library directories
    assert imports_ahead.imported == ["fake_plain"]
    # The trainer this standby becomes: did an import statement of its name the package?
    monkeypatch.setattr(import_env, "ahead_used", {"fake_plain"} if used else set())
    recorder = Recorder(str(library), frozenset())
    recorder.record()
    assert _recorded(library) == (["fake_plain"] if used else [])


def test_code_of_no_module_setting_a_variable_counts_as_the_script_s(library: Path) -> None:
    recorder = Recorder(str(library), frozenset())
    exec("import os; os.environ['FAKE_SCRIPT_SET'] = '1'", {"__name__": "not_a_module"})
    recorder.record()
    data = json.loads((library / WARM_IMPORTS_FILE).read_text())
    assert data == {"modules": [], "not_recorded": "not_a_module sets FAKE_SCRIPT_SET"}


def test_a_module_of_the_script_s_own_shadowing_a_package_imported_ahead(library: Path) -> None:
    imports_ahead.import_ahead(["fake_plain"])
    own = library / "script"
    assert imports_ahead.shadowed(str(own)) == ""
    (own / "fake_plain.py").write_text("")  # a cold start would import this one
    assert imports_ahead.shadowed(str(own)) == "fake_plain"


def test_a_module_upgraded_while_the_standby_waited_makes_it_stale(library: Path) -> None:
    """The script must run what is installed now (the standby then starts over cold)."""
    imports_ahead.import_ahead(["fake_plain"])
    assert imports_ahead.stale() == ""
    module = library / "site-packages" / "fake_plain.py"
    module.write_text(module.read_text() + "VERSION = 2\n")
    assert imports_ahead.stale() == str(module)
