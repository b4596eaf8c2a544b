"""Hooks that conftest files and other plugins can implement.

Every hook is documented with a conftest example.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .axes import Axis
    from .meters import MeterFactory


def pytest_llmenergy_meters(config: pytest.Config) -> Mapping[str, MeterFactory] | None:
    """Register energy meters of your own, usable as ``--energy-backend=NAME``.

    Return a mapping from backend name to a factory that takes the session's
    :class:`~pytest_llmenergy.MeterSettings` and returns a
    :class:`~pytest_llmenergy.Meter`; the factory raises
    :class:`~pytest_llmenergy.MeterUnavailable` when the machine cannot serve it, which
    stops the session at start with that reason.  A name can't replace a built-in one.

    Example (``conftest.py``)::

        import time
        from pytest_llmenergy import Domain, Meter, Method
        from pytest_llmenergy.meters.readings import Reading

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


def pytest_llmenergy_axes(config: pytest.Config) -> Sequence[Axis] | None:
    """Add axes of your own to the grid: every case of ``llm_input_case`` and
    ``llm_output_case`` then runs at each of the axis's values.

    Return :class:`~pytest_llmenergy.Axis` rows.  The values come from
    ``--llm-axis NAME=VALUES`` (ini ``llmenergy_axis``), read by the axis's ``parse``,
    else from its ``default``.  Each value adds its ``id_part`` to the case ids
    (none for the ``quiet`` value, so earlier runs keep their ids) and its label to the
    case's labels, which the run file keeps and reports can group by
    (``--energy-group-by=param:NAME``); the test reads it with ``case.value(NAME)``.
    A name can't be one the package already uses (``model``, ``batch_size``, ...).

    Example (``conftest.py``)::

        from pytest_llmenergy import Axis

        def temperatures(text):
            return tuple(float(t) for t in text.split(","))

        def pytest_llmenergy_axes(config):
            return [Axis("temperature", "temperature", temperatures, (0.0,), id_part="t{}")]

        # test_sampling.py
        def test_sampling(llm_input_case, llm_pool, energy_benchmark):
            t = llm_input_case.value("temperature")
            ...

    Then ``pytest --llm-axis temperature=0,0.7``: ids such as ``tiny-llama-in8-out32-t0.7``.
    """
