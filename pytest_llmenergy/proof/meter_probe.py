"""NVML against itself: the energy counter beside the integral of the power readings.

One recording, read in a thread every few milliseconds: the energy counter (mJ), the
power the driver reports (``nvmlDeviceGetPowerUsage``: a 1 s average on Ampere and
newer, says NVML's documentation) and the instantaneous power field, over an idle
stretch, a loaded one and idle again.  Windows of every length (50 ms to 10 s) are cut
from it afterwards, each at sample times, so the counter and both integrals are
compared on exactly the same window, and many windows of a length give a spread, not
one example.  What the recording says:

- the counter's update period (the median time between its changes);
- the average's window (how long the average takes to rise from 10 % to 90 % of a load
  step, / 0.8, which a boxcar average of length T takes);
- per length and phase, how far the counter's joules are from the instantaneous
  power's integral (median and 95th percentile), and so the shortest window whose
  counter reading can be trusted within ``TRUST``;
- the package's own meter (``NvmlMeter``) on windows inside the loaded stretch, against
  the same integral.

The analysis is pure (``analyse``): tests feed it traces whose true energy is known.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..meters.gpu_meter import period_s
from ..meters.nvml import VALUE_MEMBERS

TRUST = 0.05  # a window is trusted when its counter is within 5 % of the integral (p95)
WINDOWS_S = (0.05, 0.2, 1.0, 3.0, 10.0)
SAMPLE_INTERVAL_S = 0.005
STRIDE = 0.618  # windows of a length start this many lengths apart
DOCUMENTED_AVERAGE_S = 1.0  # NVML: "averaged over 1 sec interval" on Ampere (not GA100)+


@dataclass(frozen=True)
class Sample:
    """One reading of the three sources, at the middle of the time it took."""

    t_s: float
    counter_mj: int
    average_w: float
    instant_w: float | None


@dataclass(frozen=True)
class Spread:
    """Windows of one length in one phase: counter / integral - 1, median and p95 of |.|."""

    phase: str
    length_s: float
    windows: int
    vs_instant_median: float | None
    vs_instant_p95: float | None
    vs_average_median: float | None
    vs_average_p95: float | None


@dataclass(frozen=True)
class Analysis:
    counter_period_s: float | None
    counter_updates: int
    average_window_s: float | None
    idle_w: float
    load_w: float
    spreads: tuple[Spread, ...]
    instant: bool

    def smallest_trusted_s(self, trust: float = TRUST) -> float | None:
        """The shortest length whose counter agrees with the instantaneous integral
        within ``trust`` (p95) in every phase, it and every longer one; None: none."""
        lengths = sorted({s.length_s for s in self.spreads})
        trusted = None
        for length in reversed(lengths):
            rows = [s for s in self.spreads if s.length_s == length and s.windows]
            p95s = [s.vs_instant_p95 for s in rows]
            if not rows or any(p is None or p > trust for p in p95s):
                break
            trusted = length
        return trusted


def _cumulative(times: Sequence[float], watts: Sequence[float | None]) -> list[float] | None:
    """Trapezoid integral from the first sample to each sample, J; None if a value is."""
    if any(w is None for w in watts):
        return None
    out = [0.0]
    for k in range(1, len(times)):
        out.append(out[-1] + 0.5 * (watts[k - 1] + watts[k]) * (times[k] - times[k - 1]))  # type: ignore[operator]
    return out


def _quantiles(diffs: Sequence[float]) -> tuple[float | None, float | None]:
    if not diffs:
        return None, None
    magnitudes = sorted(abs(d) for d in diffs)
    p95 = magnitudes[min(len(magnitudes) - 1, math.ceil(0.95 * len(magnitudes)) - 1)]
    return statistics.median(diffs), p95


def spreads(
    samples: Sequence[Sample], phase: str, span: tuple[float, float], length_s: float
) -> Spread:
    """Windows of ``length_s`` to 1.5 x that inside ``span``, from sample to sample,
    starting every 0.618 lengths: lengths and starts that no counter period divides, so
    the windows fall at every phase of the counter's refreshes, as a case's trials do (a
    window of exactly k periods would always see k refreshes and hide the quantization)."""
    times = [s.t_s for s in samples]
    instant = _cumulative(times, [s.instant_w for s in samples])
    average = _cumulative(times, [s.average_w for s in samples])
    counter = [s.counter_mj / 1000.0 for s in samples]
    vs_instant: list[float] = []
    vs_average: list[float] = []
    i = next((k for k, t in enumerate(times) if t >= span[0]), len(times))
    for k in itertools.count():
        if i >= len(times):
            break
        length = length_s * (1.0 + 0.5 * ((k * STRIDE) % 1.0))
        j = bisect.bisect_left(times, times[i] + length, lo=i)
        if j >= len(times) or times[j] > span[1]:
            if length_s * 1.5 > span[1] - span[0]:
                length = length_s  # a span barely longer than the length: the length alone
                j = bisect.bisect_left(times, times[i] + length, lo=i)
            if j >= len(times) or times[j] > span[1]:
                break
        counted = counter[j] - counter[i]
        if instant is not None and instant[j] > instant[i]:
            vs_instant.append(counted / (instant[j] - instant[i]) - 1.0)
        if average is not None and average[j] > average[i]:
            vs_average.append(counted / (average[j] - average[i]) - 1.0)
        i = bisect.bisect_left(times, times[i] + length_s * STRIDE, lo=i + 1)
    med_i, p95_i = _quantiles(vs_instant)
    med_a, p95_a = _quantiles(vs_average)
    count = max(len(vs_instant), len(vs_average))
    return Spread(phase, length_s, count, med_i, p95_i, med_a, p95_a)


def average_window_s(samples: Sequence[Sample], load_from: float, load_to: float) -> float | None:
    """How long the average took to climb 10 % -> 90 % of the idle-to-load step, / 0.8."""
    idle = [s.average_w for s in samples if load_from - 1.5 <= s.t_s < load_from]
    loaded = [s.average_w for s in samples if load_to - 2.0 <= s.t_s < load_to]
    if not idle or not loaded:
        return None
    low, high = statistics.median(idle), statistics.median(loaded)
    if high - low < 5.0:  # no step to time (a load too light to move the power)
        return None
    after = [s for s in samples if load_from <= s.t_s < load_to]
    t10 = next((s.t_s for s in after if s.average_w >= low + 0.1 * (high - low)), None)
    t90 = next((s.t_s for s in after if s.average_w >= low + 0.9 * (high - low)), None)
    if t10 is None or t90 is None:
        return None
    return (t90 - t10) / 0.8


def counter_changes(samples: Sequence[Sample]) -> list[float]:
    return [b.t_s for a, b in itertools.pairwise(samples) if b.counter_mj != a.counter_mj]


def analyse(
    samples: Sequence[Sample],
    idle: tuple[float, float],
    load: tuple[float, float],
    lengths_s: Sequence[float] = WINDOWS_S,
) -> Analysis:
    """Everything the recording says (see the module's docstring)."""
    changes = counter_changes(samples)
    rows = []
    for length in lengths_s:
        for phase, span in (("idle", idle), ("load", load)):
            if span[1] - span[0] >= length:
                rows.append(spreads(samples, phase, span, length))
    idle_w = [s.instant_w if s.instant_w is not None else s.average_w for s in samples
              if idle[0] <= s.t_s < idle[1]]  # fmt: skip
    load_w = [s.instant_w if s.instant_w is not None else s.average_w for s in samples
              if load[0] + 1.0 <= s.t_s < load[1]]  # fmt: skip
    return Analysis(
        counter_period_s=period_s(changes) if len(changes) >= 3 else None,
        counter_updates=len(changes),
        average_window_s=average_window_s(samples, load[0], load[1]),
        idle_w=statistics.median(idle_w) if idle_w else math.nan,
        load_w=statistics.median(load_w) if load_w else math.nan,
        spreads=tuple(rows),
        instant=all(s.instant_w is not None for s in samples),
    )


# -- recording on a GPU ----------------------------------------------------------------
class Recorder:
    """Reads GPU ``handle`` through ``nvml`` every ``interval_s`` in a thread."""

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        interval_s: float = SAMPLE_INTERVAL_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.nvml, self.handle, self.interval_s, self.clock = nvml, handle, interval_s, clock
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="llmenergy-proof-probe", daemon=True
        )
        self._instant = self._instant_reader()

    def _instant_reader(self) -> Callable[[], float | None]:
        nvml = self.nvml
        field_id = getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", 186)
        ok = getattr(nvml, "NVML_SUCCESS", 0)

        def read() -> float | None:
            try:
                value = nvml.nvmlDeviceGetFieldValues(self.handle, [field_id])[0]
            except nvml.NVMLError:
                return None
            if value.nvmlReturn != ok:
                return None
            member = VALUE_MEMBERS.get(int(getattr(value, "valueType", 1)), "uiVal")
            return float(getattr(value.value, member)) / 1000.0

        return read

    def read(self) -> Sample:
        before = self.clock()
        counter = int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        average = float(self.nvml.nvmlDeviceGetPowerUsage(self.handle)) / 1000.0
        instant = self._instant()
        return Sample((before + self.clock()) / 2, counter, average, instant)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.read())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _products() -> Any:
    """Four matrix products as one module call (made on use: torch is imported late)."""
    import torch

    class Products(torch.nn.Module):
        def forward(self, a: Any, b: Any) -> Any:
            for _ in range(4):
                out = a @ b
            return out

    return Products()


class Load:
    """Work that keeps the device busy in a thread until stopped: bf16 products on a GPU,
    float32 products on the CPU (where a stand-in's power follows the CPU's use)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="llmenergy-proof-load", daemon=True)

    def _loop(self) -> None:
        import torch

        cuda = self.device.startswith("cuda")
        n = 8192 if cuda else 256
        dtype = torch.bfloat16 if cuda else torch.float32
        a = torch.randn(n, n, device=self.device, dtype=dtype)
        b = torch.randn(n, n, device=self.device, dtype=dtype)
        products = _products()  # a module: what a stand-in GPU sees as its work
        while not self._stop.is_set():
            products(a, b)
            if cuda:
                torch.cuda.synchronize()

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def meter_windows(
    meter: Any, domain: str, recorder: Recorder, lengths_s: Sequence[float]
) -> list[tuple[float, float, float]]:
    """Open the meter on windows of ``lengths_s``: (start, end, meter joules) of each."""
    out = []
    for length in lengths_s:
        start = recorder.clock()
        with meter.measure() as window:
            time.sleep(length)
        end = recorder.clock()
        out.append((start, end, float(window.measurement.by_domain[domain])))
    return out


def integral_between(
    samples: Sequence[Sample], t0: float, t1: float, instant: bool
) -> float | None:
    """Trapezoid integral of a reading over [t0, t1], at the samples inside it."""
    inside = [s for s in samples if t0 <= s.t_s <= t1]
    if len(inside) < 2:
        return None
    values = [s.instant_w if instant else s.average_w for s in inside]
    cumulative = _cumulative([s.t_s for s in inside], values)
    if cumulative is None:
        return None
    # the edges not covered by a sample, at the nearest sample's power
    head = (inside[0].t_s - t0) * values[0]  # type: ignore[operator]
    tail = (t1 - inside[-1].t_s) * values[-1]  # type: ignore[operator]
    return cumulative[-1] + head + tail
