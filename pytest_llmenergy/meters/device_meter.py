"""A GPU family read through the device layer alone: its vendor's module (``gpu/``) opens
the GPUs, numbers them and reads each one's energy counter or power; this meter reads
the counters at a window's edges and samples the power of the others in a thread.

Every vendor of the registry (``gpu.device.VENDORS``) without a meter module of its own
is measured this way, under its own backend name, so a new vendor is one module and one
row of that registry.  What its readings are (which sensor, how often it updates) is its
module's to say; see the vendor's section below.
"""

from __future__ import annotations

import sys
from time import perf_counter

from ..errors import ConfigError, MeterError, MeterUnavailable
from ..gpu.device import GpuDevice, GpuDeviceError, GpuLibrary, open_library, vendor_named
from .gpu_meter import (
    GpuMeter,
    counter_resolution_s,
    ordinal_of,
    period_s,
    period_text,
    probe_counters,
    sync_torch_gpus,
    unavailable,
)
from .marks import _frozen
from .meter_settings import MeterSettings
from .readings import Domain, Method, Reading

_modules = sys.modules  # read at every reading: is torch (and so maybe the GPUs) in use?
FALLBACK_HINT = "use --energy-backend=auto or estimate"


def create(options: MeterSettings, backend: str) -> DeviceMeter:
    """Registry entry point (``backend`` bound by the registry): the vendor's GPUs."""
    return DeviceMeter(options, backend)


class DeviceMeter(GpuMeter):
    """Energy of one vendor's GPUs through the device layer: counters where a GPU keeps
    one, sampled power elsewhere."""

    def __init__(self, options: MeterSettings | None, backend: str) -> None:
        super().__init__()
        options = options or MeterSettings()
        self.vendor = vendor_named(backend)
        self.backend = backend
        try:
            self._library: GpuLibrary = open_library(self.vendor.name)
        except GpuDeviceError as exc:
            raise MeterUnavailable(backend, unavailable(exc, FALLBACK_HINT)) from exc
        try:
            self._open(options)
        except GpuDeviceError as exc:
            self._shutdown()
            reason = f"{self.vendor.label} GPUs could not be read: {exc}; {FALLBACK_HINT}"
            raise MeterUnavailable(backend, reason) from exc
        except BaseException:
            self._shutdown()
            raise

    def _open(self, options: MeterSettings) -> None:
        every = self._library.devices()
        if not every:
            raise MeterUnavailable(
                self.backend, f"no {self.vendor.label} GPU found; {FALLBACK_HINT}"
            )
        if options.gpus is not None:
            bad = [i for i in options.gpus if i >= len(every)]
            if bad:
                raise ConfigError(
                    f"--energy-gpus names GPU {bad[0]}, but {len(every)} {self.vendor.label} "
                    f"GPU(s) are visible (valid: 0..{len(every) - 1})"
                )
        devices = every if options.gpus is None else self._library.devices(options.gpus)
        interval_s = options.interval_s(self.vendor.interval_s)
        counted: list[GpuDevice] = []
        sampled: list[GpuDevice] = []
        for d in devices:
            if d.energy_counter_j() is not None:
                counted.append(d)
                continue
            try:
                d.power_w()
            except GpuDeviceError as exc:
                raise MeterUnavailable(
                    self.backend,
                    f"{d.domain} {d.name} reports neither an energy counter nor power ({exc}); "
                    f"{FALLBACK_HINT}",
                ) from exc
            sampled.append(d)

        changes = probe_counters(_counter_j, counted)
        periods = {d.domain: period_s([t for t, _ in seen]) for d, seen in zip(counted, changes)}
        resolutions: list[float | None] = []
        for d in devices:
            if d.domain in periods:
                period = periods[d.domain]
                self.notes.append(f"{d.domain} {d.name}: counter ({period_text(period)})")
                resolutions.append(counter_resolution_s(period))
            else:
                self.notes.append(
                    f"{d.domain} {d.name}: sampled ({d.power_note()} every {interval_s:g} s)"
                )
                resolutions.append(interval_s)
        known = [r for r in resolutions if r is not None]
        self._resolution_s = max(known) if len(known) == len(resolutions) else None

        self.devices: tuple[GpuDevice, ...] = tuple(devices)
        method = {d.domain: Method.COUNTER for d in counted}
        self._domains = {
            d.domain: Domain(d.domain, method.get(d.domain, Method.SAMPLED)) for d in devices
        }
        self._names = tuple(self._domains)
        self._gpu_names = {d.domain: d.name for d in devices}
        self._every_counted = self._counted = tuple(counted)
        self._counter_names = tuple(d.domain for d in counted)
        readers = [(d.domain, d.power_w) for d in sampled]
        self._sample(readers, interval_s, f"llmenergy-{self.backend}-sampler")
        served = {d.domain: (ordinal_of(d.domain),) for d in devices}  # gpu:<i>
        gpus = [(served[d.domain], d) for d in devices]
        self._choose_gpus(options, served, gpus, self.vendor.torch)

    def _use_counters(self, positions: tuple[int, ...]) -> None:
        self._counted = tuple(self._every_counted[i] for i in positions)

    def _read(self) -> Reading:
        if "torch" in _modules:  # only a program using torch may have queued GPU work
            sync_torch_gpus(self._read_ordinals, self.vendor.torch)
        try:
            sampler = self._sampler
            t = sampler.sample_now() if sampler is not None else perf_counter()
            state = tuple(map(_counter_j, self._counted))
        except GpuDeviceError as exc:
            raise MeterError(f"{self.backend} reading failed: {exc}") from exc
        return _frozen(Reading, {"t": t, "state": state})

    def _counter_energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        return {name: j_b - j_a for name, j_a, j_b in zip(self._counter_names, a.state, b.state)}

    def _library_shutdown(self) -> None:
        self._library.close()


def _counter_j(device: GpuDevice) -> float:
    value = device.energy_counter_j()
    if value is None:
        raise GpuDeviceError(f"{device.domain} {device.name}: its energy counter stopped")
    return value
