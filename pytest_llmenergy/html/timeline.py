"""A branch's history on the page: one small panel per case, the figure per commit in
commit-time order with its interval, and the commits where the gate's test saw it change
marked with the change's size.

What counts (the branch's runs, one point per commit, the test between consecutive
points) is ``history.branch_history``'s; here it only becomes chart data, a Vega-Lite
spec and two tables.  Small multiples rather than one chart with a selector: a reader of
a 57-case suite sees at a glance which cases moved, and the changed ones come first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..figures import FIGURES, Figure
from ..history import BETTER, BranchHistory, Change
from ..results import distinct_names
from ..tables import DASH, Table, clean, fmt_mean_ci
from .casedata import Record, change_text, figure_interval, ratio_interval
from .charts import DrawnChart
from .sections import Section

HISTORY_WIDTH_PX, HISTORY_HEIGHT_PX = 200, 110
HISTORY_COLUMNS = 4
_COLOURS = {"worse": "#c0392b", "better": "#1e8449"}


def _size(change: Change) -> str:
    """The change as a reader says it: ``+25.3 %``, and the ratio's interval."""
    d = change.delta
    text = change_text(d)
    ratio = ratio_interval(d)
    if ratio is not None and ratio[1] != ratio[2]:
        text += f" (\u00d7{ratio[1]:.3g}\u2013{ratio[2]:.3g})"
    return text


def history_data(h: BranchHistory) -> list[Record]:
    """One record per commit and case with the figure; ``rank`` orders the panels: the
    cases that changed first, then the others, each by name."""
    f = FIGURES[h.gate.metric]
    nodeids = [c.nodeid for p in h.points for c in p.run.cases]
    names = distinct_names(nodeids)
    changes = {(c.nodeid, c.after): c for c in h.changes}
    data: list[Record] = []
    for i, point in enumerate(h.points):
        for case in point.run.cases:
            value = clean(f.value(case)) if case.measured else None
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            lo, hi = figure_interval(f, case)
            change = changes.get((case.nodeid, i))
            data.append(
                {
                    "panel": names[case.nodeid],
                    "commit": point.label,
                    "order": i,
                    "time": point.time,
                    "runs": ", ".join(point.runs),
                    "dirty": point.dirty,
                    "y": value,
                    "lo": lo,
                    "hi": hi,
                    "trials": len(case.trials),
                    "change": "" if change is None else change.direction,
                    "size": "" if change is None else _size(change),
                }
            )
    moved = {names[c.nodeid] for c in h.changes}
    panels = sorted({r["panel"] for r in data}, key=lambda name: (name not in moved, name))
    rank = {name: i for i, name in enumerate(panels)}
    for record in data:
        record["rank"] = rank[record["panel"]]
    return data


def _history_axes(f: Figure) -> tuple[dict[str, Any], dict[str, Any]]:
    """The x (commits) and y (the figure) encodings every layer of a panel shares."""
    # Orders by numbers, never by a list of names: Vega-Lite compiles a sort list into an
    # expression, and a name with U+2028 in it stops Vega's expression parser.
    x = {
        "field": "commit",
        "type": "ordinal",
        "sort": {"field": "order", "op": "min"},
        "title": None,
        "axis": {"labelAngle": -40, "labelFontSize": 9, "labelLimit": 90},
    }
    unit = f" [{f.unit}]" if f.unit and f.unit not in f.label else ""
    y = {"field": "y", "type": "quantitative", "scale": {"zero": False}, "title": f.label + unit}
    return x, y


def _history_tooltip(f: Figure) -> list[dict[str, Any]]:
    return [
        {"field": "panel", "title": "case"},
        {"field": "commit", "title": "commit"},
        {"field": "time", "title": "commit time"},
        {"field": "runs", "title": "runs"},
        {"field": "y", "title": f.label, "format": ".4~g"},
        {"field": "lo", "title": "CI low", "format": ".4~g"},
        {"field": "hi", "title": "CI high", "format": ".4~g"},
        {"field": "trials", "title": "trials"},
        {"field": "size", "title": "change"},
    ]


def _history_layers(h: BranchHistory, f: Figure, intervals: bool) -> list[dict[str, Any]]:
    """A panel's layers: the interval bars (where the figure has intervals), the line,
    the commits, and the changes the gate saw as diamonds with their size."""
    x, y = _history_axes(f)
    tooltip = _history_tooltip(f)
    colour = {
        "field": "change",
        "type": "nominal",
        "title": f"changed ({h.gate})",
        "scale": {"domain": list(_COLOURS), "range": list(_COLOURS.values())},
    }
    bars = {
        "transform": [{"filter": "datum.lo != null"}],
        "mark": {"type": "rule", "strokeWidth": 1.5, "color": "#5d6d7e"},
        "encoding": {"x": x, "y": {**y, "field": "lo"}, "y2": {"field": "hi"}},
    }
    layers: list[dict[str, Any]] = [
        {
            "mark": {"type": "line", "strokeWidth": 1, "color": "#999"},
            "encoding": {"x": x, "y": y},
        },
        {
            "name": "commits",
            "mark": {"type": "point", "filled": True, "size": 28, "color": "#2c3e50"},
            "encoding": {
                "x": x,
                "y": y,
                "tooltip": tooltip,
                # a run with uncommitted changes is drawn hollow
                "fillOpacity": {"condition": {"test": "datum.dirty", "value": 0}, "value": 1},
            },
        },
        {
            "name": "changes",
            "transform": [{"filter": "datum.change != ''"}],
            "mark": {"type": "point", "shape": "diamond", "size": 160, "strokeWidth": 2},
            "encoding": {"x": x, "y": y, "color": colour, "tooltip": tooltip},
        },
        {
            "transform": [{"filter": "datum.change != ''"}],
            "mark": {"type": "text", "dy": -12, "fontSize": 9, "fontWeight": "bold"},
            "encoding": {
                "x": x,
                "y": y,
                "text": {"field": "size"},
                "color": {**colour, "legend": None},
            },
        },
    ]
    return [bars, *layers] if intervals else layers


def _history_notes(h: BranchHistory, f: Figure, data: list[Record], intervals: bool) -> str:
    """The subtitle's second line: what the bars and hollow points mean."""
    if intervals:
        notes = [
            f"bars: the {h.confidence:.0%} interval of the mean of the commit's trials "
            "(the test also counts the noise between sessions)"
        ]
    else:
        notes = [f"{f.key} is counted, not measured: exact, no interval"]
    if any(r["dirty"] for r in data):
        notes.append("hollow: a run with uncommitted changes (+)")
    return "; ".join(notes)


def history_spec(h: BranchHistory, data: list[Record]) -> dict[str, Any]:
    f = FIGURES[h.gate.metric]
    intervals = any(r["lo"] is not None for r in data)
    return {
        "title": {
            "text": f"{f.label} per commit on {h.branch}",
            "subtitle": [
                f"{f.key} on {h.hardware}, in commit-time order; diamonds: where the gate "
                f"{h.gate} saw a change from the commit before (red worse, green better), "
                "with its size and the ratio's interval",
                _history_notes(h, f, data, intervals),
            ],
            "anchor": "start",
        },
        "data": {"values": data},
        "facet": {
            "field": "panel",
            "type": "nominal",
            "title": None,
            "sort": {"field": "rank", "op": "min"},
            "header": {"labelLimit": HISTORY_WIDTH_PX + 60, "labelFontSize": 9},
        },
        "columns": HISTORY_COLUMNS,
        "spec": {
            "width": HISTORY_WIDTH_PX,
            "height": HISTORY_HEIGHT_PX,
            "layer": _history_layers(h, f, intervals),
        },
        "resolve": {"scale": {"y": "independent"}},
        "config": {"title": {"subtitleFontSize": 10, "subtitleColor": "#555"}},
    }


def changes_table(h: BranchHistory) -> Table:
    """Every change the chart marks: the case, the two commits, both values, the size."""
    keys = ("case", "before", "after", "from", "to", "change", "ratio", "p", "direction")
    headers = ("case", "commit before", "commit", "before ± CI", "after ± CI")
    headers += ("change", "ratio", "p (gate)", "direction")
    names = distinct_names([c.nodeid for c in h.changes])
    rows, cells = [], []
    for c in sorted(h.changes, key=lambda c: (c.after, names[c.nodeid])):
        d = c.delta
        before, after = h.points[c.after - 1].label, h.points[c.after].label
        ratio = ratio_interval(d)
        shown = DASH if ratio is None else f"{ratio[0]:.3g}\u00d7"
        p_text = DASH if c.p is None else f"{c.p:.3g}"
        rows.append(
            (
                names[c.nodeid],
                before,
                after,
                clean(d.baseline.mean),
                clean(d.current.mean),
                clean(d.judged_change),
                None if ratio is None else ratio[0],
                c.p,
                c.direction,
            )
        )
        cells.append(
            (
                names[c.nodeid],
                before,
                after,
                fmt_mean_ci(d.baseline),
                fmt_mean_ci(d.current),
                _size(c),
                shown,
                p_text,
                c.direction,
            )
        )
    better = sum(1 for c in h.changes if c.direction == BETTER)
    title = (
        f"changes of {h.gate.metric} on {h.branch}: {len(h.changes) - better} worse, "
        f"{better} better"
    )
    return Table(
        title=title,
        keys=keys,
        headers=headers,
        rows=tuple(rows),
        cells=tuple(cells),
        legend=(
            f"a change: the gate {h.gate} failing from the commit before to this one "
            "(worse), or from this one back to the one before (better): beyond the "
            "threshold and significant, with the many cases counted (p adjusted)",
        ),
    )


def commits_table(h: BranchHistory) -> Table:
    """The history's points: which runs each commit's point pools, and what size of
    change the gate could have seen from the commit before."""
    keys = ("commit", "id", "time", "runs", "uncommitted", "detects")
    headers = ("commit", "commit id", "commit time", "runs pooled", "uncommitted changes")
    rows, cells = [], []
    for p, seen in zip(h.points, h.detectable or [math.nan] * len(h.points)):
        runs = ", ".join(p.runs)
        rows.append((p.label, p.commit, p.time, runs, p.dirty, clean(seen)))
        shown = DASH if not math.isfinite(seen) else f">= {seen:.0%}"
        cells.append((p.label, p.commit, p.time, runs, "yes" if p.dirty else "no", shown))
    return Table(
        title=f"commits on {h.branch} ({h.hardware})",
        keys=keys,
        headers=(*headers, "gate detects"),
        rows=tuple(rows),
        cells=tuple(cells),
        notes=h.notes,
        legend=(
            "a commit's clean runs are pooled into one point (each run a session, as "
            "a pull request's base is pooled); a run with uncommitted changes is a point "
            "of its own (+), compared with its neighbours like the others",
            "gate detects: the smallest worsening from the commit before that the gate "
            "could have seen in the median case (80 % power); a smaller one may be there, "
            "unmarked",
        ),
    )


def history_section(histories: Sequence[BranchHistory]) -> Section:
    charts, tables = [], []
    for i, h in enumerate(histories):
        data = history_data(h)
        if data:
            marks = len(data) + sum(1 for r in data if r["change"])
            title = f"{h.gate.metric} per commit on {h.branch}"
            charts.append(DrawnChart(f"history-{i}", title, history_spec(h, data), marks))
        tables += [changes_table(h), commits_table(h)]
    return Section(tuple(charts), tuple(tables))
