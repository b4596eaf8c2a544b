"""Gates fail a case only when it is worse beyond the threshold and significantly so."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import pytest

from pytest_llmenergy.compare import (
    FAIL,
    NOT_SIGNIFICANT,
    OK,
    TOO_FEW,
    CompareOptions,
    Gate,
    compare_cases,
    delta,
    parse_gate,
    parse_gates,
)
from pytest_llmenergy.comparison_text import Lineup, comparison_table, side_by_side, verdict_line
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.figures import DeprecatedName
from pytest_llmenergy.stats import welch_t_test
from pytest_llmenergy.tables import render
from tests.casefactory import make_case


@pytest.mark.parametrize(
    ("text", "gate"),
    [
        ("j_per_token:5%", Gate("j_per_token", 0.05, True)),
        ("energy_j:10%", Gate("energy_j", 0.10, True)),
        ("time_s:0.5", Gate("time_s", 0.5, False)),
        ("time_s:250ms", Gate("time_s", 0.25, False)),
        ("energy_j:2kJ", Gate("energy_j", 2000.0, False)),
        (" Power_W : 3W ", Gate("power_w", 3.0, False)),
        ("decode_j_per_out_token:2%", Gate("decode_j_per_out_token", 0.02, True)),
    ],
)
def test_parse_gate(text: str, gate: Gate) -> None:
    assert parse_gate(text) == gate


@pytest.mark.parametrize(
    ("text", "gate"),
    [
        ("energy_per_token:5%", Gate("j_per_token", 0.05, True)),
        ("joules:10%", Gate("energy_j", 0.10, True)),
        ("seconds:0.5", Gate("time_s", 0.5, False)),
        ("time:1s", Gate("time_s", 1.0, False)),
        (" Power : 3W ", Gate("power_w", 3.0, False)),
    ],
)
def test_old_gate_names_still_work_with_a_deprecation_note(text: str, gate: Gate) -> None:
    with pytest.warns(DeprecatedName, match="is deprecated, use"):
        assert parse_gate(text) == gate


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("j_per_token", "expected FIGURE:AMOUNT"),
        ("speed:5%", "unknown figure 'speed'"),
        ("time_s:5J", "expected a unit of s, ms, us, ns or %"),
        ("energy_j:-1", "expected a positive amount"),
        ("j_per_in_token:5%", "'j_per_in_token' is gone"),
        ("energy_per_input_token:5%", "use prefill_j_per_in_token"),
    ],
)
def test_bad_gates_say_what_is_expected(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        parse_gate(text)


def test_parse_gates_splits_lists() -> None:
    assert [str(g) for g in parse_gates(["energy_j:10%,time_s:0.5", "j_per_token:5%"])] == [
        "energy_j:10%",
        "time_s:0.5s",
        "j_per_token:5%",
    ]


BASE = [0.100, 0.101, 0.099, 0.100]


def test_significant_regression_beyond_the_threshold_fails() -> None:
    before, after = make_case(BASE), make_case([0.120, 0.121, 0.119, 0.120])  # +20 %
    gate = parse_gate("j_per_token:5%")
    d = delta(before, after, "j_per_token", gate=gate, session_noise=0.03)
    assert d is not None and d.test is not None
    assert d.relative_change == pytest.approx(0.20)
    # one session a side: the test is on the sessions' log means, with the session noise
    se = math.log1p(0.03) * math.sqrt(2)
    assert d.test.se == pytest.approx(se)
    assert d.p_value == pytest.approx(2 * (1 - NormalDist().cdf(math.log(1.2) / se)))
    assert d.significant and d.exceeded and d.failed and d.verdict == FAIL


def test_trials_agreeing_within_one_session_are_not_evidence_between_sessions() -> None:
    """Welch on the trials calls +20 % certain; two sessions of unchanged code on a
    shared runner differ that much, so with the default session noise it is not."""
    before, after = make_case(BASE), make_case([0.120, 0.121, 0.119, 0.120])
    a = [t.joules / 12 for t in before.trials]
    b = [t.joules / 12 for t in after.trials]
    assert welch_t_test(a, b).p_value < 1e-6
    d = delta(before, after, "j_per_token", gate=parse_gate("j_per_token:5%"))
    assert d is not None and d.exceeded and not d.significant
    assert d.verdict == NOT_SIGNIFICANT


def test_large_but_noisy_regression_does_not_fail() -> None:
    before = make_case([0.05, 0.25, 0.05])
    after = make_case([0.25, 0.05, 0.25])  # mean +57 %, but the spread swamps it
    d = delta(before, after, "energy_j", gate=parse_gate("energy_j:10%"))
    assert d is not None and d.relative_change > 0.5
    assert d.exceeded and not d.significant and d.p_value > 0.05
    assert not d.failed and d.verdict == NOT_SIGNIFICANT


def test_significant_but_small_change_and_improvements_pass() -> None:
    before = make_case(BASE)
    small = make_case([0.103, 0.1031, 0.1029, 0.103])  # +3 %, very significant
    d = delta(before, small, "time_s", gate=parse_gate("time_s:5%"), session_noise=0.005)
    assert d is not None and d.significant and not d.exceeded and d.verdict == OK
    faster = make_case([0.05, 0.051, 0.049, 0.05])
    d = delta(before, faster, "time_s", gate=parse_gate("time_s:0.001"))
    assert d is not None and not d.significant and d.verdict == OK  # better is never worse


def test_absolute_threshold() -> None:
    before, after = make_case(BASE), make_case([0.3, 0.301, 0.299, 0.3])
    assert delta(before, after, "time_s", gate=parse_gate("time_s:0.5")).verdict == OK
    assert delta(before, after, "time_s", gate=parse_gate("time_s:0.1")).verdict == FAIL


def test_one_trial_cannot_be_tested() -> None:
    d = delta(make_case(BASE), make_case([0.5]), "time_s", gate=parse_gate("time_s:1%"))
    assert d is not None and d.p_value is None and d.verdict == TOO_FEW and not d.failed


def test_metric_missing_from_a_case_is_skipped() -> None:
    no_phases = make_case(BASE, prefill_share=None)
    assert delta(make_case(BASE), no_phases, "prefill_j") is None
    assert delta(make_case(BASE), make_case(BASE), "prefill_j") is not None


def test_compare_cases_matches_by_node_id_and_lists_the_rest() -> None:
    baseline = [make_case(BASE), make_case(BASE, input_tokens=64)]
    current = [
        make_case([0.2, 0.201, 0.199]),  # +100 %: fails
        make_case(BASE, input_tokens=512),  # new
    ]
    c = compare_cases(
        baseline,
        current,
        CompareOptions(gates=parse_gates("j_per_token:5%"), baseline_label="0001_base"),
    )
    assert len(c.deltas) == 1 and c.failed
    assert c.only_in_baseline == (make_case(BASE, input_tokens=64).nodeid,)
    assert c.only_in_current == (make_case(BASE, input_tokens=512).nodeid,)
    line = verdict_line(c)
    # named by the shortest part of the node id that tells the run's cases apart
    assert line.startswith("energy gate FAILED") and line.endswith(": tiny-llama-in8-out4")

    table = comparison_table(c)
    assert table.title == "current (current) against 0001_base (baseline)"
    assert table.headers == (
        "case",
        "figure",
        "baseline",
        "current",
        "change",
        "p",
        "significant",
        "gate",
        "verdict",
    )
    assert table.keys[-2:] == ("threshold", "verdict")  # csv/json keys
    row = dict(zip(table.keys, table.rows[0]))
    assert row["verdict"] == FAIL and row["significant"] is True
    assert row["change"] == pytest.approx(1.0, rel=1e-2)
    assert "+100.0 %" in render([table], "table")
    assert json.loads(render([table], "json"))["tables"][0]["rows"][0]["verdict"] == FAIL


def test_without_gates_the_default_metrics_are_compared() -> None:
    c = compare_cases([make_case(BASE)], [make_case(BASE)])
    assert [d.metric for d in c.deltas] == ["j_per_token", "energy_j", "time_s"]
    assert not c.failed and all(d.verdict == "" for d in c.deltas)
    table = comparison_table(c)
    assert "verdict" not in table.keys
    assert table.headers == ("case", "figure", "baseline", "current", "change", "p", "significant")
    assert [r[1] for r in table.rows] == ["j_per_token", "energy_j", "time_s"]


def test_compared_figures_by_old_names_warn_and_removed_ones_are_refused() -> None:
    with pytest.warns(DeprecatedName, match="'joules' is deprecated, use 'energy_j'"):
        c = compare_cases([make_case(BASE)], [make_case(BASE)], CompareOptions(metrics=["joules"]))
    assert [d.metric for d in c.deltas] == ["energy_j"]
    with pytest.raises(ConfigError, match=r"'j_per_out_token' is gone: .*decode_j_per_out_token"):
        compare_cases(
            [make_case(BASE)], [make_case(BASE)], CompareOptions(metrics=["j_per_out_token"])
        )
    with pytest.raises(ConfigError, match="'tokens_in' has no value per trial"):
        compare_cases([make_case(BASE)], [make_case(BASE)], CompareOptions(metrics=["tokens_in"]))


def test_gate_passes_with_note_on_noise() -> None:
    c = compare_cases(
        [make_case([0.05, 0.25, 0.05])],
        [make_case([0.25, 0.05, 0.25])],
        CompareOptions(gates=parse_gates("energy_j:10%")),
    )
    assert not c.failed
    assert verdict_line(c) == (
        "energy gate passed (energy_j:10%): no significant regression; "
        "1 over the threshold but not significant"
    )


def test_side_by_side_ratios() -> None:
    a = [make_case([0.1, 0.1], input_tokens=8), make_case([0.4, 0.4], input_tokens=64)]
    b = [make_case([0.05, 0.05], input_tokens=8, watts=50.0)]
    table = side_by_side(Lineup(("m1", "a100"), (tuple(a), tuple(b))), "energy_j")
    assert table.keys == ("case", "nodeid", "tokens_in", "tokens_out", "m1", "a100", "a100/m1")
    assert table.hidden == ("nodeid",)
    rows = {r[2]: dict(zip(table.keys, r)) for r in table.rows}
    assert rows[8]["m1"] == pytest.approx(10.0) and rows[8]["a100"] == pytest.approx(2.5)
    assert rows[8]["a100/m1"] == pytest.approx(0.25)
    assert rows[64]["a100"] is None and rows[64]["a100/m1"] is None  # not on the second run
    text = render([table], "table")
    assert "node id" not in text and "0.25\u00d7" in text
    # the runs' columns are #1 base, #2, named under the table
    assert "#1 base" in text and "#2/#1" in text
    assert text.splitlines()[-2:] == ["#1 = m1, the baseline", "#2 = a100"]


def test_lineup_short_labels_and_their_legend() -> None:
    a = [make_case([0.1, 0.1])]
    b = [make_case([0.05, 0.05], watts=50.0)]
    c = [make_case([0.2, 0.2])]
    labels = ("cpu-x__no-gpu__rapl/0001_main", "cpu-y__1x-a100__nvml/0002_pr", "0003_other")
    lineup = Lineup(labels, (tuple(a), tuple(b), tuple(c)))
    assert lineup.short == ("#1 base", "#2", "#3")
    assert lineup.legend == (
        f"#1 = {labels[0]}, the baseline",
        *(f"#{i} = {labels[i - 1]}" for i in (2, 3)),
    )
    with pytest.warns(DeprecatedName, match="'energy_per_token' is deprecated"):
        table = side_by_side(lineup, "energy_per_token")
    assert table.title == "J/token (j_per_token), side by side"
    assert table.headers[4:] == ("#1 base", "#2", "#3", "#2/#1", "#3/#1")
    assert table.legend == lineup.legend
    # csv and json keep the whole labels as keys
    assert table.keys[4:] == (*labels, f"{labels[1]}/{labels[0]}", f"{labels[2]}/{labels[0]}")
    (row,) = json.loads(render([table], "json"))["tables"][0]["rows"]
    # J/token: 100 W x 0.1 s / 12 tokens; 50 W x 0.05 s / 12; 100 W x 0.2 s / 12
    assert row[labels[0]] == pytest.approx(10 / 12) and row[labels[1]] == pytest.approx(2.5 / 12)
    assert row[f"{labels[1]}/{labels[0]}"] == pytest.approx(0.25)
    assert row[f"{labels[2]}/{labels[0]}"] == pytest.approx(2.0)
    header = render([table], "csv").splitlines()[0]
    assert header.endswith(f"{labels[2]},{labels[1]}/{labels[0]},{labels[2]}/{labels[0]}")
    text = render([table])
    assert labels[1] not in text.splitlines()[1]  # the header row uses the short labels
    assert text.splitlines()[-3:] == list(lineup.legend)


def test_a_gate_that_compares_nothing_fails_and_says_why() -> None:
    """Issue 33: a gate against a run sharing no case passed ("nothing compared", exit 0),
    so renaming the tests passed any gate.  It fails, saying why and what to do."""
    gates = parse_gates("energy_j:5%")
    renamed = make_case(BASE, input_tokens=999)
    c = compare_cases([make_case(BASE)], [renamed], CompareOptions(gates=gates))
    assert not c.deltas and c.failed and c.fails(strict=False)
    assert verdict_line(c) == (
        "energy gate FAILED (energy_j:5%): nothing compared: none of the 1 case(s) of "
        "current is in baseline (renamed tests, or other tests); compare with a run of the "
        "same tests, or save a new baseline"
    )
    # nothing measured at all, or shared cases lacking the gated figure: failed too
    none = compare_cases([make_case(BASE)], [], CompareOptions(gates=gates))
    assert none.failed and verdict_line(none).endswith(
        "nothing compared: current measured no case; run the gated tests, or drop the gate"
    )
    bare = [make_case(BASE, prefill_share=None)]
    lacking = compare_cases(
        bare, bare, CompareOptions(gates=parse_gates("prefill_j_per_in_token:5%"))
    )
    assert lacking.failed and "the 1 case(s) in both runs have no prefill_j_per_in_token" in (
        verdict_line(lacking)
    )
    # ungated, it is only shown: nothing was asked to pass
    shown = compare_cases([make_case(BASE)], [renamed], CompareOptions(metrics=["energy_j"]))
    assert not shown.failed and verdict_line(shown).startswith("nothing compared")
    one = compare_cases(
        [make_case(BASE)], [make_case([0.5])], CompareOptions(gates=parse_gates("time_s:5%"))
    )
    assert verdict_line(one).endswith("1 over the threshold with too few trials to test")


def test_strict_fails_on_a_case_present_on_one_side_only() -> None:
    """Issue 33: ``--energy-strict`` (and ``compare --strict``) fail when a case is in one
    run only; without it the gate judges the shared cases and lists the others."""
    gates = parse_gates("energy_j:5%")
    both = make_case(BASE)
    gone, new = make_case(BASE, input_tokens=64), make_case(BASE, input_tokens=128)
    c = compare_cases([both, gone], [both, new], CompareOptions(gates=gates))
    assert len(c.deltas) == 1 and not c.failed and c.unsure
    assert not c.fails(strict=False) and c.fails(strict=True)
    one_sided = (
        "not judged, on one side only: only in baseline: "
        f"{gone.nodeid}; only in current: {new.nodeid} (--energy-strict fails on this)"
    )
    assert verdict_line(c) == (
        f"energy gate passed (energy_j:5%): no significant regression; {one_sided}"
    )
    assert verdict_line(c, strict=True) == f"FAILED (strict): {verdict_line(c)}"
    # the same cases on both sides: nothing for strict to fail on
    same = compare_cases([both, gone], [both, gone], CompareOptions(gates=gates))
    assert not same.unsure and not same.fails(strict=True)
    # a long list is cut in the verdict (the table's notes list every case)
    many = [make_case(BASE, input_tokens=n) for n in range(10, 30)]
    cut = verdict_line(compare_cases([both, *many], [both], CompareOptions(gates=gates)))
    assert cut.count("::") == 8 and "and 12 more (--energy-strict fails on this)" in cut


def test_a_throughput_gate_fails_when_throughput_falls() -> None:
    fast, slow = make_case(BASE), make_case([0.2, 0.201, 0.199, 0.2])
    d = delta(fast, slow, "tokens_per_s", gate=parse_gate("tokens_per_s:5%"))
    assert d is not None and d.relative_change < -0.4 and d.verdict == FAIL
    d = delta(slow, fast, "tokens_per_s", gate=parse_gate("tokens_per_s:5%"))
    assert d is not None and d.verdict == OK  # twice as fast is no regression


def test_long_case_names_are_shortened_to_their_unique_ids() -> None:
    two = [make_case(BASE), make_case(BASE, input_tokens=64)]
    c = compare_cases(two, two, CompareOptions(metrics=["j_per_token"]))
    table = comparison_table(c)
    assert table.cells[0][0] == "tiny-llama-in8-out4"
    assert table.rows[0][0] == two[0].nodeid  # csv/json: the whole node id
    one = comparison_table(compare_cases(two[:1], two[:1], CompareOptions(metrics=["j_per_token"])))
    assert one.cells[0][0] == "test_input_tokens[tiny-llama-in8-out4]"  # the test, named
