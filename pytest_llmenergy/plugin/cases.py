"""Repeating: which cases run, in which order, and with which repetition settings.

The grid's cases parametrize the tests that ask for ``llm_input_case`` or
``llm_output_case``; every ``@pytest.mark.llmenergy`` is checked at collection (not
mid-run); models that cannot load stop the session before the first case; energy
benchmark cases run in a random order whose seed the header prints.
"""

from __future__ import annotations

import pytest

from ..controller.order import shuffle_in_place
from ..controller.rule import ControllerOptions, with_overrides
from ..errors import ConfigError
from ..llm.grid import INPUT_SWEEP, OUTPUT_SWEEP, LLMCase
from .measuring import header_lines
from .options import LLMSettings, OrderSettings

MARKER = "llmenergy"
BENCHMARK_FIXTURE = "energy_benchmark"
# Fixture name -> sweep: a test that asks for one is parametrized over the grid's cases.
CASE_FIXTURES = {"llm_input_case": INPUT_SWEEP, "llm_output_case": OUTPUT_SWEEP}


def uses_energy_benchmark(item: pytest.Item) -> bool:
    return BENCHMARK_FIXTURE in getattr(item, "fixturenames", ())


def is_llm_case(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(isinstance(v, LLMCase) for v in callspec.params.values())


def case_labels(item: pytest.Item) -> dict[str, str]:
    """Labels for reports from the test's parameters; an ``LLMCase`` gives model and sweep."""
    labels: dict[str, str] = {}
    callspec = getattr(item, "callspec", None)
    for name, value in callspec.params.items() if callspec else ():
        as_labels = getattr(value, "labels", None)
        if callable(as_labels):
            labels.update(as_labels())
        else:
            labels[name] = str(value)
    return labels


class CasePlan:
    """Owns the case plan: parametrization, per-test repetition settings, the order."""

    def __init__(
        self,
        config: pytest.Config,
        controller: ControllerOptions,
        order: OrderSettings,
        llm: LLMSettings,
    ) -> None:
        self.config = config
        self.controller = controller
        self.order = order
        self.llm = llm
        self.shuffled = False
        self.n_llm_cases = 0
        self._controllers: dict[str, ControllerOptions] = {}
        self._collected: dict[str, int] = {}  # node id -> position in collection (file) order

    def controller_for(self, item: pytest.Item) -> ControllerOptions:
        return self._controllers.get(item.nodeid, self.controller)

    def header(self) -> list[str]:
        return [f"repetition: {self.controller.describe()}"]

    # -- hooks ---------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        for name, sweep in CASE_FIXTURES.items():
            if name in metafunc.fixturenames:
                cases = self.llm.grid.cases(sweep)
                metafunc.parametrize(name, cases, ids=[case.id for case in cases])

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        self._collected.setdefault(item.nodeid, len(self._collected))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Check every test's marker now (not mid-run), then put the cases in order: last,
        after any plugin that reorders tests (pytest-randomly), so that the energy cases run
        in the order the header states, the seed's or the file's."""
        for item in items:
            marker = item.get_closest_marker(MARKER)
            if marker is None:
                continue
            if marker.args:
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.{MARKER} takes keyword arguments only"
                )
            try:
                self._controllers[item.nodeid] = with_overrides(self.controller, marker.kwargs)
            except ConfigError as exc:
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER}: {exc}") from None
        if not self.config.option.collectonly:
            self._check_models(items)
        self.n_llm_cases = sum(1 for item in items if is_llm_case(item))
        mode = self.order.shuffle
        if mode == "on" or (mode == "auto" and any(uses_energy_benchmark(i) for i in items)):
            self.shuffled = True
        shuffle_in_place(
            items,
            self.order.seed if self.shuffled else None,
            selected=uses_energy_benchmark,
            group=lambda item: case_labels(item).get("model"),
            file_order=lambda item: self._collected.get(item.nodeid, len(self._collected)),
        )

    def pytest_report_collectionfinish(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> list[str]:
        """After collection, when it is known what will run and in which order."""
        lines = []
        if self.n_llm_cases:
            lines.append(self.llm.grid.describe())
        if self.shuffled:
            seed = self.order.seed
            lines.append(
                f"cases in random order, seed {seed} (repeat with --energy-seed={seed}; "
                "--energy-shuffle=off keeps the file order)"
            )
        if config.pluginmanager.hasplugin("randomly"):
            lines.append(
                "pytest-randomly is installed: it orders the other tests; the energy "
                "benchmark cases run in this plugin's order, "
                + ("seeded as above" if self.shuffled else "the file's")
            )
        return header_lines(config, lines)

    def _check_models(self, items: list[pytest.Item]) -> None:
        """A model that cannot load stops the session now, not once per case."""
        models = sorted({case_labels(i).get("model", "") for i in items if is_llm_case(i)})
        if not models:
            return
        from ..llm.loader import check_model

        for model in models:
            try:
                check_model(
                    model,
                    dtype=self.llm.dtype,
                    device=self.llm.device,
                    trust_remote_code=self.llm.trust_remote_code,
                )
            except ConfigError as exc:
                raise pytest.UsageError(f"--llm-model={model}: {exc}") from None


CASE_PLAN = pytest.StashKey[CasePlan]()
