"""Measuring: the session's meter, opened at session start, and the header's meter lines.

An unknown or unavailable backend stops the session here, before collection, with one
line; never with one failure per case.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..errors import ConfigError, LLMEnergyError, MeterUnavailable
from ..meters import BUILTIN_BACKENDS, Meter, MeterFactory, MeterOptions, backend_names, open_meter
from ..meters.background import BackgroundCpu
from ..meters.process_tree import ProcessTrees
from ..tables import wrap
from .options import MeasureSettings

PREFIX = "llmenergy: "


def header_lines(config: pytest.Config, lines: list[str]) -> list[str]:
    """Header lines fitted to the terminal: a long line continues, indented, below."""
    width = config.get_terminal_writer().fullwidth
    out: list[str] = []
    for line in lines:
        out += wrap(PREFIX + line, width, indent=" " * (len(PREFIX) + 2))
    return out


class Metering:
    """Owns the meter: which backend, its domains and methods, idle power."""

    def __init__(self, config: pytest.Config, settings: MeasureSettings, options: MeterOptions):
        self.config = config
        self.settings = settings
        self.options = options
        self.meter: Meter | None = None
        self.extra_backends: dict[str, MeterFactory] = {}
        self._background: BackgroundCpu | None = None

    @property
    def background(self) -> BackgroundCpu:
        """What the rest of the machine does: read around every trial (made on first use,
        so a session without energy cases does not pay for it)."""
        if self._background is None:
            # a server this session talks to is not "the rest of the machine"
            pids = self.options.attributed_pids
            self._background = BackgroundCpu(ProcessTrees(pids) if pids else None)
        return self._background

    # -- hooks ---------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.open()

    def header(self) -> list[str]:
        """The session header's lines about the meter (the plugin orders the features')."""
        if self.meter is None:
            return []
        lines = [f"backend {self.settings.backend} -> {self.meter.describe()}"]
        lines += [f"  {note}" for note in self.meter.notes]
        if self.meter.idle_power_w:
            idle = ", ".join(f"{d} {w:.2f} W" for d, w in self.meter.idle_power_w.items())
            lines.append(f"idle power over {self.settings.idle_s:g} s: {idle}")
        return lines

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.meter is not None:
            self.meter.close()
            self.meter = None

    # -- the meter -----------------------------------------------------------------
    def _collect_backends(self) -> None:
        for mapping in self.config.hook.pytest_llmenergy_meters(config=self.config):
            for name, factory in (mapping or {}).items():
                if name in BUILTIN_BACKENDS:
                    raise pytest.UsageError(
                        f"a plugin tried to register energy backend {name!r}, which is built "
                        "in; choose another name"
                    )
                self.extra_backends[name] = factory

    def open(self) -> None:
        """Open the meter (and measure idle power); any problem is a usage error."""
        self._collect_backends()
        name = self.settings.backend
        if name not in backend_names(self.extra_backends):
            choices = ", ".join(backend_names(self.extra_backends))
            raise pytest.UsageError(
                f"--energy-backend={name}: unknown backend; choose one of: {choices}"
            )
        try:
            self.meter = open_meter(name, self.options, extra=self.extra_backends)
        except MeterUnavailable as exc:
            raise pytest.UsageError(f"--energy-backend={name}: {exc.reason}") from None
        except ConfigError as exc:
            raise pytest.UsageError(f"--energy-backend={name}: {exc}") from None
        if self.settings.idle_s > 0:
            try:
                self.meter.measure_idle(self.settings.idle_s)
            except LLMEnergyError as exc:
                raise pytest.UsageError(
                    f"--energy-idle: measuring idle power failed: {exc}"
                ) from None

    def record(self) -> dict[str, Any]:
        """What a run file says about the meter: each domain's method, and idle power."""
        assert self.meter is not None
        return {
            "backend": self.meter.backend,
            "requested": self.settings.backend,
            "identity": self.meter.identity(),
            "description": self.meter.describe(),
            "notes": list(self.meter.notes),
            "domains": {
                name: {"method": str(d.method), "counted": d.counted}
                for name, d in self.meter.domains.items()
            },
            "idle_power_w": dict(self.meter.idle_power_w),
            "idle_seconds": self.settings.idle_s,
        }


METERING = pytest.StashKey[Metering]()
