"""A container image for podman with Debian's Python 3.11, TensorFlow and tf-keras, for tests
that run trainers in containers. Built without an image registry: debootstrap makes a minimal
bookworm root file system, TensorFlow and tf-keras (the versions in uv.lock) are installed into
its /usr/local/lib/python3.11/dist-packages from this host, and `podman import` makes the image.

`IMAGE` is named by the TensorFlow version and a short hash of the recipe (this file and the
locked versions), so a changed recipe builds a new image. `ensure_image` builds it when absent,
under a file lock so that two processes never build it at once. Needs root, debootstrap, tar,
podman, and uv (or pip) with access to deb.debian.org and PyPI; pulls no image from a registry.

    python -m tests.images.tf_image  # ensure the image; print its name, build time and size"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"  # Debian 12: its python3 is 3.11
MIRROR = "http://deb.debian.org/debian"
PYTHON_VERSION = "3.11"
SITE = f"usr/local/lib/python{PYTHON_VERSION}/dist-packages"  # on Debian python3's sys.path
WORK = Path("/var/tmp")  # the root file system is built here (about 3 GB at its largest)
LOCK = WORK / "orchestrate-tf-image.lock"
# Removed from the root file system before the import: documentation, caches and logs, and
# what a Python trainer never reads (TensorFlow's C++ headers, the tests of numpy and h5py).
PRUNED = (
    "usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*",
    "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*",
    "var/cache/debconf/*-old", "var/log/*.log", "var/log/apt/*",
    f"{SITE}/tensorflow/include", f"{SITE}/numpy/tests", f"{SITE}/numpy/*/tests",
    f"{SITE}/h5py/tests",
)  # fmt: skip

Log = Callable[[str], None]


class BuildError(RuntimeError):
    """The image could not be built, or the built image does not import TensorFlow."""


def locked_versions() -> dict[str, str]:
    """The versions in the repository's uv.lock (one each) of TensorFlow, tf-keras and what the
    bundled example reads its dataset with (scikit-learn)."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    versions: dict[str, str] = {}
    for name in ("tensorflow", "tf-keras", "scikit-learn"):
        found = {p["version"] for p in lock.get("package", []) if p.get("name") == name}
        if len(found) != 1:
            raise BuildError(f"uv.lock: expected one version of {name}, found {sorted(found)}")
        versions[name] = found.pop()
    return versions


VERSIONS = locked_versions()
TF_VERSION = VERSIONS["tensorflow"]
RECIPE_HASH = hashlib.sha256(
    Path(__file__).read_bytes() + repr(sorted(VERSIONS.items())).encode()
).hexdigest()[:10]
IMAGE = f"localhost/orchestrate-tf:{TF_VERSION}-{RECIPE_HASH}"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(command: Sequence[str | Path], log: Log, what: str) -> str:
    """Run a command, its output captured; its stdout, or BuildError with the output's tail."""
    log(f"tf_image: {what}")
    done = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, errors="replace"
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise BuildError(f"{what} failed (exit {done.returncode}): {command}\n{tail}")
    return done.stdout


def image_present(name: str) -> bool:
    return subprocess.run(["podman", "image", "exists", name], check=False).returncode == 0


def image_size(name: str) -> int:
    """The image's size in bytes, as podman reports it."""
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", name],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(done.stdout.strip())


def _requirements() -> None:
    if os.geteuid() != 0:
        raise BuildError("building the TensorFlow image needs root (debootstrap, rootful podman)")
    missing = [t for t in ("debootstrap", "tar", "podman", "chroot") if not shutil.which(t)]
    if missing:
        raise BuildError(f"building the TensorFlow image needs {', '.join(missing)} on PATH")


def _install_command(target: Path) -> list[str]:
    """TensorFlow and tf-keras for Debian's Python 3.11 on x86_64, installed from this host:
    with uv when it is on PATH (its cache may already hold the wheels), else with pip."""
    specs = [f"{name}=={version}" for name, version in sorted(VERSIONS.items())]
    uv = shutil.which("uv")
    if uv:
        return [
            uv, "pip", "install", "--quiet", "--target", str(target),
            "--python-version", PYTHON_VERSION, "--python-platform", "x86_64-manylinux_2_28",
            *specs,
        ]  # fmt: skip
    # pip takes each platform a wheel may name (it does not widen manylinux_2_28 to older ones)
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)]
    return [
        sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target",
        str(target), "--only-binary=:all:", "--python-version", PYTHON_VERSION,
        "--implementation", "cp",
        *(f"--platform={p}" for p in [*platforms, "manylinux2014_x86_64"]), *specs,
    ]  # fmt: skip


def _prune(rootfs: Path) -> None:
    for pattern in PRUNED:
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def _move_scripts(rootfs: Path) -> None:
    """The console scripts pip's --target left in dist-packages/bin, moved to /usr/local/bin
    with the image's python3 in their first line (rewritten as new files: an installer may
    have hard-linked them to its cache)."""
    scripts = rootfs / SITE / "bin"
    if not scripts.is_dir():
        return
    bin_dir = rootfs / "usr/local/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for script in sorted(scripts.iterdir()):
        data = script.read_bytes()
        if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
            data = b"#!/usr/bin/python3\n" + data.split(b"\n", 1)[1]
        (bin_dir / script.name).write_bytes(data)
        (bin_dir / script.name).chmod(0o755)
        script.unlink()
    scripts.rmdir()


def _unmount_below(root: Path) -> None:
    """Unmount whatever is mounted at or below root (debootstrap's /proc and /sys, if it was
    interrupted), deepest first, so that removing root never reaches into them."""
    prefix = str(root.resolve())
    mounted = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                mounted.append(point)
    for point in sorted(mounted, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)


def _remove(path: Path) -> None:
    _unmount_below(path)
    # --one-file-system: never into a file system still mounted below it
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def _remove_image(name: str) -> None:
    subprocess.run(["podman", "image", "rm", "--force", name], capture_output=True, check=False)


def _import(rootfs: Path, name: str, log: Log) -> None:
    log(f"tf_image: podman import as {name}")
    tar = subprocess.Popen(
        ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
    )
    assert tar.stdout is not None
    try:
        done = subprocess.run(
            ["podman", "import", "--change", 'CMD ["python3"]', "-", name],
            stdin=tar.stdout, capture_output=True, text=True,
        )  # fmt: skip
    finally:
        tar.stdout.close()
        tar_rc = tar.wait()
    if tar_rc != 0 or done.returncode != 0:
        raise BuildError(f"tar (exit {tar_rc}) | podman import (exit {done.returncode}) failed: "
                         f"{done.stderr.strip()}")  # fmt: skip


def podman_env(image: str) -> dict[str, str]:
    """What podman needs in the environment to start a container of `image` (one with python3)
    on this host: nothing on a usual host; on a host that is itself a container (no permission
    to raise ulimits, a hybrid cgroup layout crun 1.8 refuses), a containers.conf of our own
    (CONTAINERS_CONF) with lower ulimits and crun run in a mount namespace without the cgroup2
    mount. Tried in that order."""
    conf = WORK / "orchestrate-podman"
    tried = [{}, {"CONTAINERS_CONF": str(conf / "containers.conf")}]
    for extra in tried:
        if extra:
            _write_sandbox(conf)
        env = {**os.environ, **extra}
        run = ["podman", "run", "--rm", "--network=host", "--pid=host", image, "python3", "-c", ""]
        if subprocess.run(run, env=env, capture_output=True, check=False).returncode == 0:
            return extra
    raise BuildError("podman cannot start a container on this host, even with lower ulimits "
                     "and crun outside the cgroup2 mount")  # fmt: skip


def _write_sandbox(conf: Path) -> None:
    conf.mkdir(mode=0o700, exist_ok=True)
    crun = conf / "crun"
    inner = conf / "crun-in-namespace"
    inner.write_text(
        "#!/bin/sh\n# crun 1.8 refuses a hybrid cgroup layout: without the cgroup2 mount here.\n"
        "# Under `ip netns exec` (the SSH test bed's hosts) /sys is a fresh sysfs without the\n"
        "# cgroup mounts: this host's v1 hierarchies are mounted again first.\n"
        "if ! mountpoint -q /sys/fs/cgroup; then\n"
        "  mount -t tmpfs cgroup_root /sys/fs/cgroup\n"
        + "".join(
            f"  mkdir -p {d} && mount -t cgroup -o {o} cgroup {d}\n" for d, o in _cgroups_v1()
        )
        + "fi\n"
        'umount /sys/fs/cgroup/unified 2>/dev/null\nexec /usr/bin/crun "$@"\n'
    )
    crun.write_text(f'#!/bin/sh\nexec unshare --mount --propagation private /bin/sh {inner} "$@"\n')
    crun.chmod(0o700)
    (conf / "containers.conf").write_text(
        '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
        f'[engine]\nruntime = "crun"\n[engine.runtimes]\ncrun = ["{crun}"]\n'
    )


def _cgroups_v1() -> list[tuple[str, str]]:
    """(mount point, options) of each cgroup v1 hierarchy mounted here."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, kind, options, *_ = line.split()
        if kind == "cgroup" and point.startswith("/sys/fs/cgroup/"):
            names = [o for o in options.split(",") if o not in ("rw", "ro", "relatime")]
            found.append((point, ",".join(names)))
    return found


def check(name: str, log: Log) -> None:
    """The image's python3 imports TensorFlow and tf-keras, at the locked versions."""
    code = "import sklearn, tensorflow as tf, tf_keras; print(tf.__version__, tf_keras.__version__)"
    command = ["podman", "run", "--rm", "--network=host", name, "python3", "-c", code]
    log(f"tf_image: check: import tensorflow in {name}")
    env = {**os.environ, **podman_env(name)}
    done = subprocess.run(command, capture_output=True, text=True, errors="replace", env=env)
    lines = done.stdout.strip().splitlines()
    want = f"{TF_VERSION} {VERSIONS['tf-keras']}"
    if done.returncode == 0 and lines and lines[-1].strip() == want:
        return
    tail = "\n".join(done.stderr.strip().splitlines()[-20:])
    if done.returncode in (125, 126):  # podman's own, or the OCI runtime's: no container ran
        raise BuildError(f"podman could not start a container of {name} on this host (exit "
                         f"{done.returncode}), so the image is unchecked (inside a container, "
                         "podman may need its ulimits and cgroups set in a containers.conf, "
                         f"named by CONTAINERS_CONF):\n{tail}")  # fmt: skip
    raise BuildError(f"{name}: `python3 -c 'import tensorflow, tf_keras'` should print {want!r}; "
                     f"exit {done.returncode}, printed {done.stdout!r}\n{tail}")  # fmt: skip


def build(log: Log = _stderr) -> float:
    """Build IMAGE and check it; the seconds that took. Imported under another tag, named IMAGE
    once its check passed (an image that fails it is removed); the root file system, under
    /var/tmp, is removed whatever happens."""
    _requirements()
    unchecked = f"{IMAGE}-unchecked"
    _remove_image(unchecked)  # a killed build's
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="orchestrate-tf-", dir=WORK))
    rootfs = work / "rootfs"
    try:
        _run(
            ["debootstrap", "--variant=minbase", "--include=python3,ca-certificates", SUITE,
             rootfs, MIRROR],
            log, f"debootstrap {SUITE} into {rootfs}",
        )  # fmt: skip
        _run(
            _install_command(rootfs / SITE), log,
            f"install {', '.join(f'{n} {v}' for n, v in sorted(VERSIONS.items()))}",
        )  # fmt: skip
        _move_scripts(rootfs)
        _prune(rootfs)
        # Compiled once here, with the image's own python3, rather than in every container.
        _run(
            ["chroot", rootfs, "/usr/bin/python3", "-m", "compileall", "-q", f"/{SITE}"],
            log, "compile the installed packages",
        )  # fmt: skip
        _import(rootfs, unchecked, log)
    finally:
        _remove(work)
    try:
        check(unchecked, log)
        _run(["podman", "tag", unchecked, IMAGE], log, f"tag it {IMAGE}")
    except BaseException:
        _remove_image(unchecked)
        raise
    # untag IMAGE NAME: that name only (with no NAME, podman untag removes every name)
    subprocess.run(["podman", "untag", unchecked, unchecked], capture_output=True, check=False)
    return time.monotonic() - started


def ensure_image(log: Log = _stderr) -> tuple[str, float | None]:
    """IMAGE, and the seconds its build took if it was built now (None: it was there)."""
    if image_present(IMAGE):
        return IMAGE, None
    WORK.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it
        if image_present(IMAGE):
            return IMAGE, None
        return IMAGE, build(log)


def main() -> None:
    try:
        name, seconds = ensure_image()
    except BuildError as error:
        sys.exit(f"tf_image: {error}")
    how = "cached" if seconds is None else f"built in {seconds:.0f} s"
    print(f"{name}: {how}, {image_size(name) / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
