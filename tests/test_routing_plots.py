"""The routing figures: files written, the data drawn, never overwriting, optional matplotlib."""

from __future__ import annotations

import dataclasses
import sys
import xml.etree.ElementTree as ET
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.plotting import FORMATS
from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.routing.fit import SystemModel, build_model
from pytest_llmenergy.routing.optimize import Router, pareto
from pytest_llmenergy.routing.profile import (
    Profile,
    pool_models,
    profiles_from_cases,
    read_profile_csv,
    select,
)
from pytest_llmenergy.routing.route_plots import (
    DEFAULT_LAMS,
    ESTIMATED,
    PlotError,
    energy_per_token_figure,
    front_notes,
    measured_points,
    pareto_figure,
    runtime_figure,
    slug,
    threshold_figure,
    write_profile_plots,
    write_routing_plots,
)
from pytest_llmenergy.routing.workload import Workload, load_workload
from pytest_llmenergy.stats import summarize
from tests.casefactory import make_case

CSV = Path(__file__).resolve().parents[1] / "examples" / "wilkins2024" / "wilkins2024.csv"
TWO = ["M1-Pro", "Swing AMD+A100"]
THREE = [*TWO, "Palmetto Intel+A100"]
LLAMA = "Llama-2 (7B)"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LAMS = (0.0, 0.5, 1.0)  # enough for a front; the default 21 are slower to no purpose
# what draws needs matplotlib; the errors raised before drawing are tested without it
drawing = pytest.mark.skipif(find_spec("matplotlib") is None, reason="needs matplotlib")


@pytest.fixture(scope="module")
def profiles() -> list[Profile]:
    return read_profile_csv(CSV)


@pytest.fixture(scope="module")
def workload() -> Workload:
    return load_workload("alpaca-paper")


def _models(profiles: list[Profile], systems: list[str], model: str) -> list[SystemModel]:
    return [build_model(p) for p in select(profiles, systems, [model])[model]]


@pytest.fixture(scope="module")
def llama(profiles: list[Profile]) -> list[SystemModel]:
    return _models(profiles, TWO, LLAMA)


@pytest.fixture(scope="module")
def pooled(profiles: list[Profile]) -> list[SystemModel]:
    return _models(profiles, TWO, "all")


@pytest.fixture(scope="module")
def router(pooled: list[SystemModel], workload: Workload) -> Router:
    return Router(pooled, workload, by="input")


def _line(ax, prefix: str):
    """The one line of ``ax`` whose legend label starts with ``prefix``."""
    found = [line for line in ax.get_lines() if line.get_label().startswith(prefix)]
    assert len(found) == 1, [line.get_label() for line in ax.get_lines()]
    return found[0]


def _means(ax, prefix: str):
    """The one error-bar container of ``ax`` (measured means ± CI) whose legend label
    starts with ``prefix``."""
    found = [c for c in ax.containers if c.get_label().startswith(prefix)]
    assert len(found) == 1, [c.get_label() for c in ax.containers]
    return found[0]


def _half_widths(container) -> list[float]:
    """Half the length of each drawn error bar; NaN where no bar is drawn."""
    (bars,) = container.lines[2]
    return [(seg[1][1] - seg[0][1]) / 2 if len(seg) else np.nan for seg in bars.get_segments()]


def _legend_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _xy(decision) -> tuple[float, float]:
    return (decision.totals.energy_j, decision.totals.runtime_s)


def _svg_text(path: Path) -> str:
    root = ET.parse(path).getroot()  # raises if the file is not XML
    assert root.tag.endswith("svg")
    return " ".join(root.itertext())


def test_slug_is_safe_for_file_names() -> None:
    assert slug("Llama-2 (7B)") == "llama-2-7b"
    assert slug("all") == "all"
    assert slug(" Mistral/7B: v0.2 ") == "mistral-7b-v0-2"
    assert slug("()") == "model"


@drawing
def test_profile_plots_in_png_and_svg(llama: list[SystemModel], tmp_path: Path) -> None:
    out = tmp_path / "new" / "figures"  # created, parents too
    paths = write_profile_plots(llama, out, formats=FORMATS)
    names = [
        f"llama-2-7b-{figure}.{fmt}"
        for figure in ("energy-per-token-input", "energy-per-token-output", "runtime")
        for fmt in ("png", "svg")
    ]
    assert [p.name for p in paths] == names
    assert all(p.parent == out and p.stat().st_size > 0 for p in paths)
    for path in paths[::2]:
        assert path.read_bytes().startswith(PNG_SIGNATURE)
    text = _svg_text(out / "llama-2-7b-energy-per-token-input.svg")
    assert "Llama-2 (7B)" in text
    assert "input tokens per query" in text
    assert "energy per token (J/token, input + output)" in text
    assert "M1-Pro: measured" in text and "Swing AMD+A100: interpolated" in text
    assert "runtime (s per query)" in _svg_text(out / "llama-2-7b-runtime.svg")


@drawing
def test_routing_plots_in_png_and_svg(router: Router, tmp_path: Path) -> None:
    paths = write_routing_plots(router, tmp_path, formats=("png", "svg"), lams=LAMS)
    assert [p.name for p in paths] == [
        "all-workload-vs-threshold.png",
        "all-workload-vs-threshold.svg",
        "all-pareto.png",
        "all-pareto.svg",
    ]
    assert paths[0].read_bytes().startswith(PNG_SIGNATURE)
    assert paths[2].read_bytes().startswith(PNG_SIGNATURE)
    threshold = _svg_text(paths[1])
    assert "workload energy (J)" in threshold and "threshold (input tokens)" in threshold
    assert "alpaca-paper" in threshold and "routed by input" in threshold
    front = _svg_text(paths[3])
    assert "workload runtime (s, summed over systems)" in front and "Pareto front" in front


@drawing
def test_energy_per_token_markers_are_the_measured_means(llama: list[SystemModel]) -> None:
    fig = energy_per_token_figure(llama, "input")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    for model in llama:
        fixed = model.input_sweep.fixed
        measured = [
            p for p in model.profile.points if p.sweep == "input" and p.output_tokens == fixed
        ]
        assert len(measured) >= 5
        means = _means(ax, f"{model.system}: measured mean ± 95 % CI")
        marks = means.lines[0]
        assert list(marks.get_xdata()) == [p.input_tokens for p in measured]
        expected = [p.mean_joules / (p.input_tokens + p.output_tokens) for p in measured]
        np.testing.assert_allclose(np.asarray(marks.get_ydata(), float), expected, rtol=1e-12)
        tokens = [p.input_tokens + p.output_tokens for p in measured]
        half = [summarize(p.joules).half_width / n for p, n in zip(measured, tokens)]
        assert all(h > 0 for h in half)
        np.testing.assert_allclose(_half_widths(means), half, rtol=1e-9)
        curve = _line(ax, f"{model.system}: interpolated")
        n = np.asarray(curve.get_xdata())
        np.testing.assert_allclose(
            curve.get_ydata(), model.input_sweep.energy(n) / (n + fixed), rtol=1e-12
        )
        assert n[0] == measured[0].input_tokens and n[-1] == measured[-1].input_tokens


@drawing
def test_runtime_figure_plots_seconds_per_query(llama: list[SystemModel]) -> None:
    fig = runtime_figure(llama)
    by_input, by_output = fig.axes
    model = llama[0]
    means = _means(by_output, f"{model.system}: measured mean ± 95 % CI")
    marks = means.lines[0]
    fixed = model.output_sweep.fixed
    measured = [p for p in model.profile.points if p.sweep == "output" and p.input_tokens == fixed]
    assert list(marks.get_xdata()) == [p.output_tokens for p in measured]
    np.testing.assert_allclose(
        np.asarray(marks.get_ydata(), float), [p.mean_seconds for p in measured]
    )
    np.testing.assert_allclose(
        _half_widths(means), [summarize(p.seconds).half_width for p in measured], rtol=1e-9
    )
    assert by_input.get_xlabel() == "input tokens per query"
    assert by_output.get_ylabel() == "runtime (s per query)\nmean ± 95 % CI"


@drawing
@pytest.mark.parametrize("by", ["input", "output"])
def test_threshold_figure_marks_the_optimum(
    pooled: list[SystemModel], workload: Workload, by: str
) -> None:
    router = Router(pooled, workload, by=by)
    energy_ax, time_ax = threshold_figure(router).axes
    best = router.solve(1.0)
    limit = getattr(best.policy.rules[0], f"max_{by}_tokens")
    assert limit is not None  # the example routes between both systems
    star = _line(energy_ax, "optimum")
    assert list(star.get_xdata()) == [limit]
    assert list(star.get_ydata()) == [best.totals.energy_j]
    assert list(_line(time_ax, "optimum").get_ydata()) == [best.totals.runtime_s]
    # M1-Pro costs less for the smallest queries, so it is the pair's `low`
    curve = _line(energy_ax, "≤ threshold → M1-Pro, rest → Swing AMD+A100")
    thresholds, energy, _ = router.threshold_curve(0, 1)
    assert list(curve.get_xdata()) == list(thresholds[1:])  # -1 (none to low) not drawn
    np.testing.assert_array_equal(curve.get_ydata(), energy[1:])
    assert min(energy) == pytest.approx(best.totals.energy_j)


@drawing
def test_pareto_figure_draws_the_front_and_baselines(router: Router) -> None:
    lams = (0.0, 0.25, 0.5, 0.75, 1.0)
    ax = pareto_figure(router, lams).axes[0]
    decisions = router.sweep(lams)
    front = pareto(decisions)
    line = _line(ax, "Pareto front")
    assert list(line.get_xdata()) == [d.totals.energy_j for d in front]
    assert list(line.get_ydata()) == [d.totals.runtime_s for d in front]
    assert len(_line(ax, "best policy at each").get_xdata()) == len(lams)
    # two policies far apart: 1 alone, and every other lambda on one point
    notes = {(t.xy, t.get_text()) for t in ax.texts}
    assert notes == {(_xy(front[0]), "λ = 1"), (_xy(front[1]), "λ = 0 to 0.75")}
    for baseline in decisions[0].baselines[:2]:
        assert baseline.name.startswith("all on ")
        mark = _line(ax, baseline.name)
        assert list(mark.get_xdata()) == [baseline.totals.energy_j]
        assert list(mark.get_ydata()) == [baseline.totals.runtime_s]
    assert not [t for t in ax.get_lines() if t.get_label().startswith("workload-unaware")]
    assert ax.get_xlabel() == "workload energy (J)"


@drawing
def test_never_overwrites(router: Router, tmp_path: Path) -> None:
    foreign = tmp_path / "all-pareto-2.png"
    foreign.write_bytes(b"someone else's figure")
    first = write_routing_plots(router, tmp_path, lams=LAMS)
    before = {p: p.read_bytes() for p in first}
    second = write_routing_plots(router, tmp_path, lams=LAMS)
    assert [p.name for p in first] == ["all-workload-vs-threshold.png", "all-pareto.png"]
    assert [p.name for p in second] == ["all-workload-vs-threshold-2.png", "all-pareto-3.png"]
    assert {p: p.read_bytes() for p in first} == before
    assert foreign.read_bytes() == b"someone else's figure"
    assert all(p.read_bytes().startswith(PNG_SIGNATURE) for p in second)


@drawing
def test_formats_share_one_free_name(llama: list[SystemModel], tmp_path: Path) -> None:
    (tmp_path / "llama-2-7b-runtime.svg").write_text("<svg/>")  # only the svg is taken
    paths = write_profile_plots(llama, tmp_path, formats=("png", "svg"))
    assert {p.name for p in paths[-2:]} == {"llama-2-7b-runtime-2.png", "llama-2-7b-runtime-2.svg"}


@drawing
def test_one_system_profile_plots(llama: list[SystemModel], tmp_path: Path) -> None:
    paths = write_profile_plots(llama[:1], tmp_path)
    assert [p.name for p in paths] == [
        "llama-2-7b-energy-per-token-input.png",
        "llama-2-7b-energy-per-token-output.png",
        "llama-2-7b-runtime.png",
    ]
    labels = _legend_labels(energy_per_token_figure(llama[:1], "input").axes[0])
    assert labels == [
        "M1-Pro: measured mean ± 95 % CI (output = 32 tokens)",
        "M1-Pro: interpolated",
    ]


@drawing
def test_systems_without_a_sweep_are_skipped(llama: list[SystemModel], tmp_path: Path) -> None:
    m1 = llama[0].profile
    input_only = build_model(
        Profile(m1.system, m1.model, tuple(p for p in m1.points if p.sweep == "input"))
    )
    assert input_only.output_sweep is None
    fig = energy_per_token_figure([input_only, llama[1]], "output")
    fixed = llama[1].output_sweep.fixed
    assert _legend_labels(fig.axes[0]) == [
        f"Swing AMD+A100: measured mean ± 95 % CI (input = {fixed} tokens)",
        "Swing AMD+A100: interpolated",
    ]
    paths = write_profile_plots([input_only], tmp_path)  # nothing to draw for output
    assert [p.name for p in paths] == [
        "llama-2-7b-energy-per-token-input.png",
        "llama-2-7b-runtime.png",
    ]


@drawing
def test_three_systems_one_curve_per_pair(
    profiles: list[Profile], workload: Workload, tmp_path: Path
) -> None:
    router = Router(_models(profiles, THREE, "all"), workload, by="input")
    energy_ax, _ = threshold_figure(router).axes
    curves = [line for line in energy_ax.lines if line.get_label().startswith("≤ threshold")]
    assert len(curves) == 3
    first = dict(zip(router.systems, router.energy[:, 0]))
    for line in curves:
        low, high = line.get_label().removeprefix("≤ threshold → ").split(", rest → ")
        assert first[low] <= first[high]
    # lambda 0.05 to 0.95 send the queries to the two A100 systems at thresholds so close
    # in energy and runtime that one note names them all
    decisions = router.sweep(DEFAULT_LAMS)
    front = pareto(decisions)
    notes = [text for _, text in front_notes(front, decisions)]
    assert len(front) > 3 and notes == ["λ = 1", "λ = 0 to 0.95"]
    paths = write_routing_plots(router, tmp_path, lams=LAMS)
    assert [p.name for p in paths] == ["all-workload-vs-threshold.png", "all-pareto.png"]


@drawing
def test_by_both_writes_no_threshold_figure(
    pooled: list[SystemModel], workload: Workload, tmp_path: Path
) -> None:
    router = Router(pooled, workload, by="both")
    paths = write_routing_plots(router, tmp_path, lams=LAMS)
    assert [p.name for p in paths] == ["all-pareto.png"]
    with pytest.raises(PlotError, match="not both"):
        threshold_figure(router)


def test_missing_matplotlib(
    llama: list[SystemModel], router: Router, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotError, match=r"pip install 'pytest-llmenergy\[plots\]'"):
        write_profile_plots(llama, tmp_path / "a")
    with pytest.raises(PlotError, match="matplotlib is not installed"):
        write_routing_plots(router, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("formats", [("jpg",), ("png", "pdf"), ()])
def test_bad_format(llama: list[SystemModel], tmp_path: Path, formats: tuple[str, ...]) -> None:
    with pytest.raises(PlotError, match="give one or more of png, svg") as info:
        write_profile_plots(llama, tmp_path / "out", formats=formats)
    assert isinstance(info.value, ConfigError)
    assert not (tmp_path / "out").exists()


@drawing
def test_unwritable_out_dir(router: Router, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(PlotError) as info:
        write_routing_plots(router, blocker / "figures", lams=LAMS)
    message = str(info.value)
    assert "\n" not in message
    assert str(blocker / "figures") in message and "cannot write figures" in message


# -- uncertainty: confidence intervals, estimated energy, legends beside the data --------

SIZES = (8, 16, 32, 64)
TRIALS = {8: (1.0, 1.2, 0.9), 16: (1.5, 1.9, 1.6, 1.4), 32: (2.0, 2.8, 2.3), 64: (4.0, 4.1, 5.0)}


def _cases(confidence: float = 0.95, method: str = "counter") -> list[CaseResult]:
    """An input sweep of one model with known, unequal trials at each size."""
    options = ControllerSettings(confidence=confidence)
    return [
        dataclasses.replace(
            make_case(TRIALS[n], input_tokens=n, output_tokens=4, watts=50.0 + n, method=method),
            options=options,
        )
        for n in SIZES
    ]


def _model(cases: list[CaseResult], system: str = "box") -> SystemModel:
    (profile,) = profiles_from_cases(cases, system, "test")
    return build_model(profile)


@drawing
@pytest.mark.parametrize("confidence", [0.95, 0.9])
def test_error_bars_are_the_cases_confidence_intervals(confidence: float) -> None:
    cases = _cases(confidence)
    model = _model(cases)
    assert model.profile.confidence == confidence
    level = f"{confidence * 100:g} %"
    fig = energy_per_token_figure([model], "input")
    ax = fig.axes[0]
    means = _means(ax, f"box: measured mean ± {level} CI (output = 4 tokens)")
    assert list(means.lines[0].get_xdata()) == list(SIZES)
    tokens = [c.total_tokens for c in cases]
    expected_mean = [c.energy.mean / n for c, n in zip(cases, tokens)]
    expected_half = [c.energy.half_width / n for c, n in zip(cases, tokens)]
    np.testing.assert_allclose(np.asarray(means.lines[0].get_ydata(), float), expected_mean)
    np.testing.assert_allclose(_half_widths(means), expected_half, rtol=1e-9)
    # the level matters: the bars are not the 95 % ones when the run asked for 90 %
    at_95 = [summarize([t.joules for t in c.trials]).half_width / n for c, n in zip(cases, tokens)]
    assert np.allclose(expected_half, at_95) == (confidence == 0.95)
    assert ax.get_ylabel().endswith(f"mean ± {level} CI")
    time_ax = runtime_figure([model]).axes[0]
    runtime = _means(time_ax, f"box: measured mean ± {level} CI")
    np.testing.assert_allclose(_half_widths(runtime), [c.time.half_width for c in cases])


@drawing
def test_one_trial_gets_no_error_bar() -> None:
    cases = _cases()
    cases[1] = make_case((1.5,), input_tokens=16, output_tokens=4)  # one trial: no interval
    fig = energy_per_token_figure([_model(cases)], "input")
    means = _means(fig.axes[0], "box: measured mean ± 95 % CI (output = 4 tokens; 1 trial")
    half = _half_widths(means)
    assert np.isnan(half[1]) and all(h > 0 for h in np.delete(half, 1))


def test_profiles_carry_confidence_and_estimated() -> None:
    measured = profiles_from_cases(_cases(0.9), "box", "test")
    estimated = profiles_from_cases(_cases(method="estimated"), "laptop", "test")
    assert [(p.confidence, p.estimated) for p in measured] == [(0.9, False)]
    assert [(p.confidence, p.estimated) for p in estimated] == [(0.95, True)]
    other = profiles_from_cases(
        [make_case(TRIALS[n], model="other", input_tokens=n) for n in SIZES], "box", "test"
    )
    pooled = {p.system: p for p in pool_models([*measured, *other, *estimated])}
    assert (pooled["box"].confidence, pooled["box"].estimated) == (0.9, False)
    assert (pooled["laptop"].confidence, pooled["laptop"].estimated) == (0.95, True)
    assert Profile("A", "m", ()).confidence == 0.95  # CSV profiles: the default level
    assert not read_profile_csv(CSV)[0].estimated


@drawing
def test_estimated_energy_is_marked() -> None:
    measured = _model(_cases(), "box")
    estimated = _model(_cases(method="estimated"), "laptop")
    assert estimated.profile.estimated and not measured.profile.estimated
    ax = energy_per_token_figure([measured, estimated], "input").axes[0]
    assert "energy of laptop (estimated)" in ax.get_title() and "box" not in ax.get_title()
    hollow = _means(ax, f"laptop {ESTIMATED}: mean ± 95 % CI").lines[0]
    filled = _means(ax, "box: measured mean ± 95 % CI").lines[0]
    assert hollow.get_markerfacecolor() == "none" and filled.get_markerfacecolor() != "none"
    assert _line(ax, f"laptop {ESTIMATED}: interpolated").get_linestyle() == "--"
    assert _line(ax, "box: interpolated").get_linestyle() == "-"
    labels = _legend_labels(ax)
    assert sum(ESTIMATED in label for label in labels) == 2
    # the estimate meter estimates energy only: the runtime is timed, and not marked
    runtime = runtime_figure([measured, estimated])
    drawn = [ax for ax in runtime.axes if ax.get_legend() is not None]
    assert drawn and not [t for ax in drawn for t in _legend_labels(ax) if ESTIMATED in t]
    assert ESTIMATED not in runtime.get_suptitle()


@drawing
def test_routing_figures_mark_estimated_systems(
    llama: list[SystemModel], workload: Workload
) -> None:
    m1 = build_model(dataclasses.replace(llama[0].profile, estimated=True))
    router = Router([m1, llama[1]], workload, by="input")
    energy_ax, time_ax = threshold_figure(router).axes
    curve = _line(energy_ax, "≤ threshold → M1-Pro, rest → Swing AMD+A100")
    assert curve.get_label().endswith(ESTIMATED) and curve.get_linestyle() == "--"
    assert _line(time_ax, "≤ threshold").get_linestyle() == "-"  # runtime is measured
    ax = pareto_figure(router, LAMS).axes[0]
    assert "energy of M1-Pro (estimated)" in ax.get_title()
    assert _line(ax, f"all on M1-Pro {ESTIMATED}").get_markerfacecolor() == "none"
    assert _line(ax, "all on Swing AMD+A100").get_markerfacecolor() != "none"
    assert _line(ax, f"Pareto front {ESTIMATED}").get_linestyle() == "--"
    measured = pareto_figure(Router(llama, workload, by="input"), LAMS).axes[0]
    assert ESTIMATED not in measured.get_title()
    assert not [t for t in _legend_labels(measured) if ESTIMATED in t]


def _data_points(ax) -> np.ndarray:
    """Display coordinates of every point drawn in ``ax``: lines, markers, error bars."""
    xy = [line.get_xydata() for line in ax.get_lines()]
    for collection in ax.collections:
        xy += [np.asarray(s).reshape(-1, 2) for s in collection.get_segments() if len(s)]
    data = np.concatenate([np.asarray(a, dtype=float) for a in xy])
    data = data[np.isfinite(data).all(axis=1)]
    return ax.transData.transform(data)


def _figures(llama: list[SystemModel], router: Router):
    estimated = build_model(dataclasses.replace(llama[0].profile, estimated=True))
    return {
        "energy-input": energy_per_token_figure(llama, "input"),
        "energy-output-estimated": energy_per_token_figure([estimated, llama[1]], "output"),
        "runtime": runtime_figure(llama),
        "threshold": threshold_figure(router),
        "pareto": pareto_figure(router, LAMS),
    }


@drawing
def test_legends_never_cover_data(llama: list[SystemModel], router: Router) -> None:
    for name, fig in _figures(llama, router).items():
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        assert legends, name
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1), name
            for ax in fig.axes:
                points = _data_points(ax)
                assert len(points) >= 5, name
                inside = (
                    (points[:, 0] >= box.x0)
                    & (points[:, 0] <= box.x1)
                    & (points[:, 1] >= box.y0)
                    & (points[:, 1] <= box.y1)
                )
                assert not inside.any(), (name, points[inside][:3])
                assert not box.overlaps(ax.get_window_extent(renderer)), name


@drawing
def test_saved_figures_keep_the_legend(llama: list[SystemModel], tmp_path: Path) -> None:
    (path,) = write_profile_plots(llama, tmp_path, formats=("svg",))[:1]
    text = _svg_text(path)
    assert "mean ± 95 % CI" in text and "Swing AMD+A100: interpolated" in text
    assert len(measured_points(llama[0], "input")) >= 5
