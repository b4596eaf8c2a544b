"""The energy benchmark suite.  Today it holds the meter check; the LLM model x token-size
cases arrive with the benchmark-suite issue."""

from __future__ import annotations

import pytest

from pytest_llmenergy import Measurement

RESULTS_KEY = pytest.StashKey[list[tuple[str, Measurement]]]()


@pytest.fixture
def record_energy(request: pytest.FixtureRequest):
    """Keep a measurement for the end-of-session summary."""
    results = request.config.stash.setdefault(RESULTS_KEY, [])

    def record(label: str, measurement: Measurement) -> None:
        results.append((f"{request.node.name}:{label}", measurement))

    return record


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    results = config.stash.get(RESULTS_KEY, [])
    if not results:
        return
    terminalreporter.section("llmenergy: measured windows")
    for label, m in results:
        domains = ", ".join(
            f"{name} {j:.3f} J ({m.domains[name].method})" for name, j in m.by_domain.items()
        )
        mark = " [estimated]" if m.estimated else ""
        terminalreporter.write_line(
            f"{label}: {m.seconds:.3f} s, {m.joules:.3f} J, {m.power_w:.2f} W{mark} | {domains}"
        )
