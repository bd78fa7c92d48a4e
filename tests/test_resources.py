"""Resource sampling on the worker side (worker.resources, worker.tb_events) and the straggler
rules (orchestrator.supervision.stragglers): real processes for the samples, the real protobuf schema for
TensorBoard's records, pure values for the rules."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.supervision.stragglers import Change, StragglerWatch, candidate, likely_reason
from tests.test_gpu import stand_in_nvidia_smi
from worker import resources, tb_events
from worker.resources import tensorboard_scalars
from worker.spec import GpuSample, Progress, Resources

SPIN = [sys.executable, "-c", "while True: pass"]


@pytest.fixture
def spinners() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def _spin(started: list[subprocess.Popen[bytes]], cpu: int | None = None) -> int:
    proc = subprocess.Popen(SPIN)
    started.append(proc)
    if cpu is not None:
        os.sched_setaffinity(proc.pid, {cpu})
    return proc.pid


def _measure(*pids: int, seconds: float = 1.0) -> list[Resources]:
    """Samples of each pid over one shared window: comparisons between them do not depend on
    how busy the machine was."""
    import time

    samplers = [resources.ResourceSampler() for _ in pids]
    for sampler, pid in zip(samplers, pids, strict=True):
        sampler.sample(pid, Progress())
    time.sleep(seconds)
    return [sampler.sample(pid, Progress()) for sampler, pid in zip(samplers, pids, strict=True)]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_spinning_process_shows_its_cpu_and_memory(
    spinners: list[subprocess.Popen[bytes]],
) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        spinner = _spin(spinners)
        before = _cpu_seconds(spinner)
        sample, idle = _measure(spinner, sleeper.pid)
        used = _cpu_seconds(spinner) - before
    finally:
        sleeper.kill()
        sleeper.wait()
    # A spinner uses far more CPU than a sleeper in the same window, and at most one core.
    assert sample.cpu_percent is not None and idle.cpu_percent is not None
    assert sample.cpu_percent > idle.cpu_percent + 10, (sample, idle)
    assert sample.cpu_percent <= 100 * 1.1
    # The kernel's own count of the spinner's CPU time agrees (it spans a little more: the
    # reads around the window).
    assert sample.cpu_percent / 100 <= used / 1.0 * 1.1 + 0.05, (sample.cpu_percent, used)
    assert sample.rss_bytes is not None and 2 << 20 < sample.rss_bytes < 200 << 20
    assert sample.host_mem_total and sample.host_mem_available
    assert 0 < sample.host_mem_available <= sample.host_mem_total
    assert sample.host_cpu_percent is not None and sample.host_cpu_percent > 0
    assert sample.gpus == () and sample.collective_percent is None  # no GPU, no wait clock


def test_a_process_sharing_its_cpu_with_a_neighbour_waits_for_it(
    spinners: list[subprocess.Popen[bytes]],
) -> None:
    alone = _spin(spinners, cpu=0)
    shared = _spin(spinners, cpu=1)
    _spin(spinners, cpu=1)  # the neighbour, pinned beside it
    alone_sample, shared_sample = _measure(alone, shared)
    # Measured in the same window: the one that shares its CPU waits more and runs less than
    # the one alone, whatever else this machine runs.
    assert alone_sample.cpu_wait_percent is not None and shared_sample.cpu_wait_percent is not None
    assert shared_sample.cpu_wait_percent > alone_sample.cpu_wait_percent + 15, (
        alone_sample,
        shared_sample,
    )
    assert alone_sample.cpu_percent is not None and shared_sample.cpu_percent is not None
    assert shared_sample.cpu_percent < alone_sample.cpu_percent, (alone_sample, shared_sample)
    # Running and waiting account for (nearly) all of a spinner's time.
    total = shared_sample.cpu_percent + shared_sample.cpu_wait_percent
    assert 80 <= total <= 110, shared_sample


def test_a_gone_process_samples_the_host_alone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    sample = resources.ResourceSampler().sample(proc.pid, Progress())
    assert (sample.cpu_percent, sample.rss_bytes, sample.cpu_wait_percent) == (None, None, None)
    assert sample.host_mem_total


def test_wait_shares_come_from_the_trainers_wait_clock_over_a_window() -> None:
    shares = resources.WaitShares(window=10.0)
    assert shares.shares() == (None, None)
    for second in range(21):  # 60 % of every second in collectives, 10 % waiting for input
        shares.add(Progress(collective_seconds=0.6 * second, input_seconds=0.1 * second,
                            clock=1000.0 + second))  # fmt: skip
    assert shares.shares() == (60.0, 10.0)
    shares.add(Progress(collective_seconds=12.0, input_seconds=2.0, clock=1020.0))  # no news
    shares.add(Progress())  # not timed: ignored
    assert shares.shares() == (60.0, 10.0)


def test_gpus_by_a_stand_in_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{stand_in_nvidia_smi(tmp_path, gpus=4)}{os.pathsep}/usr/bin")
    assert resources.task_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert resources.task_gpus({}) is None
    sampler = resources.GpuSampler([2, 3])
    assert sampler.present
    assert sampler.sample() == (GpuSample(2, 87.0, 1, 143771), GpuSample(3, 87.0, 1, 143771))
    assert resources.parse_smi_usage("0, [N/A], 1, 2\nbad line\n") == [GpuSample(0, None, 1, 2)]


def test_tensorboard_records_decode_with_tensorboards_own_schema(tmp_path: Path) -> None:
    from tensorboard.compat.proto import event_pb2

    assert tb_events.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    writer = tb_events.EventWriter(tmp_path / "resources")
    sample = Resources(at=5.0, cpu_percent=180.5, rss_bytes=700 << 20,
                       gpus=(GpuSample(1, 55.0, 1024, 2048),))  # fmt: skip
    writer.scalars(7, tensorboard_scalars(sample), wall_time=1234.5)
    assert writer.path is not None and writer.path.name.startswith("events.out.tfevents.1234.")
    data, events = writer.path.read_bytes(), []
    while data:
        (length,) = struct.unpack("<Q", data[:8])
        record = data[12 : 12 + length]
        assert struct.unpack("<I", data[12 + length : 16 + length])[0] == tb_events._masked(record)
        events.append(event_pb2.Event.FromString(record))
        data = data[16 + length :]
    assert events[0].file_version == "brain.Event:2"
    assert (events[1].step, events[1].wall_time) == (7, 1234.5)
    assert {v.tag: round(v.simple_value, 1) for v in events[1].summary.value} == {
        "resources/cpu_percent": 180.5,
        "resources/rss_mib": 700.0,
        "resources/gpu1_utilization": 55.0,
        "resources/gpu1_memory_used_mib": 1024.0,
    }


# --- stragglers: pure rules -----------------------------------------------------------------


def _r(collective: float | None, **kw: object) -> Resources:
    return Resources(collective_percent=collective, **kw)  # type: ignore[arg-type]


def test_the_task_that_waits_least_for_its_peers_is_the_straggler() -> None:
    # Own parts of a step: 30 %, 32 %, 70 %: worker-2's is 2.26x the others' median.
    found = candidate({0: _r(70), 1: _r(68), 2: _r(30)}, threshold=0.15)
    assert found is not None and found.task == 2
    assert found.reason == "unknown (no sampled resource explains it)"
    assert found.message() == (
        "worker-2 is a straggler: its own part of each step is 126% longer than the other "
        "tasks' (70% of the step against 31%; they wait for it); likely reason: unknown (no "
        "sampled resource explains it)"
    )
    # Within the threshold, one task not timed, or a lone task: none.
    assert candidate({0: _r(70), 1: _r(66)}, 0.15) is None
    assert candidate({0: _r(70), 1: None, 2: _r(None)}, 0.15) is None


@pytest.mark.parametrize(
    ("mine", "peers", "reason"),
    [
        ({"cpu_wait_percent": 48.0}, {"cpu_wait_percent": 3.0},
         "CPU saturated (its threads waited for a CPU 48% of the time they could run, "
         "the others' 3%)"),
        ({"cpu_wait_percent": 48.0}, {"cpu_wait_percent": 45.0},
         "unknown (no sampled resource explains it)"),  # the same contention everywhere
        ({"host_cpu_percent": 99.0}, {"host_cpu_percent": 40.0},
         "CPU saturated (its host's CPUs 99% busy)"),
        ({"input_percent": 64.0}, {}, "input-bound (64% of its time waits for input)"),
        ({"host_mem_available": 300 << 20, "host_mem_total": 16 << 30}, {},
         "memory pressure (300 MiB of 16384 MiB available on its host)"),
        ({"gpus": (GpuSample(0, 12.0), GpuSample(1, 20.0))}, {},
         "GPU idle (16% utilisation)"),
        ({"input_percent": 40.0, "gpus": (GpuSample(0, 10.0),)}, {},
         "input-bound (40% of its time waits for input); GPU idle (10% utilisation)"),
    ],
)  # fmt: skip
def test_the_likely_reason_is_what_its_samples_show_against_its_peers(
    mine: dict[str, object], peers: dict[str, object], reason: str
) -> None:
    assert likely_reason(_r(20, **mine), [_r(70, **peers)]) == reason


def test_a_busy_host_is_no_reason_when_its_peers_share_that_host() -> None:
    samples = {0: _r(70, host_cpu_percent=80.0), 1: _r(20, host_cpu_percent=99.0)}
    found = candidate(samples, 0.15, hosts={0: 0, 1: 0})
    assert found is not None and found.reason.startswith("unknown")
    found = candidate(samples, 0.15, hosts={0: 0, 1: 1})
    assert found is not None and found.reason == "CPU saturated (its host's CPUs 99% busy)"


def test_a_straggler_is_named_only_when_consistent_and_cleared_the_same_way() -> None:
    watch = StragglerWatch(0.15, every=5.0, consistent=3)
    slow = {0: _r(70), 1: _r(20)}
    even = {0: _r(50), 1: _r(50)}
    assert watch.judge(0.0, slow) == []
    assert watch.judge(1.0, slow) == []  # not a judgement yet: one every 5 s
    assert watch.judge(5.0, even) == []  # the streak is broken
    assert [watch.judge(t, slow) for t in (10.0, 15.0)] == [[], []]
    [named] = watch.judge(20.0, slow)
    assert named.task == 1 and named.straggler is not None
    assert watch.judge(25.0, slow) == []  # said once
    assert [watch.judge(t, even) for t in (30.0, 35.0)] == [[], []]
    assert watch.judge(40.0, even) == [Change(1, None)]
    assert Change(1, None).message() == "worker-1 keeps pace again: no longer a straggler"
    other = {0: _r(20), 1: _r(70)}
    for t in (45.0, 50.0):
        watch.judge(t, slow)
    [named] = watch.judge(55.0, slow)
    assert named.task == 1
    assert [watch.judge(t, other) for t in (60.0, 65.0)] == [[], []]
    cleared, renamed = watch.judge(70.0, other)  # another task took its place
    assert (cleared, renamed.task) == (Change(1, None), 0)


def test_a_sampler_that_fails_stops_sampling_and_the_agent_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker.agent import Agent
    from worker.spec import WorkerSpec

    spec = WorkerSpec(job_id="j", task_index=0, host_label="h", tf_config={}, argv=["python"],
                      workdir=str(tmp_path), shared_dir=str(tmp_path))  # fmt: skip
    agent = Agent(spec)

    class Broken(resources.ResourceSampler):
        def sample(self, pid: int | None, progress: Progress) -> Resources:
            raise ValueError("an odd /proc")

    agent._sampler = Broken()
    assert agent._sample(os.getpid(), Progress()) is None
    assert agent._sampler is None and agent._sample(os.getpid(), Progress()) is None
    assert "resource sampling stopped: ValueError: an odd /proc" in capsys.readouterr().err


NVML_STAND_IN = r"""
/* A stand-in libnvidia-ml.so.1: three GPUs, the NVML calls orchestrate makes, real ABI. */
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
static int ready = 0;
int nvmlInit_v2(void) { ready = 1; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 3; return ready ? 0 : 1; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    if (!ready || index >= 3) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *handle = (void *)(unsigned long)(index + 1);
    return 0;
}
int nvmlDeviceGetUtilizationRates(void *handle, nvmlUtilization_t *u) {
    u->gpu = 10 * (unsigned int)(unsigned long)handle; u->memory = 0; return 0;
}
int nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *m) {
    unsigned long long n = (unsigned long)handle;
    m->total = 80ULL << 30; m->used = n << 30; m->free = m->total - m->used;
    return (n == 3) ? 3 : 0; /* the third GPU's memory is "not supported" */
}
"""


def test_gpus_are_sampled_through_nvml_when_the_library_is_there(tmp_path: Path) -> None:
    """The NVML path through ctypes, against a compiled stand-in library with NVML's ABI (no
    GPU here: what a real driver answers is proven on a GPU machine only, see docs)."""
    import shutil

    from tests.conftest import IN_CI

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        if IN_CI:
            pytest.fail("no C compiler: the NVML stand-in cannot be built")
        pytest.skip("no C compiler to build the NVML stand-in")
    source = tmp_path / "nvml.c"
    source.write_text(NVML_STAND_IN)
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(tmp_path / "libnvidia-ml.so.1"), str(source)],
        check=True,
    )
    code = (
        "import json; from worker.resources import GpuSampler\n"
        "s = GpuSampler([0, 2, 5]); a = GpuSampler(None)\n"
        "print(json.dumps([s._nvml is not None, [list(g.__dict__.values()) for g in s.sample()],"
        " [g.index for g in a.sample()]]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    used_nvml, samples, every = json.loads(out.stdout)
    assert used_nvml
    assert samples == [
        [0, 10.0, 1024, 81920],
        [2, 30.0, None, None],  # memory not supported: None, the utilisation still read
        [5, None, None, None],  # no such GPU: an empty sample, not an error
    ]
    assert every == [0, 1, 2]  # no CUDA_VISIBLE_DEVICES: all the host's GPUs
