"""The HTML report (issue 27): what the page holds, ``llmenergy report``, and
``--energy-report`` run the way users run it.  Drawing in a real browser:
``test_html_report_browser.py``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from pathlib import Path

import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import CompareOptions, compare_cases, delta, parse_gates
from pytest_llmenergy.figures import FIGURES
from pytest_llmenergy.html import render_report, write_report
from pytest_llmenergy.html.casedata import case_table, ratio_interval
from pytest_llmenergy.html.charts import CHARTS
from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.storage.runfile import Run, dumps
from tests.casefactory import make_case, synthetic_run
from tests.hostile import script_texts
from tests.test_plugin import assert_one_line_usage_error
from tests.test_plugin_keep import CASES, REPO
from tests.test_plugin_suite import TRACE_METER

pytest.importorskip("vl_convert")


def _specs(page: str) -> dict[str, dict]:
    found = re.search(
        r'<script type="application/json" id="llmenergy-specs">\n(.*?)\n</script>', page, re.S
    )
    assert found is not None
    return json.loads(found.group(1))


def _saved(tmp_path: Path, run, name: str) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(dumps(run))
    return path


# -- the page ----------------------------------------------------------------------------
def test_one_file_with_everything_inside_and_no_way_out() -> None:
    page = render_report([synthetic_run(12)])
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", page, re.S)
    assert len(scripts) == 4  # the library, the specs, the table's rows, the page's script
    assert "window.vegaEmbed" in scripts[0]  # the library itself, inlined
    markup = page
    for script in scripts:
        markup = markup.replace(script, "")
    # no external script, style, font or image; the policy forbids the page any request
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", markup)
    assert "@import" not in markup and "url(" not in markup
    assert "default-src 'none'" in markup


def test_each_chart_has_a_point_per_case_with_its_interval() -> None:
    run = synthetic_run(54)  # 3 models x 9 sizes x 2 sweeps
    specs = _specs(render_report([run]))
    assert set(specs) == {"jpt_in", "jpt_out", "prefill_in", "decode_out"}  # one batch size
    for key, spec in specs.items():
        values = spec["data"]["values"]
        sweep = next(c.sweep for c in CHARTS if c.key == key)
        assert len(values) == sum(1 for c in run.cases if c.labels["sweep"] == sweep) == 27
        figure = next(c.figure for c in CHARTS if c.key == key)
        for point in values:
            case = next(c for c in run.cases if c.name == point["case"])
            summary = FIGURES[figure].summary(case)
            assert point["y"] == pytest.approx(summary.mean)
            assert point["lo"] == pytest.approx(summary.low)
            assert point["hi"] == pytest.approx(summary.high)
            assert point["estimated"] is True  # the synthetic run is an estimate
        assert [layer["mark"]["type"] for layer in spec["layer"]] == ["area", "line", "point"]
        assert spec["encoding"]["x"]["scale"]["type"] == "log"
        assert "hollow points: estimated" in " ".join(spec["title"]["subtitle"])


def _batched(q: int) -> CaseResult:
    case = make_case([0.2, 0.21, 0.2], input_tokens=64, watts=50.0 * q)
    trials = tuple(dataclasses.replace(t, queries=q) for t in case.trials)
    return dataclasses.replace(case, queries=q, trials=trials, name=f"{case.name}-bs{q}")


def test_batch_curves_appear_only_with_several_batch_sizes() -> None:
    run = dataclasses.replace(synthetic_run(6), cases=tuple(_batched(q) for q in (1, 8, 32)))
    values = _specs(render_report([run]))["batch"]["data"]["values"]
    assert [p["x"] for p in values] == [1, 8, 32]
    assert [p["y"] for p in values] == pytest.approx(
        [FIGURES["j_per_token"].value(c) for c in run.cases]
    )
    assert "batch" not in _specs(render_report([synthetic_run(6)]))


def test_the_case_table_has_every_figure_some_case_has() -> None:
    run = synthetic_run(6)
    table = case_table([("a", run.cases)])
    keys = [c.key for c in table.columns]
    with_values = [k for k, f in FIGURES.items() if any(f.value(c) is not None for c in run.cases)]
    assert keys == ["case", *(k for k in with_values if k != "name")]
    assert "req_ttft_s" not in keys  # no server: no latency column
    j = keys.index("j_per_token")
    shown, value = table.rows[0][j]
    assert shown.startswith("~") and value == pytest.approx(
        FIGURES["j_per_token"].value(run.cases[0])
    )


def test_ratio_interval_is_the_t_interval_of_the_log_means() -> None:
    base = make_case([1.0, 1.1, 0.9, 1.05, 0.95])
    head = make_case([1.2, 1.3, 1.1, 1.25, 1.15])
    d = delta(base, head, "energy_j", session_noise=0.02)
    assert d is not None and d.test is not None
    ratio, low, high = ratio_interval(d)
    assert ratio == pytest.approx(1.2)
    # the gate's own interval: sessions compared, the noise between them counted
    assert math.log(high / ratio) == pytest.approx(1.959964 * d.test.se, rel=1e-4)
    assert low < 1.2 < high and low > 1.0  # a significant 20 % rise excludes 1
    assert math.log(high / ratio) == pytest.approx(math.log(ratio / low))  # symmetric in logs
    same = delta(base, base, "energy_j")
    assert same is not None
    r, lo, hi = ratio_interval(same)
    assert r == 1.0 and lo < 1.0 < hi


def test_two_runs_compared_with_verdicts_and_highlighted_rows() -> None:
    base, head = synthetic_run(54, seed=1), synthetic_run(54, seed=2, slower=1.3)
    comparison = compare_cases(
        base.cases,
        head.cases,
        CompareOptions(
            gates=parse_gates("j_per_token:5%"), current_label="head", session_noise=0.02
        ),
    )
    page = render_report([base, head], ["base", "head"], [comparison])
    assert "energy gate FAILED (j_per_token:5%)" in page
    found = re.search(
        r'<script type="application/json" id="comparison-0-data">(.*?)</script>', page
    )
    assert found is not None
    table = json.loads(found.group(1))
    assert table["classes"].count("worse") == len(comparison.failures) == 54
    assert len(table["rows"]) == 54 and "FAIL" in table["rows"][0]
    assert "ratio CI" in page
    specs = _specs(page)
    assert len(specs["jpt_in"]["data"]["values"]) == 2 * 27  # one mark per case and run
    assert specs["jpt_in"]["layer"][2]["encoding"]["shape"]["field"] == "run"


def test_an_existing_report_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("old")
    write_report(target, [synthetic_run(6)])
    assert target.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temp file left


# -- llmenergy report ----------------------------------------------------------------------
def test_cli_report_of_two_runs_with_a_gate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = _saved(tmp_path, synthetic_run(12, seed=1), "base")
    b = _saved(tmp_path, synthetic_run(12, seed=2, slower=1.3), "head")
    out = tmp_path / "report.html"
    gate = ["--gate", "j_per_token:5%", "--session-noise", "2%"]
    assert main(["report", str(a), str(b), "--out", str(out), *gate]) == 1  # as compare's
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    # what was written, counted as cases (12 in both runs), not cases x runs
    assert lines[0].startswith(f"wrote {out} (2 runs, 12 cases, ") and captured.err == ""
    assert lines[1].startswith("head: energy gate FAILED (j_per_token:5%)")
    page = out.read_text()
    assert "<h3>head against base (baseline)</h3>" in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "nope.json", "--out", "r.html"], "nope.json"),
        (["report", "{run}", "--out", "missing/r.html"], "folder missing does not exist"),
        (["report", "{run}", "--out", "."], "is a folder"),
    ],
)
def test_cli_report_bad_input_is_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    run = _saved(tmp_path, synthetic_run(6), "run")
    assert main([a.replace("{run}", str(run)) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmenergy: error: ") and message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


def test_cli_report_bad_gate_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["report", "a.json", "--out", "r.html", "--gate", "j_per_token"])
    assert exit_.value.code == 2
    assert "expected FIGURE:AMOUNT" in capsys.readouterr().err


# -- --energy-report -----------------------------------------------------------------------
@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO), prepend=os.pathsep)
    pytester.makeconftest(TRACE_METER)
    pytester.makepyfile(test_cases=CASES)
    return pytester


COMMON = ("--energy-backend=trace", "--energy-rule=research", "--energy-max-background=off")


def test_energy_report_is_written_at_session_end(project: pytest.Pytester) -> None:
    result = project.runpytest(*COMMON, "--energy-report=report.html", "--energy-save=base")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["llmenergy: HTML report of 2 case(s): report.html (*MB)"])
    page = (project.path / "report.html").read_text()
    assert "<h3>this run</h3>" in page and "test_case[8]" in page
    # the ini twin, and a comparison with the saved run; the old report is replaced
    project.makeini("[pytest]\nllmenergy_report = again.html\n")
    (project.path / "again.html").write_text("old")
    compared = project.runpytest(*COMMON, "--energy-compare-fail=j_per_token:50%")
    compared.assert_outcomes(passed=2)
    page = (project.path / "again.html").read_text()
    assert "this run against 0001_base (baseline)" in page
    assert "energy gate passed (j_per_token:50%)" in page


def test_a_hostile_parametrize_id_leaves_the_page_parsing_as_it_should(
    project: pytest.Pytester,
) -> None:
    """Issue 33: ``<!--<script>`` in a parametrize id kept the table's data element open
    past its ``</script>`` (the HTML tokenizer's script-data escape states), and the page
    showed no chart and no row.  Read the way a browser reads it, each data element ends
    at its own ``</script>``, holds no ``<`` at all, and gives back the ids as they were."""
    ids = ["<!--<script>", "</script><script>alert(1)</script>", "<!--", "]]>", "\"'&"]
    project.makepyfile(
        test_cases=CASES.replace('"n_in", [8, 64]', f'"n_in", [8, 64], ids={ids[:2]!r}'),
        test_more=CASES.replace('"n_in", [8, 64]', f'"n_in", [8, 64, 16], ids={ids[2:]!r}'),
    )
    result = project.runpytest(*COMMON, "--energy-report=r.html")
    result.assert_outcomes(passed=5)
    page = (project.path / "r.html").read_text()
    scripts = script_texts(page)
    assert set(scripts) == {"cases-data", "llmenergy-specs"}
    for text in scripts.values():
        assert "<" not in text and ">" not in text and "&" not in text
    shown = [row[0] for row in json.loads(scripts["cases-data"])["rows"]]
    assert sorted(shown) == sorted(f"test_case[{i}]" for i in ids)
    specs = json.loads(scripts["llmenergy-specs"])
    charted = {p["case"] for p in specs["jpt_in"]["data"]["values"]}
    assert charted == set(shown)
    # after the data, the page's own script is still a script element of its own
    assert page.rstrip().endswith("</script>\n</body></html>")
    assert "document.body.dataset.charts = 'drawn'" in page[page.rindex("<script>") :]


def test_energy_report_without_a_saved_run_still_has_the_header(project: pytest.Pytester) -> None:
    result = project.runpytest(*COMMON, "--energy-report=r.html")
    result.assert_outcomes(passed=2)
    page = (project.path / "r.html").read_text()
    assert "this run (complete)" in page and "__no-gpu__trace" in page


def test_energy_report_bad_folder_stops_at_start(project: pytest.Pytester) -> None:
    result = project.runpytest(*COMMON, "--energy-report=missing/r.html")
    assert_one_line_usage_error(
        result, "--energy-report=missing/r.html: folder missing does not exist"
    )


def test_without_the_report_extra_both_front_ends_say_what_to_install(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "vl_convert", None)  # import fails as if not installed
    result = project.runpytest(*COMMON, "--energy-report=r.html")
    assert_one_line_usage_error(
        result, "--energy-report: the HTML report needs vl-convert-python", "[report]"
    )
    run = _saved(tmp_path, synthetic_run(6), "run")
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'pytest-llmenergy[report]'" in err and len(err.splitlines()) == 1


# -- where the runs have them: frontier, routing, scale; ratios of a comparison -------------
def _at_setting(case: CaseResult, setting: str, default: bool = False) -> CaseResult:
    """The case measured at a GPU setting, labelled as the GPU-settings axis labels it."""
    labels = {**case.labels, "gpu_setting": setting, "power_limit_w": setting[2:-1]}
    labels["gpu_default"] = "yes" if default else "no"
    name = case.name.replace("]", f"-{setting}]")
    nodeid = case.nodeid.replace("]", f"-{setting}]")
    return dataclasses.replace(case, labels=labels, name=name, nodeid=nodeid)


# (setting, seconds per trial, watts): pl250W is slower than the default and dearer
SETTINGS = (("pl100W", 1.0, 100.0), ("pl150W", 0.8, 150.0), ("pl200W", 0.75, 200.0))
SETTINGS += (("pl250W", 0.8, 250.0),)


def swept_run(models: tuple[str, ...] = ("tiny-llama", "tiny-falcon")) -> Run:
    cases = [
        _at_setting(make_case([s, s * 1.01, s * 0.99], model=m, watts=w), name, name == "pl200W")
        for m in models
        for name, s, w in SETTINGS
    ]
    cases.append(make_case([0.5, 0.51, 0.49], model="tiny-mistral"))  # no setting
    return dataclasses.replace(synthetic_run(1), cases=tuple(cases))


def test_the_frontier_has_a_point_per_case_at_a_setting_and_its_front() -> None:
    run = swept_run()
    page = render_report([run])
    spec = _specs(page)["frontier"]
    values = spec["data"]["values"]
    assert len(values) == 8  # 2 models x 4 settings; the case without a setting is not one
    assert sorted({v["panel"] for v in values}) == [
        "tiny-falcon input in8-out4",
        "tiny-llama input in8-out4",
    ]
    for v in values:
        assert v["pareto"] is (v["setting"] != "pl250W")  # the one both slower and dearer
        assert v["default"] is (v["setting"] == "pl200W")
        seconds, watts = next((s, w) for name, s, w in SETTINGS if name == v["setting"])
        assert v["time_s"] == pytest.approx(seconds)
        assert v["energy_j"] == pytest.approx(seconds * watts)
        assert v["energy_lo"] < v["energy_j"] < v["energy_hi"]
    assert spec["facet"]["field"] == "panel"  # one panel per case
    assert "time-energy frontier over GPU settings" in page  # llmenergy frontier's table
    assert "frontier" not in _specs(render_report([synthetic_run(6)]))


def _system(hardware: str, fixed_s: float, per_token_s: float) -> Run:
    """A system whose query takes ``fixed_s`` plus ``per_token_s`` per input token at
    100 W: a fast-starting small one and a big one cross at some input size."""
    cases = []
    for sweep in ("input", "output"):
        for n in (8, 32, 128, 512, 2048):
            n_in, n_out = (n, 32) if sweep == "input" else (32, n)
            s = fixed_s + per_token_s * n_in + 0.001 * n_out
            cases.append(
                make_case(
                    [s, s * 1.02, s * 0.98],
                    sweep=sweep,
                    input_tokens=n_in,
                    output_tokens=n_out,
                    watts=100.0,
                )
            )
    return dataclasses.replace(
        synthetic_run(1, name=hardware), hardware=hardware, cases=tuple(cases)
    )


def test_the_routing_threshold_on_the_workload_between_two_systems() -> None:
    from pytest_llmenergy.routing.decide import route
    from pytest_llmenergy.routing.profile import profiles_from_run
    from pytest_llmenergy.routing.workload import alpaca

    small, big = _system("small__a", 0.01, 0.0001), _system("big__b", 0.03, 0.00002)
    page = render_report([small, big])
    spec = _specs(page)["routing-0"]
    curve, level, optimum = spec["layer"]
    energies = [p["energy_j"] for p in curve["data"]["values"]]
    (best,) = optimum["data"]["values"]  # one threshold between two systems
    # the optimum is the curve's lowest point, and routing's own decision
    assert best["energy_j"] == pytest.approx(min(energies))
    assert level["data"]["values"][0]["energy_j"] == pytest.approx(min(energies))
    profiles = [p for r in (small, big) for p in profiles_from_run(r)]
    (routed,) = route(profiles, alpaca())
    assert best["threshold"] == routed.decision.policy.rules[0].max_input_tokens
    assert 128 < best["threshold"] < 512  # the systems cross near 250 input tokens
    assert f"{small.hardware}" in best["policy"] and "Routing" in page
    # the session's own decision is shown instead: none, nothing drawn
    assert not any(k.startswith("routing") for k in _specs(render_report([small, big], routed=[])))
    # one system (a comparison on one machine): nothing to route
    assert not any(k.startswith("routing") for k in _specs(render_report([small, small])))


def test_the_scale_table_where_the_runs_ran_at_several_scales() -> None:
    one = dataclasses.replace(synthetic_run(1), cases=(make_case([1.0] * 3, watts=100.0),))
    layout = {"world_size": 2, "nodes": 1, "ranks_per_node": 2, "parallel": "tp"}
    two = dataclasses.replace(
        one,
        machine={**one.machine, "distributed": layout},
        cases=(make_case([0.6] * 3, watts=200.0),),
    )
    page = render_report([one, two], ["one", "two"])
    found = re.search(r'<script type="application/json" id="scale-0-data">(.*?)</script>', page)
    assert found is not None
    rows = json.loads(found.group(1))["rows"]
    assert [r[1] for r in rows] == ["1 process", "2 ranks (tp)"]
    assert "1.67x" in rows[1] and "83%" in rows[1]  # speed-up and efficiency
    assert "scale-0-data" not in render_report([one, one], ["a", "b"])  # one scale


def _own_suite(run: Run, name: str) -> Run:
    """The first two cases of ``run`` as a user's own suite names them: one test
    function parametrized by its prompt size, no model label."""
    cases = tuple(
        dataclasses.replace(
            c, nodeid=f"test_mine.py::test_generate[{n}]", name=f"test_generate[{n}]", labels={}
        )
        for c, n in zip(run.cases[:2], (16, 128))
    )
    return dataclasses.replace(run, cases=cases, name=name)


def test_a_small_change_of_two_cases_gets_a_ratio_axis_fitted_to_it() -> None:
    base = _own_suite(synthetic_run(6, seed=1), "base")
    head = _own_suite(synthetic_run(6, seed=2, slower=1.15), "head")
    gates = parse_gates("j_per_token:5%")
    comparison = compare_cases(
        base.cases, head.cases, CompareOptions(gates=gates, session_noise=0.02)
    )
    page = render_report([base, head], ["base", "head"], [comparison])
    spec = _specs(page)["ratio-0-j_per_token"]
    marks = spec["data"]["values"]
    low, high = spec["layer"][2]["encoding"]["x"]["scale"]["domain"]
    # the axis spans 1 and every interval, with a margin, not the decade 1-10
    assert low < 1 < min(m["lo"] for m in marks) and max(m["hi"] for m in marks) < high
    assert low > 0.9 and high < 1.4
    assert spec["layer"][2]["encoding"]["x"]["scale"]["nice"] is False
    assert spec["height"] >= 80  # two rows still make a chart to read ...
    # ... and the page keeps no room for more: its box fits the chart
    assert 'class="chart fitted" id="chart-ratio-0-j_per_token"' in page
    assert 'class="chart" id="chart-jpt_in"' in page


def test_the_colour_legend_names_a_test_as_a_test_not_a_model() -> None:
    own = _own_suite(synthetic_run(6), "mine")
    [chart] = [s for k, s in _specs(render_report([own])).items() if k == "jpt_in"]
    colour = chart["layer"][2]["encoding"]["color"]
    assert colour["title"] == "test (no model label)"
    assert {v["group"] for v in chart["data"]["values"]} == {"test_generate"}
    grid = _specs(render_report([synthetic_run(6)]))["jpt_in"]
    assert grid["layer"][2]["encoding"]["color"]["title"] == "model"
    mixed = dataclasses.replace(own, cases=own.cases + synthetic_run(6).cases[:1])
    title = _specs(render_report([mixed]))["jpt_in"]["layer"][2]["encoding"]["color"]["title"]
    assert title == "model, or test (no model label)"


def test_a_ratio_chart_per_gated_figure_with_a_mark_per_case() -> None:
    base, head = synthetic_run(54, seed=1), synthetic_run(54, seed=2, slower=1.3)
    gates = parse_gates("j_per_token:5%") + parse_gates("time_s:5%")
    comparison = compare_cases(
        base.cases,
        head.cases,
        CompareOptions(gates=gates, current_label="head", session_noise=0.02),
    )
    specs = _specs(render_report([base, head], ["base", "head"], [comparison]))
    assert {k for k in specs if k.startswith("ratio")} == {
        "ratio-0-j_per_token",
        "ratio-0-time_s",
    }
    values = specs["ratio-0-j_per_token"]["data"]["values"]
    assert len(values) == 54 == len({v["case"] for v in values})
    for v in values:
        assert v["lo"] < v["ratio"] < v["hi"]
        assert v["ratio"] == pytest.approx(1.3, rel=0.1)
        assert v["direction"] == "worse"
    # without gates: J/token's ratios
    plain = compare_cases(base.cases, head.cases, CompareOptions(current_label="head"))
    specs = _specs(render_report([base, head], ["base", "head"], [plain]))
    assert [k for k in specs if k.startswith("ratio")] == ["ratio-0-j_per_token"]
