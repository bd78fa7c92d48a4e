from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import LocalBackend, SshBackend, load_config, parse_config
from orchestrator.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

VALID_LOCAL = """
[job]
name = "t"
shared_dir = "shared"

[entrypoint]
module = "worker.examples.digits"

[backend]
type = "local"
workers = 2
"""


def test_example_config_loads_with_resolved_paths() -> None:
    cfg = load_config(REPO / "cluster.example.toml")
    assert isinstance(cfg.backend, LocalBackend)
    assert cfg.backend.workers == 2
    assert cfg.job.shared_dir == REPO / "runs"
    assert cfg.entrypoint.workdir == REPO
    assert cfg.supervision.stop_grace == 10.0


def test_ssh_schema_with_host_defaults_and_overrides() -> None:
    cfg = parse_config(
        {
            "job": {"name": "x", "shared_dir": "/nfs/x"},
            "entrypoint": {"script": "/nfs/train.py", "args": ["--a", "1"]},
            "backend": {
                "type": "ssh",
                "user": "ml",
                "identity_file": "~/.ssh/id_ed25519",
                "hosts": [
                    {"address": "10.0.0.1"},
                    {"address": "10.0.0.2", "user": "root", "port": 2222, "slots": 2},
                ],
            },
        }
    )
    assert isinstance(cfg.backend, SshBackend)
    assert cfg.backend.hosts[1].port == 2222
    assert cfg.backend.hosts[0].port is None  # falls back to backend.port at connect time
    assert cfg.backend.port is None  # ~/.ssh/config, then 22
    assert not cfg.backend.trust_unknown_hosts


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "file is empty"),
        ("[job\nname=1", "invalid TOML"),
        (VALID_LOCAL + "\nbogus = 1\n", "bogus: unknown key"),
        (
            VALID_LOCAL.replace("workers = 2", "workers = 'two'"),
            "backend.workers: Input should be a valid integer",
        ),
        (
            VALID_LOCAL.replace("workers = 2", "workers = 0"),
            "backend.workers: must be >= 1 (got 0)",
        ),
        (
            VALID_LOCAL.replace('module = "worker.examples.digits"', ""),
            "entrypoint: give exactly one of 'module' or 'script'",
        ),
        (
            VALID_LOCAL.replace('[entrypoint]\nmodule = "worker.examples.digits"', ""),
            "entrypoint: required key is missing",
        ),
        (
            VALID_LOCAL.replace('module = "worker.examples.digits"', 'script = "missing.py"'),
            "entrypoint.script: no such file",
        ),
        (
            VALID_LOCAL.replace('type = "local"', 'type = "k8s"'),
            "backend: unknown backend type 'k8s'",
        ),
        (
            VALID_LOCAL.replace('name = "t"', 'name = "bad name!"'),
            "job.name: String should match pattern",
        ),
    ],
)
def test_bad_config_is_one_line_naming_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message
    assert message.startswith(str(path))


def test_duplicate_host_names_both_positions(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        """
[job]
name = "t"
shared_dir = "/tmp"
[entrypoint]
module = "m"
[backend]
type = "ssh"
[[backend.hosts]]
address = "10.9.0.1"
[[backend.hosts]]
address = "10.9.0.2"
[[backend.hosts]]
address = "10.9.0.1"
port = 22
"""
    )
    with pytest.raises(
        ConfigError, match=r"backend.hosts\[2\].address: duplicate host 10.9.0.1:22"
    ):
        load_config(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
