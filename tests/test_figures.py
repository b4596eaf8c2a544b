"""The figure registry: every figure's formula against hand-computed truth, names, units."""

from __future__ import annotations

import json
import warnings

import pytest

from pytest_llmenergy.compare import Gate, parse_gate
from pytest_llmenergy.controller.rule import ControllerSettings, decide
from pytest_llmenergy.controller.targets import CITarget, parse_ci_target
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.figures import (
    ALIASES,
    DEFAULT_COLUMNS,
    DEFAULT_GATE_METRIC,
    FIGURES,
    REMOVED,
    DeprecatedName,
    canonical,
    describe,
    figure,
    parse_figure_threshold,
    value,
)
from tests.casefactory import make_case

# 100 W for 1.0, 1.2 and 0.8 s; 8 input and 4 output tokens; a quarter of each trial's
# time and energy is prefill.  Every expected value below is worked out by hand.
SECONDS = [1.0, 1.2, 0.8]


@pytest.fixture
def case():
    return make_case(SECONDS, watts=100.0, input_tokens=8, output_tokens=4)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("time_s", 1.0),
        ("energy_j", 100.0),
        ("j_per_token", 100.0 / 12),
        ("power_w", 100.0),
        ("tokens_per_s", (12 / 1.0 + 12 / 1.2 + 12 / 0.8) / 3),
        # prefill: 25, 30, 20 J over 8 input tokens
        ("prefill_j_per_in_token", 25.0 / 8),
        # decode: 75, 90, 60 J over the 3 tokens it produces (the 4th came from prefill)
        ("decode_j_per_out_token", 25.0),
        # decode seconds 0.75, 0.9, 0.6 for 3 tokens
        ("out_tokens_per_s", (3 / 0.75 + 3 / 0.9 + 3 / 0.6) / 3),
        ("ttft_s", 0.25),
        ("decode_s", 0.75),
        ("prefill_j", 25.0),
        ("decode_j", 75.0),
        ("gpu_j", 80.0),
        ("cpu_j", 20.0),  # cpu:core-0 is inside the package: not counted again
        ("tokens_in", 8),
        ("tokens_out", 4),
        ("trials", 3),
        ("peak_rss_mib", 300.0),
    ],
)
def test_each_figure_against_its_hand_computed_value(case, key: str, expected: float) -> None:
    assert value(case, key) == pytest.approx(expected)


def test_per_token_figures_add_up_to_the_query_not_twice_it(case) -> None:
    """The research's J/token times all tokens is the query; prefill per input token and
    decode per output token add up to it too (0.1.0's two columns added up to twice)."""
    total = value(case, "energy_j")
    assert value(case, "j_per_token") * 12 == pytest.approx(total)
    parts = value(case, "prefill_j_per_in_token") * 8 + value(case, "decode_j_per_out_token") * 3
    assert parts == pytest.approx(total)


def test_prefill_per_input_token_is_the_prefills_cost_not_the_querys() -> None:
    """The output sweep of the issue: 32 input tokens, 4096 output tokens, a prefill that is
    a tiny share of the query.  The whole query per input token is hundreds of times the
    prefill's cost per input token; the figure must be the latter."""
    case = make_case([10.0, 10.0], input_tokens=32, output_tokens=4096, prefill_share=0.004)
    prefill_per_in = value(case, "prefill_j_per_in_token")
    assert prefill_per_in == pytest.approx(1000 * 0.004 / 32)
    assert value(case, "energy_j") / 32 > 200 * prefill_per_in


def test_figures_without_phases_or_decode_tokens_are_none() -> None:
    no_phases = make_case(SECONDS, prefill_share=None)
    for key in ("prefill_j_per_in_token", "decode_j_per_out_token", "ttft_s", "out_tokens_per_s"):
        assert FIGURES[key].needs_phases
        assert value(no_phases, key) is None
    assert value(no_phases, "j_per_token") is not None
    one_token = make_case(SECONDS, output_tokens=1)
    assert value(one_token, "decode_j_per_out_token") is None  # decode produced nothing


def test_default_columns_hold_the_gate_default_and_are_all_figures() -> None:
    assert DEFAULT_GATE_METRIC in DEFAULT_COLUMNS
    assert all(k in FIGURES for k in DEFAULT_COLUMNS)
    assert FIGURES[DEFAULT_GATE_METRIC].per_trial


def test_every_figure_says_its_unit_and_meaning() -> None:
    records = describe()
    assert [r["key"] for r in records] == list(FIGURES)
    for r in records:
        assert r["meaning"]
        f = FIGURES[str(r["key"])]
        if f.lower_is_better is not None:
            assert r["unit"], r["key"]
    j_per_token = next(r for r in records if r["key"] == "j_per_token")
    assert "energy_per_token" in str(j_per_token["old_names"])


def test_old_names_warn_and_map_to_one_figure() -> None:
    for old, new in ALIASES.items():
        with pytest.warns(DeprecatedName, match=new):
            assert canonical(old) == new
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert canonical(old, warn=False) == new  # reading saved files stays quiet


def test_names_whose_meaning_changed_are_refused_saying_what_to_use() -> None:
    for old, why in REMOVED.items():
        with pytest.raises(ConfigError, match="is gone") as info:
            canonical(old)
        assert why in str(info.value)
    with pytest.raises(ConfigError, match="prefill_j_per_in_token"):
        parse_gate("j_per_in_token:5%")


def test_unknown_figure_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"unknown figure 'joulez'.*j_per_token"):
        figure("joulez")


def test_only_per_trial_figures_can_be_gated_or_targeted() -> None:
    with pytest.raises(ConfigError, match="no value per trial"):
        parse_gate("peak_rss_mib:5%")
    with pytest.raises(ConfigError, match="no value per trial"):
        parse_ci_target("tokens_in:1")


@pytest.mark.parametrize(
    ("text", "key", "value", "relative"),
    [
        ("j_per_token:5%", "j_per_token", 0.05, True),
        ("time_s:500ms", "time_s", 0.5, False),
        ("time_s:0.5", "time_s", 0.5, False),
        ("energy_j:2kJ", "energy_j", 2000.0, False),
        ("power_w:10W", "power_w", 10.0, False),
        (" out_tokens_per_s : 3 ", "out_tokens_per_s", 3.0, False),
    ],
)
def test_thresholds(text: str, key: str, value: float, relative: bool) -> None:
    f, amount, rel = parse_figure_threshold(text, "examples")
    assert (f.key, rel) == (key, relative)
    assert amount == pytest.approx(value)


@pytest.mark.parametrize(
    "text", ["j_per_token", "j_per_token:", ":5%", "time_s:5J", "time_s:-1", "time_s:inf"]
)
def test_bad_thresholds_are_one_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="bad"):
        parse_figure_threshold(text, "examples")


def test_a_gate_on_throughput_fails_when_it_falls() -> None:
    gate = Gate("out_tokens_per_s", 0.05, relative=True)
    assert gate.exceeded(100.0, 90.0)  # 10 % slower
    assert not gate.exceeded(100.0, 120.0)  # faster is better
    energy = Gate("j_per_token", 0.05, relative=True)
    assert energy.exceeded(1.0, 1.1) and not energy.exceeded(1.0, 0.9)


def test_old_ci_target_names_read_from_saved_runs_without_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert CITarget("time", 0.5).metric == "time_s"
        assert CITarget("energy", 0.02, relative=True).metric == "energy_j"
    assert str(CITarget("time_s", 0.5)) == "time_s:0.5s"


def test_a_ci_target_on_energy_per_token_drives_the_stopping_rule() -> None:
    steady = make_case([1.0, 1.0, 1.0, 1.0])
    noisy = make_case([1.0, 2.0, 0.5, 1.5])
    options = ControllerSettings(targets=(parse_ci_target("j_per_token:1%"),))
    assert decide(options, steady.trials).converged
    assert not decide(options, noisy.trials).converged
    phases = ControllerSettings(targets=(parse_ci_target("decode_j_per_out_token:50%"),))
    assert not decide(phases, make_case([1.0, 1.0, 1.0], prefill_share=None).trials).converged


def test_the_deprecated_result_properties_agree_with_the_registry(case) -> None:
    """0.1.0's properties live on for one release; they must mean what the figures mean."""
    pairs = {
        "joules_per_token": "j_per_token",
        "tokens_per_s": "tokens_per_s",
        "power_w": "power_w",
        "prefill_seconds": "ttft_s",
        "decode_seconds": "decode_s",
        "prefill_joules": "prefill_j",
        "decode_joules": "decode_j",
    }
    for old, key in pairs.items():
        with pytest.warns(DeprecationWarning, match=key):
            assert getattr(case, old) == pytest.approx(value(case, key))


DOMAIN_METER = """
import os
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace

def pytest_llmenergy_meters(config):
    gpu_w, cpu_w = float(os.environ["GPU_W"]), float(os.environ["CPU_W"])
    traces = {
        "gpu:0": PowerTrace([(3600, gpu_w)]),
        "cpu:package-0": PowerTrace([(3600, cpu_w)]),
        "cpu:core-0": PowerTrace([(3600, cpu_w)]),  # inside the package: not counted
    }
    return {"two": lambda options: TraceMeter(traces, counted={"cpu:core-0": False})}
"""


@pytest.mark.serial  # a gate on sleeps' energies
def test_a_gate_on_the_gpus_energy_alone(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a shared runner the CPU's energy is anyone's: gpu_j gates the GPU alone."""
    pytester.makeconftest(DOMAIN_METER)
    pytester.makepyfile(
        test_x="import time\n"
        "def test_x(energy_benchmark):\n"
        "    energy_benchmark(time.sleep, 0.01, input_tokens=4, output_tokens=4)\n"
    )
    common = (
        "--energy-backend=two",
        "--energy-rule=research",
        "--energy-min-trials=6",
        "--energy-max-trials=6",
        "--energy-max-background=off",
        "-p",
        "no:randomly",
    )
    monkeypatch.setenv("GPU_W", "100")
    monkeypatch.setenv("CPU_W", "50")
    assert pytester.runpytest(*common, "--energy-json=base.json").ret == 0
    base = json.loads((pytester.path / "base.json").read_text())["cases"][0]
    trial = base["trials"][0]
    assert trial["joules"] == pytest.approx(150 * trial["seconds"], rel=0.01)  # core uncounted
    monkeypatch.setenv("CPU_W", "500")  # a neighbour keeps the CPU busy: not the GPU's doing
    gates = ("--energy-compare=base.json", "--energy-compare-fail=gpu_j:50%,gpu_j_per_token:50%")
    noisy = pytester.runpytest(*common, *gates)
    assert noisy.ret == 0, noisy.stdout.str()
    noisy.stdout.fnmatch_lines(["*energy gate passed (gpu_j:50%, gpu_j_per_token:50%)*"])
    whole = pytester.runpytest(
        *common, "--energy-compare=base.json", "--energy-compare-fail=energy_j:50%"
    )
    assert whole.ret == pytest.ExitCode.TESTS_FAILED  # the whole machine's energy did rise
    monkeypatch.setenv("CPU_W", "50")
    monkeypatch.setenv("GPU_W", "300")
    worse = pytester.runpytest(*common, *gates)
    assert worse.ret == pytest.ExitCode.TESTS_FAILED
    worse.stdout.fnmatch_lines(["*energy gate FAILED (gpu_j:50%, gpu_j_per_token:50%)*"])
