"""The routing figures: files written, the data drawn, never overwriting, optional matplotlib."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.routing.fit import SystemModel, build_model
from pytest_llmenergy.routing.optimize import Router, pareto
from pytest_llmenergy.routing.plots import (
    DEFAULT_LAMS,
    FORMATS,
    PlotError,
    energy_per_token_figure,
    front_notes,
    pareto_figure,
    runtime_figure,
    slug,
    threshold_figure,
    write_profile_plots,
    write_routing_plots,
)
from pytest_llmenergy.routing.profile import Profile, read_profile_csv, select
from pytest_llmenergy.routing.workload import Workload, load_workload

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
        marks = _line(ax, f"{model.system}: measured")
        assert list(marks.get_xdata()) == [p.input_tokens for p in measured]
        expected = [p.mean_joules / (p.input_tokens + p.output_tokens) for p in measured]
        np.testing.assert_allclose(marks.get_ydata(), expected, rtol=1e-12)
        curve = _line(ax, f"{model.system}: interpolated")
        n = np.asarray(curve.get_xdata())
        np.testing.assert_allclose(
            curve.get_ydata(), model.input_sweep.energy(n) / (n + fixed), rtol=1e-12
        )
        assert n[0] == measured[0].input_tokens and n[-1] == measured[-1].input_tokens


@drawing
def test_runtime_figure_plots_seconds_per_query(llama: list[SystemModel]) -> None:
    fig = runtime_figure(llama)
    left, right = fig.axes
    model = llama[0]
    marks = _line(right, f"{model.system}: measured")
    fixed = model.output_sweep.fixed
    measured = [p for p in model.profile.points if p.sweep == "output" and p.input_tokens == fixed]
    assert list(marks.get_xdata()) == [p.output_tokens for p in measured]
    np.testing.assert_allclose(marks.get_ydata(), [p.mean_seconds for p in measured])
    assert left.get_xlabel() == "input tokens per query"
    assert right.get_ylabel() == "runtime (s per query)"


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
    labels = [
        line.get_label() for line in energy_per_token_figure(llama[:1], "input").axes[0].lines
    ]
    assert labels == ["M1-Pro: measured (output = 32 tokens)", "M1-Pro: interpolated"]


@drawing
def test_systems_without_a_sweep_are_skipped(llama: list[SystemModel], tmp_path: Path) -> None:
    m1 = llama[0].profile
    input_only = build_model(
        Profile(m1.system, m1.model, tuple(p for p in m1.points if p.sweep == "input"))
    )
    assert input_only.output_sweep is None
    fig = energy_per_token_figure([input_only, llama[1]], "output")
    fixed = llama[1].output_sweep.fixed
    assert [line.get_label() for line in fig.axes[0].lines] == [
        f"Swing AMD+A100: measured (input = {fixed} tokens)",
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
