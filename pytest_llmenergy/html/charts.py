"""The report's charts: one registry, each entry a figure of ``figures.FIGURES`` against
tokens or queries, drawn as a Vega-Lite spec (points with their confidence band, a line
per model and run, a tooltip with the case, the value and its interval).

A chart is drawn only where the runs have its figure: batch-size curves need more than
one batch size, serving latencies need a server's requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..figures import FIGURES
from .casedata import Record, group_title

AXES: dict[str, str] = {
    "tokens_in": "input tokens",
    "tokens_out": "output tokens",
    "queries": "queries per trial (batch size \u00d7 concurrency)",
}
# How the points of one line differ from another's, besides run and model.
_SERIES_BY: dict[str, tuple[str, ...]] = {
    "tokens_in": ("tokens_out", "queries"),
    "tokens_out": ("tokens_in", "queries"),
    "queries": ("tokens_in", "tokens_out"),
}
WIDTH_PX, HEIGHT_PX = 420, 260


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    figure: str  # a key of figures.FIGURES
    x: str  # a key of AXES
    sweep: str | None = None  # only the cases of this sweep (cases without one: "input")

    def takes(self, point: Record) -> bool:
        if self.sweep is not None:
            sweep = point["sweep"] or "input"
            if sweep != self.sweep:
                return False
        x, y = point[self.x], point[self.figure]
        return isinstance(x, int | float) and x > 0 and isinstance(y, int | float) and y > 0


CHARTS: tuple[Chart, ...] = (
    Chart("jpt_in", "J/token against input tokens", "j_per_token", "tokens_in", "input"),
    Chart("jpt_out", "J/token against output tokens", "j_per_token", "tokens_out", "output"),
    Chart(
        "prefill_in",
        "prefill J per input token",
        "prefill_j_per_in_token",
        "tokens_in",
        "input",
    ),
    Chart(
        "decode_out",
        "decode J per output token",
        "decode_j_per_out_token",
        "tokens_out",
        "output",
    ),
    Chart("batch", "J/token against queries per trial", "j_per_token", "queries"),
    Chart("ttft", "a server's time to first token", "req_ttft_s", "queries"),
    Chart("tpot", "a server's time per output token", "tpot_s", "queries"),
    Chart("p50", "median request latency", "latency_p50_s", "queries"),
    Chart("p99", "99th percentile request latency", "latency_p99_s", "queries"),
)


def chart_figures() -> list[str]:
    return list(dict.fromkeys(c.figure for c in CHARTS))


def _chart_points(chart: Chart, points: Sequence[Record]) -> list[Record]:
    out = []
    for p in points:
        if not chart.takes(p):
            continue
        series = "·".join(str(p[k]) for k in ("run", "group", *_SERIES_BY[chart.x]))
        lo, hi = p[f"{chart.figure}_lo"], p[f"{chart.figure}_hi"]
        out.append(
            {
                "run": p["run"],
                "case": p["case"],
                "group": p["group"],
                "model": p["model"],
                "series": series,
                "x": p[chart.x],
                "y": p[chart.figure],
                # a log axis cannot show an interval reaching zero: its band is left out
                "lo": lo if lo is not None and lo > 0 else None,
                "hi": hi if lo is not None and lo > 0 else None,
                "trials": p["trials"],
                "estimated": p["estimated"],
            }
        )
    return out


def _spec(chart: Chart, data: list[Record], several_runs: bool) -> dict[str, Any]:
    f = FIGURES[chart.figure]
    y_title = f"{f.label} [{f.unit}]" if f.unit and f.unit not in f.label else f.label
    x_title = AXES[chart.x]
    log = {"type": "log"}
    x = {
        "field": "x",
        "type": "quantitative",
        "scale": {**log, "nice": False, "padding": 12},
        "title": x_title,
    }
    # the y axis spans the points and their bands, as x does: a log scale's "nice"
    # rounding stretches 0.07-0.11 to 0.01-1
    y_scale = {**log, "nice": False, "padding": 12}
    y = {"field": "y", "type": "quantitative", "scale": y_scale, "title": y_title}
    color = {"field": "group", "type": "nominal", "title": group_title(data)}
    unlisted = {**color, "legend": None}  # the points' outline: no legend of its own
    tooltip = [
        *([{"field": "run", "title": "run"}] if several_runs else []),
        {"field": "case", "title": "case"},
        {"field": "x", "title": x_title},
        {"field": "y", "title": f.label, "format": ".4~g"},
        {"field": "lo", "title": "CI low", "format": ".4~g"},
        {"field": "hi", "title": "CI high", "format": ".4~g"},
        {"field": "trials", "title": "trials"},
        {"field": "estimated", "title": "estimated"},
    ]
    points: dict[str, Any] = {
        "name": "cases",
        "mark": {"type": "point", "filled": True, "size": 60, "strokeWidth": 1.5},
        "encoding": {
            "y": y,
            "color": color,
            "stroke": unlisted,
            "tooltip": tooltip,
            # an estimate (no energy sensor) is drawn hollow
            "fillOpacity": {"condition": {"test": "datum.estimated", "value": 0.1}, "value": 1},
        },
    }
    if several_runs:
        points["encoding"]["shape"] = {"field": "run", "type": "nominal", "title": "run"}
    notes = []
    if any(p["lo"] is not None for p in data):
        notes.append("band: the confidence interval of the mean")
    if any(p["estimated"] for p in data):
        notes.append("hollow points: estimated (CPU time \u00d7 TDP), not measured")
    subtitle = [f.key, *notes]
    return {
        "title": {"text": chart.title, "subtitle": subtitle, "anchor": "start"},
        "width": WIDTH_PX,
        "height": HEIGHT_PX,
        "data": {"values": data},
        "encoding": {"x": x},
        "layer": [
            {
                "mark": {"type": "area", "opacity": 0.15},
                "encoding": {
                    "y": {**y, "field": "lo"},
                    "y2": {"field": "hi"},
                    "color": color,
                    "detail": {"field": "series"},
                },
            },
            {
                "mark": {"type": "line", "strokeWidth": 1.2},
                "encoding": {"y": y, "color": color, "detail": {"field": "series"}},
            },
            points,
        ],
        "config": {"title": {"subtitleFontSize": 10, "subtitleColor": "#555"}},
    }


@dataclass(frozen=True)
class DrawnChart:
    key: str
    title: str
    spec: dict[str, Any]
    points: int  # marks of the points layer: one per case (and run)
    # Its height follows its data (a row per case): the page reserves no room for it
    # before it is drawn, or a two-case chart sits above a blank gap.
    fitted: bool = False


def draw(points: Sequence[Record], several_runs: bool) -> list[DrawnChart]:
    """The charts the points have data for, in the registry's order."""
    drawn = []
    for chart in CHARTS:
        data = _chart_points(chart, points)
        if not data:
            continue
        if chart.x == "queries" and len({p["x"] for p in data}) < 2:
            continue  # one batch size: nothing to draw a curve through
        drawn.append(
            DrawnChart(chart.key, chart.title, _spec(chart, data, several_runs), len(data))
        )
    return drawn
