"""The pytest plugin: options, the session that owns the meter, and fixtures.

Registered through the ``pytest11`` entry point as ``llmenergy``; disable it with
``-p no:llmenergy``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from .errors import ConfigError, LLMEnergyError, MeterUnavailable
from .meters import BUILTIN_BACKENDS, Meter, MeterFactory, MeterOptions, backend_names, open_meter


@dataclass(frozen=True)
class Option:
    """One command-line option and its ini twin."""

    flag: str
    ini: str
    help: str
    metavar: str

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option(
        "--energy-backend",
        "llmenergy_backend",
        "energy meter: auto (default), nvml, rapl, pyjoules, powermetrics, estimate, "
        "or one registered through the pytest_llmenergy_meters hook",
        "NAME",
    ),
    Option(
        "--energy-gpus",
        "llmenergy_gpus",
        "GPUs to measure, as indices among the CUDA-visible ones, e.g. 0,1 (default: all)",
        "LIST",
    ),
    Option(
        "--energy-sample-interval",
        "llmenergy_sample_interval",
        "seconds between power samples for sampling meters, e.g. 0.1 or 100ms "
        "(default: 0.1 for NVML, 0.2 for powermetrics)",
        "SECONDS",
    ),
    Option(
        "--energy-idle",
        "llmenergy_idle",
        "measure idle power for SECONDS at session start and report net energy too "
        "(default: 0, off)",
        "SECONDS",
    ),
    Option(
        "--energy-cpu-tdp",
        "llmenergy_cpu_tdp",
        "CPU TDP in watts for the estimate meter (default: from the CPU model table)",
        "WATTS",
    ),
)


@dataclass(frozen=True)
class PluginOptions:
    """Everything the options say, parsed and checked once."""

    backend: str = "auto"
    meter: MeterOptions = field(default_factory=MeterOptions)
    idle_s: float = 0.0


def _raw(config: pytest.Config, option: Option) -> tuple[str, str] | None:
    """The option's text and where it came from: the command line wins over the ini file."""
    value = config.getoption(option.dest, default=None)
    if value is not None:
        return str(value), f"{option.flag}={value}"
    ini = config.getini(option.ini)
    if ini not in ("", None):
        return str(ini).strip(), f"{option.ini} = {ini} (ini)"
    return None


def parse_seconds(text: str) -> float:
    text = text.strip().lower()
    scale = 1.0
    if text.endswith("ms"):
        text, scale = text[:-2], 1e-3
    elif text.endswith("s"):
        text = text[:-1]
    return float(text) * scale


def parse_gpus(text: str) -> tuple[int, ...]:
    gpus = tuple(int(part) for part in text.split(",") if part.strip())
    if not gpus or any(g < 0 for g in gpus):
        raise ValueError(text)
    return gpus


def _parsed(config: pytest.Config, option: Option, parse: Callable[[str], Any], want: str) -> Any:
    raw = _raw(config, option)
    if raw is None:
        return None
    text, origin = raw
    try:
        return parse(text)
    except ValueError:
        raise pytest.UsageError(f"{origin}: expected {want}") from None


def read_options(config: pytest.Config) -> PluginOptions:
    by_flag = {o.flag: o for o in OPTIONS}

    def positive(text: str) -> float:
        value = parse_seconds(text)
        if not value > 0:
            raise ValueError(text)
        return value

    def non_negative(text: str) -> float:
        value = parse_seconds(text)
        if not value >= 0:
            raise ValueError(text)
        return value

    def watts(text: str) -> float:
        value = float(text.lower().removesuffix("w"))
        if not value > 0:
            raise ValueError(text)
        return value

    backend = _parsed(config, by_flag["--energy-backend"], str.strip, "a backend name")
    return PluginOptions(
        backend=backend or "auto",
        meter=MeterOptions(
            gpus=_parsed(
                config,
                by_flag["--energy-gpus"],
                parse_gpus,
                "comma-separated GPU indices such as 0,1",
            ),
            sample_interval_s=_parsed(
                config,
                by_flag["--energy-sample-interval"],
                positive,
                "a positive number of seconds such as 0.1 or 100ms",
            ),
            cpu_tdp_w=_parsed(
                config, by_flag["--energy-cpu-tdp"], watts, "a positive number of watts such as 65"
            ),
        ),
        idle_s=_parsed(
            config, by_flag["--energy-idle"], non_negative, "a number of seconds >= 0 such as 5"
        )
        or 0.0,
    )


class EnergySession:
    """Owns the run's measuring state: the options, the meter, the idle baseline."""

    def __init__(self, config: pytest.Config, options: PluginOptions) -> None:
        self.config = config
        self.options = options
        self.meter: Meter | None = None
        self.extra_backends: dict[str, MeterFactory] = {}

    def collect_backends(self) -> None:
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
        self.collect_backends()
        name = self.options.backend
        if name not in backend_names(self.extra_backends):
            choices = ", ".join(backend_names(self.extra_backends))
            raise pytest.UsageError(
                f"--energy-backend={name}: unknown backend; choose one of: {choices}"
            )
        try:
            self.meter = open_meter(name, self.options.meter, extra=self.extra_backends)
        except MeterUnavailable as exc:
            raise pytest.UsageError(f"--energy-backend={name}: {exc.reason}") from None
        except ConfigError as exc:
            raise pytest.UsageError(f"--energy-backend={name}: {exc}") from None
        if self.options.idle_s > 0:
            try:
                self.meter.measure_idle(self.options.idle_s)
            except LLMEnergyError as exc:
                raise pytest.UsageError(
                    f"--energy-idle: measuring idle power failed: {exc}"
                ) from None

    def header_lines(self) -> list[str]:
        if self.meter is None:
            return []
        lines = [f"llmenergy: backend {self.options.backend} -> {self.meter.describe()}"]
        lines += [f"llmenergy:   {note}" for note in self.meter.notes]
        if self.meter.idle_power_w:
            idle = ", ".join(f"{d} {w:.2f} W" for d, w in self.meter.idle_power_w.items())
            lines.append(f"llmenergy: idle power over {self.options.idle_s:g} s: {idle}")
        return lines

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()
            self.meter = None


SESSION_KEY = pytest.StashKey[EnergySession]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmenergy", "LLM energy measurement (pytest-llmenergy)")
    for option in OPTIONS:
        group.addoption(
            option.flag,
            dest=option.dest,
            default=None,
            metavar=option.metavar,
            help=f"{option.help}. ini: {option.ini}",
        )
        parser.addini(option.ini, help=f"{option.help} (= {option.flag})", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[SESSION_KEY] = EnergySession(config, read_options(config))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[SESSION_KEY].open()


def pytest_report_header(config: pytest.Config) -> list[str]:
    energy = config.stash.get(SESSION_KEY, None)
    return energy.header_lines() if energy is not None else []


def pytest_unconfigure(config: pytest.Config) -> None:
    energy = config.stash.get(SESSION_KEY, None)
    if energy is not None:
        energy.close()


@pytest.fixture(scope="session")
def energy_meter(pytestconfig: pytest.Config) -> Iterator[Meter]:
    """The session's configured meter: ``with energy_meter.measure() as m: ...``."""
    meter = pytestconfig.stash[SESSION_KEY].meter
    if meter is None:  # only if sessionstart did not run, e.g. under an unusual runner
        raise LLMEnergyError("the energy meter was not opened at session start")
    yield meter
