"""The trainer inside a container image: each runtime's command line, built from one section of
cluster.toml (`[container]`). The agent stays on the host and starts the trainer through the
runtime; the coordinator prints the same lines in `launch --dry-run`. Standard library only.

Every runtime gets the same promises:
- host networking (the planned MWMS ports are the host's) and the host's PID namespace (the
  trainer is a process of the host: liveness, signals, stacks and resource samples reach it);
- the paths the trainer needs mounted at the same paths (the shipped worker copy, shared_dir,
  the script's directory, the working directory), and the user's own `mounts`;
- the trainer's environment passed by name from the runtime client's own (values never on a
  command line: a TF_CONFIG or a secret is not shown in `ps`);
- a name and a label with the job's id (podman, Docker): a stop removes the container by its
  name, a sweep every container with the label.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from worker.private_dir import base_dir
from worker.spec import WorkerSpec

RUNTIMES = ("podman", "docker", "apptainer", "pyxis")
JOB_LABEL = "orchestrate.job"  # each container's label: the job's id


@dataclass(frozen=True)
class Container:
    """One task's container: the `[container]` section as the agent applies it."""

    runtime: str  # one of RUNTIMES
    image: str
    name: str  # unique per task and attempt (podman, Docker)
    job_id: str
    mounts: tuple[str, ...] = ()  # "SRC:DST" or "SRC:DST:ro": ours first, then the user's
    args: tuple[str, ...] = ()  # extra runtime arguments, as the user wrote them
    gpus: tuple[int, ...] = ()  # the task's GPUs on its host (its slot's)
    executable: str = ""  # the runtime's program ("": its usual name)
    labels: tuple[tuple[str, str], ...] = ()  # besides the job's (podman, Docker)

    @property
    def program(self) -> str:
        return self.executable or {"pyxis": "srun"}.get(self.runtime, self.runtime)


def container_name(job_id: str, task_index: int, attempt: int) -> str:
    """A task's container, one per attempt: what `status` shows and a stop removes."""
    return f"orchestrate-{job_id}-{task_index}-{attempt}"


def mount_of(path: str, read_only: bool = False) -> str:
    """A path mounted at the same path inside the image."""
    return f"{path}:{path}:ro" if read_only else f"{path}:{path}"


def run_argv(
    c: Container,
    command: Sequence[str],
    workdir: str,
    env_names: Iterable[str],
    *,
    uid: int,
    gid: int,
) -> list[str]:
    """The argv that runs `command` (the trainer's: [python, ...] as inside the image) in the
    image, from `workdir`, with these environment variables passed by name. `uid`/`gid`: the
    user the files it writes must belong to (the agent's own)."""
    names = sorted(set(env_names))
    if c.runtime in ("podman", "docker"):
        argv = [c.program, "run", "--rm", "--name", c.name, "--label", f"{JOB_LABEL}={c.job_id}",
                *(f"--label={k}={v}" for k, v in c.labels),
                "--network=host", "--pid=host", "--ipc=host",
                "--workdir", workdir]  # fmt: skip
        if c.runtime == "podman":
            # Rootless: the user's own uid inside (files on shared_dir stay theirs); as root,
            # root inside.
            argv += ["--userns=keep-id"] if uid != 0 else []
        else:
            argv += ["--user", f"{uid}:{gid}"]
        argv += gpu_flags(c.runtime, c.gpus)
        for mount in c.mounts:
            argv += ["--volume", mount]
        for name in names:
            argv += ["--env", name]  # the value from this process's environment
        return [*argv, *c.args, c.image, *command]
    if c.runtime == "apptainer":
        # Apptainer shares the host's network and PID namespace and passes the environment
        # through by default; --nv brings the host's NVIDIA driver, CUDA_VISIBLE_DEVICES (set
        # by the agent) picks the slot's GPUs.
        argv = [c.program, "exec", "--pwd", workdir, *gpu_flags(c.runtime, c.gpus)]
        for mount in c.mounts:
            argv += ["--bind", mount]
        return [*argv, *c.args, c.image, *command]
    if c.runtime == "pyxis":
        return [c.program, *pyxis_flags(c, workdir), *command]
    raise ValueError(f"container runtime {c.runtime!r}: one of {', '.join(RUNTIMES)}")


def gpu_flags(runtime: str, gpus: Sequence[int]) -> list[str]:
    """How each runtime passes these host GPUs in: podman by CDI (the NVIDIA Container
    Toolkit's spec), Docker by its --gpus, Apptainer with --nv (every GPU; the agent's
    CUDA_VISIBLE_DEVICES picks the slot's); none for pyxis (Slurm's own)."""
    if not gpus:
        return []
    if runtime == "podman":
        return [f"--device=nvidia.com/gpu={g}" for g in gpus]
    if runtime == "docker":
        return ["--gpus", f'"device={",".join(map(str, gpus))}"']
    return ["--nv"] if runtime == "apptainer" else []


def pyxis_flags(c: Container, workdir: str) -> list[str]:
    """srun's options for pyxis (enroot): the image, the mounts and the working directory. GPUs
    are Slurm's own (--gpus-per-task), seen inside as on the node."""
    flags = [f"--container-image={c.image}", f"--container-workdir={workdir}"]
    if c.mounts:
        flags.append(f"--container-mounts={','.join(c.mounts)}")
    return [*flags, *c.args]


def remove_argv(c: Container) -> list[str] | None:
    """The argv that removes this task's container at once (after its trainer was killed, the
    runtime's own cleanup may not have run); None: the runtime keeps none."""
    if c.runtime == "podman":
        return [c.program, "rm", "--force", "--ignore", "--time", "0", c.name]
    if c.runtime == "docker":
        return [c.program, "rm", "--force", c.name]
    return None


def sweep_argv(runtime: str, job_id: str) -> list[str] | None:
    """A shell-free sweep of every container of a job on a host, running or not (after a lost
    supervisor, an agent killed before its runtime cleaned up): `sh -c` over the runtime's own
    listing and removal, the job's id as an argument. None: the runtime keeps none."""
    listing = listing_argv(runtime, runtime, job_id)
    if listing is None:
        return None
    script = 'ids=$("$@") && [ -n "$ids" ] && exec "$0" rm --force $ids; exit 0'
    return ["sh", "-c", script, runtime, *listing]


def listing_argv(runtime: str, program: str, job_id: str) -> list[str] | None:
    """The argv that lists the ids of every container of a job (by its label), running or not;
    None: the runtime names none (Apptainer, pyxis: the job's processes are found by their
    environment, as any other)."""
    if runtime in ("podman", "docker"):
        return [program, "ps", "--all", "--quiet", "--filter", f"label={JOB_LABEL}={job_id}"]
    return None


ENV_AGENT_PID = "ORCHESTRATE_AGENT_PID"  # in the image: the agent the trainer dies with (bootstrap)


def task_container(
    section: dict[str, Any],
    *,
    job_id: str,
    task_index: int,
    attempt: int,
    shared_dir: str,
    workdir: str,
    argv: Sequence[str],
    copy: str,
) -> Container:
    """One task's container: `section` as the spec carries it (runtime, image, mounts, args,
    gpus), the paths the trainer needs mounted first (the worker package's copy read-only,
    shared_dir, the working directory, the script's directory), each path once."""
    ours = [mount_of(copy, read_only=True), mount_of(shared_dir), mount_of(workdir)]
    script = argv[2] if len(argv) > 2 and argv[1].endswith("bootstrap.py") else argv[1]
    if not script.startswith("-") and script.startswith("/"):
        ours.append(mount_of(os.path.dirname(script)))
    return Container(
        runtime=str(section["runtime"]),
        image=str(section["image"]),
        name=container_name(job_id, task_index, attempt),
        job_id=job_id,
        mounts=tuple(dict.fromkeys([*ours, *section.get("mounts", ())])),
        args=tuple(section.get("args", ())),
        gpus=tuple(int(g) for g in section.get("gpus", ())),
    )


def for_task(
    spec: WorkerSpec, argv: list[str], env: dict[str, str], copy: str
) -> tuple[Container, list[str], dict[str, str]]:
    """The task's container, the runtime argv that runs `argv` (the trainer's, with the image's
    python) in it, and the runtime client's environment: `env` (the trainer's) with what the
    image must see passed by name. `copy`: the worker package's directory on this host."""
    container = task_container(
        spec.container or {}, job_id=spec.job_id, task_index=spec.task_index,
        attempt=spec.attempt, shared_dir=spec.shared_dir, workdir=spec.workdir, argv=argv,
        copy=copy,
    )  # fmt: skip
    env = {**env, ENV_AGENT_PID: str(os.getpid())}
    names = list(image_env(spec, env, container))
    run = run_argv(container, argv, spec.workdir, names, uid=os.getuid(), gid=os.getgid())
    return container, run, {**env, **image_env(spec, env, container)}


def image_env(spec: WorkerSpec, env: dict[str, str], container: Container) -> dict[str, str]:
    """What the trainer in the image sees of `env` (the trainer's, on the host) on top of the
    image's own environment: every variable the agent set or changed and every one of ours (the
    job's id marks each of its processes: a stop finds them by it), never the host's own PATH
    or HOME (the image has its own)."""
    if container.gpus and container.runtime in ("podman", "docker"):
        # The runtime passes only the slot's GPUs: inside they are numbered from 0.
        env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(len(container.gpus))))}
    ours = {k for k in env if k.startswith("ORCHESTRATE_")} | set(spec.env)
    return {k: v for k, v in env.items() if os.environ.get(k) != v or k in ours}


def warm_env(spec: WorkerSpec, env: dict[str, str]) -> dict[str, str]:
    """What a warm trainer in the image sees beyond the image's own environment: as a cold
    one (image_env), less the agent it would die with (its keeper ends it with its agent)."""
    c = task_container(
        spec.container or {}, job_id=spec.job_id, task_index=spec.task_index,
        attempt=spec.attempt, shared_dir=spec.shared_dir, workdir=spec.workdir, argv=spec.argv,
        copy="",
    )  # fmt: skip
    return {k: v for k, v in image_env(spec, env, c).items() if k != ENV_AGENT_PID}


# Warm restarts in an image (podman, Docker): the task's keeper (worker/warm/keeper.py) runs in
# a container of its own, from the same image with the same mounts plus this user's private
# directory (its socket), so that its standbys import the image's TensorFlow. A warm trainer
# lives in the keeper's container, which is renamed for the attempt it serves.
WARM_RUNTIMES = ("podman", "docker")


KEEPER_LABEL = "orchestrate.keeper"  # the keeper's container: the task's index


def keeper_container(spec: WorkerSpec, copy: str, private: str) -> Container:
    """The task's keeper's container: the trainer's mounts, plus `private` (this user's private
    directory on the host, where the keeper's socket is) at the same path."""
    c = task_container(
        spec.container or {}, job_id=spec.job_id, task_index=spec.task_index, attempt=0,
        shared_dir=spec.shared_dir, workdir=spec.workdir, argv=spec.argv, copy=copy,
    )  # fmt: skip
    return replace(
        c,
        name=f"orchestrate-{spec.job_id}-{spec.task_index}-standby",
        mounts=(*c.mounts, mount_of(private)),
        labels=((KEEPER_LABEL, str(spec.task_index)),),
    )


def keeper_in_image(spec: WorkerSpec, argv: list[str], copy: str) -> list[str]:
    """The keeper's `argv` ([host python, keeper.py, ...]) run in its container of the image,
    by the image's python."""
    c = keeper_container(spec, copy, base_dir())
    names = [n for n in ("TMPDIR",) if n in os.environ]  # where the private directory is
    command = [spec.argv[0], *argv[1:], "--in-image"]
    return run_argv(c, command, spec.workdir, names, uid=os.getuid(), gid=os.getgid())


def image_of(spec: WorkerSpec) -> str:
    """The image the task's trainer runs in ('': the host's own Python)."""
    return str((spec.container or {}).get("image", ""))


def name_for_attempt(runtime: str, job_id: str, task_index: int, attempt: int) -> None:
    """Rename the task's keeper's container for the attempt whose trainer it now runs, so that
    `status` names the container the trainer is in (best effort: the job's sweep goes by label)."""
    listing = listing_argv(runtime, runtime, job_id)
    assert listing is not None
    listing += ["--filter", f"label={KEEPER_LABEL}={task_index}"]
    try:
        found = subprocess.run(listing, capture_output=True, text=True, timeout=30, check=False)
        ids = found.stdout.split()
        if found.returncode == 0 and len(ids) == 1:
            new = container_name(job_id, task_index, attempt)
            subprocess.run([runtime, "rename", ids[0], new], capture_output=True, timeout=30,
                           check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pass


def main_pid(container: Container) -> int | None:
    """The host pid of the container's process (the trainer: the host's PID namespace), from
    the runtime's inspect; None: not running yet, or a runtime that names no container."""
    if container.runtime not in ("podman", "docker"):
        return None
    argv = [container.program, "inspect", "--format", "{{.State.Pid}}", container.name]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    pid = done.stdout.strip()
    return int(pid) if done.returncode == 0 and pid.isdigit() and int(pid) > 1 else None


def remove(container: Container) -> None:
    """Remove the task's container, whatever state it is in (best effort: a runtime that does
    not answer leaves it to the job's sweep by label)."""
    argv = remove_argv(container)
    if argv is None:
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, capture_output=True, timeout=60, check=False)


def die_with_agent() -> None:
    """In the trainer, inside an image: the agent is not its parent (the runtime's monitor is),
    so PR_SET_PDEATHSIG cannot tie them; a thread waits on the agent's pidfd (the host's PID
    namespace) and ends the trainer when the agent is gone."""
    raw = os.environ.get(ENV_AGENT_PID, "")
    if not raw.isdigit() or int(raw) <= 1:
        return
    try:
        fd = os.pidfd_open(int(raw))
    except OSError:  # gone already
        os.kill(os.getpid(), signal.SIGKILL)
        return

    def wait() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="die-with-agent", daemon=True).start()


def job_runtime(config_json: str) -> str | None:
    """The container runtime of a job from its stored configuration; None: none."""
    if '"container"' not in config_json or '"container":null' in config_json:  # most jobs
        return None
    section = json.loads(config_json).get("container") or {}
    return str(section["runtime"]) if section.get("runtime") else None


# Read in the image by its own python: no TensorFlow import (package metadata only).
VERSIONS_CODE = (
    "import importlib.metadata as m, json, platform\n"
    "def v(n):\n"
    "    try:\n        return m.version(n)\n"
    "    except m.PackageNotFoundError:\n        return None\n"
    "import glob\n"
    "print(json.dumps({'python': platform.python_version(), 'tensorflow': v('tensorflow') or "
    "v('tensorflow-cpu') or v('tf-nightly'), 'tf_keras': v('tf-keras'), "
    "'gpus': len(glob.glob('/dev/nvidia[0-9]*'))}))"
)


def present_argv(runtime: str, image: str) -> list[str] | None:
    """The argv that exits 0 when the image is on this host (nothing pulled); None: the
    versions' own run says so (podman, Docker: --pull=never), or the runtime resolves it
    itself (pyxis)."""
    return ["apptainer", "inspect", image] if runtime == "apptainer" else None


def versions_argv(runtime: str, image: str, python: str, gpus: Sequence[int] = ()) -> list[str]:
    """The argv that prints the image's Python and TensorFlow versions and the NVIDIA devices
    it sees with these host `gpus` passed in (VERSIONS_CODE); it never pulls the image."""
    command = [python, "-c", VERSIONS_CODE]
    if runtime == "apptainer":
        return ["apptainer", "exec", *gpu_flags(runtime, gpus), image, *command]
    return [runtime, "run", "--rm", "--pull=never", "--network=host",
            *gpu_flags(runtime, gpus), image, *command]  # fmt: skip


def pull_argv(runtime: str, image: str) -> list[str] | None:
    """The argv that pulls the image with the runtime's own registries and credentials; None:
    the runtime has no pull of its own a preflight could run (Apptainer reads a file, pyxis
    imports at the step's start)."""
    return [runtime, "pull", "--quiet", image] if runtime in ("podman", "docker") else None


def size_argv(runtime: str, image: str) -> list[str]:
    """The argv that prints the image's size in bytes on this host (podman, Docker)."""
    return [runtime, "image", "inspect", "--format", "{{.Size}}", image]


def missing_image(stderr: str) -> bool:
    """The runtime's words for an image it does not have (podman: "image not known"; Docker:
    "No such image"), after a run with --pull=never."""
    text = stderr.lower()
    return "image not known" in text or "no such image" in text or "unable to find" in text
