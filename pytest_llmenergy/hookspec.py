"""Hooks that conftest files and other plugins can implement.

Every hook is documented with a conftest example.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .meters import MeterFactory


def pytest_llmenergy_meters(config: pytest.Config) -> Mapping[str, MeterFactory] | None:
    """Register energy meters of your own, usable as ``--energy-backend=NAME``.

    Return a mapping from backend name to a factory that takes the session's
    :class:`~pytest_llmenergy.MeterOptions` and returns a
    :class:`~pytest_llmenergy.Meter`; the factory raises
    :class:`~pytest_llmenergy.MeterUnavailable` when the machine cannot serve it, which
    stops the session at start with that reason.  A name can't replace a built-in one.

    Example (``conftest.py``)::

        import time
        from pytest_llmenergy import Domain, Meter, Method
        from pytest_llmenergy.meters.base import Reading

        class WallPlugMeter(Meter):
            backend = "wallplug"
            domains = {"node:0": Domain("node:0", Method.COUNTER)}

            def _read(self):
                return Reading(t=time.perf_counter(), state=read_plug_wh())

            def _energy_j(self, a, b):
                return {"node:0": (b.state - a.state) * 3600.0}

        def pytest_llmenergy_meters(config):
            return {"wallplug": lambda options: WallPlugMeter()}

    Then ``pytest --energy-backend=wallplug``.
    """
