"""An image registry of the test suite's own (Debian's docker-registry, the CNCF
distribution registry), on loopback with its storage under a temporary directory, and a
registries.conf that lets podman reach it without TLS (CONTAINERS_REGISTRIES_CONF). Nothing
is pulled from outside: the suite pushes its own image into it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def image_registry(root: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """Start the registry, wait for it to answer, yield its address ("127.0.0.1:PORT") and the
    environment podman needs to use it, then stop it (SIGTERM, then SIGKILL) whatever
    happened."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    config = root / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: {address}\n"
    )
    conf = root / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{address}"\ninsecure = true\n')
    log = open(root / "registry.log", "ab")  # noqa: SIM115 - closed with the registry
    registry = subprocess.Popen(
        ["docker-registry", "serve", str(config)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                if registry.poll() is not None or time.monotonic() > deadline:
                    why = f"the registry did not start: see {root / 'registry.log'}"
                    raise RuntimeError(why) from None
                time.sleep(0.2)
        yield address, {"CONTAINERS_REGISTRIES_CONF": str(conf)}
    finally:
        # Our own child, not yet reaped (so its pid is still it), leading its own session.
        if (
            registry.poll() is None
            and registry.pid > 1
            and os.getpgid(registry.pid) == registry.pid
        ):
            os.killpg(registry.pid, signal.SIGTERM)
            try:
                registry.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(registry.pid, signal.SIGKILL)
                registry.wait()
        log.close()
