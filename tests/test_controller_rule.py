"""The stopping rule: it stops when and only when every target holds, or at the limit."""

from __future__ import annotations

import random
import warnings

import pytest

from pytest_llmenergy.controller.order import shuffle_in_place, shuffled_in_groups
from pytest_llmenergy.controller.rule import (
    TIME_BUDGET,
    TRIAL_LIMIT,
    ControllerSettings,
    StopDecision,
    decide,
    progress_line,
    with_overrides,
)
from pytest_llmenergy.controller.targets import (
    EXAMPLES,
    CITarget,
    parse_ci_target,
    parse_ci_targets,
)
from pytest_llmenergy.conversions import G_PER_KWH, PRICE_PER_KWH
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.figures import DeprecatedName
from pytest_llmenergy.results import PhaseRecord, Trial
from pytest_llmenergy.stats import summarize


def trials(seconds: list[float], joules: list[float], *, phases: bool = False) -> list[Trial]:
    """Trials of 8 input and 4 output tokens with these runtimes and energies; with
    ``phases``, the first 20 % of each trial (time and energy) is its prefill pass."""
    return [
        Trial(
            i + 1,
            s,
            j,
            j,
            {"gpu:0": j},
            {"gpu:0": j},
            8,
            4,
            phases={
                "prefill": PhaseRecord(0.2 * s, 0.2 * j, {"gpu:0": 0.2 * j}),
                "decode": PhaseRecord(0.8 * s, 0.8 * j, {"gpu:0": 0.8 * j}),
            }
            if phases
            else {},
        )
        for i, (s, j) in enumerate(zip(seconds, joules))
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("time_s:0.5s", CITarget("time_s", 0.5)),
        ("time_s:500ms", CITarget("time_s", 0.5)),
        ("time_s:2%", CITarget("time_s", 0.02, relative=True)),
        ("energy_j:1J", CITarget("energy_j", 1.0)),
        ("energy_j:0.5kJ", CITarget("energy_j", 500.0)),
        ("ENERGY_J : 2.5 %", CITarget("energy_j", 0.025, relative=True)),
        ("j_per_token:2%", CITarget("j_per_token", 0.02, relative=True)),
    ],
)
def test_targets_parse(text: str, expected: CITarget) -> None:
    got = parse_ci_target(text)
    assert (got.metric, got.relative) == (expected.metric, expected.relative)
    assert got.value == pytest.approx(expected.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("speed:1s", "unknown figure 'speed'; choose from: time_s"),
        ("time_s:1J", "expected a unit of s, ms, us, ns or %"),
        ("energy_j:2s", "expected a unit of j, mj, kj or %"),
        ("time_s:0s", "positive"),
        ("time_s:150%", "percentage"),
        ("time_s", "expected FIGURE:AMOUNT"),
        ("tokens_in:5", "no value per trial"),
        # measured after the trials: the rule computed it from the trials' whole joules
        ("prefill_pass_j:5%", "measured after the trials, in windows of its own"),
    ],
)
def test_bad_targets_say_what_is_wrong(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_ci_target(text)


def test_old_target_names_still_parse_with_a_deprecation_note() -> None:
    with pytest.warns(DeprecatedName, match="'time' is deprecated, use 'time_s'"):
        assert str(parse_ci_target("time:0.5s")) == "time_s:0.5s"
    with pytest.warns(DeprecatedName, match="'energy' is deprecated, use 'energy_j'"):
        assert str(parse_ci_target("energy:2%")) == "energy_j:2%"


def test_old_names_in_a_saved_run_are_read_silently() -> None:
    """0.1.0 run files say "time" and "energy": CITarget reads them as the figures they
    meant, without a warning about a file the user did not write by hand."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert CITarget("time", 0.5).metric == "time_s"
        assert CITarget("energy", 0.02, relative=True) == CITarget("energy_j", 0.02, True)
        assert str(CITarget("time", 0.5)) == "time_s:0.5s"


@pytest.mark.parametrize(
    ("text", "replacement"),
    [
        ("j_per_in_token:5%", "prefill_j_per_in_token"),
        ("energy_per_input_token:5%", "prefill_j_per_in_token"),
        ("j_per_out_token:5%", "decode_j_per_out_token"),
        ("energy_per_output_token:5%", "decode_j_per_out_token"),
    ],
)
def test_removed_names_are_refused_naming_the_replacement(text: str, replacement: str) -> None:
    name = text.split(":")[0]
    with pytest.raises(ConfigError, match=rf"'{name}' is gone: .* use {replacement} "):
        parse_ci_target(text)


def test_the_examples_parse_without_a_deprecation_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an old name in the help text would warn here
        got = [str(t) for t in parse_ci_targets(EXAMPLES)]
    assert got == ["time_s:0.5s", "time_s:2%", "energy_j:1J", "energy_j:2%"]


def test_several_targets_in_one_text_or_a_list() -> None:
    got = [str(t) for t in parse_ci_targets("time_s:0.5s, energy_j:2%")]
    assert got == ["time_s:0.5s", "energy_j:2%"]
    assert len(parse_ci_targets(["time_s:1s", "energy_j:1J energy_j:3%"])) == 3
    with pytest.raises(ConfigError, match="no CI target"):
        parse_ci_targets(" , ")


def test_relative_and_absolute_targets_against_a_summary() -> None:
    s = summarize([10.0, 10.2, 9.8, 10.1])
    assert s.half_width == pytest.approx(0.2718, abs=1e-3)  # 3.1824 * 0.17078 / 2
    assert CITarget("time", 0.3).holds(s) and not CITarget("time", 0.25).holds(s)
    assert CITarget("time", 0.03, relative=True).holds(s)
    assert not CITarget("time", 0.02, relative=True).holds(s)
    assert not CITarget("time", 100.0).holds(summarize([1.0]))  # one trial: no interval


def rule_stop_point(options: ControllerSettings, seconds: list[float], joules: list[float]) -> int:
    """Feed trials one by one; the number of trials at which the rule stopped."""
    for n in range(1, len(seconds) + 1):
        d = decide(options, trials(seconds[:n], joules[:n]))
        if d.stop:
            return n
    raise AssertionError("the rule never stopped")


@pytest.mark.parametrize("sd", [0.01, 0.1, 0.3, 0.6, 1.5])
@pytest.mark.parametrize("seed", range(5))
def test_stops_exactly_when_the_target_first_holds(sd: float, seed: int) -> None:
    """Against normal runtimes of known spread: the rule's stop point is the first n >= 3 whose
    t-interval half-width is <= 0.5 s, computed independently here, else 25."""
    rng = random.Random(seed * 100 + int(sd * 1000))
    seconds = [rng.gauss(5.0, sd) for _ in range(25)]
    joules = [100.0 * s for s in seconds]
    options = ControllerSettings(rule="research")
    stop = rule_stop_point(options, seconds, joules)

    def half_width(n: int) -> float:
        return summarize(seconds[:n], 0.95).half_width

    first_ok = next((n for n in range(3, 26) if half_width(n) <= 0.5), None)
    assert stop == (first_ok or 25)
    final = decide(options, trials(seconds[:stop], joules[:stop]))
    assert final.converged == (first_ok is not None)
    if sd <= 0.1:
        assert stop == 3  # tight from the start: the minimum, no more
    if sd >= 1.5:
        assert not final.converged and stop == 25  # needs ~36 trials: stops at the limit


def test_all_targets_must_hold() -> None:
    seconds = [1.0, 1.01, 0.99, 1.0]
    joules = [10.0, 14.0, 6.0, 10.0]  # time is tight, energy is not
    both = ControllerSettings(targets=parse_ci_targets("time_s:0.5s,energy_j:1J"), max_trials=4)
    d = decide(both, trials(seconds[:3], joules[:3]))
    assert not d.stop and [str(t) for t in d.unmet] == ["energy_j:1J"]
    d = decide(both, trials(seconds, joules))
    assert d.stop and not d.converged  # the limit, not convergence
    time_only = ControllerSettings(targets=parse_ci_targets("time_s:0.5s"), max_trials=4)
    assert decide(time_only, trials(seconds[:3], joules[:3])).converged


def test_the_decision_summarizes_each_targeted_figure_by_its_key() -> None:
    options = ControllerSettings(
        targets=parse_ci_targets("time_s:0.5s, energy_j:1J, j_per_token:5%, time_s:10%")
    )
    d = decide(options, trials([1.0, 1.2, 1.1], [5.0, 6.0, 5.5]))
    assert isinstance(d, StopDecision)
    assert list(d.summaries) == ["time_s", "energy_j", "j_per_token"]  # one per figure
    assert d.summaries["time_s"].mean == pytest.approx(1.1)
    assert d.summaries["energy_j"].mean == pytest.approx(5.5)
    # per trial: joules / (8 + 4) tokens, so 5/12, 6/12 and 5.5/12
    assert d.summaries["j_per_token"].mean == pytest.approx(5.5 / 12)
    assert d.summaries["j_per_token"].n == 3
    # energy sd 0.5, t(0.975, 2) = 4.303: half-width 4.303 * 0.5 / sqrt(3) = 1.242 J,
    # over 1 J and 22.6 % of the mean; time's 0.248 s is within 0.5 s and 22.6 % > 10 %
    assert d.summaries["energy_j"].half_width == pytest.approx(1.242, abs=1e-3)
    assert [str(t) for t in d.unmet] == ["energy_j:1J", "j_per_token:5%", "time_s:10%"]
    assert not d.stop and not d.converged


def test_a_prefill_target_holds_only_on_trials_split_into_phases() -> None:
    options = ControllerSettings(targets=parse_ci_targets("ttft_s:0.5s"), max_trials=4)
    split = decide(options, trials([1.0, 1.2, 1.1], [5.0, 6.0, 5.5], phases=True))
    assert split.converged and split.summaries["ttft_s"].mean == pytest.approx(0.2 * 1.1)
    unsplit = decide(options, trials([1.0, 1.2, 1.1], [5.0, 6.0, 5.5]))
    assert not unsplit.stop and unsplit.summaries["ttft_s"].n == 0
    assert [str(t) for t in unsplit.unmet] == ["ttft_s:0.5s"]
    assert progress_line(options, 3, unsplit) == "trial 3: ttft_s: not measured by these trials"
    at_limit = decide(options, trials([1.0] * 4, [5.0] * 4))
    assert at_limit.stop and not at_limit.converged  # the limit, never convergence


def test_min_trials_is_respected_even_when_the_target_holds_earlier() -> None:
    options = ControllerSettings(min_trials=5)
    for n in range(2, 5):
        assert not decide(options, trials([1.0] * n, [1.0] * n)).stop
    assert decide(options, trials([1.0] * 5, [1.0] * 5)).converged


def test_one_trial_can_never_converge() -> None:
    options = ControllerSettings(min_trials=1, max_trials=3)
    assert not decide(options, trials([1.0], [1.0])).stop
    assert decide(options, trials([1.0, 1.0], [1.0, 1.0])).converged


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="max_trials"):
        ControllerSettings(min_trials=5, max_trials=3)
    with pytest.raises(ConfigError, match="confidence"):
        ControllerSettings(confidence=1.5)
    with pytest.raises(ConfigError, match="warmup"):
        ControllerSettings(warmup=-1)


def test_marker_overrides_and_unknown_kwargs() -> None:
    base = ControllerSettings()
    got = with_overrides(base, {"max_trials": 2, "ci_target": "energy_j:5%", "warmup": 0})
    assert (got.min_trials, got.max_trials, got.warmup) == (2, 2, 0)
    assert [str(t) for t in got.targets] == ["energy_j:5%"]
    with pytest.raises(ConfigError, match=r"unknown argument max_trial; allowed: min_trials, "):
        with_overrides(base, {"max_trial": 3})
    with pytest.raises(ConfigError, match="confidence"):
        with_overrides(base, {"confidence": "high"})


def test_progress_line_shows_half_width_against_target() -> None:
    options = ControllerSettings()
    line = progress_line(options, 3, decide(options, trials([1.0, 1.2, 1.1], [5.0, 6.0, 5.5])))
    # both runtime targets in one part: ±0.5 s holds, 10 % of 1.1 s = 0.11 s does not
    assert line.startswith("trial 3: time_s 1.1 s ±0.248 (<= 0.5 s, > 0.11 s); energy_j 5.5 J")
    first = progress_line(options, 1, decide(options, trials([1.0], [5.0])))
    assert first.startswith("trial 1: time_s 1 s (no CI yet); energy_j 5 J (no CI yet)")
    # a relative target: its limit in the figure's unit, 2 % of the 5.5 J mean = 0.11 J
    relative = ControllerSettings(targets=parse_ci_targets("energy_j:2%"))
    d = decide(relative, trials([1.0, 1.2, 1.1], [5.0, 6.0, 5.5]))
    assert progress_line(relative, 3, d) == "trial 3: energy_j 5.5 J ±1.24 (> 0.11 J)"


def test_shuffle_is_reproducible_and_keeps_groups_together() -> None:
    items = [(m, n) for m in "abc" for n in range(6)]
    one = shuffled_in_groups(items, 42, group=lambda x: x[0])
    assert one == shuffled_in_groups(items, 42, group=lambda x: x[0])
    assert sorted(one) == items and one != items
    models = [m for m, _ in one]
    assert [models[i] for i in range(0, 18, 6)] == list(dict.fromkeys(models))  # contiguous
    orders = {tuple(shuffled_in_groups(items, s, group=lambda x: x[0])) for s in range(20)}
    assert len(orders) > 15


def test_shuffle_in_place_moves_only_selected_items() -> None:
    items = ["keep0", "b1", "keep1", "b2", "b3", "keep2", "b4"]
    shuffle_in_place(items, 3, selected=lambda x: x.startswith("b"))
    assert [items[i] for i in (0, 2, 5)] == ["keep0", "keep1", "keep2"]
    assert sorted(x for x in items if x.startswith("b")) == ["b1", "b2", "b3", "b4"]


@pytest.mark.parametrize(("mean_s", "cv"), [(0.05, 0.06), (0.2, 0.06), (3.0, 0.06), (4.0, 0.3)])
@pytest.mark.parametrize("seed", range(4))
def test_the_default_rule_wants_relative_intervals_a_second_and_at_most_15(
    mean_s: float, cv: float, seed: int
) -> None:
    """The default stops at the first n >= 3 where the runtime interval is within 0.5 s
    and 10 %, the energy interval within 10 % and the trials add up to 1 s, or where
    they add up to 15 s; computed independently here.  Short cases therefore take more
    trials than under the research rule, long noisy ones no more than 15 s."""
    rng = random.Random(seed)
    seconds = [max(1e-4, rng.gauss(mean_s, mean_s * cv)) for _ in range(25)]
    joules = [30.0 * s * rng.uniform(0.97, 1.03) for s in seconds]
    options = ControllerSettings()
    assert options.rule == "default" and options.min_time == 1.0 and options.max_time == 15.0

    def ok(n: int) -> bool:
        t, e = summarize(seconds[:n]), summarize(joules[:n])
        held = (
            t.half_width <= 0.5
            and t.half_width <= 0.10 * t.mean
            and e.half_width <= 0.10 * e.mean
            and sum(seconds[:n]) >= 1.0
        )
        return held or sum(seconds[:n]) >= 15.0

    expected = next((n for n in range(3, 26) if ok(n)), 25)
    assert rule_stop_point(options, seconds, joules) == expected
    research = rule_stop_point(ControllerSettings(rule="research"), seconds, joules)
    if mean_s < 0.5:
        assert research == 3 and expected >= min(25, int(1.0 / mean_s))
    if cv > 0.2:  # noisy and long: the 15 s budget, not 25 trials of 4 s
        assert expected <= 5


def test_a_short_precise_case_stops_at_the_limit_converged() -> None:
    """A 30 ms case cannot measure 1 s in 25 trials: its intervals hold long before, so
    at the trial limit it is marked converged (precision reached), not ``25 ✗``; the
    limit is never passed."""
    seconds = [0.03 + 0.0001 * (i % 3) for i in range(300)]
    joules = [30.0 * s for s in seconds]
    options = ControllerSettings()
    n = rule_stop_point(options, seconds, joules)
    assert n == options.max_trials
    final = decide(options, trials(seconds[:n], joules[:n]))
    assert final.stop and final.converged and final.why() == ""


def test_a_short_imprecise_case_stops_at_the_limit_and_says_which_target() -> None:
    seconds = [0.01, 0.05] * 20
    joules = [30.0 * s for s in seconds]
    options = ControllerSettings()
    n = rule_stop_point(options, seconds, joules)
    final = decide(options, trials(seconds[:n], joules[:n]))
    assert n == options.max_trials and not final.converged
    assert final.stopped_by == TRIAL_LIMIT
    assert final.why().startswith("stopped at the trial limit: time_s ±")
    assert "(wanted <= 10%)" in final.why() and "energy_j ±" in final.why()
    long = decide(options, trials([4.0, 1.0, 6.0, 5.0], [120.0, 30.0, 180.0, 150.0]))
    assert long.stop and long.stopped_by == TIME_BUDGET and "budget" in long.why()


def test_energy_of_one_domain_family_is_a_ci_target() -> None:
    """gpu_j per trial counts the meter's counted domains only."""
    options = ControllerSettings(targets=parse_ci_targets("gpu_j:5%"), min_time_s=0)
    steady = trials([1.0, 1.0, 1.0], [10.0, 10.0, 10.0])
    assert decide(options, steady, counted={"gpu:0": True}).converged
    # an uncounted domain is never a target's value: no interval, never converged
    d = decide(options, steady, counted={"gpu:0": False})
    assert not d.converged and d.summaries["gpu_j"].n == 0


@pytest.mark.parametrize(
    ("metric", "key", "per_kwh"), [("co2_g", G_PER_KWH, 360.0), ("cost", PRICE_PER_KWH, 0.36)]
)
def test_a_target_on_co2_or_cost_holds_as_the_same_target_in_joules(
    metric: str, key: str, per_kwh: float
) -> None:
    """Issue 46: the rule computed a target's values beside the figure registry, without
    the figure's factor, so co2_g and cost were in kWh: a target in grams (or money) held
    at once, whatever the trials' spread.  Now their values are the figure's."""
    scale = per_kwh / 3.6e6  # grams (or money) per joule
    spread = trials([1.0] * 6, [10.0, 10.5, 9.5, 10.2, 9.8, 10.1])
    for joules in (0.05, 5.0):  # tighter than the spread allows, and loose
        j = decide(
            ControllerSettings(targets=(CITarget("energy_j", joules),), min_time_s=0), spread
        )
        options = ControllerSettings(targets=(CITarget(metric, joules * scale),), min_time_s=0)
        d = decide(options, spread, conversions={key: per_kwh})
        assert (d.stop, d.converged) == (j.stop, j.converged), joules
        held = d.summaries[metric].half_width
        assert held == pytest.approx(j.summaries["energy_j"].half_width * scale)
    assert j.converged and not decide(options, spread).converged  # no factor: no figure


def test_a_marker_limit_of_the_wrong_kind_is_one_line_not_an_internal_error() -> None:
    """Issue 61: ``max_trials="lots"`` ended in a TypeError inside the override."""
    with pytest.raises(ConfigError, match="max_trials must be an integer >= min_trials"):
        with_overrides(ControllerSettings(), {"max_trials": "lots"})


def test_a_fine_relative_target_is_said_as_given() -> None:
    """Issue 61: a 0.1 % target read "(wanted <= 0%)"."""
    options = ControllerSettings(targets=parse_ci_targets("time_s:0.1%"), min_trials=2)
    two = trials([1.0, 1.2], [10.0, 12.0])
    assert "(wanted <= 0.1%)" in decide(options, two, disturbed=23).why()
