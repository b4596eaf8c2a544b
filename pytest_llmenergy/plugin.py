"""The pytest plugin: hooks and fixtures.  The state lives in ``session.EnergySession``.

Registered through the ``pytest11`` entry point as ``llmenergy``; disable it with
``-p no:llmenergy``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from .compare import comparison_table, verdict_line
from .controller.benchmark import EnergyBenchmark
from .errors import LLMEnergyError
from .llm.grid import INPUT_SWEEP, OUTPUT_SWEEP, Grid
from .meters import Meter
from .options import add_options, read_options
from .report import case_tables, render
from .session import MARKER, EnergySession, case_labels, is_llm_case

if TYPE_CHECKING:
    from .llm.loader import ModelPool

SESSION_KEY = pytest.StashKey[EnergySession]()

# Fixture name -> sweep: a test that asks for one is parametrized over the grid's cases.
CASE_FIXTURES = {"llm_input_case": INPUT_SWEEP, "llm_output_case": OUTPUT_SWEEP}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(min_trials=, max_trials=, confidence=, warmup=, ci_target=): "
        "repetition settings of this test's energy_benchmark",
    )
    config.stash[SESSION_KEY] = EnergySession(config, read_options(config))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[SESSION_KEY].open()


def pytest_report_header(config: pytest.Config) -> list[str]:
    energy = config.stash.get(SESSION_KEY, None)
    return energy.header_lines() if energy is not None else []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    grid = metafunc.config.stash[SESSION_KEY].options.llm.grid
    for name, sweep in CASE_FIXTURES.items():
        if name in metafunc.fixturenames:
            cases = grid.cases(sweep)
            metafunc.parametrize(name, cases, ids=[case.id for case in cases])


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    config.stash[SESSION_KEY].prepare(items)


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    energy = config.stash.get(SESSION_KEY, None)
    if energy is None:
        return []
    return energy.collection_lines(sum(1 for item in items if is_llm_case(item)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    energy = session.config.stash.get(SESSION_KEY, None)
    if energy is None:
        return
    gate_failed = energy.finish(exitstatus)
    save_failed = energy.recorder is not None and bool(energy.recorder.errors)
    if (gate_failed or save_failed) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    energy = terminalreporter.config.stash.get(SESSION_KEY, None)
    if energy is None:
        return
    write = terminalreporter.write_line
    if energy.results:
        settings = energy.options.report
        terminalreporter.section("llmenergy: energy per token")
        tables = case_tables(
            energy.results,
            columns=settings.columns,
            group_by=settings.group_by,
            sort=settings.sort,
        )
        for line in render(tables, "table").splitlines():
            write(line)
    for path in energy.saved_paths:
        write(f"llmenergy: saved {len(energy.results)} case(s) to {path}")
    if energy.recorder is not None:
        if not energy.results:
            write("llmenergy: no energy benchmark case ran; no run saved")
        for error in energy.recorder.errors:
            write(f"llmenergy: {error}", red=True)
    if energy.baseline_note:
        write(f"llmenergy: {energy.baseline_note}", yellow=True)
    comparison = energy.comparison
    if comparison is not None:
        terminalreporter.section(f"llmenergy: compared with {comparison.baseline_label}")
        baseline = energy.baseline
        if baseline is not None and baseline.hardware != energy.hardware:
            write(f"llmenergy: the baseline ran on other hardware: {baseline.hardware}")
        for line in render([comparison_table(comparison)], "table").splitlines():
            write(line)
        failed = comparison.failed
        write(f"llmenergy: {verdict_line(comparison)}", red=failed, green=not failed, bold=True)
    _routing_summary(terminalreporter, energy)


def _routing_summary(terminalreporter: pytest.TerminalReporter, energy: EnergySession) -> None:
    """Runs from two systems: where each query should go, and the figures."""
    write = terminalreporter.write_line
    if energy.routed or energy.routing_note:
        terminalreporter.section(
            "llmenergy: routing between this run's and the baseline's hardware"
        )
    if energy.routed:
        from .routing.tables import render_routed

        for line in render_routed(energy.routed, "table").splitlines():
            write(line)
    if energy.routing_note:
        write(f"llmenergy: {energy.routing_note}", yellow=True)
    if energy.plots:
        folder = energy.plots[0].parent
        write(f"llmenergy: {len(energy.plots)} figure(s) written to {folder}")
    if energy.plots_note:
        write(f"llmenergy: {energy.plots_note}", yellow=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    energy = config.stash.get(SESSION_KEY, None)
    if energy is not None:
        energy.close()


# -- fixtures ----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def energy_meter(pytestconfig: pytest.Config) -> Iterator[Meter]:
    """The session's configured meter: ``with energy_meter.measure() as m: ...``."""
    meter = pytestconfig.stash[SESSION_KEY].meter
    if meter is None:  # only if sessionstart did not run, e.g. under an unusual runner
        raise LLMEnergyError("the energy meter was not opened at session start")
    yield meter


def _progress_writer(request: pytest.FixtureRequest) -> Callable[[str], None] | None:
    """With ``-v``, each trial's line goes straight to the terminal, past output capture."""
    config = request.config
    if config.get_verbosity() < 1:
        return None
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return None
    name = request.node.name

    def write(line: str) -> None:
        if capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"    {name}: {line}")
        else:
            reporter.write_line(f"    {name}: {line}")

    return write


@pytest.fixture
def energy_benchmark(request: pytest.FixtureRequest, energy_meter: Meter) -> EnergyBenchmark:
    """Repeat a target under the stopping rule and keep every trial:
    ``energy_benchmark(fn, *args, input_tokens=N, output_tokens=M)``."""
    energy = request.config.stash[SESSION_KEY]
    node = request.node
    return EnergyBenchmark(
        energy_meter,
        energy.controller_for(node),
        nodeid=node.nodeid,
        name=node.name,
        labels=case_labels(node),
        on_result=energy.record,
        progress=_progress_writer(request),
    )


@pytest.fixture(scope="session")
def llm_grid(pytestconfig: pytest.Config) -> Grid:
    """The cases ``--llm-grid``, ``--llm-model`` and the token options select."""
    return pytestconfig.stash[SESSION_KEY].options.llm.grid


@pytest.fixture(scope="session")
def llm_pool(pytestconfig: pytest.Config) -> Iterator[ModelPool]:
    """Loads models on first use and keeps one at a time: ``llm_pool.get("tiny-llama")``."""
    from .llm.loader import ModelPool

    settings = pytestconfig.stash[SESSION_KEY].options.llm
    pool = ModelPool(
        dtype=settings.dtype, device=settings.device, trust_remote_code=settings.trust_remote_code
    )
    yield pool
    pool.close()
