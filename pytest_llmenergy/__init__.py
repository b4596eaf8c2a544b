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

import importlib
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, LLMEnergyError, MeterError, MeterUnavailable, renamed_names

if TYPE_CHECKING:
    from .axes import Axis
    from .controller import ControllerSettings
    from .controller.benchmark import EnergyBenchmark
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

# The public names, imported on first use: importing the package stays quick (pytest,
# numpy and the meters take a second or more), so that the ``llmenergy`` command is
# running, and takes Ctrl-C as it says, before the heavy imports begin.
_LAZY = {
    "Axis": "axes",
    "ControllerSettings": "controller",
    "EnergyBenchmark": "controller.benchmark",
    **dict.fromkeys(
        (
            "Domain",
            "Measurement",
            "Meter",
            "MeterSettings",
            "Method",
            "Phase",
            "PowerSample",
            "backend_names",
            "mark_phase",
            "open_meter",
        ),
        "meters",
    ),
    "CaseResult": "results",
    "Trial": "results",
}
# The 0.1 names, until 0.3.0.
_RENAMED = {"MeterOptions": "MeterSettings", "ControllerOptions": "ControllerSettings"}


class _Names(dict):  # type: ignore[type-arg]
    """The namespace the old names are read from: a public name is imported when asked."""

    def __missing__(self, name: str) -> Any:
        return _public(name)


def _public(name: str) -> Any:
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


_old_name = renamed_names(__name__, _RENAMED, _Names(), stacklevel=3)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return _public(name)
    return _old_name(name)  # warns, naming the code that used it; or AttributeError


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
