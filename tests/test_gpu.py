"""GPU hosts: gpus_per_task and slots = "per_gpu" in cluster.toml, nvidia-smi's output and
TensorFlow's build_info read on the host, the preflight's verdict, each task's GPUs, and whole
launches on the local backend with a stand-in `nvidia-smi` (no GPU needed)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.local import LocalHosts
from orchestrator.config import LocalBackend, parse_config
from orchestrator.errors import ConfigError
from orchestrator.planning.gpus import Gpu, HostGpus, gpu_problems, host_gpus, summary, task_env
from orchestrator.planning.plan import build_plan, task_slots
from orchestrator.planning.task_specs import make_specs
from tests.conftest import CliResult, fake_job, status_json, wait_for
from worker import gpu_probe

# --- cluster.toml ---------------------------------------------------------------------------


def _config(backend: dict[str, Any], **sections: Any) -> Any:
    raw = {
        "job": {"name": "g", "shared_dir": "/shared"},
        "entrypoint": {"module": "m"},
        "backend": backend,
        **sections,
    }
    return parse_config(raw)


def _refused(backend: dict[str, Any], **sections: Any) -> str:
    from orchestrator.config.rules import check_semantics

    with pytest.raises(ConfigError) as exc:
        check_semantics(_config(backend, **sections), "c.toml")
    return str(exc.value)


SSH = {"type": "ssh", "hosts": [{"address": "10.0.0.1", "name": "gpu0"}]}


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        (
            {"type": "local", "workers": 2, "gpus_per_task": 0},
            "backend.gpus_per_task: must be >= 1",
        ),
        ({"type": "local", "workers": 2, "gpus_per_task": "2"}, "backend.gpus_per_task: Input"),
        (
            {"type": "local", "workers": "per-gpu"},
            "backend.workers: Input should be a valid integer",
        ),
        (
            {**SSH, "hosts": [{"address": "a", "slots": "all"}]},
            "backend.hosts[0].slots: Input should be a valid integer or \"per_gpu\" (got 'all')",
        ),
        ({**SSH, "hosts": [{"address": "a", "slots": 0}]}, "backend.hosts[0].slots: must be >= 1"),
        (
            {**SSH, "hosts": [{"address": "a", "gpus_per_task": 65}]},
            "backend.hosts[0].gpus_per_task: must be <= 64 (got 65)",
        ),
        (
            {"type": "slurm", "nodes": 2, "gpus_per_task": 1},
            "backend.gpus_per_task: unknown key on the Slurm backend: Slurm assigns GPUs itself; "
            "ask for them with backend.gres",
        ),
    ],
)
def test_bad_gpu_keys_are_one_line_naming_the_key(backend: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        _config(backend)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_gpu_rules_across_keys() -> None:
    env = {"module": "m", "env": {"CUDA_VISIBLE_DEVICES": "0"}}
    assert "entrypoint.env.CUDA_VISIBLE_DEVICES: orchestrate sets it" in _refused(
        {"type": "local", "workers": 2, "gpus_per_task": 1}, entrypoint=env
    )
    assert 'backend.hosts[0].slots = "per_gpu" plans one per GPU' in _refused(
        {**SSH, "hosts": [{"address": "a", "slots": "per_gpu"}]}, strategy={"kind": "mirrored"}
    )
    # Without GPUs asked, the user's own CUDA_VISIBLE_DEVICES is theirs.
    _config({"type": "local", "workers": 2}, entrypoint=env)
    # min_workers beyond what is known: a per_gpu host's width is counted at launch.
    _config({**SSH, "hosts": [{"address": "a", "slots": "per_gpu"}]}, restart={"min_workers": 4})


# --- the plan: which GPUs each task gets ----------------------------------------------------


def test_each_task_gets_its_own_gpus_in_host_order() -> None:
    cfg = _config(
        {
            "type": "ssh",
            "gpus_per_task": 2,
            "hosts": [
                {"address": "10.0.0.1", "name": "a", "slots": 2},
                {"address": "10.0.0.2", "name": "b", "slots": 3, "gpus_per_task": 1},
                {"address": "10.0.0.3", "name": "c"},
            ],
        }
    )
    assert [(s.host_label, s.gpus) for s in task_slots(cfg)] == [
        ("a", (0, 1)),
        ("a", (2, 3)),
        ("b", (0,)),
        ("b", (1,)),
        ("b", (2,)),
        ("c", (0, 1)),
    ]
    plan = build_plan(cfg, list(range(20000, 20006)))
    assert [t.gpus for t in plan.tasks][:2] == [(0, 1), (2, 3)]


def test_per_gpu_counts_tasks_from_the_preflight_and_stands_as_one_before() -> None:
    cfg = _config(
        {
            "type": "ssh",
            "hosts": [
                {"address": "10.0.0.1", "name": "a", "slots": "per_gpu"},
                {"address": "10.0.0.2", "name": "b", "slots": "per_gpu", "gpus_per_task": 2},
                {"address": "10.0.0.3", "name": "cpu"},
            ],
        }
    )
    assert [(s.host_label, s.gpus) for s in task_slots(cfg)] == [
        ("a", (0,)),
        ("b", (0, 1)),
        ("cpu", ()),
    ]
    slots = task_slots(cfg, gpu_counts={0: 3, 1: 5})  # b: 5 GPUs make 2 tasks of 2
    assert [(s.host_label, s.gpus) for s in slots] == [
        ("a", (0,)),
        ("a", (1,)),
        ("a", (2,)),
        ("b", (0, 1)),
        ("b", (2, 3)),
        ("cpu", ()),
    ]


def test_no_gpu_asked_leaves_the_environment_alone() -> None:
    cfg = _config({"type": "local", "workers": 2})
    plan = build_plan(cfg, [41001, 41002])
    specs = make_specs(cfg, plan, "j", 0, LocalHosts(cfg.backend))
    assert all(t.gpus == () for t in plan.tasks)
    assert not any("CUDA" in k or "GPU" in k for s in specs for k in s.env)


def test_specs_carry_each_tasks_gpus_and_memory_growth_unless_opted_out() -> None:
    cfg = _config({"type": "local", "workers": 2, "gpus_per_task": 2})
    assert isinstance(cfg.backend, LocalBackend)
    plan = build_plan(cfg, [41001, 41002])
    specs = make_specs(cfg, plan, "j", 0, LocalHosts(cfg.backend))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0,1", "2,3"]
    assert all(s.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for s in specs)
    assert all(s.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" for s in specs)
    off = _config(
        {"type": "local", "workers": 2, "gpus_per_task": 2},
        strategy={"gpu_memory_growth": False},
    )
    specs = make_specs(off, build_plan(off, [1, 2]), "j", 0, LocalHosts(cfg.backend))
    assert not any("TF_FORCE_GPU_ALLOW_GROWTH" in s.env for s in specs)
    assert task_env((), True) == {}


# --- what nvidia-smi and TensorFlow's build_info say ----------------------------------------

GPUS_CSV = """\
0, GPU-aaaa, NVIDIA H200, 1, 143771, 550.54.15
1, GPU-bbbb, NVIDIA H200, 20480, 143771, 550.54.15
2, GPU-cccc, NVIDIA RTX A6000, Ada, [N/A], 49140, 550.54.15
"""


def test_nvidia_smi_csv_parsing() -> None:
    gpus = gpu_probe.parse_gpus(GPUS_CSV)
    assert [(g["index"], g["uuid"], g["name"], g["memory_total"]) for g in gpus] == [
        (0, "GPU-aaaa", "NVIDIA H200", 143771),
        (1, "GPU-bbbb", "NVIDIA H200", 143771),
        (2, "GPU-cccc", "NVIDIA RTX A6000, Ada", 49140),  # a comma in the name
    ]
    assert gpus[1]["memory_used"] == 20480 and gpus[2]["memory_used"] is None
    assert gpus[0]["driver"] == "550.54.15"
    assert gpu_probe.parse_gpus("") == []
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        gpu_probe.parse_gpus("No devices were found\n")
    apps = gpu_probe.parse_apps("GPU-bbbb, 4242, 20470\nGPU-aaaa, 77, [N/A]\n\n")
    assert apps == [
        {"uuid": "GPU-bbbb", "pid": 4242, "memory": 20470},
        {"uuid": "GPU-aaaa", "pid": 77, "memory": None},
    ]
    assert gpu_probe.parse_apps("No running processes found\n") == []


def test_cuda_version_from_nvidia_smi_header_or_query() -> None:
    header = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |"
    assert gpu_probe.parse_cuda_version(header) == "12.4"
    assert gpu_probe.parse_cuda_version("    CUDA Version                    : 12.8\n") == "12.8"
    assert gpu_probe.parse_cuda_version("no such line") is None


def test_tensorflow_build_info_read_as_text(tmp_path: Path) -> None:
    modern = (
        "build_info = collections.OrderedDict([('cpu_compiler', 'clang'), "
        "('cuda_version', '12.5.1'), ('cudnn_version', '9'), ('is_cuda_build', True)])\n"
    )
    assert gpu_probe.parse_build_info(modern) == {"is_cuda_build": True, "cuda_version": "12.5.1"}
    old = "is_cuda_build = True\ncuda_version_number = '10.1'\n"
    assert gpu_probe.parse_build_info(old) == {"is_cuda_build": True, "cuda_version": "10.1"}
    cpu = "build_info = collections.OrderedDict([('is_cuda_build', False)])"
    assert gpu_probe.parse_build_info(cpu) == {"is_cuda_build": False, "cuda_version": None}
    site = tmp_path / "site"
    (site / "tensorflow/python/platform").mkdir(parents=True)
    (site / "tensorflow/python/platform/build_info.py").write_text(modern)
    found = gpu_probe.tensorflow_build([str(tmp_path / "nothing"), str(site)])
    assert found is not None and found["cuda_version"] == "12.5.1"
    assert gpu_probe.tensorflow_build([str(tmp_path)]) is None


# --- the preflight's verdict ----------------------------------------------------------------


def _host(count: int = 4, busy: dict[int, int] | None = None, **kw: Any) -> HostGpus:
    gpus = tuple(
        Gpu(i, "NVIDIA H200", 143771, 1, ((4242, 812),) if busy and i in busy else ())
        for i in range(count)
    )
    return HostGpus(
        gpus,
        **{"driver": "550.54", "cuda": "12.4", "tf_cuda_build": True, "tf_cuda": "12.3.2", **kw},
    )


def test_gpu_problems() -> None:
    assert gpu_problems(_host(), 2, 2) == []
    assert gpu_problems(_host(3), 2, 2) == ["3 GPU(s) found, 4 needed (2 task(s) x 2 GPU(s))"]
    assert gpu_problems(_host(1), 2, None) == [
        'no GPU for a task: 1 GPU(s) found, slots = "per_gpu" with gpus_per_task = 2'
    ]
    assert gpu_problems(_host(busy={1: 812}), 1, 2) == [
        "GPU 1 in use by pid 4242 (812 MiB) (orchestrate launch --force uses busy GPUs anyway)"
    ]
    assert gpu_problems(_host(busy={1: 812}), 1, 2, force=True) == []
    assert gpu_problems(_host(busy={3: 812}), 1, 2) == []  # a GPU no task gets
    assert gpu_problems(_host(tf_cuda_build=False), 1, 1, tensorflow="2.21.0") == [
        "TensorFlow 2.21.0 here is a CPU-only build: it cannot use the GPUs asked for (install "
        "a CUDA build, e.g. pip install 'tensorflow[and-cuda]')"
    ]
    assert gpu_problems(_host(tf_cuda="12.5.1"), 1, 1, tensorflow="2.21.0") == [
        "NVIDIA driver 550.54 supports CUDA 12.4, older than the CUDA 12.5 TensorFlow 2.21.0 "
        "was built with: update the driver"
    ]
    assert gpu_problems(_host(cuda=""), 1, 1) == []  # unknown: not judged
    assert gpu_problems(_host(tf_cuda_build=None), 1, 1) == []  # no build_info found


def test_summary_line() -> None:
    assert (
        summary("gpu0", _host(2)) == "gpu0: 2x NVIDIA H200 (143771 MiB), driver 550.54, CUDA 12.4"
    )
    mixed = HostGpus((Gpu(0, "A100", 40960, 0), Gpu(1, "T4", 15360, 0, ((9, 5),))), "535.1", "12.2")
    assert (
        summary("b", mixed, used=1)
        == "b: 1x A100 (40960 MiB) + 1x T4 (15360 MiB), driver 535.1, CUDA 12.2"
    )
    assert summary("b", mixed).endswith("; GPU 1 in use by pid 9 (5 MiB): used anyway (--force)")
    assert host_gpus({"gpus": [], "driver": "", "cuda": ""}) == HostGpus(())


# --- a stand-in nvidia-smi ------------------------------------------------------------------

STAND_IN = """\
#!{python}
import json, sys
spec = json.load(open({spec!r}))
args = sys.argv[1:]
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if query is not None:
    for i in range(spec["gpus"]):
        values = {{"index": i, "uuid": f"GPU-{{i:04d}}", "name": "NVIDIA H200",
                   "memory.used": 1, "memory.total": 143771, "driver_version": spec["driver"],
                   "utilization.gpu": spec["utilization"]}}
        print(", ".join(str(values[field]) for field in query.split(",")))
elif any(a.startswith("--query-compute-apps=") for a in args):
    for gpu, pid, mib in spec.get("busy", []):
        print(f"GPU-{{gpu:04d}}, {{pid}}, {{mib}}")
else:
    print("| NVIDIA-SMI " + spec["driver"] + "  Driver Version: " + spec["driver"]
          + "  CUDA Version: " + spec["cuda"] + " |")
"""


def stand_in_nvidia_smi(
    directory: Path,
    gpus: int = 4,
    busy: Sequence[tuple[int, int, int]] = (),
    cuda: str = "12.8",
    utilization: int = 87,
) -> Path:
    """A `nvidia-smi` in `directory` that reports `gpus` H200s (1 MiB used, `utilization` %
    busy), `busy` (gpu, pid, MiB) compute processes and the driver's CUDA version. Returns the
    directory (to put first on PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    spec = directory / "spec.json"
    spec.write_text(
        json.dumps({"gpus": gpus, "busy": list(busy), "cuda": cuda, "driver": "570.86",
                    "utilization": utilization})
    )  # fmt: skip
    smi = directory / "nvidia-smi"
    smi.write_text(STAND_IN.format(python=sys.executable, spec=str(spec)))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return directory


def stand_in_tensorflow(directory: Path, cuda: str | None = "12.5.1") -> Path:
    """A site directory with only TensorFlow's build_info.py (a CUDA build of `cuda`; None: a
    CPU-only build), to put first on PYTHONPATH: the probe reads the first one on sys.path.
    Without an __init__.py it is never what `import tensorflow` finds."""
    platform = directory / "tensorflow" / "python" / "platform"
    platform.mkdir(parents=True, exist_ok=True)
    items = [("is_cuda_build", cuda is not None)] + ([("cuda_version", cuda)] if cuda else [])
    (platform / "build_info.py").write_text(
        f"import collections\n\nbuild_info = collections.OrderedDict({items!r})\n"
    )
    return directory


def test_probe_reads_the_stand_in_and_skips_this_jobs_own_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = subprocess.Popen(  # an earlier attempt's trainer, still letting go of GPU 0
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, "ORCHESTRATE_JOB_ID": "job-x"},
    )
    try:
        bin_dir = stand_in_nvidia_smi(
            tmp_path / "bin", gpus=2, busy=[(1, 4242, 812), (0, ours.pid, 5)]
        )
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        report = gpu_probe.probe_gpus("job-x")
    finally:
        ours.kill()
        ours.wait()
    assert report["problems"] == []
    assert (report["driver"], report["cuda"]) == ("570.86", "12.8")
    assert [(g["index"], g["busy"]) for g in report["gpus"]] == [
        (0, []),
        (1, [{"pid": 4242, "memory": 812}]),
    ]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu_probe.probe_gpus()["problems"] == [
        "GPUs asked for (gpus_per_task / per_gpu) but no nvidia-smi on PATH here"
    ]


# --- whole launches on the local backend ----------------------------------------------------


def gpu_job(tmp_path: Path, workers: str = "2", gpus_per_task: int = 2, extra: str = "") -> Path:
    text = fake_job(tmp_path, ["--mode", "ok"], extra=extra).replace(
        "workers = 2", f"workers = {workers}\ngpus_per_task = {gpus_per_task}"
    )
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def gpu_env(
    tmp_path: Path,
    busy: Sequence[tuple[int, int, int]] = (),
    cuda: str = "12.8",
    tf: str = "12.5.1",
) -> dict[str, str]:
    """The CLI's environment: the stand-in nvidia-smi first on PATH, the stand-in TensorFlow
    build first on PYTHONPATH."""
    bin_dir = stand_in_nvidia_smi(tmp_path / "bin", busy=busy, cuda=cuda)
    site = stand_in_tensorflow(tmp_path / "site", tf)
    python_path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": python_path}


def task_envs(tmp_path: Path, job_id: str) -> list[dict[str, str]]:
    tasks = sorted((tmp_path / "shared" / job_id / "tasks").iterdir(), key=lambda p: int(p.name))
    return [json.loads((t / "gpu_env.json").read_text()) for t in tasks]


@pytest.mark.parametrize("workers", ["2", '"per_gpu"'])
def test_two_tasks_of_two_gpus_each_see_their_own(
    workers: str, tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    result = cli("launch", str(gpu_job(tmp_path, workers)), env=gpu_env(tmp_path), timeout=60)
    assert result.code == 0, result
    assert "orchestrate: local: 4x NVIDIA H200 (143771 MiB), driver 570.86, CUDA 12.8\n" in (
        result.out
    )
    [job] = status_json(cli)["jobs"]
    assert job["state"] == "succeeded" and len(job["tasks"]) == 2
    envs = task_envs(tmp_path, job["id"])
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3"]
    assert all(e["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" for e in envs)
    assert all(e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for e in envs)


def test_a_busy_gpu_refuses_the_launch_and_force_takes_it(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    path = gpu_job(tmp_path, extra="[strategy]\ngpu_memory_growth = false\n")
    env = gpu_env(tmp_path, busy=[(1, 4242, 812)])
    refused = cli("launch", str(path), env=env, timeout=60)
    assert refused.code == 3, refused
    assert refused.err == (
        "error: preflight failed on 1 host(s): local: GPU 1 in use by pid 4242 (812 MiB) "
        "(orchestrate launch --force uses busy GPUs anyway)\n"
    )
    [job] = status_json(cli)["jobs"]
    assert job["state"] == "failed"
    assert not (tmp_path / "shared" / job["id"] / "tasks").exists()  # nothing started

    forced = cli("launch", "--force", str(path), env=env, timeout=60)
    assert forced.code == 0, forced
    assert "; GPU 1 in use by pid 4242 (812 MiB): used anyway (--force)" in forced.out
    job = status_json(cli)["jobs"][0]
    envs = task_envs(tmp_path, job["id"])
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3"]
    assert not any("TF_FORCE_GPU_ALLOW_GROWTH" in e for e in envs)  # opted out
    events = status_json(cli, job["id"])["jobs"][0]["events"]
    assert "forced" in [e["kind"] for e in events]


def test_a_refusal_exits_3_in_the_background_too(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    env = gpu_env(tmp_path, busy=[(1, 4242, 812)])
    refused = cli("launch", "--detach", str(gpu_job(tmp_path)), env=env, timeout=60)
    assert refused.code == 3, refused
    assert "preflight failed on 1 host(s): local: GPU 1 in use by pid 4242" in refused.err
    assert refused.err.count("\n") == 1
    [job] = status_json(cli)["jobs"]
    assert job["state"] == "failed"


def test_a_driver_older_than_tensorflows_cuda_is_refused(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    env = gpu_env(tmp_path, cuda="12.2", tf="12.5.1")
    result = cli("launch", str(gpu_job(tmp_path)), env=env, timeout=60)
    assert result.code == 3, result
    assert result.err.count("\n") == 1
    assert "local: NVIDIA driver 570.86 supports CUDA 12.2, older than the CUDA 12.5" in result.err


def test_dry_run_and_validate_show_the_assignment(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    result = cli("launch", "--dry-run", str(gpu_job(tmp_path)))
    assert result.code == 0, result.err
    assert "worker-0 on local (127.0.0.1:auto) chief GPUs 0,1\n" in result.out
    assert "worker-1 on local (127.0.0.1:auto) GPUs 2,3\n" in result.out
    per_gpu = cli("launch", "--dry-run", str(gpu_job(tmp_path, '"per_gpu"', 1)))
    assert "job fake: at least 1 task(s)" in per_gpu.out
    assert "chief GPUs: one task per GPU, counted at launch" in per_gpu.out
    checked = cli("validate", str(gpu_job(tmp_path, '"per_gpu"', 1)))
    assert checked.out.endswith(
        "local backend, at least 1 task(s) on 1 host(s) (local: tasks counted from the GPUs "
        "found at launch)\n"
    )


def test_each_tasks_gpus_are_sampled_and_shown_by_status(
    tmp_path: Path, cli: Callable[..., CliResult], reap_pids: list[int]
) -> None:
    """The agents sample their task's GPUs (the stand-in nvidia-smi here, NVML on a GPU host)
    at the heartbeat; `status` shows them, per GPU in --json."""
    path = gpu_job(tmp_path)
    path.write_text(path.read_text().replace('["--mode", "ok"]', '["--mode", "sleep"]'))
    result = cli("launch", "--detach", str(path), env=gpu_env(tmp_path), timeout=60)
    assert result.code == 0, result
    job_id = status_json(cli)["jobs"][0]["id"]
    reap_pids.append(status_json(cli)["jobs"][0]["supervisor"]["pid"])
    try:

        def sampled() -> list[dict[str, Any]] | None:
            tasks = status_json(cli, job_id)["jobs"][0]["tasks"]
            ready = all(t["resources"] and t["resources"]["gpus"] for t in tasks)
            return tasks if ready else None

        tasks = wait_for(sampled, 30)
        assert isinstance(tasks, list)
        assert [[g["index"] for g in t["resources"]["gpus"]] for t in tasks] == [[0, 1], [2, 3]]
        for gpu in (g for t in tasks for g in t["resources"]["gpus"]):
            assert (gpu["utilization"], gpu["memory_used"], gpu["memory_total"]) == (
                87.0, 1, 143771
            )  # fmt: skip
        text = cli("status", job_id).out
        header = next(line for line in text.splitlines() if line.startswith("TASK"))
        assert " GPU " in header
        rows = [line for line in text.splitlines() if line.startswith("worker-")]
        assert len(rows) == 2 and all("87% 2M" in line for line in rows), text
    finally:
        assert cli("stop", job_id, timeout=60).code == 0
