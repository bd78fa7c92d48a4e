"""`[container]`: each runtime's command line against its documented flags, the rules that refuse
a bad section before anything starts, and what the agent runs for a task."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from orchestrator.backends.capabilities import LOCAL, SLURM
from orchestrator.config import load_config
from orchestrator.errors import ConfigError
from orchestrator.planning.plan import dry_run_plan
from orchestrator.planning.task_specs import cold_restarts, container_argv, warm_restarts
from worker import container
from worker.container import Container, listing_argv, remove_argv, run_argv
from worker.spec import WorkerSpec

COMMAND = ["python3", "/copy/worker/bootstrap.py", "/code/train.py", "--epochs", "3"]


def one(runtime: str, gpus: tuple[int, ...] = ()) -> Container:
    return Container(runtime, "img:1", "orchestrate-j-0-0", "j",
                     mounts=("/copy:/copy:ro", "/shared:/shared"), args=("--shm-size=1g",),
                     gpus=gpus)  # fmt: skip


def test_podman_runs_the_trainer_on_the_hosts_network_and_pids_with_env_by_name() -> None:
    argv = run_argv(one("podman", (2, 3)), COMMAND, "/code", ["TF_CONFIG", "A"], uid=1000, gid=100)
    assert argv[:3] == ["podman", "run", "--rm"]
    for flag in ("--network=host", "--pid=host", "--ipc=host", "--userns=keep-id"):
        assert flag in argv
    assert argv[argv.index("--name") + 1] == "orchestrate-j-0-0"
    assert argv[argv.index("--label") + 1] == "orchestrate.job=j"
    assert argv[argv.index("--workdir") + 1] == "/code"
    # CDI names each GPU of the slot (podman run --device nvidia.com/gpu=N)
    assert [a for a in argv if a.startswith("--device")] == [
        "--device=nvidia.com/gpu=2", "--device=nvidia.com/gpu=3"
    ]  # fmt: skip
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
    assert volumes == ["/copy:/copy:ro", "/shared:/shared"]
    # --env NAME takes the value from the client's environment: no value on the command line
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--env"] == ["A", "TF_CONFIG"]
    image = argv.index("img:1")
    assert argv[image - 1] == "--shm-size=1g" and argv[image + 1 :] == COMMAND


def test_podman_as_root_keeps_root_and_docker_runs_as_the_user_with_its_gpus() -> None:
    assert "--userns=keep-id" not in run_argv(one("podman"), COMMAND, "/", [], uid=0, gid=0)
    argv = run_argv(one("docker", (1,)), COMMAND, "/code", ["X"], uid=1000, gid=100)
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[argv.index("--user") + 1] == "1000:100"
    assert argv[argv.index("--gpus") + 1] == '"device=1"'  # docker run --gpus '"device=1"'
    assert "--device=nvidia.com/gpu=1" not in argv


def test_apptainer_execs_with_binds_and_nv_and_pyxis_is_srun_container_flags() -> None:
    argv = run_argv(one("apptainer", (0,)), COMMAND, "/code", ["TF_CONFIG"], uid=1, gid=1)
    assert argv[:4] == ["apptainer", "exec", "--pwd", "/code"]
    assert "--nv" in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"] == [
        "/copy:/copy:ro", "/shared:/shared"
    ]  # fmt: skip
    assert argv[argv.index("img:1") + 1 :] == COMMAND
    assert "--nv" not in run_argv(one("apptainer"), COMMAND, "/code", [], uid=1, gid=1)
    srun = run_argv(one("pyxis"), COMMAND, "/code", [], uid=1, gid=1)
    assert srun[0] == "srun"
    assert "--container-image=img:1" in srun
    assert "--container-mounts=/copy:/copy:ro,/shared:/shared" in srun
    assert "--container-workdir=/code" in srun
    assert srun[-len(COMMAND) :] == COMMAND


def test_a_task_container_is_removed_by_name_and_a_job_s_found_by_label() -> None:
    assert remove_argv(one("podman")) == [
        "podman", "rm", "--force", "--ignore", "--time", "0", "orchestrate-j-0-0"
    ]  # fmt: skip
    assert remove_argv(one("docker")) == ["docker", "rm", "--force", "orchestrate-j-0-0"]
    assert remove_argv(one("apptainer")) is None  # no container outlives its process
    assert listing_argv("podman", "podman", "j") == [
        "podman", "ps", "--all", "--quiet", "--filter", "label=orchestrate.job=j"
    ]  # fmt: skip
    assert listing_argv("pyxis", "srun", "j") is None


def write_config(tmp_path: Path, container_lines: str, backend: str = "") -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[job]\nname = "c"\nshared_dir = "{tmp_path}/shared"\n'
        '[entrypoint]\nscript = "train.py"\nenv = {"SECRET_TOKEN" = "s3cret"}\n'
        + (backend or '[backend]\ntype = "local"\nworkers = 2\n')
        + "[container]\n"
        + container_lines
    )
    (tmp_path / "shared").mkdir(exist_ok=True)
    return path


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ('image = "img"\nruntime = "pyxis"\n', "container.runtime: pyxis runs containers in Slurm"),
        ('image = "img"\nruntime = "lxc"\n', "container.runtime"),
        ('image = "-it"\n', "container.image: must be an image reference"),
        ('image = "img"\nmounts = ["/data"]\n', "container.mounts[0]: must be SRC:DST"),
        ('image = "img"\nmounts = ["/d:/data:rx"]\n', "container.mounts[0]: must be SRC:DST"),
        ('image = "img"\nmounts = ["/a:/a", "/x:/"]\n', "container.mounts[1]: '/' would hide"),
        ('image = "img"\npython = "python3 -u"\n', "container.python: must be one executable"),
        ('runtime = "podman"\n', "container.image: required key is missing"),
    ],
)
def test_a_bad_container_section_is_one_line_naming_its_key(
    tmp_path: Path, lines: str, said: str
) -> None:
    with pytest.raises(ConfigError, match="^" + str(tmp_path)) as caught:
        load_config(write_config(tmp_path, lines))
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_mount_over_the_shared_dir_is_refused(tmp_path: Path) -> None:
    lines = f'image = "img"\nmounts = ["/elsewhere:{tmp_path}/shared/ckpt"]\n'
    with pytest.raises(ConfigError, match=r"container.mounts\[0\]: .* would hide job.shared_dir"):
        load_config(write_config(tmp_path, lines))


def test_the_dry_run_command_mounts_what_the_trainer_needs_and_where_restarts_are_warm(
    tmp_path: Path,
) -> None:
    config = load_config(write_config(tmp_path, 'image = "img"\nmounts = ["/data:/data:ro"]\n'))
    plan = dry_run_plan(config)
    argv = container_argv(config, plan.tasks[1], uid=1000)
    assert argv is not None and argv[:2] == ["podman", "run"]
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
    assert volumes == ["<worker copy>:<worker copy>:ro", f"{tmp_path}/shared:{tmp_path}/shared",
                       f"{tmp_path}:{tmp_path}", "/data:/data:ro"]  # fmt: skip
    assert "s3cret" not in " ".join(argv) and "SECRET_TOKEN" in argv  # by name only
    assert argv[-2:] == ["<worker copy>/worker/bootstrap.py", str(tmp_path / "train.py")]

    class Backend:
        capabilities = LOCAL

    class OnSlurm:
        capabilities = SLURM

    assert warm_restarts(config, Backend())  # type: ignore[arg-type]
    assert not warm_restarts(config, OnSlurm())  # type: ignore[arg-type]  # the keeper step
    apptainer = load_config(write_config(tmp_path, 'image = "a.sif"\nruntime = "apptainer"\n'))
    assert not warm_restarts(apptainer, Backend())  # type: ignore[arg-type]
    assert cold_restarts(config, LOCAL) is None
    assert cold_restarts(apptainer, LOCAL) == (
        "apptainer runs no long-lived container beside the trainer's to hold a standby in the "
        "image (podman and Docker do)"
    )
    assert cold_restarts(config, SLURM) == (
        "this backend's standbys run on the node's own Python, not in the image"
    )


def test_a_keeper_in_the_image_has_the_private_directory_mounted_and_its_own_label(
    tmp_path: Path,
) -> None:
    from worker.container import KEEPER_LABEL, keeper_container, run_argv
    from worker.spec import WorkerSpec

    spec = WorkerSpec(
        job_id="j1", attempt=2, task_index=1, host_label="h",
        tf_config={}, argv=["/usr/bin/python3", str(tmp_path / "train.py")],
        container={"runtime": "podman", "image": "img", "mounts": [], "args": [], "gpus": []},
        env={}, workdir=str(tmp_path), shared_dir=str(tmp_path / "shared"),
    )  # fmt: skip
    c = keeper_container(spec, "/copy", "/tmp/orchestrate-1000")
    assert c.name == "orchestrate-j1-1-standby"
    assert "/tmp/orchestrate-1000:/tmp/orchestrate-1000" in c.mounts
    assert "/copy:/copy:ro" in c.mounts
    argv = run_argv(c, ["/usr/bin/python3", "k.py"], str(tmp_path), ["TMPDIR"], uid=0, gid=0)
    assert f"--label={KEEPER_LABEL}=1" in argv and "orchestrate.job=j1" in argv


def test_the_agent_runs_its_trainer_through_the_runtime_with_env_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME_ONLY", "host")
    spec = WorkerSpec(
        job_id="j1", task_index=1, host_label="h", tf_config={}, attempt=2,
        argv=["python3", "/c/worker/bootstrap.py", f"{tmp_path}/train.py"],
        workdir=str(tmp_path), shared_dir=f"{tmp_path}/shared", env={"SECRET_TOKEN": "x"},
        container={"runtime": "podman", "image": "img", "mounts": [], "args": [], "gpus": [4]},
    )  # fmt: skip
    env = {**os.environ, "TF_CONFIG": "{}", "SECRET_TOKEN": "x", "CUDA_VISIBLE_DEVICES": "4"}
    image, argv, client_env = container.for_task(spec, list(spec.argv), env, "/c")
    assert image.name == "orchestrate-j1-1-2"
    passed = {argv[i + 1] for i, a in enumerate(argv) if a == "--env"}
    assert {"TF_CONFIG", "SECRET_TOKEN", "CUDA_VISIBLE_DEVICES", container.ENV_AGENT_PID} <= passed
    assert "HOME_ONLY" not in passed and "PATH" not in passed
    assert client_env["CUDA_VISIBLE_DEVICES"] == "0"  # the slot's GPU 4 is the image's 0
    assert "--device=nvidia.com/gpu=4" in argv
    assert client_env[container.ENV_AGENT_PID] == str(os.getpid())
    assert "x" not in argv


def test_a_job_s_containers_are_swept_by_its_label_and_none_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from worker.container import sweep_argv

    calls = tmp_path / "calls"
    fake = tmp_path / "podman"  # lists what $IDS holds, records every other call
    fake.write_text(f'#!/bin/sh\n[ "$1" = ps ] && {{ echo "$@" >> {calls}; echo $IDS; exit 0; }}\n'
                    f'echo "$@" >> {calls}\n')  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    argv = sweep_argv("podman", "j-1")
    assert argv is not None and sweep_argv("apptainer", "j-1") is None
    monkeypatch.setenv("IDS", "abc def")
    assert subprocess.run(argv, check=False).returncode == 0
    monkeypatch.setenv("IDS", "")
    assert subprocess.run(argv, check=False).returncode == 0
    assert calls.read_text().splitlines() == [
        "ps --all --quiet --filter label=orchestrate.job=j-1",
        "rm --force abc def",
        "ps --all --quiet --filter label=orchestrate.job=j-1",
    ]


class Answers:
    """A host whose commands answer from a table ((argv[0], argv[1]) -> exit, stdout, stderr)."""

    host_label = "h1"

    def __init__(self, table: dict[tuple[str, str], tuple[int, bytes, bytes]]) -> None:
        self.table = table

    def run(self, argv: list[str], **_: object) -> object:
        from orchestrator.transport.base import CommandResult

        code, out, err = self.table[(argv[0], argv[1])]
        return CommandResult("h1", tuple(argv), code, out, err)


RUN = ("podman", "run")
PULL = ("podman", "pull")


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({RUN: (127, b"", b"")}, "podman is not installed (needed for image img)"),
        ({RUN: (0, b'{"tensorflow": null}\n', b"")}, "image img: no TensorFlow and tf-keras"),
        ({RUN: (126, b"", b"exec failed")}, "image img: python3 did not start in it (podman"),
        (
            {RUN: (125, b"", b"Error: img: image not known"), PULL: (125, b"", b"Error: denied")},
            "image img is not on this host and could not be pulled (podman exit 125: Error: denied)",
        ),
        (
            {("apptainer", "inspect"): (255, b"", b"no such file")},
            "image img is not on this host (apptainer)",
        ),
    ],
)
def test_an_image_without_what_the_trainer_needs_is_one_line_naming_it(
    table: dict[tuple[str, str], tuple[int, bytes, bytes]], said: str
) -> None:
    from orchestrator.backends.image_check import image_tensorflow
    from orchestrator.config.container import ContainerSection
    from orchestrator.errors import PreflightError

    runtime = next(iter(table))[0]
    section = ContainerSection(image="img", runtime=runtime)  # type: ignore[arg-type]
    with pytest.raises(PreflightError, match="^" + re.escape(said)):
        image_tensorflow(Answers(table), section)  # type: ignore[arg-type]
    ok = {RUN: (0, b'{"tensorflow": "2.21.0", "tf_keras": "2.21.0"}\n', b"")}
    found = image_tensorflow(Answers(ok), ContainerSection(image="img"))  # type: ignore[arg-type]
    assert found.tensorflow == "2.21.0" and found.pulled == ""


def test_gpus_asked_for_but_not_visible_in_the_image_are_one_line_naming_the_flags() -> None:
    from orchestrator.backends.image_check import image_tensorflow
    from orchestrator.config.container import ContainerSection
    from orchestrator.errors import PreflightError

    seen = b'{"tensorflow": "2.21.0", "tf_keras": "2.21.0", "gpus": 1}\n'
    answers = Answers({RUN: (0, seen, b"")})
    section = ContainerSection(image="img")
    said = (
        "image img: 2 GPU(s) asked for, 1 visible inside it with --device=nvidia.com/gpu=0 "
        "--device=nvidia.com/gpu=1 (generate the NVIDIA Container Toolkit's CDI spec"
    )
    with pytest.raises(PreflightError, match="^" + re.escape(said)):
        image_tensorflow(answers, section, (0, 1))  # type: ignore[arg-type]
    assert image_tensorflow(answers, section, (0,)).tensorflow == "2.21.0"  # type: ignore[arg-type]
    assert image_tensorflow(answers, section).tensorflow == "2.21.0"  # type: ignore[arg-type]
    argv = container.versions_argv("podman", "img", "python3", (0, 1))
    assert argv[argv.index("img") - 2 : argv.index("img")] == [
        "--device=nvidia.com/gpu=0", "--device=nvidia.com/gpu=1"
    ]  # fmt: skip
    apptainer = container.versions_argv("apptainer", "a.sif", "python3", (0,))
    assert apptainer[:4] == ["apptainer", "exec", "--nv", "a.sif"]


class InTurn:
    """A host that answers each command with the next of its answers to that command."""

    host_label = "h1"

    def __init__(self, answers: dict[tuple[str, str], list[tuple[int, bytes, bytes]]]) -> None:
        self.answers = answers
        self.ran: list[list[str]] = []

    def run(self, argv: list[str], **_: object) -> object:
        from orchestrator.transport.base import CommandResult

        self.ran.append(argv)
        code, out, err = self.answers[(argv[0], argv[1])].pop(0)
        return CommandResult("h1", tuple(argv), code, out, err)


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_a_missing_image_is_pulled_and_said_with_its_size(runtime: str) -> None:
    from orchestrator.backends.image_check import image_tensorflow
    from orchestrator.config.container import ContainerSection

    ok = (0, b'{"tensorflow": "2.21.0", "tf_keras": "2.21.0"}\n', b"")
    host = InTurn(
        {
            (runtime, "run"): [(125, b"", b"Error: Unable to find image 'img' locally"), ok],
            (runtime, "pull"): [(0, b"sha256:abc\n", b"")],
            (runtime, "image"): [(0, b"2071234567\n", b"")],
        }
    )
    section = ContainerSection(image="reg.example:5000/tf:1", runtime=runtime)  # type: ignore[arg-type]
    found = image_tensorflow(host, section)  # type: ignore[arg-type]
    assert found.tensorflow == "2.21.0"
    assert re.fullmatch(r"pulled image reg.example:5000/tf:1 \(2.07 GB\) in \d+ s", found.pulled)
    assert [runtime, "pull", "--quiet", "reg.example:5000/tf:1"] in host.ran
    assert all("--pull=never" in argv for argv in host.ran if argv[1] == "run")
