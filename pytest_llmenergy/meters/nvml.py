"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package, module ``pynvml``).

Volta and newer GPUs keep a total-energy counter in millijoules: reading it at the
window's edges costs two calls and no thread.  The driver refreshes it only every few
to a hundred milliseconds, so the meter times that period once when it opens and
reports it as its resolution.  Older GPUs (or boards whose counter is
unsupported) are sampled for power in a background thread, only while a window is
open.  The GPUs measured are the ones CUDA sees, numbered as CUDA numbers them, so
``gpu:i`` is what torch calls ``cuda:i``.

NVML is opened, and ``CUDA_VISIBLE_DEVICES`` resolved, by the device layer
(``gpu/nvidia.py``), when a meter is opened, never when this module is imported.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from ..errors import MeterError, MeterUnavailable
from ..gpu.device import GpuDeviceError, SmSample, vendor_named
from ..gpu.nvidia import CudaVisible, NvidiaGpu, NvidiaLibrary, text
from ..probes.process_tree import tree_pids
from .gpu_meter import (
    PERIOD_PROBE_INTERVALS,
    PERIOD_PROBE_MAX_S,
    GpuMeter,
    one_line,
    ordinal_of,
    period_s,
    probe_counters,
    select_gpus,
    sync_torch_gpus,
    unavailable,
    with_period,
)
from .marks import _frozen
from .meter_settings import MeterSettings
from .readings import Domain, Method, Reading

_modules = sys.modules  # read at every reading: is torch (and so maybe the GPUs) in use?
BACKEND = "nvml"
GPU_PROCESS = "gpu:process"  # this process tree's share of the GPUs' joules
VENDOR = vendor_named("nvidia")
DEFAULT_INTERVAL_S = VENDOR.interval_s
# nvmlDeviceGetPowerUsage on Ampere (but GA100) and newer: "power averaged over 1 sec
# interval" (NVML's documentation); a window shorter than that reads a blur of the power
# before it, so a GPU sampled through it resolves no finer (its windows are marked).
AVERAGED_POWER_S = 1.0
FALLBACK_HINT = "use --energy-backend=auto or estimate"
SAMPLER_THREAD_NAME = "llmenergy-nvml-sampler"
COUNTER_TEXT = "counter (NVML total energy, mJ)"

# Fallbacks for the pynvml constants we use, in case an old nvidia-ml-py lacks one.
_ARCH_VOLTA = 5
_ARCH_AMPERE = 7
_ARCH_UNKNOWN = 0xFFFFFFFF
_FI_DEV_POWER_INSTANT = 186
_ARCH_NAMES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
}
# nvmlValueType_t -> the member of the nvmlValue_t union that holds the value.
VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


@dataclass(frozen=True)
class NvmlGpu:
    """One measured GPU: ``domain`` is ``gpu:<CUDA ordinal>``, ``index`` its NVML index."""

    domain: str
    index: int
    uuid: str
    name: str
    method: Method
    note: str
    # Counter: the measured update period; sampled: the sampling interval; None: unknown.
    resolution_s: float | None = None

    def identity(self) -> tuple[str, str, str]:
        """(domain, name, uuid): what the device layer's GPU is made of."""
        return self.domain, self.name, self.uuid


def counter_periods_s(
    read_mj: Callable[[Any], int],
    handles: Sequence[Any],
    max_s: float = PERIOD_PROBE_MAX_S,
    intervals: int = PERIOD_PROBE_INTERVALS,
    clock: Callable[[], float] = perf_counter,
) -> list[float | None]:
    """Each counter's update period: the median time between changes of its value.

    A window shorter than the period sees either nothing or a whole period's energy,
    so the period is what the meter can resolve.  The counters are polled in turn, all
    within ``max_s``; one that changed fewer than twice in that time gets None.
    """
    changes = probe_counters(read_mj, handles, max_s, intervals, clock)
    return [period_s([t for t, _ in seen]) for seen in changes]


def sm_share(samples: Sequence[SmSample], ours: set[int], until_us: int) -> float:
    """This session's share of a GPU's SM use from the driver's per-process samples up to
    ``until_us``: its processes' SM % over every process's.  No sample (a window shorter
    than the driver's sampling, or an idle GPU): all of it, as nobody else was seen."""
    used = [(s.pid, s.sm_percent) for s in samples if s.at_us <= until_us]
    total = sum(sm for _, sm in used)
    if total <= 0:
        return 1.0
    return sum(sm for pid, sm in used if pid in ours) / total


def _visible_ordinals(visible: CudaVisible, spec: str | None) -> list[int]:
    """The NVML index of each GPU CUDA sees, in CUDA's order; none is no meter."""
    ordinals = visible.resolve(spec)
    if not ordinals:
        if spec is not None:
            raise MeterUnavailable(
                BACKEND, f"CUDA_VISIBLE_DEVICES={spec!r} hides all GPUs; {FALLBACK_HINT}"
            )
        raise MeterUnavailable(BACKEND, f"NVML found no NVIDIA GPU; {FALLBACK_HINT}")
    return ordinals


def _physical_gpus(ordinals: Sequence[int], selected: Sequence[int]) -> list[tuple[int, int]]:
    """One domain per physical GPU, named after its first selected CUDA ordinal:
    ``(NVML index, CUDA ordinal)``, in CUDA's order."""
    first_ordinal: dict[int, int] = {}
    for ordinal in selected:
        first_ordinal.setdefault(ordinals[ordinal], ordinal)
    return sorted(first_ordinal.items(), key=lambda kv: kv[1])


def _served(
    ordinals: Sequence[int], selected: Sequence[int], devices: Sequence[NvmlGpu]
) -> dict[str, tuple[int, ...]]:
    """Each GPU's CUDA ordinals: one, or several where CUDA sees it as MIG devices."""
    return {
        d.domain: tuple(o for o in selected if ordinals[o] == d.index) or (ordinal_of(d.domain),)
        for d in devices
    }


def _mig_text(visible: CudaVisible, index: int) -> str:
    """What a GPU's note adds when CUDA sees it through MIG devices."""
    if index not in visible.mig_entries:
        return ""
    return (
        f"; CUDA sees MIG device(s) {', '.join(visible.mig_entries[index])} of it, "
        "but the energy is the whole GPU's, other MIG instances' work included"
    )


def create(options: MeterSettings) -> NvmlMeter:
    """Registry entry point: open NVML on the GPUs CUDA sees (or ``options.gpus`` of them)."""
    return NvmlMeter(options)


class NvmlMeter(GpuMeter):
    """Energy of NVIDIA GPUs: the mJ counter where there is one, sampled power elsewhere."""

    backend = BACKEND

    def __init__(self, options: MeterSettings | None = None) -> None:
        super().__init__()
        options = options or MeterSettings()
        try:
            self._library = NvidiaLibrary()
        except GpuDeviceError as exc:
            raise MeterUnavailable(BACKEND, unavailable(exc, FALLBACK_HINT)) from exc
        nvml = self._library.nvml
        self._nvml = nvml
        self._nvml_error: type[BaseException] = nvml.NVMLError
        try:
            self._open(options)
        except nvml.NVMLError as exc:
            self._shutdown()
            reason = f"NVML failed while listing GPUs: {one_line(exc)}"
            raise MeterUnavailable(BACKEND, reason) from exc
        except BaseException:
            self._shutdown()
            raise

    # -- opening -------------------------------------------------------------------
    def _open(self, options: MeterSettings) -> None:
        nvml = self._nvml
        spec = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = CudaVisible(nvml, int(nvml.nvmlDeviceGetCount()))
        ordinals = _visible_ordinals(visible, spec)
        where = "" if spec is None else f" with CUDA_VISIBLE_DEVICES={spec!r}"
        selected = select_gpus(options.gpus, len(ordinals), where)

        interval_s = options.interval_s(DEFAULT_INTERVAL_S)
        described = [
            self._describe(index, ordinal, interval_s, visible)
            for index, ordinal in _physical_gpus(ordinals, selected)
        ]
        counted = [(d.domain, handle) for d, handle, read in described if read is None]
        devices = self._timed([d for d, _, _ in described], counted)
        self._measure(devices)
        names = {d.name for d in devices}
        if len(names) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            self.notes.append(
                "CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA may number these different GPUs "
                "fastest first, so gpu:i may not be cuda:i"
            )

        self.devices: tuple[NvmlGpu, ...] = tuple(devices)
        self._every_handles = self._counter_handles = tuple(handle for _, handle in counted)
        self._counter_names = tuple(domain for domain, _ in counted)
        self._energy_mj = nvml.nvmlDeviceGetTotalEnergyConsumption
        readers = [(d.domain, read) for d, _, read in described if read is not None]
        self._sample(readers, interval_s, SAMPLER_THREAD_NAME, skipped=(nvml.NVMLError,))
        gpus = [
            NvidiaGpu(self._library, handle, *d.identity())
            for d, (_, handle, _) in zip(devices, described)
        ]
        self._attribute(options, gpus)
        served = _served(ordinals, selected, devices)
        self._choose_gpus(options, served, [(served[g.domain], g) for g in gpus], VENDOR.torch)

    def _describe(
        self, index: int, ordinal: int, interval_s: float, visible: CudaVisible
    ) -> tuple[NvmlGpu, Any, Callable[[], float] | None]:
        """One GPU: its description, its handle, and its power reader where it is sampled
        (None: its counter is read, and its resolution timed with the other counters)."""
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        domain = f"gpu:{ordinal}"
        name = text(nvml.nvmlDeviceGetName(handle))
        uuid = text(nvml.nvmlDeviceGetUUID(handle))
        why_sampled = self._counter_problem(handle)
        mig = _mig_text(visible, index)
        if why_sampled is None:
            note = f"{domain} {name}: {COUNTER_TEXT}{mig}"
            return NvmlGpu(domain, index, uuid, name, Method.COUNTER, note), handle, None
        read, source, averaged_s = self._power_reader(handle, domain, name)
        note = f"{domain} {name}: sampled ({why_sampled}; {source} every {interval_s:g} s){mig}"
        resolution_s = max(interval_s, averaged_s)
        return NvmlGpu(domain, index, uuid, name, Method.SAMPLED, note, resolution_s), handle, read

    def _timed(self, devices: list[NvmlGpu], counted: Sequence[tuple[str, Any]]) -> list[NvmlGpu]:
        """The GPUs with their counters' update periods, timed together, in their notes."""
        read_mj = self._nvml.nvmlDeviceGetTotalEnergyConsumption
        periods = counter_periods_s(read_mj, [handle for _, handle in counted])
        period_of = dict(zip((domain for domain, _ in counted), periods))
        return [
            with_period(d, COUNTER_TEXT, period_of[d.domain]) if d.domain in period_of else d
            for d in devices
        ]

    def _attribute(self, options: MeterSettings, gpus: Sequence[NvidiaGpu]) -> None:
        """gpu:process where the driver keeps per-process SM utilization (counted=False:
        a share of the GPUs' joules, beside them, as RAPL's cpu:process)."""
        self._roots = (os.getpid(), *options.attributed_pids)
        self._attributed = tuple((g.domain, g) for g in gpus if _keeps_sm_samples(g))
        if self._attributed:  # windows without it pay nothing for it
            self._energy_j = self._attributed_energy_j  # type: ignore[method-assign]
            self._domains[GPU_PROCESS] = Domain(GPU_PROCESS, Method.ATTRIBUTED, counted=False)
            self.notes.append(
                f"{GPU_PROCESS}: the GPUs' joules x this process tree's share of their SM "
                "utilization per process (NVML), an attribution"
            )

    def _counter_problem(self, handle: Any) -> str | None:
        """Why this GPU cannot use the energy counter, or None when it can."""
        nvml = self._nvml
        try:
            arch = int(nvml.nvmlDeviceGetArchitecture(handle))
        except nvml.NVMLError:
            arch = _ARCH_UNKNOWN  # an old driver: let the counter itself tell
        volta = getattr(nvml, "NVML_DEVICE_ARCH_VOLTA", _ARCH_VOLTA)
        if arch < volta:
            return f"{_ARCH_NAMES.get(arch, arch)}, energy counter unsupported before Volta"
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except nvml.NVMLError as exc:
            return f"energy counter unavailable: {one_line(exc)}"
        return None

    def _power_reader(
        self, handle: Any, domain: str, name: str
    ) -> tuple[Callable[[], float], str, float]:
        """The best power source of a GPU, chosen once: the instant field, else power usage;
        with the span the reading averages over (0: instantaneous)."""
        nvml = self._nvml
        field_id = getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", _FI_DEV_POWER_INSTANT)
        success = getattr(nvml, "NVML_SUCCESS", 0)
        try:
            probe = nvml.nvmlDeviceGetFieldValues(handle, [field_id])[0]
            instant = probe.nvmlReturn == success
        except nvml.NVMLError:
            instant = False
        if instant:
            member = VALUE_MEMBERS.get(int(probe.valueType), "uiVal")
            get_fields = nvml.nvmlDeviceGetFieldValues
            error = nvml.NVMLError
            ids = [field_id]

            def read_instant_w() -> float:
                value = get_fields(handle, ids)[0]
                if value.nvmlReturn != success:
                    raise error(value.nvmlReturn)
                return float(getattr(value.value, member)) / 1000.0

            return read_instant_w, "instant power field", 0.0

        get_usage = nvml.nvmlDeviceGetPowerUsage
        try:
            get_usage(handle)
        except nvml.NVMLError as exc:
            raise MeterUnavailable(
                BACKEND,
                f"{domain} {name} reports neither an energy counter nor power "
                f"({one_line(exc)}); {FALLBACK_HINT}",
            ) from exc
        source = "nvmlDeviceGetPowerUsage"
        try:
            arch = int(nvml.nvmlDeviceGetArchitecture(handle))
        except nvml.NVMLError:
            arch = _ARCH_UNKNOWN
        averaged_s = 0.0
        if getattr(nvml, "NVML_DEVICE_ARCH_AMPERE", _ARCH_AMPERE) <= arch != _ARCH_UNKNOWN:
            source += f", a {AVERAGED_POWER_S:g} s average on Ampere and newer, so edges blur"
            averaged_s = AVERAGED_POWER_S

        def read_usage_w() -> float:
            return get_usage(handle) / 1000.0

        return read_usage_w, source, averaged_s

    # -- the Meter interface ---------------------------------------------------------
    def _use_counters(self, positions: tuple[int, ...]) -> None:
        every = self._every_handles
        self._counter_handles = tuple(every[i] for i in positions)

    def _read(self) -> Reading:
        if "torch" in _modules:  # only a program using torch may have queued GPU work
            sync_torch_gpus(self._read_ordinals, VENDOR.torch)
        try:
            sampler = self._sampler
            t = sampler.sample_now() if sampler is not None else perf_counter()
            state = tuple(map(self._energy_mj, self._counter_handles))
            if self._attributed:  # the wall clock (µs) the driver stamps its samples with
                state += (int(time.time() * 1e6),)
        except self._nvml_error as exc:
            raise MeterError(f"NVML reading failed: {one_line(exc)}") from exc
        return _frozen(Reading, {"t": t, "state": state})  # Reading(t, state), a bit cheaper

    def _counter_energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        return {
            name: (mj_b - mj_a) / 1000.0
            for name, mj_a, mj_b in zip(self._counter_names, a.state, b.state)
        }

    def _attributed_energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        """The GPUs' joules and gpu:process (the meter's ``_energy_j`` when attributing)."""
        out = GpuMeter._energy_j(self, a, b)
        t0_us, t1_us = a.state[-1], b.state[-1]
        ours = tree_pids(self._roots)
        out[GPU_PROCESS] = sum(
            out[domain] * sm_share(_sm_samples(gpu, t0_us), ours, t1_us)
            for domain, gpu in self._attributed
            if domain in out  # a GPU read by this window
        )
        return out

    def _library_shutdown(self) -> None:
        self._library.close()


def _keeps_sm_samples(gpu: NvidiaGpu) -> bool:
    """Whether the driver keeps per-process SM utilization of this GPU."""
    try:
        return gpu.sm_samples(int(time.time() * 1e6)) is not None
    except GpuDeviceError:
        return False


def _sm_samples(gpu: NvidiaGpu, since_us: int) -> tuple[SmSample, ...]:
    try:
        return gpu.sm_samples(since_us) or ()
    except GpuDeviceError as exc:
        raise MeterError(f"NVML per-process utilization failed: {exc}") from exc
