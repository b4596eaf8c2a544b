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
from .controller import ControllerSettings
from .controller.benchmark import EnergyBenchmark
from .errors import ConfigError, LLMEnergyError, MeterError, MeterUnavailable, renamed_names
from .meters import (
    Domain,
    Measurement,
    Meter,
    MeterSettings,
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
    "ControllerSettings",
    "Domain",
    "EnergyBenchmark",
    "LLMEnergyError",
    "Measurement",
    "Meter",
    "MeterError",
    "MeterSettings",
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

# The 0.1 names, until 0.3.0.
__getattr__ = renamed_names(
    "pytest_llmenergy",
    {"MeterOptions": "MeterSettings", "ControllerOptions": "ControllerSettings"},
    globals(),
)
