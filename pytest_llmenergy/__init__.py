"""pytest-llmenergy: measure the energy and time of LLM inference, case by case.

In pytest: the ``energy_meter`` and ``energy_benchmark`` fixtures.  Usable without
pytest::

    from pytest_llmenergy import open_meter
    meter = open_meter("auto")
    with meter.measure() as m:
        work()
    m.seconds, m.joules, m.by_domain
"""

from __future__ import annotations

from .axes import Axis
from .controller import ControllerOptions
from .controller.benchmark import EnergyBenchmark
from .errors import ConfigError, LLMEnergyError, MeterError, MeterUnavailable
from .meters import (
    Domain,
    Measurement,
    Meter,
    MeterOptions,
    Method,
    Phase,
    PowerSample,
    backend_names,
    mark_phase,
    open_meter,
)
from .results import CaseResult, Trial

__version__ = "0.2.0.dev0"

__all__ = [
    "Axis",
    "CaseResult",
    "ConfigError",
    "ControllerOptions",
    "Domain",
    "EnergyBenchmark",
    "LLMEnergyError",
    "Measurement",
    "Meter",
    "MeterError",
    "MeterOptions",
    "MeterUnavailable",
    "Method",
    "Phase",
    "PowerSample",
    "Trial",
    "__version__",
    "backend_names",
    "mark_phase",
    "open_meter",
]
