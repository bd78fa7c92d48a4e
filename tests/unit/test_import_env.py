"""worker.warm.import_env: which variables matter to TensorFlow's import, and the one look at the
script's first import of it (a stand-in module name here: importing TensorFlow takes seconds)."""

from __future__ import annotations

import builtins
import importlib
import os
from pathlib import Path

import pytest

from worker.warm import import_env


def test_only_import_time_variables_count_and_not_the_per_attempt_ones() -> None:
    before = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": "{}", "HOME": "/h", "XLA_FLAGS": "-a"}
    now = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_CONFIG": "{...}", "HOME": "/x",
           "CUDA_VISIBLE_DEVICES": "", "ORCHESTRATE_ATTEMPT": "4"}  # fmt: skip
    assert import_env.changed(before, now) == [
        "CUDA_VISIBLE_DEVICES",
        "TF_CPP_MIN_LOG_LEVEL",
        "XLA_FLAGS",
    ]
    assert import_env.changed(before, dict(before)) == []
    # Read later by TensorFlow, or only when an interpreter starts: no difference warm or cold.
    later = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "PYTHONHASHSEED": "0", "LD_PRELOAD": "x"}
    assert import_env.changed(before, {**before, **later}) == []


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """import_env.watch with `json` standing for tensorflow; what start_cold was told."""
    monkeypatch.setattr(import_env, "WATCHED", frozenset({"json"}))
    monkeypatch.setattr(builtins, "__import__", builtins.__import__)  # restored afterwards
    monkeypatch.setattr(importlib, "import_module", importlib.import_module)
    calls: list[list[str]] = []
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    # the activation's environment
    import_env.watch(dict(os.environ), lambda names, library: calls.append(names))
    return calls


def _import_from(importer: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exec("import json", {"__name__": importer})


@pytest.mark.parametrize("importer", ["__main__", "worker.runtime"], ids=["script", "runtime"])
def test_the_scripts_import_after_it_set_a_variable_starts_over_cold(
    watched: list[list[str]], monkeypatch: pytest.MonkeyPatch, importer: str
) -> None:
    """The script's own import, or one our runtime makes for it."""
    _import_from(importer, monkeypatch, TF_ENABLE_ONEDNN_OPTS="0")
    assert watched == [["TF_ENABLE_ONEDNN_OPTS"]]


def test_imports_by_the_package_itself_or_by_ours_are_not_the_scripts(
    watched: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for importer in ("json.decoder", "worker.instrument", "worker.wait_clock"):
        _import_from(importer, monkeypatch, TF_ENABLE_ONEDNN_OPTS="0")
    assert watched == []
    assert builtins.__import__.__name__ == "checking"  # still watching for the script's


def test_one_look_only_and_nothing_when_nothing_changed(
    watched: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _import_from("train", monkeypatch, TF_ENABLE_ONEDNN_OPTS="1")  # a helper module of it
    assert watched == []
    assert builtins.__import__.__name__ == "__import__"  # unwrapped: steady state costs nothing
    _import_from("__main__", monkeypatch, TF_ENABLE_ONEDNN_OPTS="0")
    assert watched == []


def test_the_reason_a_task_starts_cold_shows_the_trainers_names_cut_and_printable(
    tmp_path: Path,
) -> None:
    assert import_env.undone_reason(str(tmp_path)) == ""
    (tmp_path / import_env.UNDONE_FILE).write_text("TF_X\x1b[2J," + "A" * 500)
    reason = import_env.undone_reason(str(tmp_path))
    assert reason.startswith("the script sets TF_X?[2J,AAA") and "\x1b" not in reason
    assert len(reason) < 260


def test_a_trainer_started_over_cold_is_still_the_keepers_standby_to_the_agent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The exec may come before the agent checks the pid the keeper named (worker.warm.activation
    verify_trainer reads its environment): the new interpreter keeps the standby's mark."""
    from worker import bootstrap
    from worker.warm.standby import ENV_STANDBY

    monkeypatch.setenv(import_env.ENV_TASK_DIR, str(tmp_path))
    execs: list[dict[str, str]] = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: execs.append(env))
    order = {"env": {"TF_CONFIG": "{}"}, "target": ["train.py"]}
    bootstrap._start_cold(["TF_ENABLE_ONEDNN_OPTS"], order, library=False)
    assert len(execs) == 1 and execs[0][ENV_STANDBY] == "1", execs
    assert execs[0][import_env.ENV_UNDONE] == "TF_ENABLE_ONEDNN_OPTS"
    assert (tmp_path / import_env.UNDONE_FILE).read_text() == "TF_ENABLE_ONEDNN_OPTS\n"


def test_with_libraries_imported_ahead_the_script_setting_a_variable_counts_until_training(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """worker.warm.imports_ahead: the standby imported `json` (say, scikit-learn) besides TensorFlow.
    Once the script's own code set a variable (the Recorder tells which), its next import of
    such a library starts it over cold, without marking the task (`library`); TensorFlow's
    variables count as before; at training, the watch ends."""
    monkeypatch.setattr(builtins, "__import__", builtins.__import__)  # restored afterwards
    monkeypatch.setattr(importlib, "import_module", importlib.import_module)
    monkeypatch.setattr(import_env, "ahead_used", set())
    calls: list[tuple[list[str], bool]] = []
    script_set: list[str] = []
    import_env.watch(dict(os.environ), lambda names, library: calls.append((names, library)),
                     frozenset({"json"}), lambda: script_set)  # fmt: skip
    _import_from("__main__", monkeypatch)
    _import_from("json.decoder", monkeypatch)  # the library's own: counted as used only
    assert calls == [] and builtins.__import__.__name__ == "checking"  # watching on
    assert import_env.ahead_used == {"json"}
    script_set.append("MY_LIBRARY_FLAG")
    _import_from("__main__", monkeypatch)
    assert calls == [(["MY_LIBRARY_FLAG"], True)]
    assert builtins.__import__.__name__ == "__import__"  # one difference is enough

    monkeypatch.setattr(builtins, "__import__", builtins.__import__)
    calls.clear()
    import_env.watch(dict(os.environ), lambda names, library: calls.append((names, library)),
                     frozenset({"json"}), lambda: ["MY_LIBRARY_FLAG"])  # fmt: skip
    import_env.stop_watching()  # training began
    assert builtins.__import__.__name__ == "__import__"
    _import_from("__main__", monkeypatch)
    assert calls == []


def test_every_module_of_ours_the_instrumentation_imports_tensorflow_through_is_excused() -> None:
    """The watch compares the environment at the first import of TensorFlow that is not
    TensorFlow's own or ours: a module of ours missing from OURS would use up that one look
    before the script runs, and a script that sets TF_ENABLE_ONEDNN_OPTS would go on warm."""
    import ast

    from tests.conftest import REPO

    def imports(name: str) -> set[str]:
        tree = ast.parse((REPO / (name.replace(".", "/") + ".py")).read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        return found

    direct = {m for m in imports("worker.instrument") if m.startswith("worker.")}
    ours = {m for m in direct if (REPO / (m.replace(".", "/") + ".py")).exists()}
    importing_tf = {m for m in ours if any(i.split(".")[0] == "tensorflow" for i in imports(m))}
    assert "worker.leader_wait" in importing_tf  # the check sees lazy imports
    assert importing_tf <= import_env.OURS, importing_tf - import_env.OURS


def test_an_import_by_importlib_import_module_is_looked_at_too(
    watched: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No import statement: `importlib.import_module("tensorflow")` after the variable is set."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    exec("import importlib\nimportlib.import_module('json.decoder')", {"__name__": "__main__"})
    assert watched == [["TF_ENABLE_ONEDNN_OPTS"]]
    assert importlib.import_module.__name__ == "import_module"
    assert importlib.import_module.__module__ == "importlib"  # unwrapped once it looked


def test_importlib_imports_by_the_package_itself_are_not_the_scripts(
    watched: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    exec("import importlib\nimportlib.import_module('json.decoder')", {"__name__": "json"})
    assert watched == []
    assert importlib.import_module.__module__ == "worker.warm.import_env"  # still watching
