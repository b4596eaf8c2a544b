"""What the GPU meters (NVML, amdsmi) share: energy counters read at a window's edges,
power sampled in a thread for the GPUs without a usable counter, and each counter's
update period, timed when the meter opens (a window shorter than the period sees a
whole period's energy or none, so the period is what the meter resolves).

A vendor's meter subclasses ``GpuMeter``: it opens its library, describes each GPU it
measures, reads its counters in ``_read`` and turns two readings into joules in
``_counter_energy_j``; the choice of GPUs (``--energy-gpus``), a counter's period in its
GPU's note, the domains, notes and resolution the descriptions make, the sampler, the
merging of sampled and counted GPUs, the window bookkeeping and closing live here.
"""

from __future__ import annotations

import itertools
import statistics
import sys
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import replace
from time import perf_counter
from typing import Any, Protocol, TypeVar

from ..errors import ConfigError
from ..gpu.device import GpuDeviceError
from ..gpu.device import one_line as one_line  # the GPU meters' messages
from .base import Meter
from .readings import Domain, Method, PowerSample, Reading, duration_text
from .sampling import PowerSampler, integrate_instant

# Timing the counters' update period at open: every counter GPU is polled in turn in one
# tight loop, which stops once each has shown this many updates, or after the cap (so
# opening stays well under a second even with a 100 ms counter on every GPU; long enough
# that a 100 ms counter shows four updates, so one poll delayed by a busy machine cannot
# make the median interval)
PERIOD_PROBE_MAX_S = 0.5
PERIOD_PROBE_INTERVALS = 3


class MeasuredGpu(Protocol):
    """What a vendor's description of one measured GPU (a frozen dataclass) gives the
    bookkeeping shared here."""

    @property
    def domain(self) -> str: ...
    @property
    def method(self) -> Method: ...
    @property
    def note(self) -> str: ...
    @property
    def resolution_s(self) -> float | None: ...


GpuT = TypeVar("GpuT", bound=MeasuredGpu)


def unavailable(exc: GpuDeviceError, fallback: str) -> str:
    """Why a GPU meter cannot open, from the device layer's error: its words, then
    ``fallback`` (what to use instead) unless the library is missing, whose install line
    is what to do."""
    return str(exc) if exc.missing else f"{exc}; {fallback}"


def select_gpus(gpus: Sequence[int] | None, visible: int, where: str) -> list[int]:
    """The positions among the ``visible`` GPUs that are measured: all, or the ones
    ``--energy-gpus`` names; ``where``: what makes them visible, for the message."""
    if gpus is None:
        return list(range(visible))
    bad = [i for i in gpus if i >= visible]
    if bad:
        raise ConfigError(
            f"--energy-gpus names GPU {bad[0]}, but {visible} GPU(s) are "
            f"visible{where} (valid: 0..{visible - 1})"
        )
    return sorted(set(gpus))


def probe_counters(
    read_count: Callable[[Any], int],
    handles: Sequence[Any],
    max_s: float = PERIOD_PROBE_MAX_S,
    intervals: int = PERIOD_PROBE_INTERVALS,
    clock: Callable[[], float] = perf_counter,
) -> list[list[tuple[float, int]]]:
    """Each counter's changes ``(time, value)`` while all are polled in turn, within
    ``max_s``: what its update period (and, for amdsmi, its rate) is measured from."""
    last = [read_count(handle) for handle in handles]
    changes: list[list[tuple[float, int]]] = [[] for _ in handles]
    pending = list(range(len(handles)))
    deadline = clock() + max_s
    while pending and clock() < deadline:
        for i in pending:
            value = read_count(handles[i])
            if value != last[i]:
                last[i] = value
                changes[i].append((clock(), value))
        pending = [i for i in pending if len(changes[i]) <= intervals]
    return changes


def period_s(times: Sequence[float]) -> float | None:
    """The mean period over the whole span, its number of periods counted with the median
    interval: a change seen late (a busy machine) shortens one interval and lengthens the
    next, which the span evens out; a tick that added nothing (two periods between seen
    changes) is counted as two.  None: fewer than two changes."""
    if len(times) < 2:
        return None
    median_s = statistics.median(b - a for a, b in itertools.pairwise(times))
    span_s = times[-1] - times[0]
    periods = max(round(span_s / median_s), 1) if median_s > 0 else len(times) - 1
    return span_s / periods


def period_text(period: float | None) -> str:
    if period is None:
        return f"update period unknown (fewer than 2 updates in {PERIOD_PROBE_MAX_S:g} s)"
    return f"updates every {duration_text(period)}"


def with_period(device: GpuT, counter_text: str, period: float | None) -> GpuT:
    """A counter GPU once its counter's period is timed: the period follows
    ``counter_text`` in its note and is its resolution."""
    note = device.note.replace(counter_text, f"{counter_text}, {period_text(period)}", 1)
    return replace(device, note=note, resolution_s=period)


def sync_torch_gpus(ordinals: Sequence[int], api: str = "cuda") -> None:
    """Let queued kernels finish, so their energy lands inside the window they ran in;
    ``api``: the torch module of the vendor's GPUs (its ``Vendor.torch``: torch on ROCm
    keeps the ``torch.cuda`` names).  Only when the program already uses the GPUs through
    torch: we never import torch."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, api, None) if torch is not None else None
    if cuda is None or not cuda.is_initialized():
        return
    try:
        for ordinal in ordinals:
            cuda.synchronize(ordinal)
    except (RuntimeError, ValueError, AssertionError):
        cuda.synchronize()  # torch numbers devices differently: at least the current one


class GpuMeter(Meter):
    """GPUs with counters (read at the edges) and GPUs sampled in a thread, together."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []
        self._closed = False
        self._sampler: PowerSampler | None = None
        self._names: tuple[str, ...] = ()  # every domain, in order
        self._counter_names: tuple[str, ...] = ()
        self._sampled_names: tuple[str, ...] = ()

    def _measure(self, devices: Sequence[MeasuredGpu]) -> None:
        """The domains, notes and resolution of the GPUs measured, in order."""
        self.notes.extend(d.note for d in devices)
        # The coarsest GPU sets what the meter resolves; one unknown makes it unknown.
        known_s = [d.resolution_s for d in devices if d.resolution_s is not None]
        self._resolution_s = max(known_s) if len(known_s) == len(devices) else None
        self._domains: dict[str, Domain] = {d.domain: Domain(d.domain, d.method) for d in devices}
        self._names = tuple(self._domains)

    def _sample(
        self,
        readers: Sequence[tuple[str, Callable[[], float]]],
        interval_s: float,
        thread: str,
        skipped: tuple[type[BaseException], ...] = (),
    ) -> None:
        """Sample these GPUs' power (W) while a window is open; none: no thread at all.

        Between the edges, a GPU whose read raises one of ``skipped`` (the library's own
        error) is left out of that sample: the hole is the window's telemetry's to judge
        (meters/validity.py), not a reason to lose the other GPUs' samples.  The edges
        read every GPU or fail the window.
        """
        read_all = tuple(readers)
        self._sampled_names = tuple(name for name, _ in read_all)
        if not read_all:
            self._uses_start_stop = False  # counters only: nothing to start or stop
            return

        def read_power_w() -> dict[str, float]:
            return {name: read() for name, read in read_all}

        def read_some_w() -> dict[str, float]:
            out: dict[str, float] = {}
            for name, read in read_all:
                try:
                    out[name] = read()
                except skipped:
                    continue
            return out

        background = read_some_w if skipped else None
        self._sampler = PowerSampler(read_power_w, interval_s, thread, read_background_w=background)

    @abstractmethod
    def _counter_energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        """Joules of the counted GPUs between two readings."""

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        out = self._counter_energy_j(a, b)
        if self._sampler is not None:
            samples = self._sampler.bracket(a.t, b.t)
            out.update(integrate_instant(samples, a.t, b.t, self._sampled_names))
            if self._counter_names:
                out = {name: out[name] for name in self._names}
        return out

    def _start(self) -> None:
        if self._sampler is not None:
            self._sampler.start()

    def _stop(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    def _samples(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        return self._sampler.between(t0, t1) if self._sampler is not None else ()

    def describe(self) -> str:
        return f"{self.backend}: " + "; ".join(self.notes)

    def close(self) -> None:
        if self._closed:
            return
        if self._sampler is not None:
            self._sampler.stop()
        self._shutdown()

    def _shutdown(self) -> None:
        """The library shut down once per init, however often close() is called."""
        self._closed = True
        self._library_shutdown()

    @abstractmethod
    def _library_shutdown(self) -> None:
        """Shut the vendor's library down, its own errors suppressed."""
