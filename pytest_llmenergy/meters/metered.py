"""What a window and its edges read of their meter: ``Meter``'s interface as ``marks``
and ``edges`` use it, below all three, so that ``base`` imports the window it opens and
the window never imports ``base`` back (no import loop; tests/test_layers.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .readings import Domain, PowerSample, Reading


class WindowMeter(Protocol):
    """The meter a window reads: ``base.Meter`` and every subclass of it."""

    @property
    def backend(self) -> str: ...

    @property
    def domains(self) -> Mapping[str, Domain]: ...

    @property
    def idle_power_w(self) -> Mapping[str, float]: ...

    @property
    def tick_period_s(self) -> float | None: ...

    @property
    def _uses_start_stop(self) -> bool: ...

    def _acquire(self) -> None: ...

    def _release(self) -> None: ...

    def _read(self) -> Reading: ...

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]: ...

    def _samples(self, t0: float, t1: float) -> tuple[PowerSample, ...]: ...
