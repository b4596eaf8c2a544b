"""A steady thermal state before every case: wait for the GPUs to cool back down.

A GPU that a case left hot runs the next one warmer: its leakage power is higher and
its boost clock lower, so two cases (or the same case in two sessions) differ by what
ran before them.  With ``--energy-thermal-tolerance=C`` every case waits, before its
warm-up, until each measured GPU is no more than C °C above its reference, or until
``--energy-thermal-max-wait`` has passed (then it starts anyway, and says so).

The reference is the previous case's start temperature, but never above the first
case's: a chain of "within C of the one before" alone would let every case start C
warmer than the last.  Zeus makes the same point another way (``zeus.profile``: a fixed
idle cooldown before each trial, long enough that trials agree); here the GPUs' own
temperature says when the cooldown is enough, and the longest wait is bounded.

GPU temperatures are read through the device layer (``device.py``): the GPUs the meter
measures, through the same vendor library, numbered and made visible as the meter does.
``monotonic`` and ``sleep`` are module attributes: a stand-in GPU with virtual time
replaces them, so tests of long cooldowns take no real time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from ..errors import ConfigError
from ..gpu.device import GpuDeviceError, open_gpus, vendor_labels
from ..results import ThermalWait

Temperatures = Callable[[], list[float | None]]

POLL_S = 1.0  # NVML reports whole degrees; a GPU cools by one in seconds, not less
monotonic = time.monotonic
sleep = time.sleep


class GpuTemperatures:
    """°C per measured GPU, by calling it; ``close()`` releases the library."""

    def __init__(self, read: Temperatures, close: Callable[[], None], source: str) -> None:
        self._read = read
        self._close = close
        self.source = source  # "NVML" or "amdsmi", for the header

    def __call__(self) -> list[float | None]:
        return self._read()

    def close(self) -> None:
        self._close()


def gpu_temperatures_reader(
    gpus: Sequence[int] | None = None, backend: str = "auto"
) -> GpuTemperatures:
    """The measured GPUs' temperature (°C, None where a GPU does not say), through the
    device layer: the GPUs the session's backend measures (``auto`` or a CPU backend: the
    first vendor whose GPUs are here), numbered and made visible as that vendor's meter
    numbers them (``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``...).  ``gpus``:
    ordinals as ``--energy-gpus`` gives them; None: all.  Raises ``ConfigError`` when no
    GPU's temperature can be read here."""
    try:
        library = open_gpus(backend)
    except GpuDeviceError as exc:
        raise ConfigError(_no_temperature(str(exc))) from None
    try:
        devices = library.devices(gpus)
    except GpuDeviceError as exc:
        library.close()
        raise ConfigError(_no_temperature(f"{library.vendor}: {exc}")) from None
    if not devices:
        library.close()
        raise ConfigError(_no_temperature(f"{library.vendor}: no GPU"))
    return GpuTemperatures(
        lambda: [d.temperature_c() for d in devices], library.close, library.reads_through
    )


def _no_temperature(why: str) -> str:
    return (
        f"no GPU temperature can be read here ({why}): run on a machine with a GPU of a "
        f"known vendor ({vendor_labels()}), or leave out "
        "--energy-thermal-tolerance"
    )


def _hottest_excess(now: Sequence[float | None], reference: Sequence[float | None]) -> float:
    """How far the GPU furthest above its reference is above it (°C; -inf: none known)."""
    excess = [n - r for n, r in zip(now, reference) if n is not None and r is not None]
    return max(excess, default=-math.inf)


class ThermalSettling:
    """Before each case: wait until the GPUs are back near their reference temperature.

    ``settle()`` waits (polling every ``poll_s``) and returns the case's ``ThermalWait``;
    the first case does not wait, and its start temperature is the ceiling of every
    later reference."""

    def __init__(
        self,
        read: Temperatures,
        tolerance_c: float,
        max_wait_s: float,
        poll_s: float = POLL_S,
    ) -> None:
        self.read = read
        self.tolerance_c = tolerance_c
        self.max_wait_s = max_wait_s
        self.poll_s = poll_s
        self._first: list[float | None] | None = None
        self._previous: list[float | None] | None = None

    def reference(self) -> list[float | None] | None:
        """Per GPU: the previous case's start, capped at the first case's (None: first)."""
        first, previous = self._first, self._previous
        if first is None or previous is None:
            return None
        return [
            None if f is None and p is None else min(x for x in (f, p) if x is not None)
            for f, p in zip(first, previous)
        ]

    def settle(self, progress: Callable[[str], None] | None = None) -> ThermalWait:
        reference = self.reference()
        began = monotonic()
        now = self.read()
        gave_up = slept = False
        if reference is not None:
            limit = self.tolerance_c
            while _hottest_excess(now, reference) > limit:
                left = self.max_wait_s - (monotonic() - began)
                if left <= 0:
                    gave_up = True
                    break
                if progress is not None:
                    progress(
                        f"waiting for the GPUs to cool: {_temps(now)} °C, to <= "
                        f"{_temps([r + limit if r is not None else None for r in reference])} °C"
                    )
                sleep(min(self.poll_s, left))
                slept = True
                now = self.read()
        # a case that found the GPUs cool did not wait (reading them is not waiting)
        waited_s = monotonic() - began if slept else 0.0
        if self._first is None:
            self._first = list(now)
        self._previous = list(now)
        return ThermalWait(
            start_c=tuple(now),
            reference_c=tuple(reference) if reference is not None else (),
            tolerance_c=self.tolerance_c,
            waited_s=waited_s,
            gave_up=gave_up,
        )


def _temps(values: Sequence[float | None]) -> str:
    return "/".join("?" if v is None else f"{v:.0f}" for v in values)


def wait_summary(waits: Sequence[ThermalWait], max_wait_s: float) -> str:
    """One line for the terminal summary: the total wait, how many cases waited, and
    how many started at the limit, hotter than their reference."""
    waited = [w for w in waits if w.waited_s > 0]
    total_s = math.fsum(w.waited_s for w in waits)
    line = (
        f"thermal: waited {total_s:.1f} s in all for the GPUs to cool, before "
        f"{len(waited)} of {len(waits)} case(s)"
    )
    if waited:
        line += f" (longest {max(w.waited_s for w in waited):.1f} s)"
    gave_up = [w for w in waits if w.gave_up]
    if gave_up:
        line += (
            f"; {len(gave_up)} started hotter than their reference after the longest wait "
            f"({max_wait_s:g} s, --energy-thermal-max-wait)"
        )
    return line
