"""Carbon and cost (issue 13, item 5): joules / 3.6e6 x gCO2e/kWh, and x price/kWh."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_llmenergy.compare import CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.conversions import (
    G_PER_KWH,
    PRICE_PER_KWH,
    intensity_table,
    parse_intensity,
    parse_price,
)
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.figures import value
from pytest_llmenergy.storage.runfile import Run, dumps, loads
from tests.casefactory import make_case
from tests.test_plugin import TRACE_CONFTEST  # a 200 W meter registered as "trace"


def test_intensity_from_a_number_or_a_code() -> None:
    assert parse_intensity("120").g_per_kwh == 120.0
    assert parse_intensity("120g").g_per_kwh == 120.0
    fra = parse_intensity("fra")
    assert fra.g_per_kwh == intensity_table()["FRA"][1] and "France" in fra.source
    assert parse_intensity("gcp:europe-west1").g_per_kwh > 0
    with pytest.raises(ConfigError, match="unknown carbon-intensity code 'XYZ'"):
        parse_intensity("XYZ")
    with pytest.raises(ConfigError, match=">= 0"):
        parse_intensity("-5")


def test_the_shipped_table_is_sane() -> None:
    table = intensity_table()
    assert len(table) > 200
    assert all(0 < g < 2000 for _, g, _ in table.values())
    assert table["FRA"][1] < table["USA"][1] < table["IND"][1]  # nuclear, mixed, coal


def test_price() -> None:
    assert parse_price("0.30EUR").per_kwh == 0.30 and parse_price("0.30EUR").currency == "EUR"
    assert parse_price("0.2").currency == ""
    with pytest.raises(ConfigError):
        parse_price("cheap")


def test_figures_are_hand_checked() -> None:
    case = make_case([1.0, 1.0, 1.0], watts=360.0, input_tokens=8, output_tokens=2)
    assert value(case, "co2_g") is None  # no intensity given: no figure
    case = replace(case, conversions={G_PER_KWH: 400.0, PRICE_PER_KWH: 0.25})
    # 360 J per query = 1e-4 kWh
    assert value(case, "co2_g") == pytest.approx(1e-4 * 400.0)
    assert value(case, "co2_g_per_1k_tokens") == pytest.approx(1e-4 * 400.0 * 1000 / 10)
    assert value(case, "cost") == pytest.approx(1e-4 * 0.25)
    assert value(case, "cost_per_1k_tokens") == pytest.approx(1e-4 * 0.25 * 100)


def test_conversions_are_saved_and_gateable(tmp_path: Path) -> None:
    conv = {G_PER_KWH: 56.0}
    base = replace(make_case([1.0, 1.01, 0.99]), conversions=conv)
    worse = replace(make_case([1.5, 1.51, 1.49]), conversions=conv)
    run = Run("", "x", "", "complete", "hw", {}, {}, {}, {}, cases=(base,))
    assert loads(dumps(run), tmp_path / "r.json").cases[0].conversions == conv
    assert compare_cases(
        [base],
        [worse],
        CompareOptions(gates=parse_gates("co2_g_per_1k_tokens:5%"), session_noise=0.02),
    ).failed


def test_the_session_shows_and_keeps_them(pytester: pytest.Pytester) -> None:
    from tests.test_plugin_suite import TRACE_METER

    pytester.makeconftest(TRACE_METER)
    pytester.makepyfile(
        """
        import time
        def test_q(energy_benchmark):
            energy_benchmark(time.sleep, 0.01, input_tokens=8, output_tokens=2)
        """
    )
    result = pytester.runpytest(
        "--energy-backend=trace",
        "--energy-rule=research",
        "--energy-carbon-intensity=100",
        "--energy-price=0.5EUR",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "llmenergy: carbon intensity 100 gCO2e/kWh: given",
            "llmenergy: electricity price 0.5 EUR per kWh",
            "*gCO2e/1k tok*cost/1k tok*",
        ]
    )


NAPS = """
import itertools
import time

naps = itertools.cycle([0.01, 0.03])

def test_q(energy_benchmark):
    energy_benchmark(lambda: time.sleep(next(naps)), input_tokens=8, output_tokens=2)
"""


def test_a_ci_target_on_co2_in_grams_stops_as_the_same_target_in_joules(
    pytester: pytest.Pytester,
) -> None:
    """Issue 46: the stopping rule computed co2_g beside the figure registry, without the
    session's gCO2e/kWh: in kWh, a target in grams held at the third trial whatever the
    spread.  Trials of 2 J and 6 J (200 W x 10 and 30 ms) never hold +-0.1 J, nor its
    1e-5 g at 360 gCO2e/kWh; both run to the trial limit."""
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(NAPS)

    def run(target: str, path: str) -> dict:
        result = pytester.runpytest(
            "--energy-backend=trace",
            "--energy-rule=research",
            "--energy-max-background=off",
            "--energy-carbon-intensity=360",
            f"--energy-ci-target={target}",
            "--energy-max-trials=6",
            f"--energy-json={path}",
        )
        result.assert_outcomes(passed=1)
        (case,) = json.loads((pytester.path / path).read_text())["cases"]
        return case

    joules, grams = run("energy_j:0.1J", "j.json"), run("co2_g:1e-5", "g.json")
    assert (len(grams["trials"]), grams["status"]) == (len(joules["trials"]), joules["status"])
    assert joules["status"] == "limit" and "co2_g \u00b1" in grams["reason"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--energy-ci-target=co2_g:1e-5"], "--energy-ci-target: the CI target co2_g:1e-05 needs "),
        (["--energy-carbon-intensity=100"], "@pytest.mark.llmenergy: the CI target cost:5% needs "),
    ],
)
def test_a_ci_target_on_co2_or_cost_without_its_factor_stops_at_start(
    pytester: pytest.Pytester, args: list[str], says: str
) -> None:
    """Without --energy-carbon-intensity (or --energy-price) co2_g (cost) has no value:
    every case would run to its trial limit.  The session says so before it starts."""
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(
        """
        import pytest, time

        @pytest.mark.llmenergy(ci_target="cost:5%")
        def test_q(energy_benchmark):
            energy_benchmark(time.sleep, 0.01, input_tokens=8, output_tokens=2)
        """
    )
    result = pytester.runpytest("--energy-backend=trace", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    flag = "--energy-carbon-intensity" if "co2_g" in says else "--energy-price"
    result.stderr.fnmatch_lines([f"ERROR: *{says}{flag}*"])
