"""A Docker daemon of the test suite's own (Debian's docker.io), with the test image loaded from
podman's store: its own data root, socket and pid file under /var/tmp/orchestrate-docker, no
bridge and no iptables rules (the jobs use host networking), so a system daemon, if any, is
neither used nor touched. Root only."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path("/var/tmp/orchestrate-docker")
SOCKET = ROOT / "docker.sock"
HOST = f"unix://{SOCKET}"
BRIDGE_NF = [Path(f"/proc/sys/net/bridge/bridge-nf-call-{t}") for t in ("iptables", "ip6tables")]


@contextmanager
def docker_daemon() -> Iterator[dict[str, str]]:
    """Start the daemon, wait for it to answer, yield the environment a `docker` client needs
    (DOCKER_HOST), then stop the daemon (SIGTERM, then SIGKILL) whatever happened."""
    ROOT.mkdir(mode=0o700, exist_ok=True)
    # Left as they were: a daemon with a bridge sends bridged traffic (the test beds') through
    # iptables; --bridge=none should not, and is checked.
    bridged = {p: p.read_text() for p in BRIDGE_NF if p.exists()}
    log = open(ROOT / "dockerd.log", "ab")  # noqa: SIM115 - closed with the daemon
    daemon = subprocess.Popen(
        ["dockerd", "--data-root", str(ROOT / "data"), "--exec-root", str(ROOT / "run"),
         "--pidfile", str(ROOT / "dockerd.pid"), "--host", HOST, "--bridge=none",
         "--iptables=false", "--ip-masq=false"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    env = {"DOCKER_HOST": HOST}
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env={**os.environ, **env},
                             capture_output=True).returncode != 0:  # fmt: skip
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start: see {ROOT / 'dockerd.log'}")
            time.sleep(0.5)
        yield env
    finally:
        # Our own child, not yet reaped (so its pid is still it), leading its own session.
        if daemon.poll() is None and daemon.pid > 1 and os.getpgid(daemon.pid) == daemon.pid:
            os.killpg(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:  # still unreaped: still our daemon's group
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        log.close()
        for path, value in bridged.items():
            if path.read_text() != value:
                path.write_text(value)


def load_image(image: str, env: dict[str, str]) -> None:
    """The podman image in the daemon's store (podman save | docker load), unless there."""
    full = {**os.environ, **env}
    if subprocess.run(["docker", "image", "inspect", image], env=full,
                      capture_output=True).returncode == 0:  # fmt: skip
        return
    save = subprocess.Popen(["podman", "save", image], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    loaded = subprocess.run(["docker", "load"], stdin=save.stdout, env=full,
                            capture_output=True, text=True)  # fmt: skip
    assert save.stdout is not None
    save.stdout.close()
    if save.wait() != 0 or loaded.returncode != 0:
        raise RuntimeError(f"could not load {image} into Docker: {loaded.stderr.strip()}")
