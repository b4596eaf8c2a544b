"""What a case used besides energy: peak memory, CPU time and time lost waiting on I/O.

Peaks are those of the probe's own stretch of time, not of the process's life, so a
small case run after a big one does not inherit the big one's peak.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

# Writing "5" here resets the kernel's peak-RSS counter (VmHWM) of this process (Linux 4.0+).
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")

# The kernel counter is process-wide: only one probe at a time may reset it, or an inner
# probe would wipe the outer one's peak.  The others sample.
_kernel_lock = threading.Lock()


@dataclass(frozen=True)
class ResourceUsage:
    """Resources used over one probe."""

    peak_rss_bytes: int
    peak_gpu_bytes: int | None  # torch allocations summed over GPUs; None without CUDA
    cpu_seconds: float  # this process, user + system, all threads
    iowait_share: float | None  # system-wide share of CPU time in I/O wait; None if unknown
    wall_seconds: float


class ResourceProbe:
    """``with ResourceProbe() as probe: ...`` then ``probe.usage``.

    Peak RSS comes from the kernel's high-water mark where it can be reset (Linux),
    else from sampling RSS every ``sample_interval_s`` in a thread, which can miss
    spikes shorter than the interval.  ``peak_method`` says which one was used.
    """

    def __init__(self, *, sample_interval_s: float = 0.01, use_kernel_peak: bool = True) -> None:
        if sample_interval_s <= 0:
            raise ValueError(f"sample_interval_s must be positive, got {sample_interval_s}")
        self.sample_interval_s = sample_interval_s
        self.use_kernel_peak = use_kernel_peak
        self.peak_method: str | None = None  # "kernel" or "sampled", once entered
        self._usage: ResourceUsage | None = None
        self._process = psutil.Process()
        self._owns_kernel = False
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()
        self._sampled_peak_bytes = 0
        self._gpu_devices: list[int] = []
        self._t0 = 0.0
        self._cpu0_s = 0.0
        self._sys0: Any = None

    @property
    def usage(self) -> ResourceUsage:
        if self._usage is None:
            raise RuntimeError("the probe has not finished: read usage after the with block")
        return self._usage

    def __enter__(self) -> ResourceProbe:
        if self.peak_method is not None:
            raise RuntimeError("a ResourceProbe can be entered only once")
        if self.use_kernel_peak and _kernel_lock.acquire(blocking=False):
            if _reset_kernel_peak():
                self._owns_kernel = True
                self.peak_method = "kernel"
            else:
                _kernel_lock.release()
        if not self._owns_kernel:
            self.peak_method = "sampled"
            self._sampled_peak_bytes = self._rss_bytes()
            self._sampler = threading.Thread(
                target=self._sample, name="llmenergy-rss-sampler", daemon=True
            )
            self._sampler.start()
        self._gpu_devices = _reset_gpu_peaks()
        self._sys0 = psutil.cpu_times()
        self._cpu0_s = time.process_time()
        self._t0 = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        wall_s = time.perf_counter() - self._t0
        cpu_s = time.process_time() - self._cpu0_s
        iowait = _iowait_share(self._sys0, psutil.cpu_times())
        gpu_bytes = _gpu_peak_bytes(self._gpu_devices)
        if self._owns_kernel:
            try:
                peak_bytes = _kernel_peak_bytes()
            finally:
                self._owns_kernel = False
                _kernel_lock.release()
            peak_bytes = max(peak_bytes, self._rss_bytes())
        else:
            self._stop.set()
            if self._sampler is not None:
                self._sampler.join()
            peak_bytes = max(self._sampled_peak_bytes, self._rss_bytes())
        self._usage = ResourceUsage(
            peak_rss_bytes=peak_bytes,
            peak_gpu_bytes=gpu_bytes,
            cpu_seconds=cpu_s,
            iowait_share=iowait,
            wall_seconds=wall_s,
        )

    def _rss_bytes(self) -> int:
        return int(self._process.memory_info().rss)

    def _sample(self) -> None:
        while not self._stop.wait(self.sample_interval_s):
            rss = self._rss_bytes()
            if rss > self._sampled_peak_bytes:
                self._sampled_peak_bytes = rss


def _reset_kernel_peak() -> bool:
    """Reset VmHWM; False where the kernel has no such file or refuses the write."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        return _kernel_peak_bytes() > 0
    except (OSError, ValueError):
        return False


def _kernel_peak_bytes() -> int:
    """VmHWM of /proc/self/status, in bytes."""
    for line in _STATUS.read_text().splitlines():
        if line.startswith("VmHWM:"):
            value, unit = line.split()[1:3]
            if unit.lower() != "kb":
                raise ValueError(f"unexpected unit in {line!r}")
            return int(value) * 1024
    raise ValueError(f"no VmHWM line in {_STATUS}")


def _cuda_devices() -> list[int]:
    """GPU indices, only if the code under test already imported torch and uses CUDA: a
    process on a GPU machine that never touched CUDA (a model on the CPU) has no peak to
    read, and torch refuses to reset one ("Invalid device argument", seen on an H100)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return []
        return list(range(torch.cuda.device_count()))
    except Exception:  # a broken driver must not break the measurement
        return []


def _reset_gpu_peaks() -> list[int]:
    devices = _cuda_devices()
    if devices:
        torch = sys.modules["torch"]
        for i in devices:
            torch.cuda.reset_peak_memory_stats(i)
    return devices


def _gpu_peak_bytes(devices: list[int]) -> int | None:
    if not devices:
        return None
    torch = sys.modules["torch"]
    return sum(int(torch.cuda.max_memory_allocated(i)) for i in devices)


def _iowait_share(before: Any, after: Any) -> float | None:
    """Share of all CPU time, system-wide, spent waiting on I/O between two snapshots."""
    if not hasattr(before, "iowait"):
        return None
    fields = before._fields

    def total(times: Any) -> float:
        # guest time is already counted in user/nice on Linux (psutil does the same).
        return sum(getattr(times, f) for f in fields if f not in ("guest", "guest_nice"))

    elapsed = total(after) - total(before)
    if elapsed <= 0:
        return 0.0  # less than one clock tick passed: nothing measurable waited
    share = (after.iowait - before.iowait) / elapsed
    return min(max(share, 0.0), 1.0)
