"""Preflight probe, run on each host by the coordinator before anything starts:
`python -m worker.probe --shared-dir DIR --ports N --token-file PATH`.

Prints one JSON object: interpreter and TensorFlow versions (read from package metadata, never
by importing TensorFlow), whether the shared directory is writable, its free space, N free TCP
ports probed on this host, and writes a token file that the coordinator then asks every other
host to read back (proof that the directory is really shared). Standard library only.
`--read-tokens PATH...` prints which of those token files this host can read.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

from worker.spec import HOST_PROTOCOL


def _version(dist: str) -> str | None:
    """A distribution's version. Looks for its .dist-info directory on sys.path first (a few
    ms), then asks importlib.metadata (about 40 ms)."""
    prefix = dist.replace("-", "_").lower() + "-"
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info") and name.lower().startswith(prefix):
                version = name[len(prefix) : -len(".dist-info")]
                if version and version[0].isdigit():
                    return version
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free now; all held open together so they are distinct."""
    held = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            held.append(sock)
        return [s.getsockname()[1] for s in held]
    finally:
        for sock in held:
            sock.close()


def probe(
    shared_dir: str,
    ports: int,
    token_file: str | None,
    token: str,
    gpu: dict[str, Any] | None = None,
) -> dict[str, object]:
    """`gpu` (when the job asks for GPUs): {"job_id", "per_task", "per_gpu"}; the report then
    has "gpu" (worker.gpu_probe), and with "per_gpu" one port per task the GPUs make."""
    report: dict[str, object] = {
        "hostname": socket.gethostname(),
        "python": "{}.{}.{}".format(*sys.version_info[:3]),
        "tensorflow": _version("tensorflow") or _version("tensorflow-cpu"),
        "tf_keras": _version("tf-keras"),
        "protocol": HOST_PROTOCOL,
        "problems": [],
    }
    problems: list[str] = report["problems"]  # type: ignore[assignment]
    if os.path.exists(shared_dir) and not os.path.isdir(shared_dir):
        problems.append(f"shared_dir {shared_dir} is not a directory")
    elif not os.path.isdir(shared_dir):
        problems.append(f"shared_dir {shared_dir} does not exist")
    elif not os.access(shared_dir, os.W_OK | os.X_OK):
        problems.append(f"shared_dir {shared_dir} is not writable")
    else:
        stat = os.statvfs(shared_dir)
        report["free_bytes"] = stat.f_bavail * stat.f_frsize
        if token_file:
            try:
                os.makedirs(os.path.dirname(token_file), mode=0o700, exist_ok=True)
                with open(token_file, "w") as fh:
                    fh.write(token)
            except OSError as exc:
                problems.append(f"cannot write to shared_dir: {exc}")
    if gpu is not None:
        from worker.gpu_probe import probe_gpus

        gpus = probe_gpus(str(gpu.get("job_id", "")))
        problems.extend(gpus.pop("problems"))
        report["gpu"] = gpus
        if gpu.get("per_gpu"):
            ports = len(gpus["gpus"]) // max(int(gpu.get("per_task", 1)), 1)
    try:
        report["ports"] = free_ports(ports)
    except OSError as exc:
        problems.append(f"cannot probe a free port: {exc}")
    return report


def read_tokens(paths: list[str]) -> dict[str, str | None]:
    result: dict[str, str | None] = {}
    for path in paths:
        try:
            with open(path) as fh:
                result[path] = fh.read()
        except OSError:
            result[path] = None
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.probe")
    parser.add_argument("--shared-dir")
    parser.add_argument("--ports", type=int, default=1)
    parser.add_argument("--token-file")
    parser.add_argument("--token", default="")
    parser.add_argument("--read-tokens", nargs="*")
    args = parser.parse_args(argv)
    if args.read_tokens is not None:
        print(json.dumps(read_tokens(args.read_tokens)))
        return 0
    print(json.dumps(probe(args.shared_dir, args.ports, args.token_file, args.token)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
