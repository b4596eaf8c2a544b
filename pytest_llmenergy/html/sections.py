"""The report's analyses, where the runs have them: the time-energy frontier per case (runs
measured at several GPU settings), the front over a sweep's configurations and the best
one under the run's latency limits (``frontier.slo``), the routing threshold on the
workload (runs of two systems or more), the scale table (runs at several scales), and per
comparison the ratio of each case with its interval.

Each is computed by the package's own analysis (``frontier``, ``routing``, ``scale``,
``compare``), so the report shows what ``llmenergy frontier``, ``route`` and ``scale``
print; here it only becomes chart data and a Vega-Lite spec.  A question the runs cannot
answer (one system, one scale, one setting) draws nothing rather than failing the report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..compare import Comparison
from ..errors import LLMEnergyError
from ..figures import FIGURES
from ..frontier import CaseFrontier, at_best_settings, frontier_table, frontiers
from ..frontier.slo import saved_limits, slo_tables, sweeps
from ..scale import scale_of, scale_rows, scale_table
from ..storage.runfile import Run
from ..tables import Table, clean
from .casedata import Record, comparison_rows
from .charts import DrawnChart

if TYPE_CHECKING:
    from ..routing.decide import Routed
    from ..routing.workload import Workload

PANEL_WIDTH_PX, PANEL_HEIGHT_PX = 220, 170
RATIO_WIDTH_PX = 420
RATIO_STEP_PX = 18  # one row per case ...
RATIO_MIN_HEIGHT_PX = 90  # ... however few (two cases still get a chart to read) ...
RATIO_MAX_LABELLED = 80  # ... up to this many; beyond, a fixed height and no case labels
RATIO_HEIGHT_PX = 600
# The ratio axis spans the data and 1 (no change), widened by this share of that span on
# each side (in logs), and at least this far either side of 1: +-2 % is readable.
RATIO_PAD_SHARE, RATIO_MIN_SPAN = 0.08, 1.02
_SUBTITLE = {"title": {"subtitleFontSize": 10, "subtitleColor": "#555"}}


@dataclass(frozen=True)
class Section:
    """What one analysis adds to the page: charts, and tables (the terminal's own)."""

    charts: tuple[DrawnChart, ...] = ()
    tables: tuple[Table, ...] = ()


# -- the time-energy frontier ----------------------------------------------------------------
def _panel_name(f: CaseFrontier, taken: set[str]) -> str:
    """The case a frontier is of, named as a reader knows it: model, sweep, tokens."""
    name = f"{f.model} {f.sweep or 'case'} in{f.input_tokens}-out{f.output_tokens}"
    if name in taken:
        name = f"{f.test.rsplit('::', 1)[-1]}: {name}"
    taken.add(name)
    return name


def frontier_points(run_label: str, items: Sequence[CaseFrontier]) -> list[Record]:
    """One record per case measured at a setting: its mean time and energy with their
    intervals, and whether it is on the Pareto frontier or the GPU's default."""
    out: list[Record] = []
    taken: set[str] = set()
    for f in items:
        panel = _panel_name(f, taken)
        front = {p.setting for p in f.pareto}
        for p in f.points:
            t_half = p.time_half_s if p.time_half_s and math.isfinite(p.time_half_s) else None
            e_half = p.energy_half_j if p.energy_half_j and math.isfinite(p.energy_half_j) else 0
            low = p.energy_j - e_half
            out.append(
                {
                    "run": run_label,
                    "panel": panel,
                    "setting": p.setting,
                    "time_s": clean(p.time_s),
                    "energy_j": clean(p.energy_j),
                    "time_half_s": clean(t_half) if t_half is not None else None,
                    "energy_lo": clean(low) if e_half and low > 0 else None,
                    "energy_hi": clean(p.energy_j + e_half) if e_half and low > 0 else None,
                    "pareto": p.setting in front,
                    "default": p.default,
                    "best": p.setting == f.lam_best.setting,
                }
            )
    return out


def frontier_spec(data: list[Record], several_runs: bool) -> dict[str, Any]:
    """Small multiples, one panel per case: every setting a point, the frontier a line."""
    x = {"field": "time_s", "type": "quantitative", "title": "time per trial [s]"}
    x["scale"] = {"zero": False, "nice": False, "padding": 10}
    y = {"field": "energy_j", "type": "quantitative", "title": "energy per trial [J]"}
    y["scale"] = {"zero": False, "padding": 10}
    tooltip = [
        *([{"field": "run", "title": "run"}] if several_runs else []),
        {"field": "panel", "title": "case"},
        {"field": "setting", "title": "GPU setting"},
        {"field": "time_s", "title": "time [s]", "format": ".4~g"},
        {"field": "energy_j", "title": "energy [J]", "format": ".4~g"},
        {"field": "energy_lo", "title": "energy CI low", "format": ".4~g"},
        {"field": "energy_hi", "title": "energy CI high", "format": ".4~g"},
        {"field": "pareto", "title": "on the frontier"},
        {"field": "default", "title": "GPU default"},
    ]
    colour = (
        {"field": "run", "type": "nominal", "title": "run"}
        if several_runs
        else {"value": "#4c78a8"}
    )
    points: dict[str, Any] = {
        "mark": {"type": "point", "filled": True, "size": 50},
        "encoding": {
            "x": x,
            "y": y,
            "color": colour,
            "shape": {
                "field": "default",
                "type": "nominal",
                "title": "the GPU's default",
                "legend": {"labelExpr": "datum.label == 'true' ? 'yes' : 'no'"},
                "scale": {"domain": [False, True], "range": ["circle", "square"]},
            },
            "opacity": {"condition": {"test": "datum.pareto", "value": 1}, "value": 0.45},
            "tooltip": tooltip,
        },
    }
    front_line = {
        "transform": [{"filter": "datum.pareto"}],
        "mark": {"type": "line", "strokeWidth": 1.2},
        "encoding": {
            "x": x,
            "y": y,
            "color": colour,
            "order": {"field": "time_s"},
            **({"detail": {"field": "run"}} if several_runs else {}),
        },
    }
    bars = {
        "transform": [{"filter": "datum.energy_lo != null"}],
        "mark": {"type": "rule", "opacity": 0.5},
        "encoding": {"x": x, "y": {**y, "field": "energy_lo"}, "y2": {"field": "energy_hi"}},
    }
    return {
        "title": {
            "text": "time-energy frontier per case, over GPU settings",
            "subtitle": [
                "line: the Pareto frontier (no setting both faster and cheaper); "
                "faded: off the frontier; squares: the GPU's default; bars: energy CI",
            ],
            "anchor": "start",
        },
        "data": {"values": data},
        "facet": {"field": "panel", "type": "nominal", "title": None},
        "columns": 4,
        "spec": {
            "width": PANEL_WIDTH_PX,
            "height": PANEL_HEIGHT_PX,
            "layer": [bars, front_line, points],
        },
        "resolve": {"scale": {"x": "independent", "y": "independent"}},
        "config": _SUBTITLE,
    }


def frontier_section(runs: Sequence[Run], labels: Sequence[str]) -> Section:
    per_run = [(label, frontiers(run.cases)) for run, label in zip(runs, labels)]
    data = [p for label, items in per_run for p in frontier_points(label, items)]
    if not data:
        return Section()
    several = len(runs) > 1
    chart = DrawnChart(
        "frontier",
        "time-energy frontier per case",
        frontier_spec(data, several),
        len(data),
    )
    tables = []
    for label, items in per_run:
        if items:
            table = frontier_table(items)
            title = f"{table.title}: {label}" if several else table.title
            tables.append(replace(table, title=title))
    return Section((chart,), tuple(tables))


# -- the best configuration under a latency limit ------------------------------------------
def slo_section(runs: Sequence[Run], labels: Sequence[str]) -> Section:
    """Per run: the front over each sweep's configurations and the choice under the
    run's ``--llm-slo`` (its options' ``slo``), as the terminal showed them."""
    tables = []
    several = len(runs) > 1
    for run, label in zip(runs, labels):
        limits, note = saved_limits(run.options)
        for table in slo_tables(sweeps(run.cases, limits)):
            title = f"{table.title}: {label}" if several else table.title
            notes = (*table.notes, note) if note else table.notes
            tables.append(replace(table, title=title, notes=notes))
    return Section((), tuple(tables))


# -- the routing threshold -------------------------------------------------------------------
def routed_between(
    runs: Sequence[Run], workload: Workload | None = None, lam: float = 1.0
) -> list[Routed]:
    """Routing between the runs' systems (their hardware keys), as ``llmenergy route``
    decides it: each system's cases at their best GPU setting, the workload (Alpaca
    unless given) counted.  Runs of one system, or without a routable sweep: none."""
    systems = {run.hardware for run in runs if run.hardware}
    if len(systems) < 2 or len(systems) != len(runs):
        return []  # one system (or one measured twice): nothing to route between
    from ..routing.decide import RouteSettings, route
    from ..routing.profile import profiles_from_run
    from ..routing.workload import alpaca

    try:
        pick = at_best_settings(lam)
        profiles = [p for run in runs for p in profiles_from_run(run, pick=pick)]
        settings = RouteSettings(lam=lam, lambda_steps=0)
        return route(profiles, workload if workload is not None else alpaca(), settings)
    except LLMEnergyError:
        return []


def threshold_data(routed: Routed) -> tuple[list[Record], list[Record]]:
    """The workload's energy at every threshold, one curve per pair of systems; and the
    optimal policy's thresholds (one point each) at its total energy."""
    from ..routing.optimize import RoutingError
    from ..routing.route_plots import threshold_pairs

    router, decision = routed.router, routed.decision
    curves: list[Record] = []
    try:
        pairs = threshold_pairs(router)
    except RoutingError:
        return [], []
    for low, high in pairs:
        thresholds, energy, runtime = router.threshold_curve(low, high)
        pair = f"\u2264 threshold \u2192 {router.systems[low]}, rest \u2192 {router.systems[high]}"
        for t, e, s in zip(thresholds.tolist(), energy.tolist(), runtime.tolist()):
            if t > 0:  # a log axis: "nothing to the first system" has no place
                curves.append(
                    {"pair": pair, "threshold": int(t), "energy_j": clean(e), "runtime_s": clean(s)}
                )
    key = f"max_{router.by}_tokens"
    total = decision.totals
    optimum = [
        {
            "threshold": getattr(rule, key),
            "energy_j": clean(total.energy_j),
            "runtime_s": clean(total.runtime_s),
            "policy": decision.policy.describe(),
        }
        for rule in decision.policy.rules[:-1]
        if (getattr(rule, key, None) or 0) > 0  # on the log axis
    ]
    return curves, optimum


def threshold_spec(routed: Routed, curves: list[Record], optimum: list[Record]) -> dict[str, Any]:
    router, decision = routed.router, routed.decision
    x = {
        "field": "threshold",
        "type": "quantitative",
        "scale": {"type": "log"},
        "title": f"threshold ({router.by} tokens)",
    }
    y = {"field": "energy_j", "type": "quantitative", "title": "workload energy [J]"}
    y["scale"] = {"zero": False}
    line = {
        "data": {"values": curves},
        "mark": {"type": "line", "interpolate": "step-after", "strokeWidth": 1.5},
        "encoding": {
            "x": x,
            "y": y,
            "color": {
                "field": "pair",
                "type": "nominal",
                "title": None,
                "legend": {"orient": "bottom", "labelLimit": 600},
            },
            "tooltip": [
                {"field": "pair", "title": "routing"},
                {"field": "threshold", "title": "threshold"},
                {"field": "energy_j", "title": "workload energy [J]", "format": ".4~g"},
                {"field": "runtime_s", "title": "workload runtime [s]", "format": ".4~g"},
            ],
        },
    }
    level = {
        "data": {"values": [{"energy_j": clean(decision.totals.energy_j)}]},
        "mark": {"type": "rule", "strokeDash": [2, 3], "color": "black"},
        "encoding": {"y": {"field": "energy_j", "type": "quantitative"}},
    }
    layers: list[dict[str, Any]] = [line, level]
    if optimum:
        layers.append(
            {
                "data": {"values": optimum},
                "mark": {"type": "point", "shape": "diamond", "size": 140, "filled": True},
                "encoding": {
                    "x": x,
                    "y": y,
                    "color": {"value": "black"},
                    "tooltip": [
                        {"field": "policy", "title": "optimum (\u03bb = 1)"},
                        {"field": "threshold", "title": "threshold"},
                        {"field": "energy_j", "title": "workload energy [J]", "format": ".4~g"},
                    ],
                },
            }
        )
    workload = router.workload
    return {
        "title": {
            "text": f"{router.model}: workload energy against the routing threshold",
            "subtitle": [
                f"workload {workload.name} ({router.n} queries), routed by {router.by}",
                f"optimum, dotted: {decision.policy.describe()}",
            ],
            "anchor": "start",
        },
        "width": RATIO_WIDTH_PX,
        "height": 260,
        "layer": layers,
        "config": _SUBTITLE,
    }


def routing_section(routed: Sequence[Routed]) -> Section:
    from ..routing.route_tables import policy_table, savings_table

    charts, tables = [], []
    for i, r in enumerate(routed):
        tables += [policy_table(r), savings_table(r.decision)]
        if r.router.by not in ("input", "output"):
            continue  # routing by both: a box, not a threshold
        curves, optimum = threshold_data(r)
        if curves:
            spec = threshold_spec(r, curves, optimum)
            title = f"{r.router.model}: routing threshold"
            charts.append(DrawnChart(f"routing-{i}", title, spec, len(optimum)))
    return Section(tuple(charts), tuple(tables))


# -- the scale table -------------------------------------------------------------------------
def scale_section(runs: Sequence[Run], labels: Sequence[str]) -> Section:
    """``llmenergy scale``'s table, where the runs ran at more than one scale."""
    scales = {(s.world_size, s.nodes) for s in (scale_of(r, n) for r, n in zip(runs, labels))}
    if len(runs) < 2 or len(scales) < 2:
        return Section()
    try:
        rows = scale_rows(runs, labels)
    except LLMEnergyError:
        return Section()
    return Section(tables=(scale_table(rows),))


# -- ratios of a comparison ------------------------------------------------------------------
def ratio_figures(c: Comparison) -> list[str]:
    """The figures a comparison's ratio chart shows: the gated ones, else J/token (else
    the first compared)."""
    compared = list(dict.fromkeys(d.metric for d in c.deltas))
    gated = [m for m in dict.fromkeys(g.metric for g in c.gates) if m in compared]
    if gated:
        return gated
    return ["j_per_token"] if "j_per_token" in compared else compared[:1]


def ratio_points(c: Comparison, figure: str) -> list[Record]:
    """One record per case with a ratio: current / baseline and its interval."""
    return [
        {
            "case": r["case"],
            "ratio": clean(r["ratio_value"]),
            "lo": clean(r["ratio_ci_value"]),
            "hi": clean(r["ratio_hi_value"]),
            "change": r["change"],
            "direction": r["direction"],
            "verdict": r["verdict"],
            "baseline": r["baseline"],
            "current": r["current"],
        }
        for r in comparison_rows(c)
        if r["figure"] == figure and r["ratio_value"] is not None
    ]


def ratio_domain(data: Sequence[Record]) -> tuple[float, float]:
    """The ratio axis: every mark and its interval, and 1 (the dashed no-change line),
    with a margin; a log scale's "nice" rounding would stretch 1.15 to the decade 1-10."""
    seen = [1.0] + [
        float(v) for p in data for v in (p["lo"], p["ratio"], p["hi"]) if v is not None and v > 0
    ]
    low, high = math.log(min(seen)), math.log(max(seen))
    pad = (high - low) * RATIO_PAD_SHARE
    least = math.log(RATIO_MIN_SPAN)
    return math.exp(min(low - pad, -least)), math.exp(max(high + pad, least))


def ratio_spec(c: Comparison, figure: str, data: list[Record]) -> dict[str, Any]:
    f = FIGURES[figure]
    labelled = len(data) <= RATIO_MAX_LABELLED
    y: dict[str, Any] = {
        "field": "case",
        "type": "nominal",
        "sort": {"field": "ratio", "order": "descending"},
        "title": None,
        "axis": {"labelLimit": 260, "labelFontSize": 10} if labelled else None,
    }
    low, high = ratio_domain(data)
    x = {
        "field": "ratio",
        "type": "quantitative",
        "scale": {"type": "log", "domain": [low, high], "nice": False, "zero": False},
        "axis": {"format": ".3~g", "tickCount": 6},
        "title": f"{f.label}: {c.current_label} / {c.baseline_label}",
    }
    colour = {
        "field": "direction",
        "type": "nominal",
        "title": "change",
        "scale": {
            "domain": ["worse", "better", "same"],
            "range": ["#c0392b", "#1e8449", "#7f8c8d"],
        },
    }
    tooltip = [
        {"field": "case", "title": "case"},
        {"field": "ratio", "title": "ratio", "format": ".4~g"},
        {"field": "lo", "title": "CI low", "format": ".4~g"},
        {"field": "hi", "title": "CI high", "format": ".4~g"},
        {"field": "baseline", "title": "baseline"},
        {"field": "current", "title": "current"},
        {"field": "verdict", "title": "verdict"},
    ]
    return {
        "title": {
            "text": f"{f.label}: {c.current_label} against {c.baseline_label}",
            "subtitle": [
                f"{figure}; ratio with its {c.confidence:.0%} interval, worst first; "
                "dashed: no change",
            ],
            "anchor": "start",
        },
        "width": RATIO_WIDTH_PX,
        "height": max(RATIO_MIN_HEIGHT_PX, RATIO_STEP_PX * len(data))
        if labelled
        else RATIO_HEIGHT_PX,
        "data": {"values": data},
        "layer": [
            {
                "data": {"values": [{"one": 1}]},
                "mark": {"type": "rule", "strokeDash": [4, 3], "color": "#333"},
                "encoding": {"x": {"field": "one", "type": "quantitative"}},
            },
            {
                "transform": [{"filter": "datum.lo != null"}],
                "mark": {"type": "rule", "strokeWidth": 1.5},
                "encoding": {"y": y, "x": {**x, "field": "lo"}, "x2": {"field": "hi"}},
            },
            {
                "mark": {"type": "point", "filled": True, "size": 40},
                "encoding": {"y": y, "x": x, "color": colour, "tooltip": tooltip},
            },
        ],
        "resolve": {"scale": {"color": "shared"}},
        "config": _SUBTITLE,
    }


def ratio_section(comparisons: Sequence[Comparison]) -> Section:
    charts = []
    for i, c in enumerate(comparisons):
        for figure in ratio_figures(c):
            data = ratio_points(c, figure)
            if data:
                title = f"ratio of {figure}, {c.current_label} / {c.baseline_label}"
                charts.append(
                    DrawnChart(
                        f"ratio-{i}-{figure}",
                        title,
                        ratio_spec(c, figure, data),
                        len(data),
                        fitted=True,
                    )
                )
    return Section(tuple(charts))
