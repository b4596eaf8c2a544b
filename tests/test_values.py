"""One parser per kind of value: the pytest options and the CLI take the same text."""

from __future__ import annotations

import math

import pytest

from pytest_llmenergy import values
from pytest_llmenergy.cli import main
from pytest_llmenergy.errors import ConfigError


@pytest.mark.parametrize("text", ["400", "400W", "400w", "400 W", " 400.0 "])
def test_watts_accepted(text: str) -> None:
    assert values.watts(text) == 400.0


@pytest.mark.parametrize("text", ["0", "-5", "inf", "nan", "1e999", "400J", "", "W"])
def test_watts_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="expected watts > 0"):
        values.watts(text)


@pytest.mark.parametrize(
    ("text", "expected"), [("0.1", 0.1), ("100ms", 0.1), ("2s", 2.0), ("2 s", 2.0)]
)
def test_seconds(text: str, expected: float) -> None:
    assert values.seconds(text) == pytest.approx(expected)


def test_seconds_refused_and_zero_only_where_allowed() -> None:
    for text in ("0", "-1", "inf", "fast", "1h"):
        with pytest.raises(ConfigError, match="expected seconds > 0"):
            values.seconds(text)
    assert values.non_negative_seconds("0") == 0.0


@pytest.mark.parametrize(("text", "expected"), [("0.95", 0.95), ("95%", 0.95), ("99.9 %", 0.999)])
def test_confidence(text: str, expected: float) -> None:
    assert values.confidence(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["0", "1", "100%", "inf", "nan", "-0.5", "high"])
def test_confidence_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="between 0 and 1"):
        values.confidence(text)


def test_fraction_takes_both_ends_and_percentages() -> None:
    assert values.fraction("0") == 0.0 and values.fraction("1") == 1.0
    assert values.fraction("30%") == pytest.approx(0.3)
    for text in ("1.5", "inf", "nan", "-0.1"):
        with pytest.raises(ConfigError, match="between 0 and 1"):
            values.fraction(text)


def test_integer_switch_choice_and_lists() -> None:
    assert values.integer(1)("25") == 25
    for text in ("0", "2.5", "x", ""):
        with pytest.raises(ConfigError, match="whole number >= 1"):
            values.integer(1)(text)
    assert [values.switch(t) for t in ("on", "TRUE", "1", "off", "no")] == [1, 1, 1, 0, 0]
    with pytest.raises(ConfigError, match="on or off"):
        values.switch("maybe")
    assert values.choice(("on", "off"), {"true": "on"})("True") == "on"
    assert values.names("a, b a") == ("a", "b")
    assert values.indices("0,1") == (0, 1)
    with pytest.raises(ConfigError, match="GPU indices"):
        values.indices("0,-1")


@pytest.mark.parametrize(
    ("text", "expected"), [("5%", (0.05, True)), ("2kJ", (2000.0, False)), ("3", (3.0, False))]
)
def test_threshold(text: str, expected: tuple[float, bool]) -> None:
    value, relative = values.threshold(text, {"j": 1.0, "kj": 1e3})
    assert (value, relative) == (pytest.approx(expected[0]), expected[1])
    assert not math.isnan(value)


def test_the_cli_and_the_plugin_agree_on_watts(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.1.0's CLI took '400W' and refused 'inf'; its plugin did the opposite."""
    pytester.makepyfile("def test_x(): pass")
    assert pytester.runpytest("--energy-cpu-tdp=400W").ret == 0
    refused = pytester.runpytest("--energy-cpu-tdp=inf")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    assert "expected watts > 0" in refused.stderr.str()
    with pytest.raises(SystemExit) as exited:  # argparse: one usage line, exit 2
        main(["route", "--profile", "x.csv", "--p-ref", "inf"])
    assert exited.value.code == 2
    assert "argument --p-ref: expected watts > 0" in capsys.readouterr().err
