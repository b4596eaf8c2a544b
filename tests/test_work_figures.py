"""Counted work as figures: per token and per phase, in the run file, and gated exactly."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import FAIL, OK, CompareOptions, compare_cases, parse_gate
from pytest_llmenergy.comparison_text import comparison_table, evidence_line, verdict_line
from pytest_llmenergy.controller.targets import parse_ci_target
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.figures import FIGURES, value
from pytest_llmenergy.results import CaseResult, CountedWork, OpWork
from pytest_llmenergy.storage.runfile import dumps, loads
from tests.casefactory import make_case
from tests.test_storage_runfile import sample_run

BASE = [0.100, 0.101, 0.099, 0.100]
FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"


def work(decode_mm_flops: float = 400.0) -> CountedWork:
    return CountedWork(
        prefill=(
            OpWork("aten::mm", "matmul", 2, 1000.0, 800),
            OpWork("aten::view", "other", 3, 0.0, 0),
        ),
        decode=(
            OpWork("aten::mm", "matmul", 3, decode_mm_flops, 120),
            OpWork(FLASH, "attention", 3, 60.0, 300, estimated=True),
        ),
        marked=True,
        seconds=0.5,
    )


def counted(seconds: list[float], w: CountedWork | None = None) -> CaseResult:
    return replace(make_case(seconds, input_tokens=8, output_tokens=4), work=w or work())


def test_work_per_token_and_per_phase_by_hand() -> None:
    case = counted(BASE)
    assert value(case, "flops_per_token") == pytest.approx(1460 / 12)  # (in + out) tokens
    assert value(case, "prefill_flops_per_input_token") == pytest.approx(1000 / 8)
    assert value(case, "decode_flops_per_output_token") == pytest.approx(460 / 3)  # out - 1
    assert value(case, "bytes_per_token") == pytest.approx(1220 / 12)
    assert value(case, "prefill_bytes_per_input_token") == pytest.approx(800 / 8)
    assert value(case, "decode_bytes_per_output_token") == pytest.approx(420 / 3)
    assert value(case, "ops_per_token") == pytest.approx(11 / 12)
    assert value(case, "decode_ops_per_output_token") == pytest.approx(6 / 3)
    assert value(replace(case, queries=2), "flops_per_token") == pytest.approx(1460 / 24)
    assert case.work is not None and case.work.estimated


def test_no_counted_work_or_no_phase_mark_means_no_figure() -> None:
    assert value(make_case(BASE), "flops_per_token") is None
    unmarked = counted(BASE, replace(work(), marked=False))
    assert value(unmarked, "decode_flops_per_output_token") is None
    assert value(unmarked, "prefill_bytes_per_input_token") is None
    assert value(unmarked, "flops_per_token") == pytest.approx(1460 / 12)
    one_token = replace(counted(BASE), output_tokens=1)
    assert value(one_token, "decode_flops_per_output_token") is None  # no decode token


def test_counted_figures_are_exact_gateable_and_not_ci_targets() -> None:
    names = [k for k, f in FIGURES.items() if f.exact]
    assert sorted(names) == sorted(
        f"{p}{w}_{s}"
        for w in ("flops", "bytes", "ops")
        for p, s in (
            ("", "per_token"),
            ("prefill_", "per_input_token"),
            ("decode_", "per_output_token"),
        )
    )
    assert all(FIGURES[k].per_trial for k in names)
    assert parse_gate("flops_per_token:0%").threshold == 0  # no noise to allow for
    with pytest.raises(ConfigError):
        parse_gate("j_per_token:0%")  # a measured figure still needs room
    with pytest.raises(ConfigError, match="no confidence interval"):
        parse_ci_target("flops_per_token:5%")


def test_a_gate_on_counted_work_fails_any_worsening_beyond_it_with_no_statistics() -> None:
    gate = parse_gate("flops_per_token:0%")
    base = counted(BASE)
    slower = counted([0.2, 0.21, 0.19, 0.2])  # twice the time, the same work
    c = compare_cases([base], [slower], CompareOptions(gates=[gate]))
    assert not c.failed and [d.verdict for d in c.deltas] == [OK]
    assert "counted, exact: no noise" in evidence_line(c)
    one_more = counted(BASE, work(decode_mm_flops=401.0))  # one FLOP, 0.07 % per token
    c = compare_cases([base], [one_more], CompareOptions(gates=[gate]))
    (d,) = c.deltas
    assert c.failed and d.verdict == FAIL and d.p_value is None and d.exact
    assert d.relative_change == pytest.approx(1 / 1460)
    assert not compare_cases(
        [base], [one_more], CompareOptions(gates=[parse_gate("flops_per_token:1%")])
    ).failed
    fewer = counted(BASE, work(decode_mm_flops=200.0))
    assert not compare_cases(
        [base], [fewer], CompareOptions(gates=[gate])
    ).failed  # less work is better


def test_a_counted_gate_beside_a_measured_one_says_what_each_rests_on() -> None:
    gates = [parse_gate("j_per_token:5%"), parse_gate("flops_per_token:0%")]
    c = compare_cases([counted(BASE)], [counted(BASE)], CompareOptions(gates=gates))
    assert len(c.deltas) == 2 and not c.failed
    line = evidence_line(c)
    assert "counted, exact: no noise" in line and "Benjamini-Hochberg" in line


def test_runs_measured_by_other_meters_still_gate_their_counted_work() -> None:
    """Counted work does not depend on the meter: two machines' runs (here a RAPL run and
    an estimated one) gate it exactly while their energies stay ungated."""
    gates = [parse_gate("j_per_token:5%"), parse_gate("flops_per_token:0%")]
    other = "baseline: meter rapl, this run: meter estimate; energies not comparable"
    more = counted([0.3, 0.31, 0.29, 0.3], work(decode_mm_flops=800.0))
    c = compare_cases([counted(BASE)], [more], CompareOptions(gates=gates, not_comparable=other))
    by_figure = {d.metric: d for d in c.deltas}
    assert by_figure["flops_per_token"].verdict == FAIL and by_figure["j_per_token"].gate is None
    assert c.failed and c.meters_differ and c.unsure
    line = verdict_line(c)
    assert "FAILED" in line and "only counted work gated, the rest not: " + other in line
    assert "counted, exact" in evidence_line(c)
    rows = [r[-1] for r in comparison_table(c).cells]
    assert sorted(rows) == [FAIL, "not gated"]
    same = compare_cases(
        [counted(BASE)], [counted(BASE)], CompareOptions(gates=gates[1:], not_comparable=other)
    )
    assert not same.failed and not same.unsure and not same.meters_differ  # nothing unjudged
    assert verdict_line(same).startswith("energy gate passed (flops_per_token:0%)")
    energy_only = compare_cases(
        [counted(BASE)], [more], CompareOptions(gates=gates[:1], not_comparable=other)
    )
    assert verdict_line(energy_only) == f"not gated: {other}" and not energy_only.failed


def test_a_case_a_busy_machine_left_unmeasured_still_gates_its_counted_work() -> None:
    """Every trial disturbed: no measured figure to compare, but the counted work is
    exact whatever the load, so its gate judges it (found in the issue's A/A, where
    sessions of one trial a case on a busy machine lost 40 of 57 cases to the gate)."""
    gates = [parse_gate("j_per_token:5%"), parse_gate("flops_per_token:0%")]

    def busy(w: CountedWork) -> CaseResult:
        case = counted(BASE, w)
        return replace(case, trials=(), disturbed=case.trials)

    c = compare_cases(
        [busy(work())], [busy(work(decode_mm_flops=800.0))], CompareOptions(gates=gates)
    )
    assert [(d.metric, d.verdict) for d in c.deltas] == [("flops_per_token", FAIL)]
    assert c.failed and not c.only_in_baseline and not c.only_in_current
    same = compare_cases([counted(BASE)], [busy(work())], CompareOptions(gates=gates))
    assert [d.metric for d in same.deltas] == ["flops_per_token"] and not same.failed
    assert same.busy_unmeasured  # its energy was not compared, and the verdict says so
    measured_only = compare_cases([busy(work())], [busy(work())], CompareOptions(gates=gates[:1]))
    assert not measured_only.deltas and measured_only.only_in_current == ()


def test_counted_work_is_kept_in_the_run_file_and_old_files_still_load() -> None:
    run = sample_run((counted(BASE), make_case(BASE, input_tokens=64)))
    again = loads(dumps(run), "run.json")
    assert again.cases[0].work == work() and again.cases[1].work is None
    data = json.loads(dumps(run))
    assert "work" not in data["cases"][1]  # not counted: no key, as before
    assert data["cases"][0]["work"]["decode"][1] == {
        "name": FLASH,
        "class": "attention",
        "calls": 3,
        "flops": 60.0,
        "bytes": 300,
        "estimated": True,
    }


def test_a_paired_run_refuses_a_gate_on_counted_work_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["ab", str(tmp_path), str(tmp_path), "--gate", "flops_per_token:0%"])
    assert code == 2
    assert "counted work cannot gate a paired run" in capsys.readouterr().err
