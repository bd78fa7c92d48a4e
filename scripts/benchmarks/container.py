"""The trainers in a container image (podman), each round beside the same image started by hand
(two `podman run`s with TF_CONFIG, the same trainer, the same mounts, host networking):

P2c  `launch` to the first training step; rounds alternate which side goes first;
P14c a trainer SIGKILLed -> training resumed, in the warm standbys its keepers hold in the
     image (waited for before the kill); a round that restarted cold is a failed round.

The image is the test suite's (tests/images/tf_image.py: Debian's Python, TensorFlow and
tf-keras, built from the package registries), built first if this machine lacks it.

    python -m scripts.benchmarks.container [--rounds N]"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from scripts.benchmarks.measure import (
    REPO,
    TRAINER,
    first_step,
    free_ports,
    kill_left,
    launch,
    no_kept_standbys,
)
from scripts.benchmarks.rows import Row, measure_alone


def row() -> Row:
    return Row(
        "P2c",
        "launch to first training step, 2 workers in a podman image",
        "s",
        kind="ratio",
        target_ratio=1.1,
        baseline_label="the same image started by hand (podman run, TF_CONFIG)",
        target="<= 1.1x raw",
    )


def warm_row() -> Row:
    return Row(
        "P14c",
        "trainer SIGKILL -> training resumed, warm standby in a podman image",
        "s",
        kind="ratio",
        target_ratio=0.4,
        baseline_label="a cold start of the image by hand (podman run, TF_CONFIG)",
        target="<= 0.4x a cold start",
    )


def unavailable() -> str | None:
    """Why P2c cannot be measured here; None: it can."""
    if shutil.which("podman") is None:
        return "podman is not installed"
    if os.geteuid() != 0:
        return "the image is built as root (debootstrap)"
    return None


def image_and_env() -> tuple[str, dict[str, str]]:
    from tests.images.tf_image import ensure_image, podman_env

    image, _ = ensure_image()
    return image, {**os.environ, **podman_env(image)}


def raw_run(root: Path, image: str, env: dict[str, str]) -> float:
    """Two workers in the image, started by hand: their start to the later first step."""
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    job_dir = Path(tempfile.mkdtemp(dir=root, prefix="raw-image-"))
    logs = [job_dir / f"w{i}.log" for i in range(2)]
    t0 = time.time()
    procs = []
    for i in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        worker_env = {**env, "TF_CONFIG": tf_config, "TF_USE_LEGACY_KERAS": "1",
                      "TF_CPP_MIN_LOG_LEVEL": "2", "ORCHESTRATE_JOB_DIR": str(job_dir),
                      "PYTHONPATH": str(REPO)}  # fmt: skip
        argv = ["podman", "run", "--rm", "--network=host", "--volume", f"{REPO}:{REPO}",
                "--volume", f"{job_dir}:{job_dir}", "--workdir", str(REPO),
                *(a for k in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL",
                              "ORCHESTRATE_JOB_DIR", "PYTHONPATH") for a in ("--env", k)),
                image, "python3", str(TRAINER), "--epochs", "3", "--raw"]  # fmt: skip
        with open(logs[i], "wb") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          env=worker_env))  # fmt: skip
    try:
        for p in procs:
            p.wait(timeout=300)
    finally:
        kill_left(procs)
    return first_step("\n".join(log.read_text() for log in logs)) - t0


def orchestrated_run(root: Path, home: Path, image: str, env: dict[str, str]) -> float:
    """The same trainer launched by orchestrate with `[container]`: launch to the first step."""
    config = root / "bench-image.toml"
    config.write_text(
        f'[job]\nname = "bench-image"\nshared_dir = "{root / "shared"}"\n'
        f'[entrypoint]\nscript = "{TRAINER}"\nargs = ["--epochs", "3"]\n'
        f'env = {{ TF_CPP_MIN_LOG_LEVEL = "2" }}\nworkdir = "{REPO}"\n'
        '[backend]\ntype = "local"\nworkers = 2\n'
        f'[container]\nimage = "{image}"\n'
    )
    no_kept_standbys()
    saved = dict(os.environ)
    os.environ.update(env)  # the launch's runtime settings (CONTAINERS_CONF where needed)
    try:
        t0 = time.time()
        out = launch(config, home, fresh=False)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return first_step(out) - t0


def warm_restart(root: Path, home: Path, image: str, env: dict[str, str]) -> dict[str, float]:
    """P14's restart (scripts/benchmarks/warm.py) with the trainers and their keepers in the
    image."""
    from scripts.benchmarks.warm import kill_and_resume

    saved = dict(os.environ)
    os.environ.update(env)  # the runtime's settings (CONTAINERS_CONF where needed)
    try:
        return kill_and_resume(root, home, warm=True, extra=f'[container]\nimage = "{image}"\n')
    finally:
        os.environ.clear()
        os.environ.update(saved)


def container_rows(root: Path, home: Path, rounds: int, p2c: Row, p14c: Row) -> None:
    why = unavailable()
    if why is not None:
        p2c.skipped = p14c.skipped = why
        return
    image, env = image_and_env()
    (root / "shared").mkdir(exist_ok=True)
    for n in range(rounds):
        print(f"P2c: round {n + 1}/{rounds} ...", flush=True)
        if n % 2:
            ours, raw = orchestrated_run(root, home, image, env), raw_run(root, image, env)
        else:
            raw, ours = raw_run(root, image, env), orchestrated_run(root, home, image, env)
        p2c.baseline.append(raw)
        p2c.values.append(ours)
    p2c.note = f"image {image}"
    for n in range(rounds):
        print(f"P14c: round {n + 1}/{rounds} ...", flush=True)
        baseline = raw_run(root, image, env)
        warm = warm_restart(root, home, image, env)
        if not warm["warm_used"]:
            p14c.failed_rounds += 1  # it restarted cold: not a warm restart's figure
            continue
        p14c.baseline.append(baseline)
        p14c.values.append(warm["resumed"])
    p14c.note = f"image {image}; the keepers and their standbys run in containers of the image"


def main() -> int:
    p2c, p14c = row(), warm_row()
    return measure_alone(
        __doc__ or "", "scripts/benchmarks/container.py", [p2c, p14c],
        lambda root, rounds: container_rows(root, root / "home", rounds, p2c, p14c),
        flag="--rounds", default=3,
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
