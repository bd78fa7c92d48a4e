#!/usr/bin/env python3
"""What installing orchestrate costs: the coordinator alone (`pip install orchestrate`) against
everything (`orchestrate[all]`: TensorFlow, tf-keras, the example's scikit-learn, TensorBoard,
matplotlib), each into a fresh virtual environment with an empty package cache (every wheel
downloaded), measured in the same run. Needs uv and the package index.

    uv run python -m scripts.benchmarks.install [--out docs/bench/install.json]

Prints, per install: wall seconds, size on disk, packages, and the CLI's start (`orchestrate
--version`, best of 5), then the ratios coordinator/everything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _size(path: Path) -> int:
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            file = Path(folder) / name
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def measure(target: str, work: Path) -> dict[str, object]:
    """Install `target` (a pip requirement) into a new venv with a cold cache."""
    venv, cache = work / "venv", work / "cache"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "VIRTUAL_ENV": str(venv)}
    began = time.monotonic()
    subprocess.run(["uv", "pip", "install", "-q", target], check=True, env=env, cwd=REPO)
    seconds = time.monotonic() - began
    listed = subprocess.run(
        ["uv", "pip", "list", "--format", "json"], check=True, env=env, capture_output=True
    )
    starts = []
    for _ in range(5):
        t0 = time.monotonic()
        subprocess.run([str(venv / "bin" / "orchestrate"), "--version"], check=True,
                       capture_output=True)  # fmt: skip
        starts.append(time.monotonic() - t0)
    # The coordinator alone still validates and plans the example (it never imports TensorFlow).
    validate = subprocess.run(
        [str(venv / "bin" / "orchestrate"), "validate", str(REPO / "cluster.example.toml")],
        capture_output=True, text=True, cwd=work,
    )  # fmt: skip
    return {
        "target": target,
        "seconds": round(seconds, 1),
        "megabytes": round(_size(venv) / 1e6, 1),
        "packages": len(json.loads(listed.stdout)),
        "cli_start_s": round(min(starts), 3),
        "validate_ok": validate.returncode == 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "install.json")
    args = parser.parse_args()
    if shutil.which("uv") is None:
        print("bench_install: needs uv (pip install uv)", file=sys.stderr)
        return 2
    results = {}
    for name, target in (("coordinator", "."), ("everything", ".[all]")):
        with tempfile.TemporaryDirectory(prefix=f"orch-install-{name}-") as work:
            results[name] = measure(target, Path(work))
        row = results[name]
        print(f"{name:12} {target:8} {row['seconds']:6.1f} s  {row['megabytes']:7.1f} MB  "
              f"{row['packages']:3} packages  CLI start {row['cli_start_s'] * 1000:.0f} ms  "
              f"validate {'ok' if row['validate_ok'] else 'FAILED'}")  # fmt: skip
    light, full = results["coordinator"], results["everything"]
    ratios = {
        key: round(float(light[key]) / float(full[key]), 3)  # type: ignore[arg-type]
        for key in ("seconds", "megabytes", "packages", "cli_start_s")
    }
    print("coordinator / everything: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    args.out.write_text(json.dumps({**results, "ratios": ratios}, indent=2) + "\n")
    return 0 if light["validate_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
