"""Why a case got worse: the line under a failed gate and the --explain tables."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import CompareOptions, compare_cases, parse_gate
from pytest_llmenergy.comparison_text import verdict_lines, why_lines
from pytest_llmenergy.explain import NOT_COUNTED, explain, explain_tables, work_changed
from pytest_llmenergy.figures import value
from pytest_llmenergy.results import CaseResult, CountedWork, OpWork
from pytest_llmenergy.tables import render
from tests.casefactory import make_case

BASE_S = [0.100, 0.101, 0.099, 0.100, 0.100, 0.101]
SLOWER_S = [1.5 * s for s in BASE_S]
FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"


def work(
    *, decode_attention: float = 60.0, matmul: float = 1.0, calls: int = 3, moved: float = 1.0
) -> CountedWork:
    return CountedWork(
        prefill=(
            OpWork("aten::mm", "matmul", 2, 1000.0 * matmul, int(800 * moved)),
            OpWork("aten::view", "other", 3, 0.0, 0),
        ),
        decode=(
            OpWork("aten::mm", "matmul", calls, 400.0 * matmul, int(120 * moved)),
            OpWork(FLASH, "attention", 3, decode_attention, int(300 * moved), estimated=True),
        ),
        marked=True,
    )


def profile(outside_s: float = 0.01, mm_s: float = 0.02, attention_s: float = 0.005) -> dict:
    classes = {
        "matmul": {"calls": 5, "self_cpu_s": mm_s, "flops": 0.0, "bytes": 0.0},
        "attention": {"calls": 3, "self_cpu_s": attention_s, "flops": 0.0, "bytes": 0.0},
    }
    ops = [
        {"name": "aten::mm", "shapes": [], "class": "matmul", "calls": 5, "self_cpu_s": mm_s},
        {"name": FLASH, "shapes": [], "class": "attention", "calls": 3, "self_cpu_s": attention_s},
    ]
    own = mm_s + attention_s
    return {
        "version": 1,
        "classes": classes,
        "ops": ops,
        "self_cpu_s": own,
        "wall_s": own + outside_s,
    }


def case(seconds: list[float], w: CountedWork | None = None, p: dict | None = None) -> CaseResult:
    return replace(make_case(seconds, input_tokens=8, output_tokens=4), work=w, op_profile=p)


# -- the line --------------------------------------------------------------------------
def test_a_decode_that_computes_over_the_whole_sequence_names_the_kv_cache() -> None:
    line = explain(case(BASE_S, work()), case(SLOWER_S, work(decode_attention=60.0 * 31)))
    assert line.startswith("more work: decode: attention FLOPs/token x31"), line
    assert "KV cache" in line


def test_every_product_twice_is_named_as_matmul_flops_doubled() -> None:
    line = explain(case(BASE_S, work()), case(SLOWER_S, work(matmul=2.0)))
    assert "matmul FLOPs/token x2" in line and "twice" in line, line
    assert "KV cache" not in line


def test_same_work_slower_names_the_time_outside_operators_or_the_operator() -> None:
    base = case(BASE_S, work(), profile())
    outside = explain(base, case(SLOWER_S, work(), profile(outside_s=0.03)))
    assert outside == (
        "same work (counted) and operators; +200% time outside operators "
        "(Python, the generate loop)"
    )
    in_mm = explain(base, case(SLOWER_S, work(), profile(mm_s=0.05)))
    assert in_mm == "same work (counted); +150% time in aten::mm (matmul)"


def test_same_work_without_profiles_says_how_to_see_where() -> None:
    line = explain(case(BASE_S, work()), case(SLOWER_S, work()))
    assert line.startswith("same work (counted); +50% time per trial"), line
    assert "--energy-profile-ops" in line


def test_more_calls_alone_is_more_work() -> None:
    line = explain(case(BASE_S, work()), case(BASE_S, work(calls=6)))
    assert line.startswith("more work: decode: matmul operator calls/token x2"), line


def test_without_counted_work_it_says_what_to_turn_on() -> None:
    assert explain(case(BASE_S), case(SLOWER_S, work())).startswith(NOT_COUNTED)
    profiled = explain(case(BASE_S, None, profile()), case(SLOWER_S, None, profile(mm_s=0.05)))
    assert profiled.startswith(NOT_COUNTED) and "aten::mm" in profiled


def test_a_server_case_says_its_work_is_not_counted() -> None:
    from pytest_llmenergy.results import RequestRecord

    request = RequestRecord(0.01, 0.1, 4)
    served = case(BASE_S)
    served = replace(served, trials=tuple(replace(t, requests=(request,)) for t in served.trials))
    assert "server" in explain(served, served)


# -- in a comparison ---------------------------------------------------------------------
def test_a_failed_gate_explains_each_failed_case_and_only_those() -> None:
    base = [case(BASE_S, work()), replace(case(BASE_S, work()), nodeid="other", name="other")]
    head = [
        case(BASE_S, work(matmul=2.0)),
        replace(case(BASE_S, work()), nodeid="other", name="other"),
    ]
    c = compare_cases(base, head, CompareOptions(gates=[parse_gate("flops_per_token:0%")]))
    assert c.failed
    lines = why_lines(c)
    assert len(lines) == 1 and lines[0].startswith("why test_input_tokens"), lines
    assert "matmul FLOPs/token x2" in lines[0]
    assert lines[0] in verdict_lines(c)
    unconfirmed = replace(c, deltas=tuple(replace(d, unconfirmed=True) for d in c.deltas))
    assert why_lines(unconfirmed) == []  # a paired run's FAIL that did not repeat


def test_the_tables_show_work_by_phase_and_class_the_movers_and_time() -> None:
    base = case(BASE_S, work(), profile())
    head = case(SLOWER_S, work(matmul=2.0), profile(mm_s=0.04))
    tables = explain_tables("test_x[<b>]", base, head)
    assert [t.title.split(": ", 1)[1][:20] for t in tables] == [
        "counted work per tok",
        "the operators whose ",
        "time per token by op",
    ]
    text = render(tables, "table", width=200)
    assert "x2" in text and "aten::mm" in text and "outside operators" in text
    work_table = tables[0]
    row = next(r for r in work_table.rows if r[:3] == ("decode", "matmul", "flops"))
    assert row[3] == pytest.approx(400 / 3) and row[4] == pytest.approx(800 / 3)
    assert work_changed(base, head) and not work_changed(base, base)


# -- compare --explain, the report, the way users run them --------------------------------
def _saved(tmp_path: Path, name: str, cases: list[CaseResult]) -> Path:
    from pytest_llmenergy.storage.runfile import dumps
    from tests.casefactory import synthetic_run

    run = replace(synthetic_run(1, name=name), cases=tuple(cases))
    path = tmp_path / f"{name}.json"
    path.write_text(dumps(run))
    return path


def test_compare_explain_prints_why_and_the_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _saved(tmp_path, "base", [case(BASE_S, work())])
    head = _saved(tmp_path, "head", [case(BASE_S, work(decode_attention=600.0))])
    code = main(["compare", str(base), str(head), "--fail-on", "flops_per_token:0%", "--explain"])
    out = capsys.readouterr().out
    assert code == 1
    assert "why test_input_tokens[tiny-llama-in8-out4]: more work: decode: attention" in out
    assert "counted work per token" in out and FLASH in out
    # without a gate: every case whose counted work changed
    assert main(["compare", str(base), str(head), "--explain"]) == 0
    out = capsys.readouterr().out
    assert "counted work changed in 1 of 1 case(s)" in out and "counted work per token" in out


def test_the_report_shows_why_escaped(tmp_path: Path) -> None:
    nasty = "test_x[<img src=x onerror=alert(1)>]"
    b = replace(case(BASE_S, work()), nodeid=nasty, name=nasty)
    h = replace(case(BASE_S, work(matmul=2.0)), nodeid=nasty, name=nasty)
    base, head = _saved(tmp_path, "base", [b]), _saved(tmp_path, "head", [h])
    out = tmp_path / "r.html"
    code = main(["report", str(base), str(head), "--out", str(out), "--gate", "flops_per_token:0%"])
    page = out.read_text()
    assert code == 1
    assert "why test_x[&lt;img src=x onerror=alert(1)&gt;]" in page
    assert "<img src=x" not in page
    assert "matmul FLOPs/token x2" in page


# -- the real thing: counted on a tiny model ----------------------------------------------
def _counted(model: Any, ids: Any, n_out: int) -> CountedWork:
    from pytest_llmenergy.predict.work_count import count_work

    return count_work(lambda: model.generate(ids, n_out))


def _as_case(w: CountedWork, n_in: int, n_out: int) -> CaseResult:
    return replace(make_case(BASE_S, input_tokens=n_in, output_tokens=n_out), work=w)


def test_on_a_tiny_llama_no_kv_cache_and_a_doubled_linear_are_named(tiny_cache: Path) -> None:
    from pytest_llmenergy.llm.inject import inject_work
    from pytest_llmenergy.llm.loader import load_model

    model = load_model("tiny-llama", cache_dir=tiny_cache)
    ids = model.prompt_ids(16)
    base = _as_case(_counted(model, ids, 8), 16, 8)
    model.kv_cache = False
    no_cache = _as_case(_counted(model, ids, 8), 16, 8)
    model.kv_cache = True
    line = explain(base, no_cache)
    assert line.startswith("more work: decode:") and "KV cache" in line, line
    # a batch of two: each query's FLOPs as one alone, the weights read once for both
    pair = replace(_as_case(_counted(model, model.prompt_ids(16, 2), 8), 16, 8), queries=2)
    assert value(pair, "flops_per_token") == pytest.approx(value(base, "flops_per_token"))
    assert value(pair, "bytes_per_token") < value(base, "bytes_per_token")
    inject_work(model.model, ("linear-twice",))
    twice = _as_case(_counted(model, ids, 8), 16, 8)
    line = explain(base, twice)
    assert "matmul FLOPs/token x2" in line and "twice" in line, line
