"""The figures of routing: what each system measured, and what routing between them buys.

Per model (``write_profile_plots``):

- ``energy-per-token-input`` / ``-output``: joules per token (input + output) along each
  sweep, measured means as markers with their confidence intervals as error bars, and
  the interpolated curve as a line, per system;
- ``runtime``: seconds per query along the input and the output sweep, the same way.

Per router (``write_routing_plots``):

- ``workload-vs-threshold``: the workload's energy and runtime at every threshold, with
  the optimum marked (routing by input or output only);
- ``pareto``: energy against runtime of the policies over a sweep of lambda, the Pareto
  front, and every query on one system as the baselines.

Uncertainty is shown, never hidden: every measured mean carries its confidence interval
at the profile's level (``mean ± 95 % CI`` in the legend), and energy from the
``estimate`` meter is marked as such (hollow markers, dashed lines, "(estimated)" in the
legend and the title).  Legends sit outside the axes, so they never cover data.

Each figure has one small function that returns its ``matplotlib.figure.Figure``; the
``write_*`` functions save them as ``<model slug>-<figure>.<format>`` and never overwrite
a file.  matplotlib is optional and imported only here, when a figure is drawn.  Figures
get their own Agg canvas and are never registered with pyplot, so no backend is selected
globally and no figure is left open.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..figures import FIGURES
from ..plotting import (
    PlotError,
    check_formats,
    make_dir,
    matplotlib_parts,
    new_figure,
    save_figure,
    slug,
)
from ..stats import Summary, summarize
from . import BOTH, INPUT, OUTPUT
from .fit import Sweep, SystemModel
from .optimize import Baseline, Capacity, Decision, Router, pareto
from .profile import Point

_J_PER_TOKEN = FIGURES["j_per_token"]  # the figure these plots draw, named as everywhere

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ENERGY_PER_TOKEN_INPUT = "energy-per-token-input"
ENERGY_PER_TOKEN_OUTPUT = "energy-per-token-output"
RUNTIME = "runtime"
WORKLOAD_VS_THRESHOLD = "workload-vs-threshold"
PARETO = "pareto"
DEFAULT_LAMS = tuple(i / 20 for i in range(21))  # 0, 0.05, ..., 1
_MARKERS = ("s", "^", "D", "v", "P", "X")  # the single-system baselines, one per system
_NEAR = 0.03  # front points this close (share of the axis span) share one note
_CURVE_POINTS = 200  # samples of an interpolated curve between its first and last size
ESTIMATED = "(estimated)"  # in the legend label of every estimated energy
_CAPSIZE_PT = 3.0


# -- figures: profiles -----------------------------------------------------------------


def energy_per_token_figure(models: Sequence[SystemModel], axis: str) -> Figure | None:
    """Joules per token along one sweep, per system (None: no system measured that sweep).

    Per token, not per query: the systems' curves cross where routing should switch.
    """
    if all(_sweep_of(m, axis) is None for m in models):
        return None
    fig, axes = new_figure(width=10.5)
    ax = axes[0][0]
    _draw_sweeps(
        ax,
        models,
        axis,
        energy_per_token_summary,
        lambda s, n: s.energy(n) / (n + s.fixed),
        energy=True,
    )
    ax.set_ylabel(
        f"energy per token ({_J_PER_TOKEN.label}, input + output){_ci_note(models, axis)}"
    )
    ax.set_title(
        f"{models[0].profile.model}: energy per token, {axis} sweep{_estimated_note(models)}"
    )
    return fig


def runtime_figure(models: Sequence[SystemModel]) -> Figure | None:
    """Seconds per query along the input (left) and output (right) sweep, per system
    (None: no system measured either sweep).  Energy alone hides a slow system."""
    if all(_sweep_of(m, a) is None for m in models for a in (INPUT, OUTPUT)):
        return None
    fig, axes = new_figure(nrows=2, width=10.5, height=8.0)  # room for legends beside
    for ax, axis in zip(axes[:, 0], (INPUT, OUTPUT)):
        _draw_sweeps(ax, models, axis, runtime_summary, lambda s, n: s.time(n), energy=False)
        ax.set_ylabel(f"runtime (s per query){_ci_note(models, axis)}")
        ax.set_title(f"{axis} sweep")
    # the estimate meter estimates energy; the runtime is timed, so nothing is marked here
    fig.suptitle(f"{models[0].profile.model}: runtime per query")
    return fig


def _draw_sweeps(
    ax: Axes,
    models: Sequence[SystemModel],
    axis: str,
    measured: Callable[[Point, float], Summary],
    curve: Callable[[Sweep, np.ndarray], np.ndarray],
    energy: bool,
) -> None:
    """Per system with this sweep, its measured means as markers with their confidence
    intervals as error bars, and its interpolated curve as a line, in the system's colour,
    on log-log axes.  With ``energy``, an estimated system's markers are hollow, its curve
    dashed and its labels say "(estimated)"."""
    drawn = [(i, m) for i, m in enumerate(models) if _sweep_of(m, axis) is not None]
    handles: list[Any] = []  # per system: its means, then its curve
    for i, model in drawn:
        sweep = _sweep_of(model, axis)
        points = measured_points(model, axis)
        summaries = [measured(p, model.profile.confidence) for p in points]
        estimated = energy and model.profile.estimated
        name = f"{model.system} {ESTIMATED}" if estimated else model.system
        what = "" if estimated else "measured "
        lonely = any(not math.isfinite(s.half_width) for s in summaries)
        note = "; 1 trial: no CI" if lonely else ""
        n = _dense(sweep)
        means = ax.errorbar(
            [_size(p, axis) for p in points],
            [s.mean for s in summaries],
            yerr=[_drawn_half_width(s) for s in summaries],
            ls="none",
            marker="o",
            mfc="none" if estimated else _colour(i),
            color=_colour(i),
            capsize=_CAPSIZE_PT,
            label=(
                f"{name}: {what}mean ± {_percent(model.profile.confidence)} CI "
                f"({_other(axis)} = {sweep.fixed} tokens{note})"
            ),
        )
        (line,) = ax.plot(
            n,
            curve(sweep, n),
            color=_colour(i),
            ls="--" if estimated else "-",
            label=f"{name}: interpolated",
        )
        handles += [means, line]
    ax.set_xlabel(f"{axis} tokens per query")
    if not drawn:
        ax.text(0.5, 0.5, f"no {axis} sweep measured", ha="center", transform=ax.transAxes)
        return
    _log_log(ax)
    _legend_outside(ax, handles)


# -- figures: routing ------------------------------------------------------------------


def threshold_figure(router: Router, capacities: Sequence[Capacity] = ()) -> Figure:
    """Workload energy (top) and runtime (bottom) at every threshold, one curve per pair of
    systems, the optimum at lambda 1 marked: shows how much a threshold a little off costs.

    A threshold t sends the queries with at most t tokens to the pair's ``low`` system
    (the cheaper one for the smallest queries) and the rest to the other.
    """
    if router.by == BOTH:
        raise PlotError("a threshold figure is for routing by input or by output, not both")
    fig, axes = new_figure(nrows=2, sharex=True, width=10.5, height=7.5)
    energy_ax, time_ax = axes[0][0], axes[1][0]
    smallest = np.inf
    for k, (low, high) in enumerate(threshold_pairs(router)):
        thresholds, energy, runtime = router.threshold_curve(low, high)
        keep = thresholds >= 0  # -1 (nothing to low) has no place on a token axis
        label = f"≤ threshold → {router.systems[low]}, rest → {router.systems[high]}"
        estimated = _is_estimated(router.models[low]) or _is_estimated(router.models[high])
        style = {"color": _colour(k), "drawstyle": "steps-post"}
        energy_ax.plot(
            thresholds[keep],
            energy[keep],
            label=f"{label} {ESTIMATED}" if estimated else label,
            ls="--" if estimated else "-",
            **style,
        )
        time_ax.plot(thresholds[keep], runtime[keep], label=label, **style)
        smallest = min(smallest, thresholds[keep].min())
    _mark_optimum(router, router.solve(1.0, capacities), energy_ax, time_ax)
    _token_axis((energy_ax, time_ax), smallest)
    time_ax.set_xlabel(f"threshold ({router.by} tokens)")
    energy_ax.set_ylabel("workload energy (J)")
    time_ax.set_ylabel("workload runtime (s, summed over systems)")
    _legend_outside(energy_ax)
    note = "; curves without the capacity limits" if capacities else ""
    fig.suptitle(
        f"{router.model}: workload energy and runtime against the threshold\n"
        f"workload {router.workload.name} ({router.n} queries), routed by {router.by}{note}"
        f"{_from_means_note(router.models)}{_estimated_note(router.models)}"
    )
    return fig


def threshold_pairs(router: Router) -> list[tuple[int, int]]:
    """(low, high) for every pair of systems i < j; ``low`` costs less energy per query at
    the workload's smallest size, so each curve starts near 'all on high'."""
    first = router.energy[:, 0]  # every system prices the same queries of the first group
    return [(i, j) if first[i] <= first[j] else (j, i) for i, j in _pairs(len(router.systems))]


def _mark_optimum(router: Router, decision: Decision, energy_ax: Axes, time_ax: Axes) -> None:
    """A star at each threshold of the optimal policy, at its totals, and a dotted level."""
    key = "max_input_tokens" if router.by == INPUT else "max_output_tokens"
    cuts = [getattr(rule, key) for rule in decision.policy.rules[:-1]]
    label = f"optimum (λ = 1): {decision.policy.describe()}"
    totals = decision.totals
    for ax, value in ((energy_ax, totals.energy_j), (time_ax, totals.runtime_s)):
        level = ax.axhline(value, color="black", ls=":", lw=1)
        if cuts:
            star = {"ls": "none", "marker": "*", "ms": 14, "color": "black", "zorder": 5}
            ax.plot(cuts, [value] * len(cuts), label=label, **star)
        else:
            level.set_label(label)  # one system takes every query: the level is the optimum


def pareto_figure(
    router: Router, lams: Sequence[float] = DEFAULT_LAMS, capacities: Sequence[Capacity] = ()
) -> Figure:
    """Workload energy against runtime of the best policy at each lambda, the Pareto front
    annotated with its lambdas, and every query on one system: what saving energy costs
    in time, and what no policy can beat."""
    if not lams:
        raise PlotError("a Pareto figure needs one or more lambdas between 0 and 1")
    decisions = router.sweep(lams, capacities)
    front = pareto(decisions)
    fig, axes = new_figure(width=10.5, height=5.5)
    ax = axes[0][0]
    mixed = any(_is_estimated(m) for m in router.models)  # some policies' energy estimated
    tag = f" {ESTIMATED}" if mixed else ""
    ax.plot(
        *_totals(decisions),
        ls="none",
        marker="o",
        mfc="none",
        color="0.6",
        label=f"best policy at each of {len(decisions)} λ{tag}",
    )
    ax.plot(
        *_totals(front),
        marker="o",
        color="black",
        ls="--" if mixed else "-",
        mfc="none" if mixed else "black",
        label=f"Pareto front{tag}",
    )
    for (x, y), text in front_notes(front, decisions):
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(6, 6), fontsize="small")
    for k, baseline in enumerate(_single_system(decisions[0])):
        system = baseline.name.removeprefix("all on ")
        i = router.systems.index(system) if system in router.systems else k
        estimated = i < len(router.models) and _is_estimated(router.models[i])
        ax.plot(
            [baseline.totals.energy_j],
            [baseline.totals.runtime_s],
            ls="none",
            marker=_MARKERS[k % len(_MARKERS)],
            ms=10,
            color=_colour(i),
            mfc="none" if estimated else _colour(i),
            label=f"{baseline.name} {ESTIMATED}" if estimated else baseline.name,
        )
    ax.set_xlabel("workload energy (J)")
    ax.set_ylabel("workload runtime (s, summed over systems)")
    ax.set_title(
        f"{router.model}: energy against runtime, λ = weight of energy\n"
        f"workload {router.workload.name} ({router.n} queries), routed by {router.by}"
        f"{_from_means_note(router.models)}{_estimated_note(router.models)}"
    )
    _legend_outside(ax)
    return fig


def _totals(decisions: Sequence[Decision]) -> tuple[list[float], list[float]]:
    return [d.totals.energy_j for d in decisions], [d.totals.runtime_s for d in decisions]


def front_notes(
    front: Sequence[Decision], decisions: Sequence[Decision]
) -> list[tuple[tuple[float, float], str]]:
    """(point, "λ = ...") per group of front points that would overlap on the figure
    (within ``_NEAR`` of the axes' spans); each note names every lambda of the sweep
    whose policy costs what one of the group's points costs."""
    drawn = [_xy(d) for d in decisions]
    drawn += [(b.totals.energy_j, b.totals.runtime_s) for b in _single_system(decisions[0])]
    span = [max(axis) - min(axis) or 1.0 for axis in zip(*drawn)]

    def near(a: Decision, b: Decision) -> bool:
        return all(abs(u - v) <= _NEAR * s for u, v, s in zip(_xy(a), _xy(b), span))

    groups: list[list[Decision]] = []
    for d in front:
        if groups and near(groups[-1][0], d):
            groups[-1].append(d)
        else:
            groups.append([d])
    notes = []
    for group in groups:
        points = {_xy(d) for d in group}
        lams = [d.policy.lam for d in decisions if _xy(d) in points]
        low, high = min(lams), max(lams)
        text = f"λ = {low:g}" if low == high else f"λ = {low:g} to {high:g}"
        notes.append((_xy(group[0]), text))
    return notes


def _single_system(decision: Decision) -> list[Baseline]:
    """The baselines with every query on one system."""
    return [b for b in decision.baselines if b.name.startswith("all on ")]


def _xy(decision: Decision) -> tuple[float, float]:
    return decision.totals.energy_j, decision.totals.runtime_s


# -- writing ---------------------------------------------------------------------------


def write_profile_plots(
    models: Sequence[SystemModel], out_dir: Path, formats: Sequence[str] = ("png",)
) -> list[Path]:
    """Per model name, the energy-per-token figures (input, output sweep) and the runtime
    figure; a figure no system has data for is not written.  Returns the paths written."""
    formats = check_formats(formats)
    matplotlib_parts()
    if not models:
        return []
    out_dir = make_dir(out_dir)
    by_model: dict[str, list[SystemModel]] = {}
    for m in models:
        by_model.setdefault(m.profile.model, []).append(m)
    written: list[Path] = []
    for name, group in by_model.items():
        figures = (
            (ENERGY_PER_TOKEN_INPUT, energy_per_token_figure(group, INPUT)),
            (ENERGY_PER_TOKEN_OUTPUT, energy_per_token_figure(group, OUTPUT)),
            (RUNTIME, runtime_figure(group)),
        )
        for figure, fig in figures:
            if fig is not None:
                written += save_figure(fig, out_dir, f"{slug(name)}-{figure}", formats)
    return written


def write_routing_plots(
    router: Router,
    out_dir: Path,
    formats: Sequence[str] = ("png",),
    lams: Sequence[float] = DEFAULT_LAMS,
    capacities: Sequence[Capacity] = (),
) -> list[Path]:
    """The workload-vs-threshold figure (not when routing by both) and the Pareto figure
    of one router.  Returns the paths written."""
    formats = check_formats(formats)
    matplotlib_parts()
    out_dir = make_dir(out_dir)
    stem = slug(router.model)
    written: list[Path] = []
    if router.by != BOTH:
        fig = threshold_figure(router, capacities)
        written += save_figure(fig, out_dir, f"{stem}-{WORKLOAD_VS_THRESHOLD}", formats)
    pareto_fig = pareto_figure(router, lams, capacities)
    written += save_figure(pareto_fig, out_dir, f"{stem}-{PARETO}", formats)
    return written


def measured_points(model: SystemModel, axis: str) -> list[Point]:
    """The measured sizes behind a sweep's curve, chosen as ``fit`` chose them (one size's
    trials pooled), by size; empty when the system has no such sweep."""
    sweep = _sweep_of(model, axis)
    if sweep is None:
        return []
    labelled = [p for p in model.profile.points if p.sweep == axis]
    pooled: dict[int, list[Point]] = {}
    for p in labelled or model.profile.points:
        if _size(p, _other(axis)) == sweep.fixed and _size(p, axis) in sweep.sizes:
            pooled.setdefault(_size(p, axis), []).append(p)
    return [_pool(pooled[size]) for size in sorted(pooled)]


def _pool(points: list[Point]) -> Point:
    first = points[0]
    seconds = tuple(s for p in points for s in p.seconds)
    joules = tuple(j for p in points for j in p.joules)
    return Point(first.input_tokens, first.output_tokens, seconds, joules, first.sweep)


def energy_per_token(point: Point) -> float:
    """Mean joules of a query over all its tokens, input and output."""
    return point.mean_joules / (point.input_tokens + point.output_tokens)


def energy_per_token_summary(point: Point, confidence: float = 0.95) -> Summary:
    """Joules per token (input + output) of the point's trials: their mean and its
    confidence interval, as the figure draws them."""
    tokens = point.input_tokens + point.output_tokens
    return summarize([j / tokens for j in point.joules], confidence)


def runtime_summary(point: Point, confidence: float = 0.95) -> Summary:
    """Seconds per query of the point's trials: their mean and its confidence interval."""
    return summarize(point.seconds, confidence)


def _drawn_half_width(summary: Summary) -> float:
    """The error bar's half-length; NaN (no bar) for one trial, whose interval is
    infinite: one trial says nothing about spread."""
    return summary.half_width if math.isfinite(summary.half_width) else math.nan


def _percent(confidence: float) -> str:
    return f"{confidence * 100:g} %"


def _ci_note(models: Sequence[SystemModel], axis: str) -> str:
    """What the error bars are, for the axis label: one level for every system drawn,
    else the legend gives each system's level."""
    levels = {m.profile.confidence for m in models if _sweep_of(m, axis) is not None}
    if len(levels) == 1:
        return f"\nmean ± {_percent(levels.pop())} CI"
    return "\nmean ± CI (level per system in the legend)" if levels else ""


def _is_estimated(model: SystemModel) -> bool:
    return model.profile.estimated


def _estimated_note(models: Sequence[SystemModel]) -> str:
    """A title line naming the systems whose energy was estimated, not measured."""
    systems = [m.system for m in models if _is_estimated(m)]
    if not systems:
        return ""
    return f"\nenergy of {', '.join(systems)} {ESTIMATED}: the estimate meter, not measured"


def _from_means_note(models: Sequence[SystemModel]) -> str:
    """Routing figures price queries with the curves through the measured means; where
    the measured intervals are drawn, so a reader can judge a small difference."""
    levels = sorted({m.profile.confidence for m in models})
    level = "/".join(_percent(c) for c in levels)
    return f"\nfrom the interpolated means; their {level} CIs: the energy-per-token figures"


def _legend_outside(ax: Axes, handles: Sequence[Any] = ()) -> None:
    """The legend right of the axes, where it cannot cover data; the constrained layout
    (and ``bbox_inches="tight"`` on saving) keeps it inside the figure."""
    where = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0}
    if handles:
        ax.legend(handles=list(handles), fontsize="small", **where)
    else:
        ax.legend(fontsize="small", **where)


def _sweep_of(model: SystemModel, axis: str) -> Sweep | None:
    return model.input_sweep if axis == INPUT else model.output_sweep


def _size(point: Point, axis: str) -> int:
    return point.input_tokens if axis == INPUT else point.output_tokens


def _other(axis: str) -> str:
    return OUTPUT if axis == INPUT else INPUT


def _dense(sweep: Sweep) -> np.ndarray:
    """Token counts to draw a curve through: evenly spaced on the log axis."""
    return np.geomspace(sweep.sizes[0], sweep.sizes[-1], _CURVE_POINTS)


def _pairs(count: int) -> list[tuple[int, int]]:
    return list(itertools.combinations(range(count), 2))


def _colour(index: int) -> str:
    """One colour per system (or pair), the same in every figure of a call."""
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
    palette += ("#7f7f7f", "#bcbd22", "#17becf")  # matplotlib's tab10
    return palette[index % len(palette)]


def _log_log(ax: Axes) -> None:
    """Token counts and costs span decades; labels stay plain numbers (8, 16, 0.5)."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_labels(ax.xaxis)
    _plain_labels(ax.yaxis, ax.dataLim.intervaly)
    ax.grid(True, which="both", alpha=0.3)


def _token_axis(axes: Sequence[Axes], smallest: float) -> None:
    """A shared token axis; a count of 0 needs the linear stretch of symlog."""
    if smallest > 0:
        axes[0].set_xscale("log", base=2)
    else:
        axes[0].set_xscale("symlog", base=2, linthresh=1, linscale=0.5)
    _plain_labels(axes[0].xaxis)
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)


def _plain_labels(axis: Any, span: Sequence[float] = ()) -> None:
    """'%g' tick labels; within one decade the minor ticks get labels too, or a log axis
    would show one label or none."""
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    axis.set_major_formatter(plain)
    if len(span) == 2 and span[0] > 0 and span[1] < 10 * span[0]:
        axis.set_minor_formatter(plain)
