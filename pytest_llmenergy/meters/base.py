"""The one small interface every energy source implements.

A meter takes *readings* at the edges of a window (and at marks inside it); the
energy between two readings is its own business: counter meters subtract, sampling
meters integrate the power samples taken in between.  Windows therefore nest
freely and can be split into phases at marks (prefill | decode).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from ..errors import ConfigError
from .marks import Window
from .readings import Domain, PowerSample, Reading, duration_text

# The longest idle measurement: an hour holds every stretch an idle baseline needs (past it
# the machine's drift is measured, not its idle power), and time.sleep refuses far less
# than some values a user can type (1e10 s overflows it).
MAX_IDLE_S = 3600.0


class Meter(ABC):
    """A source of energy readings.

    Subclasses implement ``domains``, ``_read`` and ``_energy_j``; sampling meters
    also ``_start``/``_stop`` (called when the first window opens and the last one
    closes) and ``_samples``.
    """

    backend: str = "?"
    # Lines for the report header: where each domain's figures come from, and caveats.
    notes: Sequence[str] = ()

    def __init__(self) -> None:
        self.idle_power_w: dict[str, float] = {}
        self._active = 0
        self._active_lock = threading.Lock()
        # Set by subclasses that know it once they are open; see ``resolution_s``.
        self._resolution_s: float | None = None
        # Whether windows must call _start/_stop: a meter that overrides neither has no
        # background work, and its windows skip the lock that orders them (a subclass
        # that overrides them may still clear this when, once open, they do nothing).
        self._uses_start_stop = (
            type(self)._start is not Meter._start or type(self)._stop is not Meter._stop
        )

    # -- what subclasses provide -------------------------------------------------
    @property
    @abstractmethod
    def domains(self) -> Mapping[str, Domain]:
        """Every domain this meter reports, in a stable order."""

    @abstractmethod
    def _read(self) -> Reading:
        """Take a reading now (counter values, or a forced power sample)."""

    @abstractmethod
    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        """Joules per domain between two readings of this meter."""

    def _start(self) -> None:
        """First window opened: start background sampling if the meter needs it."""

    def _stop(self) -> None:
        """Last window closed: stop background sampling."""

    def _samples(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        """Power samples taken within [t0, t1]; counter meters have none."""
        return ()

    @property
    def kind(self) -> str:
        """The meter that actually measures, whatever name chose it: ``auto`` resolving to
        the estimate is the estimate.  Runs of different kinds are not comparable."""
        return self.backend

    def settings(self) -> dict[str, str]:
        """Settings that change the figures themselves (the estimate's TDP), by label."""
        return {}

    def identity(self) -> dict[str, str]:
        """What two runs must share for their energies to be compared."""
        counted = [name for name, d in self.domains.items() if d.counted]
        return {"meter": self.kind, "domains": ", ".join(counted), **self.settings()}

    @property
    def resolution_s(self) -> float | None:
        """The shortest stretch of time whose energy this meter can tell apart.

        A counter's update period, a sampler's interval; None when unknown.  A window
        much shorter than this sees the energy of whole update periods or none at all.
        """
        return self._resolution_s

    @property
    def tick_period_s(self) -> float | None:
        """The period of the counter an aligned window's edges wait for (each edge on a
        refresh, ``meters/edges.py``); None: this meter's edges are read as they come
        (no counter, a fine one, or an unknown period)."""
        return None

    def describe(self) -> str:
        """One line for the report header: what measures which domain, and how."""
        doms = ", ".join(f"{d.name} ({d.method})" for d in self.domains.values())
        resolution_s = self.resolution_s
        if resolution_s is None:
            return f"{self.backend}: {doms}"
        return f"{self.backend}: {doms}; resolution {duration_text(resolution_s)}"

    def close(self) -> None:
        """Release the library or device handles."""

    # -- public API --------------------------------------------------------------
    def measure(self, phase: str = "main", *, aligned: bool = False) -> Window:
        """A window to use as ``with meter.measure() as m: ...``.

        ``phase`` names the stretch up to the first ``m.mark(...)``; ``aligned`` puts
        its edges on the counter's refreshes where it is coarse (``tick_period_s``): a
        trial's window, not a mark's.
        """
        return Window(self, phase, aligned)

    def measure_idle(self, seconds: float) -> dict[str, float]:
        """Measure idle power per domain and keep it as this meter's baseline."""
        if not 0 <= seconds <= MAX_IDLE_S:  # NaN too
            raise ConfigError(
                f"idle power is measured for 0 to {MAX_IDLE_S:g} s (an hour), not {seconds:g} s; "
                "give fewer seconds (a minute is plenty)"
            )
        with self.measure() as window:
            time.sleep(seconds)
        m = window.measurement
        self.idle_power_w = {name: j / m.seconds for name, j in m.by_domain.items()}
        return dict(self.idle_power_w)

    def _acquire(self) -> None:
        if not self._uses_start_stop:
            return
        with self._active_lock:
            self._active += 1
            if self._active == 1:
                try:
                    self._start()
                except BaseException:
                    self._active -= 1  # the next window must try to start again
                    raise

    def _release(self) -> None:
        if not self._uses_start_stop:
            return
        with self._active_lock:
            self._active -= 1
            if self._active == 0:
                self._stop()

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
