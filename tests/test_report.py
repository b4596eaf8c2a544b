"""Energy-per-token tables: raw figures, grouping, sorting, markers and the four formats."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
from collections.abc import Mapping, Sequence

import pytest

from pytest_llmenergy.case_tables import (
    BUSY_LEGEND,
    ESTIMATED_NOTE,
    HELD_LEGEND,
    REJECTED_LEGEND,
    SHORT_LEGEND,
    THROTTLED_LEGEND,
    TRIALS_LEGEND,
    UNSTABLE_LEGEND,
    case_tables,
    cell,
    default_columns,
    parse_columns,
    parse_group_by,
    parse_sort,
    unresolved_legend,
)
from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.figures import DEFAULT_COLUMNS, FIGURES, DeprecatedName
from pytest_llmenergy.probes.resources import ResourceUsage
from pytest_llmenergy.results import (
    CONVERGED,
    LIMIT,
    OOM,
    ROUNDS,
    CaseResult,
    PhaseRecord,
    Trial,
)
from pytest_llmenergy.tables import FORMATS, Table, fmt_number, render

# Per trial: gpu:0, gpu:1, cpu:package-0, cpu:dram-0 are counted (sum = the trial's joules);
# cpu:core-0 sits inside the package and is not.
GPU_CPU_DOMAINS = (
    {"gpu:0": 5.0, "gpu:1": 1.0, "cpu:package-0": 3.0, "cpu:dram-0": 1.0, "cpu:core-0": 2.0},
    {"gpu:0": 6.0, "gpu:1": 1.0, "cpu:package-0": 4.0, "cpu:dram-0": 1.0, "cpu:core-0": 2.0},
    {"gpu:0": 7.0, "gpu:1": 1.0, "cpu:package-0": 5.0, "cpu:dram-0": 1.0, "cpu:core-0": 2.0},
)
GPU_CPU_COUNTED = {"cpu:core-0": False}
GPU_CPU_METHODS = {d: "counter" for d in GPU_CPU_DOMAINS[0]}


def make_trial(
    index: int,
    seconds: float,
    domains: Mapping[str, float],
    counted: Mapping[str, bool],
    tokens: tuple[int, int],
    phases: bool,
) -> Trial:
    joules = math.fsum(j for d, j in domains.items() if counted.get(d, True))
    records = (
        {
            "prefill": PhaseRecord(0.2 * seconds, 0.2 * joules, {}),
            "decode": PhaseRecord(0.8 * seconds, 0.8 * joules, {}),
        }
        if phases
        else {}
    )
    return Trial(
        index=index,
        seconds=seconds,
        joules=joules,
        net_joules=joules - 1.0,
        joules_by_domain=dict(domains),
        net_joules_by_domain={d: j - 0.1 for d, j in domains.items()},
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        phases=records,
    )


def make_case(
    name: str = "test_input_tokens[tiny-llama-in8-out32]",
    tokens: tuple[int, int] = (8, 32),
    *,
    seconds: Sequence[float] = (1.0, 1.2, 1.4),
    domains: Sequence[Mapping[str, float]] = GPU_CPU_DOMAINS,
    counted: Mapping[str, bool] = GPU_CPU_COUNTED,
    methods: Mapping[str, str] = GPU_CPU_METHODS,
    labels: Mapping[str, str] | None = None,
    status: str = CONVERGED,
    phases: bool = True,
    backend: str = "auto",
    reason: str = "",
    resources: ResourceUsage | None = None,
) -> CaseResult:
    trials = tuple(
        make_trial(i + 1, s, domains[i % len(domains)], counted, tokens, phases)
        for i, s in enumerate(seconds)
    )
    return CaseResult(
        nodeid=f"bench/test_llm.py::{name}",
        name=name,
        labels={"sweep": "input", "model": "tiny-llama"} if labels is None else labels,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        status=status,
        options=ControllerSettings(),
        trials=trials,
        methods=methods,
        counted=counted,
        backend=backend,
        reason=reason,
        resources=resources,
    )


def cpu_case(name: str, tokens: tuple[int, int], *, estimated: bool, **kw: object) -> CaseResult:
    """A CPU-only machine without phases: no GPU, no DRAM, no prefill/decode figures."""
    domain = "cpu:process" if estimated else "cpu:package-0"
    return make_case(
        name,
        tokens,
        domains=({domain: 20.0},),
        counted={},
        methods={domain: "estimated" if estimated else "counter"},
        phases=False,
        **kw,  # type: ignore[arg-type]
    )


def oom_case(tokens: tuple[int, int] = (8192, 32)) -> CaseResult:
    return make_case(
        f"test_input_tokens[tiny-llama-in{tokens[0]}-out{tokens[1]}]",
        tokens,
        seconds=(),
        status=OOM,
        reason=f"OOM at {tokens[0]} input tokens ({tokens[1]} output tokens)",
    )


def rows_of(table: Table) -> list[dict[str, object]]:
    return [dict(zip(table.keys, row)) for row in table.rows]


def cells_of(table: Table) -> list[dict[str, str]]:
    return [dict(zip(table.keys, row)) for row in table.cells]


def header_of(line: str) -> list[str]:
    """A rendered header line's labels (labels have single spaces, columns two or more)."""
    return re.split(r"\s{2,}", line.strip())


CI_LEGEND = "s ± CI, J ± CI: per query, mean ± half-width of the 95% confidence interval"


# -- raw values ----------------------------------------------------------------


def test_raw_values_of_a_measured_case() -> None:
    usage = ResourceUsage(3 * 2**20, None, 0.75, None, 3.6)
    (table,) = case_tables([make_case(resources=usage)], columns=list(FIGURES))
    (row,) = rows_of(table)
    assert row["name"] == "test_input_tokens[tiny-llama-in8-out32]"
    assert (row["tokens_in"], row["tokens_out"], row["trials"]) == (8, 32, 3)
    assert row["status"] == "converged"
    assert row["time_s"] == pytest.approx(1.2)
    assert row["energy_j"] == 12.0  # (10 + 12 + 14) / 3
    assert row["net_energy_j"] == 11.0
    assert row["j_per_token"] == pytest.approx(12.0 / 40)
    # prefill is 20 % of each trial's joules (2.4 J on average), over 8 input tokens
    assert row["prefill_j_per_in_token"] == pytest.approx(0.2 * 12.0 / 8)
    # decode is 80 % (9.6 J), over the 31 tokens it produces (the prefill made the 32nd)
    assert row["decode_j_per_out_token"] == pytest.approx(0.8 * 12.0 / 31)
    assert row["prefill_j"] == pytest.approx(0.2 * 12.0)
    assert row["decode_j"] == pytest.approx(0.8 * 12.0)
    assert row["ttft_s"] == pytest.approx(0.2 * 1.2)
    assert row["decode_s"] == pytest.approx(0.8 * 1.2)
    # throughputs are means of the trials' own: 40 tokens in 1.0, 1.2 and 1.4 s
    assert row["tokens_per_s"] == pytest.approx((40 / 1.0 + 40 / 1.2 + 40 / 1.4) / 3)
    decode = [0.8 * s for s in (1.0, 1.2, 1.4)]
    assert row["out_tokens_per_s"] == pytest.approx(sum(31 / d for d in decode) / 3)
    assert row["power_w"] == pytest.approx(10.0)  # 10 J/s in every trial
    assert row["peak_rss_mib"] == 3.0
    assert row["cpu_s"] == 0.75
    assert row["estimated"] is False


def test_column_headers_are_the_figures_labels() -> None:
    (table,) = case_tables([make_case()], columns=list(FIGURES))
    assert table.keys[:-2] == tuple(FIGURES)  # then "estimated" and "nodeid", csv/json only
    assert table.headers[:-2] == tuple(f.label for f in FIGURES.values())
    assert table.priorities[1:-2] == tuple(f.priority for f in FIGURES.values())[1:]
    assert table.priorities[0] == 0  # the name: kept longest


def test_cell_formats_one_figure_of_one_case() -> None:
    case = make_case()
    assert cell(FIGURES["trials"], case) == "3 ✓"
    assert cell(FIGURES["time_s"], case) == "1.20 ± 0.50"
    assert cell(FIGURES["j_per_token"], case) == "0.3"  # 12 J / 40 tokens
    assert cell(FIGURES["tokens_in"], case) == "8"
    assert cell(FIGURES["ttft_s"], make_case(phases=False)) == "—"
    estimated = cpu_case("est", (8, 32), estimated=True)
    assert cell(FIGURES["j_per_token"], estimated) == "~0.5"  # 20 J / 40 tokens, marked
    assert cell(FIGURES["time_s"], estimated) == "1.20 ± 0.50"  # not energy: no mark


def test_domain_families_count_only_counted_domains() -> None:
    (table,) = case_tables([make_case()], columns=["gpu_j", "cpu_j", "dram_j", "energy_j"])
    (row,) = rows_of(table)
    assert row["gpu_j"] == pytest.approx(6.0 + 1.0)  # both GPUs
    assert row["cpu_j"] == pytest.approx(4.0)  # the package, not the core inside it
    assert row["dram_j"] == pytest.approx(1.0)
    assert row["gpu_j"] + row["cpu_j"] + row["dram_j"] == pytest.approx(row["energy_j"])  # type: ignore[operator]


def test_named_columns_come_after_the_rows_tokens_unless_they_name_them() -> None:
    """--energy-columns=time_s still says which case a row is (pytest-benchmark's Name)."""
    cases = [make_case("a", (8, 32)), make_case("b", (16, 32))]
    (table,) = case_tables(cases, columns=["time_s"])
    assert table.keys[:3] == ("tokens_in", "tokens_out", "time_s")
    (table,) = case_tables(cases, columns=["name", "time_s"])
    assert table.keys[:2] == ("name", "time_s")
    batched = [make_case("a", (8, 32)), dataclasses.replace(make_case("b", (8, 32)), queries=4)]
    (table,) = case_tables(batched, columns=["trials", "queries"])
    assert table.keys[:4] == ("tokens_in", "tokens_out", "queries", "trials")


def test_dram_outside_the_cpu_namespace_is_still_dram() -> None:
    case = make_case(domains=({"dram": 2.0, "cpu:package": 8.0},), counted={}, methods={})
    (row,) = rows_of(case_tables([case], columns=["gpu_j", "cpu_j", "dram_j"])[0])
    assert (row["gpu_j"], row["cpu_j"], row["dram_j"]) == (None, 8.0, 2.0)


# -- display cells -------------------------------------------------------------


def test_cells_show_ci_and_how_the_trials_ended() -> None:
    cases = [
        make_case("a", (8, 32)),
        make_case("b", (16, 32), seconds=[1.0] * 25, status=LIMIT),
        make_case("c", (32, 32), seconds=[1.0] * 5, status=ROUNDS),
        make_case("d", (64, 32), seconds=[2.0]),
    ]
    (table,) = case_tables(cases, columns=["name", "trials", "time_s", "energy_j", "status"])
    cells = {c["name"]: c for c in cells_of(table)}
    assert cells["a"]["trials"] == "3 ✓"
    assert cells["b"]["trials"] == "25 ✗"
    assert cells["c"]["trials"] == "5"
    assert cells["b"]["status"] == "limit"
    half = make_case().energy.half_width  # 4.97: two digits, 5.0, and the mean to match
    assert cells["a"]["energy_j"] == f"12.0 ± {half:.1f}"
    assert cells["a"]["time_s"] == "1.20 ± 0.50"  # 0.497: the mean to its place
    assert cells["d"]["time_s"] == "2"  # one trial: no interval to show


def test_fmt_number_uses_significant_digits_and_a_dash_for_nothing() -> None:
    assert fmt_number(0.000123456) == "0.0001235"
    assert fmt_number(1.23456) == "1.235"
    assert fmt_number(12345.6) == "12346"  # whole, not 1.235e+04
    assert fmt_number(0.123456, 2) == "0.12"
    assert [fmt_number(v) for v in (None, math.nan, math.inf)] == ["—", "—", "—"]


# -- grouping --------------------------------------------------------------------


def grid() -> list[CaseResult]:
    return [
        make_case("out-b", (32, 64), labels={"sweep": "output", "model": "b"}),
        make_case("in-b", (8, 32), labels={"sweep": "input", "model": "b"}),
        make_case("in-a-64", (64, 32), labels={"sweep": "input", "model": "a"}),
        make_case("in-a-8", (8, 32), labels={"sweep": "input", "model": "a"}),
        make_case("plain", (1, 1), labels={}, backend="rapl"),
    ]


def test_default_grouping_by_sweep_and_model_with_titles_in_order() -> None:
    tables = case_tables(grid())
    assert [t.title for t in tables] == [
        "all cases",  # the plain test has neither label
        "sweep input · model a",
        "sweep input · model b",
        "sweep output · model b",
    ]
    assert [r["name"] for r in rows_of(tables[1])] == ["in-a-8", "in-a-64"]


def test_group_by_model_only_and_by_nothing() -> None:
    by_model = case_tables(grid(), group_by=("model",))
    assert [t.title for t in by_model] == ["all cases", "model a", "model b"]
    assert len(by_model[2].rows) == 2
    (everything,) = case_tables(grid(), group_by=())
    assert everything.title == "all cases" and len(everything.rows) == 5


def test_group_by_test_backend_and_param() -> None:
    cases = [
        make_case("test_x[1]", labels={"batch": "1"}, backend="nvml"),
        make_case("test_x[2]", labels={"batch": "2"}, backend="nvml"),
        make_case("test_y", labels={}, backend="rapl"),
    ]
    titles = [t.title for t in case_tables(cases, group_by=("test", "backend"))]
    assert titles == [
        "test bench/test_llm.py::test_x · backend nvml",
        "test bench/test_llm.py::test_y · backend rapl",
    ]
    titles = [t.title for t in case_tables(cases, group_by=("param:batch",))]
    assert titles == ["all cases", "batch 1", "batch 2"]


# -- sorting ---------------------------------------------------------------------


def sweep_with_oom() -> list[CaseResult]:
    return [
        make_case("in64", (64, 32), seconds=(3.0, 3.0, 3.0)),
        oom_case((8192, 32)),
        make_case("in8", (8, 32), seconds=(1.0, 1.0, 1.0), domains=({"gpu:0": 50.0},)),
        make_case("in32", (32, 32), seconds=(2.0, 2.0, 2.0), domains=({"gpu:0": 5.0},)),
    ]


def names(cases: list[CaseResult], sort: str) -> list[object]:
    (table,) = case_tables(cases, sort=sort)
    return [r["name"] for r in rows_of(table)]


def test_sort_by_tokens_and_descending() -> None:
    assert names(sweep_with_oom(), "tokens") == ["in8", "in32", "in64", oom_case().name]
    assert names(sweep_with_oom(), "-tokens") == [oom_case().name, "in64", "in32", "in8"]


def test_sort_by_a_figure_puts_missing_values_last_both_ways() -> None:
    assert names(sweep_with_oom(), "time_s") == ["in8", "in32", "in64", oom_case().name]
    # joules: in32 5, in64 12, in8 50
    assert names(sweep_with_oom(), "energy_j") == ["in32", "in64", "in8", oom_case().name]
    assert names(sweep_with_oom(), "-energy_j") == ["in8", "in64", "in32", oom_case().name]


def test_sort_by_name() -> None:
    expected = sorted(["in64", oom_case().name, "in8", "in32"])
    assert names(sweep_with_oom(), "name") == expected
    assert names(sweep_with_oom(), "-name") == expected[::-1]


# -- which columns -----------------------------------------------------------------


# Default columns only a batch (queries > 1) or a server's requests have.
SERVER_OR_BATCH = (
    "queries",
    "steady_j_per_token",
    "req_ttft_s",
    "tpot_s",
    "latency_p50_s",
    "latency_p99_s",
)

# Default columns only a case whose work was counted has (these cases were not).
NOT_COUNTED = ("flops_per_token",)


def test_default_columns_drop_what_no_case_has() -> None:
    (table,) = case_tables([cpu_case("c", (8, 32), estimated=False)])
    shown = [k for k in table.keys if k not in table.hidden]
    no_phases = [k for k in DEFAULT_COLUMNS if FIGURES[k].needs_phases]
    assert no_phases  # the default columns include prefill | decode figures
    absent = (*no_phases, "gpu_j", "dram_j", *SERVER_OR_BATCH, *NOT_COUNTED)
    assert shown == [k for k in DEFAULT_COLUMNS if k not in absent]


def test_default_columns_keep_a_column_one_case_has() -> None:
    cases = [cpu_case("c", (8, 32), estimated=False), make_case("g", (16, 32))]
    (table,) = case_tables(cases)
    shown = [k for k in table.keys if k not in table.hidden]
    assert shown == [k for k in DEFAULT_COLUMNS if k not in (*SERVER_OR_BATCH, *NOT_COUNTED)]
    assert cells_of(table)[0]["gpu_j"] == "—"


def test_explicit_columns_are_all_kept_even_when_empty() -> None:
    (table,) = case_tables(
        [cpu_case("c", (8, 32), estimated=False)], columns=["tokens_in", "gpu_j", "ttft_s"]
    )
    assert [k for k in table.keys if k not in table.hidden] == ["tokens_in", "gpu_j", "ttft_s"]
    assert rows_of(table)[0]["gpu_j"] is None and cells_of(table)[0]["ttft_s"] == "—"


def test_name_is_shown_only_when_tokens_do_not_tell_rows_apart() -> None:
    sweep = [make_case("a", (8, 32)), make_case("b", (16, 32))]
    (table,) = case_tables(sweep)
    assert "name" in table.hidden and "name" in table.keys  # still in csv/json
    plain = [make_case("test_a", (1, 1), labels={}), make_case("test_b", (1, 1), labels={})]
    (table,) = case_tables(plain)
    assert table.keys[0] == "name" and "name" not in table.hidden


# -- estimated and unmeasured cases ------------------------------------------------


def test_estimated_cases_are_marked_and_noted() -> None:
    cases = [cpu_case("est", (8, 32), estimated=True), cpu_case("real", (16, 32), estimated=False)]
    (table,) = case_tables(cases, columns=["name", "tokens_in", "energy_j", "power_w", "cpu_j"])
    est, real = cells_of(table)
    assert est["energy_j"].startswith("~20") and est["power_w"].startswith("~")
    assert est["cpu_j"] == "~20"
    assert est["tokens_in"] == "8"  # not energy: no marker
    assert not any(c.startswith("~") for c in real.values())
    assert [r["estimated"] for r in rows_of(table)] == [True, False]
    assert rows_of(table)[0]["energy_j"] == 20.0  # the raw figure stays a number
    # power is the mean of the trials' own J/s (20 J in 1.0, 1.2 and 1.4 s): 16.98 W,
    # not the ratio of the means (20 J / 1.2 s = 16.67 W)
    assert rows_of(table)[0]["power_w"] == pytest.approx((20 / 1.0 + 20 / 1.2 + 20 / 1.4) / 3)
    assert est["power_w"] == "~16.98"
    assert ESTIMATED_NOTE in table.legend and ESTIMATED_NOTE not in table.notes


def test_measured_cases_carry_no_estimate_note() -> None:
    (table,) = case_tables([make_case()])
    assert ESTIMATED_NOTE not in table.legend
    # ± and ✓ explained under the table; no ✗ in it, so none explained
    assert table.legend == (CI_LEGEND, HELD_LEGEND)
    assert table.notes == ()  # notes are for cases that were not measured
    assert not any("~" in text for row in table.cells for text in row)
    # pedantic rounds: no ✓ or ✗ to explain
    (rounds,) = case_tables([make_case(status=ROUNDS)])
    assert not any(line.startswith("trials:") for line in rounds.legend)
    # a case stopped at the limit besides: both marks, both explained
    (both,) = case_tables([make_case("test_x[a]"), make_case("test_x[b]", status=LIMIT)])
    assert TRIALS_LEGEND in both.legend


def test_a_case_short_of_the_minimum_time_has_its_own_mark_and_one_note() -> None:
    # 25 trials of 28 ms: the intervals held, but 0.7 s is below the rule's 1 s minimum
    short = make_case("test_x[short]", seconds=[0.028] * 25)
    enough = make_case("test_x[enough]", seconds=[0.05] * 25)  # 1.25 s
    assert short.short_of_time and not enough.short_of_time
    # a paired run's case stops on its pairs: no trial limit to blame
    paired = dataclasses.replace(
        short, trials=tuple(dataclasses.replace(t, pair=i) for i, t in enumerate(short.trials))
    )
    assert not paired.short_of_time
    (table,) = case_tables([short, enough], group_by=())
    trials = {row[0]: row[table.keys.index("trials")] for row in table.cells}
    assert trials == {"short": "25 \u2713<", "enough": "25 \u2713"}
    assert table.legend[-1] == SHORT_LEGEND and HELD_LEGEND in table.legend
    assert table.notes == (
        "short: stopped at the trial limit with 0.7 s measured, below the 1 s minimum; "
        "--energy-max-trials=36 would measure it",
    )
    (plain,) = case_tables([enough], group_by=())
    assert SHORT_LEGEND not in plain.legend and plain.notes == ()
    # Issue 54: a quick session's cases are mostly short; one line says it for all of
    # them, with the trial limit that measures the slowest, not three lines per case
    shorter = make_case("test_x[shorter]", seconds=[0.014] * 25)  # 0.35 s: 72 trials
    (table,) = case_tables([short, enough, shorter], group_by=())
    assert table.notes == (
        "2 of 3 cases stopped at the trial limit with 0.35-0.7 s measured, below the 1 s "
        "minimum; --energy-max-trials=72 would measure them all",
    )
    (every,) = case_tables([short, shorter], group_by=())
    assert every.notes[0].startswith("all 2 cases stopped at the trial limit")
    assert HELD_LEGEND not in every.legend  # only ✓< in the table: ✓ is not explained


def test_a_narrow_terminal_leaves_out_the_legend_of_the_columns_it_left_out() -> None:
    """Issue 54: the legend explained the ✓< of a trials column the terminal had left out."""
    short = make_case("test_x[short]", seconds=[0.028] * 25)
    (table,) = case_tables([short], group_by=())
    assert SHORT_LEGEND in table.legend and table.legend_keys[table.legend.index(SHORT_LEGEND)]
    wide = render([table], width=200)
    assert SHORT_LEGEND in wide
    trials = table.keys.index("trials")
    narrow_width = next(
        w for w in range(120, 20, -1) if "trials" not in render([table], width=w).splitlines()[1]
    )
    narrow = render([table], width=narrow_width).replace("\n  ", " ")
    left_out = next(line for line in narrow.splitlines() if line.startswith("columns left out"))
    assert table.headers[trials] in left_out.split(": ", 1)[1].split(", ")
    assert "\u2713<:" not in narrow
    # the note on how short the case was stays: it needs no mark
    assert "test_x[short]: stopped at the trial limit" in narrow


def test_a_gated_figure_is_always_a_default_column() -> None:
    assert default_columns() == DEFAULT_COLUMNS
    assert default_columns(("ttft_s", "j_per_token")) == (*DEFAULT_COLUMNS, "ttft_s")
    (table,) = case_tables([make_case()], gated=("ttft_s",))
    assert [k for k in table.keys if k not in table.hidden][-1] == "ttft_s"


def test_an_oom_case_is_a_row_of_dashes_with_its_reason_in_the_notes() -> None:
    cases = [make_case("in8", (8, 32)), oom_case((8192, 32))]
    (table,) = case_tables(cases)
    oom_row, oom_cells = rows_of(table)[1], cells_of(table)[1]
    assert (oom_row["tokens_in"], oom_row["tokens_out"]) == (8192, 32)
    assert oom_cells["trials"] == "—" and oom_cells["energy_j"] == "—"
    named = ("tokens_in", "tokens_out", "name", "estimated", "nodeid")
    numbers = [k for k in table.keys if k not in named]
    assert all(oom_row[k] is None for k in numbers)
    assert table.notes == (
        "test_input_tokens[tiny-llama-in8192-out32]: OOM at 8192 input tokens (32 output tokens)",
    )
    (status_table,) = case_tables(cases, columns=["status"])
    assert rows_of(status_table)[1]["status"] == "oom"


# -- parsing -------------------------------------------------------------------------


def test_parse_columns() -> None:
    assert parse_columns(" energy_j ,name,energy_j") == ("energy_j", "name")
    with pytest.warns(DeprecatedName, match="'joules' is deprecated, use 'energy_j'"):
        assert parse_columns("joules,energy_j") == ("energy_j",)  # an old name, one column
    with pytest.raises(ConfigError, match=r"unknown figure 'jules'; choose from: name, tokens_in"):
        parse_columns("energy_j,jules")
    with pytest.raises(ConfigError, match=r"'j_per_in_token' is gone.*prefill_j_per_in_token"):
        parse_columns("j_per_in_token")
    with pytest.raises(ConfigError, match="choose from"):
        parse_columns(" , ")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("seconds", "time_s"),
        ("joules_per_token", "j_per_token"),
        ("watts", "power_w"),
        ("prefill_s", "ttft_s"),
        ("decode_tokens_per_s", "out_tokens_per_s"),
    ],
)
def test_old_column_names_still_work_with_a_deprecation_warning(old: str, new: str) -> None:
    with pytest.warns(DeprecatedName, match=f"'{old}' is deprecated, use '{new}'"):
        (table,) = case_tables([make_case()], columns=["tokens_in", old])
    assert table.keys[:2] == ("tokens_in", new)
    assert rows_of(table)[0][new] == FIGURES[new].value(make_case())


def test_removed_column_names_are_refused_naming_the_replacement() -> None:
    with pytest.raises(ConfigError, match=r"'j_per_out_token' is gone: .*decode_j_per_out_token"):
        parse_columns("tokens_in,j_per_out_token")
    with pytest.raises(ConfigError, match=r"'energy_per_input_token' is gone: .*prefill_j_per_in"):
        case_tables([make_case()], columns=["energy_per_input_token"])


def test_parse_group_by() -> None:
    assert parse_group_by("model, param:batch") == ("model", "param:batch")
    assert parse_group_by(" none ") == ()
    choices = "choose from: sweep, model, test, backend, param:NAME, none"
    with pytest.raises(ConfigError, match=f"unknown group 'modle'; {choices}"):
        parse_group_by("modle")
    with pytest.raises(ConfigError, match="unknown group 'param:'"):
        parse_group_by("param:")
    with pytest.raises(ConfigError, match="'none'"):
        parse_group_by("none,model")


def test_parse_sort() -> None:
    assert parse_sort("tokens") == "tokens"
    assert parse_sort(" -energy_j ") == "-energy_j"
    with pytest.warns(DeprecatedName):
        assert parse_sort("-joules") == "-energy_j"
    assert parse_sort("name") == "name"
    with pytest.raises(ConfigError, match=r"unknown sort 'enrgy'; choose from: tokens, "):
        parse_sort("enrgy")
    with pytest.raises(ConfigError, match="unknown sort 'status'"):  # not a figure
        parse_sort("status")


def test_a_removed_sort_name_is_refused_naming_the_replacement() -> None:
    with pytest.raises(ConfigError, match=r"'j_per_out_token' is gone: .*decode_j_per_out_token"):
        parse_sort("-j_per_out_token")


def test_case_tables_checks_its_arguments() -> None:
    with pytest.raises(ConfigError, match="unknown figure 'x'"):
        case_tables([make_case()], columns=["x"])
    with pytest.raises(ConfigError, match="unknown sort 'x'"):
        case_tables([make_case()], sort="x")


# -- rendering ----------------------------------------------------------------------


def two_tables() -> list[Table]:
    return case_tables(
        [
            make_case("in8", (8, 32)),
            oom_case((8192, 32)),
            cpu_case("est", (8, 8), estimated=True, labels={"sweep": "output", "model": "m"}),
        ]
    )


def test_render_table() -> None:
    text = render(two_tables())
    lines = text.splitlines()
    assert lines[0] == "sweep input · model tiny-llama"
    header = lines[1]
    for h in ("in", "out", "trials", "s ± CI", "J ± CI", "J/token", "prefill J/in", "GPU J"):
        assert h in header
    assert "estimated" not in header and "name" not in header  # csv/json only
    assert lines[3].startswith("   8   32")  # figures right-aligned under "  in", " out"
    assert "sweep output · model m" in lines
    assert lines[lines.index("sweep output · model m") - 1] == ""  # tables apart
    assert ESTIMATED_NOTE in lines
    assert any(line.startswith("test_input_tokens[tiny-llama-in8192-out32]: OOM") for line in lines)


def test_a_legend_shared_by_tables_is_printed_once_after_the_last() -> None:
    lines = render(two_tables()).splitlines()
    assert lines.count(CI_LEGEND) == 1 and lines.count(HELD_LEGEND) == 1
    # issue 61: every legend line once, after the last table, the second table's own
    # (the estimate's) too: not under its table and a final legend besides
    assert lines[-3:] == [CI_LEGEND, HELD_LEGEND, ESTIMATED_NOTE]
    assert lines.count(ESTIMATED_NOTE) == 1


def test_a_width_leaves_out_the_lowest_priority_columns_and_says_which() -> None:
    tables = case_tables([make_case("in8", (8, 32)), make_case("in16", (16, 32))])
    full = render(tables)
    assert max(map(len, full.splitlines())) > 100  # every default column: 118 wide
    assert "left out" not in full
    text = render(tables, width=80, narrow_hint="choose with --columns")
    assert all(len(line) <= 80 for line in text.splitlines()), text
    # GPU/CPU/DRAM J (priority 5), avg W and tok/s (4), out tok/s (3) go; the rest fits
    assert header_of(text.splitlines()[1]) == [
        "in",
        "out",
        "trials",
        "s ± CI",
        "J ± CI",
        "J/token",
        "prefill J/in",
        "decode J/out",
    ]
    assert (
        "columns left out to fit 80 characters: tok/s, out tok/s, avg W, GPU J, CPU J, "
        "DRAM J; choose with --columns"
    ) in text.replace("\n  ", " ")
    # narrower: trials and the prefill | decode figures (2) go, then J ± CI (1, the
    # rightmost of its priority); in, out and J/token (0) would stay even if nothing fit
    text = render(tables, width=40)
    assert all(len(line) <= 40 for line in text.splitlines()), text
    assert header_of(text.splitlines()[1]) == ["in", "out", "s ± CI", "J/token"]
    # the data formats keep every column whatever the width
    assert render(tables, "csv", width=40) == render(tables, "csv")
    assert render(tables, "json", width=40) == render(tables, "json")


def test_every_legend_line_leaves_a_100_column_terminal_its_last_column() -> None:
    """Issue 46: at COLUMNS=100 the legend lines of ``✓<``, ``+Nx`` and ``(Nu)`` were 100
    characters: they filled the terminal's last column, and a terminal that wraps on
    reaching it shows each as a line and an empty one.  Every line stops short of it, its
    continuation lines indented two spaces, no word lost."""
    legend = (
        CI_LEGEND,
        TRIALS_LEGEND,
        SHORT_LEGEND,
        BUSY_LEGEND,
        THROTTLED_LEGEND,
        REJECTED_LEGEND,
        UNSTABLE_LEGEND,
        unresolved_legend(0.1),
        ESTIMATED_NOTE,
    )
    table = Table("t", ("a",), ("A",), ((1,),), (("1",),), legend=legend)
    lines = render([table], width=100).splitlines()[4:]  # under the title and the body
    assert all(len(line) < 100 for line in lines), "\n".join(lines)
    joined: list[str] = []
    for line in lines:
        if line.startswith("  "):
            joined[-1] += " " + line[2:]
        else:
            joined.append(line)
    assert joined == list(legend)


def test_render_markdown() -> None:
    text = render(two_tables(), "markdown")
    assert "### sweep input · model tiny-llama" in text
    table_rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table_rows) == 2 * 2 + 1 + 2 * 1  # header + rule per table, then the rows
    assert f"> {ESTIMATED_NOTE}" in text
    assert "estimated" not in table_rows[0]


def test_render_csv_is_one_sheet_of_raw_values() -> None:
    tables = two_tables()
    text = render(tables, "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0])[:2] == ["group", tables[0].keys[0]]
    assert [r["group"] for r in rows] == [
        "sweep input · model tiny-llama",
        "sweep input · model tiny-llama",
        "sweep output · model m",
    ]
    first = rows_of(tables[0])[0]
    assert float(rows[0]["energy_j"]) == first["energy_j"]
    assert float(rows[0]["prefill_j_per_in_token"]) == first["prefill_j_per_in_token"]
    assert rows[0]["name"] == "in8" and rows[0]["estimated"] == "False"
    assert rows[1]["energy_j"] == "" and rows[1]["tokens_in"] == "8192"  # OOM: empty, not nan
    assert rows[2]["gpu_j"] == "" and rows[2]["estimated"] == "True"  # not a column there


def test_render_json_is_strict() -> None:
    tables = two_tables()

    def no_constants(name: str) -> object:
        raise AssertionError(f"non-standard JSON constant {name}")

    data = json.loads(render(tables, "json"), parse_constant=no_constants)
    assert [t["title"] for t in data["tables"]] == [t.title for t in tables]
    first = data["tables"][0]
    assert first["columns"] == list(tables[0].keys)
    assert first["rows"][0]["energy_j"] == 12.0 and first["rows"][0]["estimated"] is False
    assert first["rows"][1]["energy_j"] is None
    assert ESTIMATED_NOTE in data["tables"][1]["legend"] and data["tables"][1]["notes"] == []


def test_render_takes_any_table_and_never_writes_nan() -> None:
    table = Table(
        title="compare",
        keys=("case", "ratio"),
        headers=("case", "ratio"),
        rows=(("a", math.nan), ("b", 1.5)),
        cells=(("a", "—"), ("b", "1.5x")),
        notes=("a note",),
    )
    assert json.loads(render([table], "json"))["tables"][0]["rows"][0] == {
        "case": "a",
        "ratio": None,
    }
    assert render([table], "csv") == "group,case,ratio\ncompare,a,\ncompare,b,1.5\n"
    text = render([table])
    assert text.splitlines()[0] == "compare" and "1.5x" in text and text.endswith("a note")


def test_render_rejects_an_unknown_format() -> None:
    with pytest.raises(ConfigError, match="unknown format 'html'; choose from: table, csv"):
        render(two_tables(), "html")
    assert FORMATS == ("table", "csv", "json", "markdown")
