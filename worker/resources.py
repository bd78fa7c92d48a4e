"""What a task's machine is doing, sampled by its agent at every heartbeat: the trainer's CPU
and how long its threads waited for one, its resident memory, the host's CPU and free memory,
the task's GPUs, and (from the trainer's own wait clock) the share of its time spent waiting
for peers and for input. Standard library only: the agent never imports TensorFlow.

Linux /proc: a stat of the trainer (CPU time, RSS), one schedstat per thread (run and
run-queue wait, nanoseconds), /proc/stat and /proc/meminfo. GPUs through NVML (ctypes, no
process started) where libnvidia-ml is installed, else nvidia-smi at most every
NVIDIA_SMI_EVERY seconds; a host with neither costs nothing after the first look.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time
from collections import deque
from collections.abc import Mapping, Sequence

from worker.spec import GpuSample, Progress, Resources

NVIDIA_SMI_EVERY = 5.0  # seconds: nvidia-smi is a process start, NVML a function call
NVIDIA_SMI_TIMEOUT = 5.0
SHARE_WINDOW = 10.0  # seconds of wait-clock readings a share is computed over
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def process_times(pid: int) -> tuple[float, int] | None:
    """(CPU seconds, RSS bytes) of a process, from /proc/PID/stat; None: gone."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the name may hold spaces and parentheses
    utime, stime, rss = int(fields[11]), int(fields[12]), int(fields[21])
    return (utime + stime) / _TICKS, rss * _PAGE


def thread_schedstats(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread's (nanoseconds on a CPU, nanoseconds runnable but waiting for one)."""
    stats = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        text = _read(f"/proc/{pid}/task/{tid}/schedstat")
        if text:
            run, wait, *_ = text.split()
            stats[int(tid)] = (int(run), int(wait))
    return stats


def host_cpu() -> tuple[int, int] | None:
    """(busy, total) jiffies of all the host's CPUs, from /proc/stat."""
    text = _read("/proc/stat")
    if not text:
        return None
    values = [int(v) for v in text.split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def host_memory() -> tuple[int | None, int | None]:
    """(MemAvailable, MemTotal) in bytes."""
    text = _read("/proc/meminfo") or ""
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemAvailable", "MemTotal"):
            found[name] = int(rest.split()[0]) * 1024
    return found.get("MemAvailable"), found.get("MemTotal")


class _Nvml:
    """NVML through ctypes: utilisation and memory of GPUs by nvidia-smi index."""

    class _Utilization(ctypes.Structure):
        _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

    class _Memory(ctypes.Structure):
        _fields_ = [
            ("total", ctypes.c_ulonglong),
            ("free", ctypes.c_ulonglong),
            ("used", ctypes.c_ulonglong),
        ]

    def __init__(self) -> None:
        self._lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self._lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        count = ctypes.c_uint()
        if self._lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            raise OSError("nvmlDeviceGetCount failed")
        self.count = count.value

    def sample(self, index: int) -> GpuSample:
        handle = ctypes.c_void_p()
        if self._lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
            return GpuSample(index)
        util, memory = self._Utilization(), self._Memory()
        busy = self._lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)) == 0
        mem_ok = self._lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0
        return GpuSample(
            index,
            float(util.gpu) if busy else None,
            memory.used >> 20 if mem_ok else None,
            memory.total >> 20 if mem_ok else None,
        )


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_smi_usage(text: str) -> list[GpuSample]:
    """`nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total
    --format=csv,noheader,nounits`."""
    samples = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            continue
        util, used, total = (_number(f) for f in fields[1:])
        samples.append(
            GpuSample(
                int(fields[0]),
                util,
                None if used is None else int(used),
                None if total is None else int(total),
            )
        )
    return samples


class GpuSampler:
    """The task's GPUs (nvidia-smi indexes; None: all the host's), by NVML or nvidia-smi."""

    def __init__(self, indexes: Sequence[int] | None) -> None:
        self.indexes = None if indexes is None else list(indexes)
        self._nvml: _Nvml | None = None
        self._smi: str | None = None
        self._last: tuple[GpuSample, ...] = ()
        self._last_smi = float("-inf")
        try:
            self._nvml = _Nvml()
        except (OSError, AttributeError):
            self._smi = shutil.which("nvidia-smi")

    @property
    def present(self) -> bool:
        return self._nvml is not None or self._smi is not None

    def sample(self) -> tuple[GpuSample, ...]:
        if self._nvml is not None:
            indexes = self.indexes if self.indexes is not None else range(self._nvml.count)
            return tuple(self._nvml.sample(i) for i in indexes)
        if self._smi is None or time.monotonic() - self._last_smi < NVIDIA_SMI_EVERY:
            return self._last
        self._last_smi = time.monotonic()
        query = "index,utilization.gpu,memory.used,memory.total"
        try:
            out = subprocess.run(
                [self._smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=NVIDIA_SMI_TIMEOUT,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return self._last
        samples = parse_smi_usage(out)
        if self.indexes is not None:
            samples = [s for s in samples if s.index in self.indexes]
        self._last = tuple(samples)
        return self._last


def task_gpus(env: Mapping[str, str]) -> list[int] | None:
    """The GPUs given to the task (CUDA_VISIBLE_DEVICES as orchestrate sets it, nvidia-smi
    indexes); None: not set, so all the host's are the task's."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    return [int(p) for p in parts] if all(p.isdigit() for p in parts) else None


class WaitShares:
    """The share of the trainer's time spent in collectives and waiting for input over the
    last SHARE_WINDOW seconds, from its cumulative wait clock (Progress.collective_seconds,
    input_seconds at clock)."""

    def __init__(self, window: float = SHARE_WINDOW) -> None:
        self.window = window
        self._readings: deque[tuple[float, float, float]] = deque()

    def add(self, progress: Progress) -> None:
        if not progress.clock:
            return
        if self._readings and progress.clock == self._readings[-1][0]:
            return  # not written anew since
        if self._readings and progress.clock < self._readings[-1][0]:
            self._readings.clear()  # the host's clock stepped back: start the window again
        self._readings.append((progress.clock, progress.collective_seconds, progress.input_seconds))
        while len(self._readings) > 2 and progress.clock - self._readings[1][0] >= self.window:
            self._readings.popleft()

    def shares(self) -> tuple[float | None, float | None]:
        """(collective %, input %); None until two readings a second apart."""
        if len(self._readings) < 2:
            return None, None
        (t0, c0, i0), (t1, c1, i1) = self._readings[0], self._readings[-1]
        if t1 - t0 < 1.0:
            return None, None
        return _percent(c1 - c0, t1 - t0), _percent(i1 - i0, t1 - t0)


def _percent(part: float, whole: float) -> float:
    return round(min(max(part / whole, 0.0), 1.0) * 100, 1)


class RunQueueShare:
    """Of the time the trainer's threads wanted a CPU over the last SHARE_WINDOW seconds, the
    percent they waited for one (a second's worth alone is too noisy to judge by)."""

    def __init__(self, window: float = SHARE_WINDOW) -> None:
        self.window = window
        self._threads: dict[int, tuple[int, int]] = {}
        self._ran = self._waited = 0
        self._totals: deque[tuple[float, int, int]] = deque()

    def add(self, now: float, threads: dict[int, tuple[int, int]]) -> float | None:
        for tid, (run, wait) in threads.items():
            if tid in self._threads:  # a thread seen at both ends of the interval
                self._ran += max(run - self._threads[tid][0], 0)
                self._waited += max(wait - self._threads[tid][1], 0)
        self._threads = threads
        self._totals.append((now, self._ran, self._waited))
        while len(self._totals) > 2 and now - self._totals[1][0] >= self.window:
            self._totals.popleft()
        _, ran0, waited0 = self._totals[0]
        ran, waited = self._ran - ran0, self._waited - waited0
        if ran + waited == 0:
            return None
        return round(waited / (ran + waited) * 100, 1)


class ResourceSampler:
    """One task's samples: each call measures the interval since the previous one (the
    shares of waiting: the last SHARE_WINDOW seconds)."""

    def __init__(self, gpus: GpuSampler | None = None) -> None:
        self.gpus = gpus
        self.shares = WaitShares()
        self._pid: int | None = None
        self._at = 0.0
        self._cpu: float | None = None
        self._run_queue = RunQueueShare()
        self._host: tuple[int, int] | None = None

    def sample(self, pid: int | None, progress: Progress) -> Resources:
        now = time.monotonic()
        interval = now - self._at
        if pid != self._pid:  # a new trainer: nothing to measure an interval against yet
            self._pid, self._cpu, self._run_queue, interval = pid, None, RunQueueShare(), 0.0
        self._at = now
        self.shares.add(progress)
        cpu_percent = cpu_wait = rss = None
        if pid is not None:
            times = process_times(pid)
            if times is not None:
                cpu, rss = times
                if self._cpu is not None and interval > 0:
                    cpu_percent = round(max(cpu - self._cpu, 0.0) / interval * 100, 1)
                self._cpu = cpu
            cpu_wait = self._run_queue.add(now, thread_schedstats(pid))
        host = host_cpu()
        host_percent = None
        if host is not None and self._host is not None and host[1] > self._host[1]:
            busy, total = host[0] - self._host[0], host[1] - self._host[1]
            host_percent = round(busy / total * 100, 1)
        self._host = host
        available, total_memory = host_memory()
        collective, waiting_input = self.shares.shares()
        return Resources(
            at=time.time(),
            cpu_percent=cpu_percent,
            cpu_wait_percent=cpu_wait,
            rss_bytes=rss,
            host_cpu_percent=host_percent,
            host_mem_available=available,
            host_mem_total=total_memory,
            gpus=self.gpus.sample() if self.gpus is not None and self.gpus.present else (),
            collective_percent=collective,
            input_percent=waiting_input,
        )


def sampler_for(env: Mapping[str, str]) -> ResourceSampler:
    """The sampler of a task whose trainer runs with `env`."""
    return ResourceSampler(GpuSampler(task_gpus(env)))


def tensorboard_scalars(resources: Resources) -> dict[str, float]:
    """The scalars of one sample, named for TensorBoard (MiB for memory)."""
    values: dict[str, float | int | None] = {
        "resources/cpu_percent": resources.cpu_percent,
        "resources/cpu_wait_percent": resources.cpu_wait_percent,
        "resources/rss_mib": None if resources.rss_bytes is None else resources.rss_bytes >> 20,
        "resources/host_cpu_percent": resources.host_cpu_percent,
        "resources/host_mem_available_mib": None
        if resources.host_mem_available is None
        else resources.host_mem_available >> 20,
        "resources/collective_percent": resources.collective_percent,
        "resources/input_percent": resources.input_percent,
    }
    for gpu in resources.gpus:
        values[f"resources/gpu{gpu.index}_utilization"] = gpu.utilization
        values[f"resources/gpu{gpu.index}_memory_used_mib"] = gpu.memory_used
    return {k: float(v) for k, v in values.items() if v is not None}
