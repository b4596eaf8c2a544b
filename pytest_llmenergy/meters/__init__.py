"""Energy meters: one module per source, all behind :class:`~.base.Meter`.

Vendor libraries (pynvml, amdsmi, pyJoules) are imported when a meter is opened, never when
this package is imported.  The GPU backends are the device layer's vendors
(``gpu.device.VENDORS``), in its order.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError, renamed_names
from ..gpu.device import VENDORS
from .base import Meter
from .marks import Window, mark_phase
from .meter_settings import MeterSettings
from .readings import Domain, Measurement, Method, Phase, PowerSample

MeterFactory = Callable[[MeterSettings], Meter]

# GPU backends with a meter module of their own; every other vendor of the device layer's
# registry (``gpu.device.VENDORS``) is measured by the device meter, through that layer
# alone, so a new vendor is a backend without a line here.
OWN_GPU_METERS = {
    "nvml": "pytest_llmenergy.meters.nvml:create",
    "amdsmi": "pytest_llmenergy.meters.amdsmi:create",
}
DEVICE_METER = "pytest_llmenergy.meters.device_meter:create"

# name -> "module:function"; imported only when that backend is opened.
BUILTIN_BACKENDS: dict[str, str] = {
    "auto": "pytest_llmenergy.meters.auto:create",
    **{v.backend: OWN_GPU_METERS.get(v.backend, DEVICE_METER) for v in VENDORS},
    "rapl": "pytest_llmenergy.meters.rapl:create",
    "pyjoules": "pytest_llmenergy.meters.pyjoules:create",
    "powermetrics": "pytest_llmenergy.meters.powermetrics:create",
    "estimate": "pytest_llmenergy.meters.estimate:create",
}


def sample_interval_defaults() -> dict[str, float]:
    """Each sampling meter's own sampling period, for help texts (imports no vendor
    library: the vendor modules import theirs when a meter opens)."""
    from . import powermetrics

    return {
        **{v.backend: v.interval_s for v in VENDORS},
        "powermetrics": powermetrics.DEFAULT_INTERVAL_S,
    }


def backend_names(extra: Mapping[str, MeterFactory] | None = None) -> list[str]:
    return [*BUILTIN_BACKENDS, *(extra or {})]


def resolve_factory(name: str, extra: Mapping[str, MeterFactory] | None = None) -> MeterFactory:
    if extra and name in extra:
        return extra[name]
    target = BUILTIN_BACKENDS.get(name)
    if target is None:
        choices = ", ".join(backend_names(extra))
        raise ConfigError(f"unknown energy backend {name!r}; choose one of: {choices}")
    module, func = target.split(":")
    factory: MeterFactory = getattr(importlib.import_module(module), func)
    if target == DEVICE_METER:  # one function for every such vendor: which one, bound here
        return functools.partial(factory, backend=name)
    return factory


def open_meter(
    name: str = "auto",
    options: MeterSettings | None = None,
    *,
    extra: Mapping[str, MeterFactory] | None = None,
    **option_kwargs: Any,
) -> Meter:
    """Open the named backend; raises :class:`MeterUnavailable` saying why it can't.

    ``open_meter("nvml", gpus=(0, 1))`` is short for passing a :class:`MeterSettings`.
    """
    if options is None:
        if "gpus" in option_kwargs and option_kwargs["gpus"] is not None:
            option_kwargs["gpus"] = tuple(option_kwargs["gpus"])
        try:
            options = MeterSettings(**option_kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc)) from exc
    elif option_kwargs:
        raise TypeError("pass either options= or keyword options, not both")
    return resolve_factory(name, extra)(options)


__all__ = [
    "BUILTIN_BACKENDS",
    "Domain",
    "Measurement",
    "Meter",
    "MeterFactory",
    "MeterSettings",
    "Method",
    "Phase",
    "PowerSample",
    "Window",
    "backend_names",
    "mark_phase",
    "open_meter",
    "resolve_factory",
    "sample_interval_defaults",
]

# The 0.1 names, until 0.3.0.
__getattr__ = renamed_names("pytest_llmenergy.meters", {"MeterOptions": "MeterSettings"}, globals())
