"""Bad input as data: every file in tests/bad_configs/ must be refused by the real CLI with one
line on stderr naming the key (or host), exit code 2, no traceback, and nothing started.

Each file's first line is `# expect: <substring of the message>` (more `# expect:` lines may
follow; every one must appear); a file with several problems says `# problems: N` (one line each). `{tmp}` in a file is replaced by the test's tmp dir; the file is
copied there first, so a relative shared_dir ("shared") lands in that tmp dir too, and a regular
file `a_file` sits beside it. Cases that cannot be a small .toml file (a FIFO, /dev/zero, deep
nesting, values over the exec size limit, an oversized file) are built below as extra cases.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult

CASES_DIR = Path(__file__).parent / "bad_configs"
CASES = sorted(p.stem for p in CASES_DIR.glob("*.toml"))
EXPECT = "# expect: "
PROBLEMS = "# problems: "
# Also run through `orchestrate launch`: it must refuse them before registering a job.
LAUNCHED = (
    "workers_string",
    "address_proxycommand",
    "restart_backoff_inf",
    "hosts_differ_in_case",
    "shared_dir_is_file",
    "env_nul_value",
    "python_with_option",
    "shared_dir_too_long",
    "heartbeat_interval_not_below_timeout",
    "three_problems",
    "entrypoint_module_option",
)

GOOD_HEAD = """
[job]
name = "bad"
shared_dir = "shared"

[backend]
type = "local"
workers = 2

[entrypoint]
module = "worker.examples.digits"
"""


def expectations(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        if not line.startswith(EXPECT):
            break
        found.append(line.removeprefix(EXPECT))
    assert found, f"the first line must be '{EXPECT}<substring>'"
    return found


def error_lines(text: str) -> int:
    """How many problems the case holds: `# problems: N` after its expectations, else 1."""
    marked = [ln for ln in text.splitlines() if ln.startswith(PROBLEMS)]
    return int(marked[0].removeprefix(PROBLEMS)) if marked else 1


def job_rows(home: Path) -> int:
    db = home / "state.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])


def assert_refused(
    result: CliResult, expected: list[str], home: Path, tmp_path: Path, lines: int = 1
) -> None:
    assert result.code == 2, result
    assert result.err.endswith("\n"), result.err
    # One line per problem, each its own "error: " line (a file may hold several problems).
    assert all(line.startswith("error: ") for line in result.err.splitlines()), result.err
    assert result.err.count("\n") == lines, result.err
    assert all(c.isprintable() for c in result.err.replace("\n", "")), (
        f"raw control characters: {result.err!r}"
    )
    assert "Traceback" not in result.err + result.out
    assert result.out == "", result.out
    for text in expected:
        assert text in result.err, (text, result.err)
    assert job_rows(home) == 0  # nothing registered
    assert list((tmp_path / "shared").iterdir()) == []  # nothing started or written


@pytest.fixture
def workspace(tmp_path: Path, home: Path) -> Path:
    (tmp_path / "shared").mkdir()
    (tmp_path / "a_file").write_text("not a directory\n")
    return tmp_path


def place(case: str, workspace: Path) -> tuple[Path, list[str], int]:
    text = (CASES_DIR / f"{case}.toml").read_text().replace("{tmp}", str(workspace))
    path = workspace / f"{case}.toml"
    path.write_text(text)
    return path, expectations(text), error_lines(text)


def test_the_corpus_is_there() -> None:
    assert len(CASES) >= 40
    assert set(LAUNCHED) <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_validate_refuses_bad_config(
    case: str, workspace: Path, home: Path, cli: Callable[..., CliResult]
) -> None:
    path, expected, lines = place(case, workspace)
    assert_refused(cli("validate", str(path), timeout=60), expected, home, workspace, lines)


@pytest.mark.parametrize("case", LAUNCHED)
def test_launch_refuses_bad_config_before_registering_a_job(
    case: str, workspace: Path, home: Path, cli: Callable[..., CliResult]
) -> None:
    path, expected, lines = place(case, workspace)
    assert_refused(cli("launch", str(path), timeout=60), expected, home, workspace, lines)


# Cases that cannot be a small file: (how to build it in the workspace, expected substrings).


def _fifo(ws: Path) -> Path:
    path = ws / "fifo.toml"
    os.mkfifo(path)
    return path


def _dev_zero(ws: Path) -> Path:
    return Path("/dev/zero")


def _link_to_dev_zero(ws: Path) -> Path:
    path = ws / "zero.toml"
    path.symlink_to("/dev/zero")
    return path


def _write(ws: Path, text: str) -> Path:
    path = ws / "c.toml"
    path.write_text(text)
    return path


def _deep_arrays(ws: Path) -> Path:
    depth = 100_000
    return _write(ws, GOOD_HEAD + "args = " + "[" * depth + "]" * depth + "\n")


def _deep_inline_tables(ws: Path) -> Path:
    depth = 100_000
    return _write(ws, GOOD_HEAD + "env = " + "{a = " * depth + "1" + "}" * depth + "\n")


def _moderately_deep(ws: Path) -> Path:  # parses fine, but no config is nested like that
    depth = 40
    return _write(ws, GOOD_HEAD + "args = " + "[" * depth + "]" * depth + "\n")


def _env_value_too_big(ws: Path) -> Path:
    return _write(ws, GOOD_HEAD + f'env = {{ BIG = "{"x" * 200_000}" }}\n')


def _env_too_big_in_all(ws: Path) -> Path:
    values = ", ".join(f'V{i} = "{"x" * 100_000}"' for i in range(12))
    return _write(ws, GOOD_HEAD + f"env = {{ {values} }}\n")


def _arg_too_big(ws: Path) -> Path:
    return _write(ws, GOOD_HEAD + f'args = ["{"x" * 200_000}"]\n')


def _file_too_big(ws: Path) -> Path:
    return _write(ws, GOOD_HEAD + ("# padding " + "x" * 80 + "\n") * 60_000)


EXTRA = {
    "fifo": (_fifo, ["fifo.toml: not a regular file"]),
    "dev_zero": (_dev_zero, ["/dev/zero: not a regular file"]),
    "symlink_to_dev_zero": (_link_to_dev_zero, ["zero.toml: not a regular file"]),
    "deep_arrays": (_deep_arrays, ["nested too deeply"]),
    "deep_inline_tables": (_deep_inline_tables, ["nested too deeply"]),
    "moderately_deep": (_moderately_deep, ["entrypoint.args", "nested too deeply"]),
    "env_value_too_big": (_env_value_too_big, ["entrypoint.env.BIG: ", "131072"]),
    "env_too_big_in_all": (_env_too_big_in_all, ["entrypoint.env: ", "exec size limit"]),
    "arg_too_big": (_arg_too_big, ["entrypoint.args[0]: ", "131072"]),
    "file_too_big": (_file_too_big, ["c.toml: larger than"]),
}


@pytest.mark.parametrize("case", list(EXTRA))
def test_validate_refuses_built_case(
    case: str, workspace: Path, home: Path, cli: Callable[..., CliResult]
) -> None:
    build, expected = EXTRA[case]
    assert_refused(cli("validate", str(build(workspace)), timeout=60), expected, home, workspace)


@pytest.mark.parametrize("case", ["fifo", "env_value_too_big"])
def test_launch_refuses_built_case(
    case: str, workspace: Path, home: Path, cli: Callable[..., CliResult]
) -> None:
    build, expected = EXTRA[case]
    assert_refused(cli("launch", str(build(workspace)), timeout=60), expected, home, workspace)


def test_thousands_of_problems_are_capped_with_a_count(
    workspace: Path, home: Path, cli: Callable[..., CliResult]
) -> None:
    """20,000 unknown tables: the first 20 problems and how many more, not 1.6 MB of lines."""
    path = _write(workspace, GOOD_HEAD + "".join(f"[table{i}]\n" for i in range(20_000)))
    result = cli("validate", str(path), timeout=60)
    assert_refused(result, ["table0: unknown key", "... and 19980 more problem(s)"], home,
                   workspace, lines=21)  # fmt: skip


def test_an_interpreter_path_with_a_space_and_a_unicode_module_name_validate(
    workspace: Path, cli: Callable[..., CliResult]
) -> None:
    text = GOOD_HEAD.replace("worker.examples.digits", "pkg.train_ü")
    path = _write(workspace, text.replace("workers = 2", 'workers = 2\npython = "/opt/my envs/py"'))
    result = cli("validate", str(path), timeout=60)
    assert result.code == 0, result
