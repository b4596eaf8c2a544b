"""A Hopper (H100 SXM) stand-in in real time, as NVML's documentation and Zeus describe it.

What a real H100 does that the A100 stand-in of gpu_project.py does not model, and what
this one does:

- power follows the work: by default what the models do (``PhaseTrace``: every forward
  pass hooked, a prefill at 600 W, a decode step at 300 W, other work at 600 W, idle
  75 W between passes, so that each phase's true joules are known exactly whatever
  this CPU's load); or, with ``CpuLoadTrace``, this process's CPU use, ``idle_w`` plus
  ``dynamic_w`` times the share of the cores busy; both capped at the power limit;
- ``nvmlDeviceGetPowerUsage`` is the mean of the last second (NVML: "On Ampere (except
  GA100) or newer GPUs, the API returns power averaged over 1 sec interval"), and the
  instantaneous power is a field (``NVML_FI_DEV_POWER_INSTANT``);
- the energy counter (mJ) is refreshed only every ``COUNTER_PERIOD_S`` (Zeus: NVML
  counters "can update as slow as 10 Hz depending on the GPU model");
- the power limit can be set between 200 W and 700 W (``nvidia-smi -q -d POWER`` of an
  H100 SXM), only as root, and persists in ``$FAKE_GPU_STATE`` between processes.

The trace is exact: each stretch between two readings has one power, known once the
stretch has ended, so any past interval's true energy is known to the microjoule.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .fake_pynvml import NVML_DEVICE_ARCH_HOPPER, FakeGPU, build_fake_pynvml, fake_uuid

NAME = "NVIDIA H100 80GB HBM3"
# Corrected by the proof on a real H100 (docs/hardware-proof.md, 2026-11-26): idle 75 W
# (was 70), bf16 products held at the 700 W limit (so full load reaches the cap, was
# 570 W), the counter refreshed every 100.0 ms (as modelled), the average's window
# 0.88 s by its rise (NVML documents 1 s: kept, a boxcar as documented).
IDLE_W = 75.0
DYNAMIC_W = 625.0
COUNTER_PERIOD_S = 0.1
MIN_LIMIT_MW, MAX_LIMIT_MW = 200_000, 700_000
MIN_STRETCH_S = 0.001  # readings closer than this extend the current stretch


class StretchTrace:
    """Power piecewise constant over stretches that end as the trace learns their power,
    each stretch's energy summed as it ends: what both stand-in traces keep (the
    PowerTrace interface: ``origin``, ``steps``, ``power_at``, ``energy_until``)."""

    def __init__(self, idle_w: float, clock: Callable[[], float]) -> None:
        self.idle_w, self.clock = idle_w, clock
        self.origin = clock()
        self._ends = [self.origin]  # stretch k runs from _ends[k] to _ends[k + 1]
        self._watts: list[float] = []
        self._joules = [0.0]  # energy from the origin to _ends[k]

    @property
    def steps(self) -> list[tuple[float, float]]:
        """Only the first is read (the power before the trace began): idle."""
        return [(float("inf"), self.idle_w)]

    def _append(self, t: float, watts: float) -> bool:
        """End the current stretch at ``t`` at ``watts``; False: ``t`` is not after it."""
        if t <= self._ends[-1]:
            return False
        self._joules.append(self._joules[-1] + watts * (t - self._ends[-1]))
        self._ends.append(t)
        self._watts.append(watts)
        return True

    def _stretch(self, t: float) -> int:
        """The stretch holding ``t`` (binary search over the ends)."""
        lo, hi = 0, len(self._ends) - 1
        while lo < hi - 1:
            mid = (lo + hi) // 2
            if self._ends[mid] <= t:
                lo = mid
            else:
                hi = mid
        return lo

    def _energy_at(self, t: float) -> float:
        """Joules from the origin to ``t``, within the stretches ended so far."""
        k = self._stretch(t)
        return self._joules[k] + self._watts[k] * (t - self._ends[k])

    def energy_until(self, t: float) -> float:  # pragma: no cover - each trace's own
        raise NotImplementedError

    def power_at(self, t: float) -> float:  # pragma: no cover - each trace's own
        raise NotImplementedError

    def energy_between(self, t0: float, t1: float) -> float:
        return self.energy_until(t1) - self.energy_until(t0)

    def mean_power(self, t0: float, t1: float) -> float:
        return self.energy_between(t0, t1) / (t1 - t0) if t1 > t0 else self.power_at(t1)

    def max_power(self) -> float:
        return max(self._watts, default=self.idle_w)


class CpuLoadTrace(StretchTrace):
    """GPU power that follows this process's CPU use, piecewise constant between
    readings."""

    def __init__(
        self,
        idle_w: float = IDLE_W,
        dynamic_w: float = DYNAMIC_W,
        limit_w: Callable[[], float] = lambda: MAX_LIMIT_MW / 1000,
        clock: Callable[[], float] = time.perf_counter,
        cpu_s: Callable[[], float] = time.process_time,
        cores: int | None = None,
    ) -> None:
        super().__init__(idle_w, clock)
        self.dynamic_w, self.limit_w, self.cpu_s = dynamic_w, limit_w, cpu_s
        self.cores = cores or os.cpu_count() or 1
        self._cpu, self._cpu_t = cpu_s(), self.origin  # the last CPU reading, and when
        self._lock = threading.Lock()

    def advance(self) -> None:
        """Close the stretch since the last reading at the power its CPU use gives."""
        with self._lock:
            now, cpu = self.clock(), self.cpu_s()
            if now - self._cpu_t < MIN_STRETCH_S:
                return
            busy = min(1.0, max(0.0, (cpu - self._cpu) / (now - self._cpu_t) / self.cores))
            self._append(now, min(self.limit_w(), self.idle_w + self.dynamic_w * busy))
            self._cpu, self._cpu_t = cpu, now

    def power_at(self, t: float) -> float:
        self.advance()
        if t >= self._ends[-1]:
            return self._watts[-1] if self._watts else self.idle_w
        k = self._stretch(t)
        return self.idle_w if k < 0 else self._watts[k]

    def energy_until(self, t: float) -> float:
        self.advance()
        if t <= self.origin:
            return 0.0
        if t > self._ends[-1]:
            # read before the stretch could close (readings under MIN_STRETCH_S apart):
            # the time up to t is kept at the last power, so a counter never reads less
            # for a moment it already reported (a real one is monotonic)
            with self._lock:
                self._append(t, self._watts[-1] if self._watts else self.idle_w)
        return self._energy_at(t)


class MiscountedTrace(CpuLoadTrace):
    """A board whose energy counter (and so its average) counts ``factor`` times the
    power it reports as instantaneous: what the proof's meter checks must catch."""

    factor = 1.5

    def energy_until(self, t: float) -> float:
        return self.factor * super().energy_until(t)


# What the phase-scripted stand-in draws: the prefill's dense products near the cap, the
# decode's memory-bound steps at half of that, over Hopper's idle (issue 60).
PREFILL_W = 600.0
DECODE_W = 300.0
IDLE, PREFILL, DECODE, WORK = "idle", "prefill", "decode", "work"


class PhaseTrace(StretchTrace):
    """GPU power set by what the GPU does, not by this CPU's load: each activity
    (``idle``, ``prefill``, ``decode``, other ``work``) draws its scripted power, so the
    true energy of any past interval, and of each phase, is known exactly.

    ``set(name)`` marks this thread's work from now on, ``set(None)`` its end
    (``TorchHooks`` does it for every model's forward pass).  Several threads may work at
    once: the GPU draws the most any of them asks for.
    """

    def __init__(
        self,
        watts: dict[str, float] | None = None,
        limit_w: Callable[[], float] = lambda: MAX_LIMIT_MW / 1000,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.watts = {IDLE: IDLE_W, PREFILL: PREFILL_W, DECODE: DECODE_W, WORK: PREFILL_W}
        self.watts.update(watts or {})
        super().__init__(self.watts[IDLE], clock)
        self.limit_w = limit_w
        self._running: dict[int, str] = {}  # thread id -> its activity
        self._lock = threading.RLock()

    def _now_w(self) -> float:
        """The power now: of the activity drawing most, under the limit."""
        drawn = [self.watts.get(a, self.watts[WORK]) for a in self._running.values()]
        return min(self.limit_w(), max(drawn, default=self.idle_w))

    def set(self, name: str | None) -> None:
        """This thread's activity from now on (None: it stops working)."""
        with self._lock:
            self._close(self.clock())
            me = threading.get_ident()
            if name is None:
                self._running.pop(me, None)
            else:
                self._running[me] = name

    def _close(self, t: float) -> None:
        """End the current stretch at ``t`` at the power drawn since the last change."""
        self._append(t, self._now_w())

    def power_at(self, t: float) -> float:
        with self._lock:
            if t >= self._ends[-1]:
                return self._now_w()
            k = self._stretch(t)
            return self.idle_w if k < 0 else self._watts[k]

    def energy_until(self, t: float) -> float:
        if t <= self.origin:
            return 0.0
        with self._lock:
            if t > self._ends[-1]:
                self._close(t)  # the present activity up to t (never a future one)
            return self._energy_at(t)


class TorchHooks:
    """Every model's forward pass, seen as the GPU's work: a pass over more than one
    token a prefill, over one token a decode step (told by the first embedding's
    input), anything else ``work``; between passes the GPU is idle.  A pass lasts at
    least ``prefill_s`` / ``decode_s`` where given (the GPU's time for it, longer than a
    tiny model's on this CPU), so that a test can script a prefill of 10-50 ms."""

    def __init__(self, trace: PhaseTrace, prefill_s: float = 0.0, decode_s: float = 0.0) -> None:
        import torch

        self.trace, self.prefill_s, self.decode_s = trace, prefill_s, decode_s
        self._local = threading.local()
        module = torch.nn.modules.module
        self._handles = [
            module.register_module_forward_pre_hook(self._pre),
            module.register_module_forward_hook(self._post, always_call=True),
        ]
        self._embedding = torch.nn.Embedding

    def _pre(self, module: Any, args: Any) -> None:
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        if depth == 0:
            local.start, local.kind = time.perf_counter(), WORK
            self.trace.set(WORK)
        elif local.kind == WORK and isinstance(module, self._embedding) and args:
            tokens = args[0].shape[-1] if args[0].dim() else 1
            local.kind = PREFILL if tokens > 1 else DECODE
            self.trace.set(local.kind)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        local = self._local
        local.depth -= 1
        if local.depth:
            return
        least_s = {PREFILL: self.prefill_s, DECODE: self.decode_s}.get(local.kind, 0.0)
        left_s = local.start + least_s - time.perf_counter()
        if left_s > 0:
            time.sleep(left_s)
        self.trace.set(None)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def make_h100(index: int = 0, trace: Any = None) -> FakeGPU:
    """One H100 SXM whose power follows ``trace`` (default: this process's CPU use)."""
    own = trace is None or isinstance(trace, PhaseTrace)
    gpu = FakeGPU(
        NAME,
        fake_uuid(index),
        NVML_DEVICE_ARCH_HOPPER,
        trace if trace is not None else CpuLoadTrace(),
        counter_period_s=COUNTER_PERIOD_S,
        instant_field=True,
        memory_bytes=80 * 1024**3,
        power_limit_mw=MAX_LIMIT_MW,
        default_power_limit_mw=MAX_LIMIT_MW,
        max_power_limit_mw=MAX_LIMIT_MW,
        min_power_limit_mw=MIN_LIMIT_MW,
        max_sm_clock_mhz=1980,
        supported_sm_clocks_mhz=tuple(range(1980, 344, -15)),
        idle_sm_clock_mhz=345,
        memory_clock_mhz=2619,
    )
    if own:  # the cap holds the power down, as the board's power brake does
        gpu.trace.limit_w = lambda: (gpu.power_limit_mw or MAX_LIMIT_MW) / 1000
    return gpu


def build() -> Any:
    """The fake ``pynvml`` of one H100, its settings in ``$FAKE_GPU_STATE`` if set.

    ``$FAKE_GPU_POWER``: ``phases`` (the default) draws the scripted power of what the
    models do (``PhaseTrace``, every forward pass hooked; ``$FAKE_GPU_PREFILL_MS`` and
    ``$FAKE_GPU_DECODE_MS`` the least time of a pass), ``cpu`` follows this process's
    CPU use (``CpuLoadTrace``)."""
    trace: Any = None
    if os.environ.get("FAKE_GPU_POWER", "phases") == "phases":
        trace = PhaseTrace()
        TorchHooks(
            trace,
            prefill_s=float(os.environ.get("FAKE_GPU_PREFILL_MS", "0")) / 1000,
            decode_s=float(os.environ.get("FAKE_GPU_DECODE_MS", "0")) / 1000,
        )
    return build_fake_pynvml(
        [make_h100(trace=trace)],
        root=os.environ.get("FAKE_GPU_ROOT", "1") == "1",
        state_path=os.environ.get("FAKE_GPU_STATE") or None,
    )
