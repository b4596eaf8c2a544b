"""The page: one HTML file with every script and style inside it.

A Content-Security-Policy forbids the page any request (``default-src 'none'``), so a
report opened offline from a CI artifact draws exactly as it does anywhere; fonts are
the system's.  Charts are Vega-Lite specs drawn by the inlined library; the case table is
plain HTML, sorted and filtered by a few lines of script (and readable without it).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..compare import Comparison
from ..comparison_text import verdict_line
from ..errors import ConfigError
from ..storage.runfile import Run
from ..tables import Table
from . import vega
from .casedata import (
    COMPARISON_COLUMNS,
    CaseTable,
    case_table,
    comparison_rows,
    points,
    run_header,
)
from .charts import DrawnChart, chart_figures, draw
from .sections import (
    Section,
    frontier_section,
    ratio_section,
    routed_between,
    routing_section,
    scale_section,
    slo_section,
)
from .served_chart import served_section
from .timeline import history_section

if TYPE_CHECKING:
    from ..history import BranchHistory
    from ..routing.decide import Routed

_CSP = (
    "default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; "
    "style-src 'unsafe-inline'; img-src data: blob:"
)

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem;color:#222}
h1{font-size:1.4rem}h3{font-size:1rem;margin:1.2rem 0 .4rem}
h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
dl.run{display:grid;grid-template-columns:max-content auto;gap:.15rem 1rem;font-size:.9rem}
dl.run dt{color:#666}dl.run dd{margin:0}
.runs{display:flex;flex-wrap:wrap;gap:2rem}
.charts{display:flex;flex-wrap:wrap;gap:1.5rem}
.chart{min-width:460px;min-height:320px}.chart.fitted{min-height:0}
table{border-collapse:collapse;font-size:.82rem;font-variant-numeric:tabular-nums}
th,td{padding:.2rem .5rem;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{position:sticky;top:0;background:#f6f6f6;cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td.text,th.text{text-align:left}
th{white-space:normal}td.prose{white-space:normal;min-width:9rem}
tr.worse td{background:#fde8e8}tr.better td{background:#e6f4ea}
.verdict{font-weight:600}.failed{color:#b00020}.passed{color:#1b6e32}
.scroll{max-height:70vh;overflow:auto;border:1px solid #ddd;content-visibility:auto;
contain-intrinsic-size:auto 70vh}
input.filter{margin:.5rem 0;padding:.3rem;width:24rem}
.note{color:#555;font-size:.85rem}footer{margin-top:2rem;color:#777;font-size:.8rem}
"""

# Draws the charts, then marks the body (data-charts="drawn") so a browser test can time
# it; the table's headers sort, the filter box hides rows lacking any of its words.
_SCRIPT = """
(function(){
const specs = JSON.parse(document.getElementById('llmenergy-specs').textContent);
const views = {};
window.llmenergy = {views: views};
Promise.all(Object.keys(specs).map(function(key){
  return vegaEmbed('#chart-' + key, specs[key], {actions: false, renderer: 'canvas'})
    .then(function(result){ views[key] = result.view; });
})).then(function(){ document.body.dataset.charts = 'drawn'; },
         function(error){ document.body.dataset.charts = 'failed'; console.error(error); });
// Tables are drawn from their JSON, the first LIMIT rows of the sorted and filtered
// order (a thousand rows of thirty figures would take the browser a second to lay out).
const LIMIT = 200;
document.querySelectorAll('table.sortable').forEach(function(table){
  const data = JSON.parse(document.getElementById(table.id + '-data').textContent);
  const heads = Array.from(table.tHead.rows[0].cells);
  const lower = data.rows.map(function(row){ return row.join(' ').toLowerCase(); });
  const more = document.getElementById(table.id + '-more');
  let order = data.rows.map(function(_, i){ return i; });
  let words = [], all = false;
  function draw(){
    const shown = order.filter(function(i){
      return words.every(function(w){ return lower[i].includes(w); });
    });
    const limit = all ? shown.length : Math.min(shown.length, LIMIT);
    const body = document.createElement('tbody');
    for (let k = 0; k < limit; k++) {
      const i = shown[k], tr = body.insertRow();
      if (data.classes) tr.className = data.classes[i];
      data.rows[i].forEach(function(text, c){
        const td = tr.insertCell(), v = data.values[i][c];
        td.className = heads[c].className;
        td.textContent = text;
        td.dataset.v = v === null ? '' : v;
      });
    }
    table.replaceChild(body, table.tBodies[0]);
    more.hidden = limit >= shown.length;
    more.firstChild.textContent = limit + ' of ' + shown.length + ' rows shown ';
  }
  heads.forEach(function(th, c){
    th.addEventListener('click', function(){
      const down = th.getAttribute('aria-sort') === 'ascending';
      heads.forEach(function(h){ h.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', down ? 'descending' : 'ascending');
      const value = function(i){ return data.values[i][c]; };
      order.sort(function(a, b){
        const x = value(a), y = value(b);
        if (x === null || y === null) return (x === null) - (y === null);  // blanks last
        const sign = x < y ? -1 : x > y ? 1 : 0;
        return down ? -sign : sign;
      });
      draw();
    });
  });
  more.querySelector('button').addEventListener('click', function(){ all = true; draw(); });
  document.querySelector('input.filter[data-table="' + table.id + '"]')
    .addEventListener('input', function(event){
      words = event.target.value.toLowerCase().split(/\\s+/).filter(Boolean);
      draw();
    });
  draw();
});
})();
"""


# What a run's text must not put inside a <script> element as itself: ``<`` starts
# ``</script>`` (which ends the element) and ``<!--`` (whose script-data escape states hide
# the ``</script>`` after it, so the page's own data never closes); ``>`` and ``&`` are
# escaped too so that nothing in the element reads as markup to any parser, and the two
# line separators that some JavaScript engines take for line ends.  Each becomes JSON's
# own ``\uXXXX`` escape, so ``JSON.parse`` gives back the very same string.
_SCRIPT_ESCAPES = str.maketrans(
    {c: f"\\u{ord(c):04x}" for c in ("<", ">", "&", "\u2028", "\u2029")}
)


def _script_json(value: Any) -> str:
    """JSON that no text from a run can change the page's parsing with: inside it no
    ``<``, ``>`` or ``&`` appears, so the element ends at its own ``</script>``."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.translate(_SCRIPT_ESCAPES)


def _sort_value(value: Any) -> Any:
    """What a cell sorts by: its number, else its text (booleans as 0/1)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# Columns of words (a verdict, a note) wrap at their spaces, so that a wide comparison
# fits a 1,400-pixel window instead of hiding its verdicts past the scroll box's edge;
# numbers and names stay on one line each.
PROSE_KEYS = frozenset({"verdict", "note"})


def _cell_class(key: str, numeric: bool) -> str:
    """The class of a column's header and cells: its alignment, and whether it wraps."""
    if numeric:
        return "num"
    return "text prose" if key in PROSE_KEYS else "text"


def _table_html(
    table_id: str,
    heads: list[tuple[str, str, str, bool]],
    rows: list[list[tuple[str, Any]]],
    classes: list[str] | None = None,
    placeholder: str = "filter rows",
) -> str:
    """A sortable, filterable table: its header here, its rows as JSON drawn by the
    page's script.  ``heads``: (key, label, title, numeric); a row: (text, sort value)."""
    ths = "".join(
        f'<th class="{_cell_class(key, numeric)}" data-key="{escape(key)}" '
        f'title="{escape(title)}">{escape(label)}</th>'
        for key, label, title, numeric in heads
    )
    data: dict[str, Any] = {
        "rows": [[text for text, _ in row] for row in rows],
        "values": [[_sort_value(v) for _, v in row] for row in rows],
    }
    if classes is not None:
        data["classes"] = classes
    return (
        f'<input class="filter" type="search" data-table="{table_id}" '
        f'placeholder="{escape(placeholder)}" aria-label="{escape(placeholder)}">'
        f'<div class="scroll"><table id="{table_id}" class="sortable">'
        f"<thead><tr>{ths}</tr></thead><tbody></tbody></table></div>"
        f'<p class="note" id="{table_id}-more" hidden><span></span>'
        "<button>show all</button></p>"
        f'<script type="application/json" id="{table_id}-data">{_script_json(data)}</script>'
    )


def _case_table_html(table: CaseTable) -> str:
    heads = [(c.key, c.label, c.title, c.numeric) for c in table.columns]
    rows = [list(row) for row in table.rows]
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in table.notes)
    table_html = _table_html(
        "cases", heads, rows, placeholder="filter rows: words that must all appear"
    )
    return table_html + notes


def _registry_table_html(table_id: str, table: Table) -> str:
    """A table of the package's analyses (the terminal's ``Table``), sortable like the
    case table: its cells as shown, its raw values to sort by."""
    numeric = [
        any(isinstance(row[i], int | float) and not isinstance(row[i], bool) for row in table.rows)
        for i in range(len(table.keys))
    ]
    shown = [i for i, key in enumerate(table.keys) if key not in table.hidden]
    heads = [(table.keys[i], table.headers[i], table.headers[i], numeric[i]) for i in shown]
    rows = [[(cells[i], raw[i]) for i in shown] for raw, cells in zip(table.rows, table.cells)]
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in (*table.legend, *table.notes))
    return (
        f"<h3>{escape(table.title)}</h3>"
        + _table_html(table_id, heads, rows, placeholder="filter rows")
        + notes
    )


def _section_html(title: str, key: str, section: Section, intro: str = "") -> str:
    if not section.charts and not section.tables:
        return ""
    parts = [f"<h2>{escape(title)}</h2>"]
    if intro:
        parts.append(f'<p class="note">{escape(intro)}</p>')
    if section.charts:
        parts.append(_charts_html(list(section.charts)))
    parts += [_registry_table_html(f"{key}-{i}", t) for i, t in enumerate(section.tables)]
    return "".join(parts)


def _header_html(fields: list[tuple[str, str]]) -> str:
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in fields)
    return f'<dl class="run">{items}</dl>'


def _shorten(text: str, limit: int = 400) -> str:
    """A verdict naming hundreds of cases stays readable: the rows below list them."""
    return text if len(text) <= limit else text[: limit - 1].rsplit(",", 1)[0] + ", \u2026"


# Columns that hold one value in every row where one figure is compared (its name, its
# gate) are said once above the table instead: as the terminal drops them first, so the
# table fits a 1,400-pixel window.
ONCE_KEYS = ("figure", "gate")


def _said_once(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """By key, the value of each ``ONCE_KEYS`` column that every row holds alike."""
    found = {}
    for key in ONCE_KEYS:
        values = {str(r.get(key) or "") for r in rows}
        if len(values) == 1 and "" not in values:
            found[key] = values.pop()
    return found


def _comparison_html(index: int, c: Comparison, ratios: Sequence[DrawnChart] = ()) -> str:
    rows = comparison_rows(c)
    once = _said_once(rows)
    shown = [(k, h) for k, h in COMPARISON_COLUMNS if k not in once and any(r.get(k) for r in rows)]
    text_keys = ("case", "figure", "verdict", "gate")
    heads = [(k, h, h, k not in text_keys) for k, h in shown]
    body = [[(str(r[k]), r.get(f"{k}_value", r[k])) for k, _ in shown] for r in rows]
    verdict = verdict_line(c)
    state = "failed" if c.failed else "passed" if c.gates and not c.unsure else ""
    notes = [_columns_note(c)]
    if c.only_in_baseline:
        notes.append(f"only in {c.baseline_label}: {', '.join(c.only_in_baseline)}")
    if c.only_in_current:
        notes.append(f"only in {c.current_label}: {', '.join(c.only_in_current)}")
    table_id = f"comparison-{index}"
    return (
        f"<h3>{escape(c.current_label)} against {escape(c.baseline_label)} (baseline)</h3>"
        f'<p class="verdict {state}" title="{escape(verdict)}">{escape(_shorten(verdict))}</p>'
        + _once_html(once)
        + _table_html(table_id, heads, body, [r["direction"] for r in rows])
        + "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
        + (_charts_html(list(ratios)) if ratios else "")
        + _why_html(index, c)
    )


def _once_html(once: Mapping[str, str]) -> str:
    """The line above a comparison's table naming what each of its rows shares."""
    if not once:
        return ""
    said = ", ".join(f"{key} {value}" for key, value in once.items())
    return f'<p class="note once">every row: {escape(said)}</p>'


def _columns_note(c: Comparison) -> str:
    """What each column of a comparison is: ratio and change are one number (change =
    ratio - 1), so where the machine's speed was taken out the note says both have it
    taken out and the means beside them do not."""
    normalized = any(d.speed != 1.0 for d in c.deltas)
    speed = (
        ", the machine's speed taken out (the current mean divided by the machine speed "
        "column: how much the speed reference alone moved the figure)"
        if normalized
        else ""
    )
    means = "; baseline, current: the means as measured" + (", speed left in" if normalized else "")
    return (
        f"ratio: current / baseline as the gate judges it{speed}, with its "
        f"{c.confidence:.0%} interval (t interval on the log means); change: the same "
        f"ratio as a percentage (ratio - 1){means}; p: sessions compared, not trials "
        "(paired trials in a paired run), and where gated the p of a worsening adjusted "
        "for the many cases (Benjamini-Hochberg), the one the verdict is decided on; rows "
        "in red got significantly worse, in green significantly better"
    )


def _why_html(index: int, c: Comparison) -> str:
    """Why each failed case got worse: its line, then its work and time tables."""
    parts = []
    failing = {d.name for d in c.failures}
    for i, w in enumerate(w for w in c.explanations if w.name in failing):
        parts.append(f'<h4>why {escape(w.name)}</h4><p class="why">{escape(w.line)}</p>')
        parts += [_registry_table_html(f"why-{index}-{i}-{j}", t) for j, t in enumerate(w.tables)]
    return "".join(parts)


def _charts_html(charts: list[DrawnChart]) -> str:
    if not charts:
        return '<p class="note">no measured case has a figure to chart</p>'
    divs = "".join(
        f'<div class="chart{" fitted" if c.fitted else ""}" '
        f'id="chart-{escape(c.key)}" data-points="{c.points}" '
        f'aria-label="{escape(c.title)}"></div>'
        for c in charts
    )
    return f'<div class="charts">{divs}</div>'


def _head_html(title: str) -> list[str]:
    """The page's head (its policy, style and the Vega bundle) and its title."""
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style>",
        f"<!-- {escape(vega.versions())} --><script>{vega.bundle()}</script>",
        "</head><body>",
        f"<h1>{escape(title)}</h1>",
    ]


def _runs_html(runs: Sequence[Run], names: Sequence[str]) -> str:
    headers = "".join(
        f"<section><h3>{escape(name)}</h3>{_header_html(run_header(run, name))}</section>"
        for run, name in zip(runs, names)
    )
    return f'<h2>Runs</h2><div class="runs">{headers}</div>'


def _comparisons_html(comparisons: Sequence[Comparison], ratios: list[DrawnChart]) -> list[str]:
    """Each comparison with its own ratio charts; nothing without comparisons."""
    if not comparisons:
        return []
    return ["<h2>Comparison</h2>"] + [
        _comparison_html(i, c, [r for r in ratios if r.key.startswith(f"ratio-{i}-")])
        for i, c in enumerate(comparisons)
    ]


def _studies_html(
    frontier: Section, slo: Section, routing: Section, scale: Section, served: Section
) -> list[str]:
    """The sections of runs that vary a setting: each says when it has nothing to show."""
    return [
        _section_html(
            "Time-energy frontier",
            "frontier",
            frontier,
            "cases measured at several GPU settings (llmenergy frontier)",
        ),
        _section_html(
            "The best configuration under a latency limit",
            "slo",
            slo,
            "cases measured in several configurations (batch size, concurrency, GPU "
            "setting): the time-energy front, and the least energy per output token that "
            "meets the run's --llm-slo",
        ),
        _section_html(
            "Routing",
            "routing",
            routing,
            "which queries of the workload go to which system (llmenergy route)",
        ),
        _section_html(
            "Scale", "scale", scale, "the same cases at several scales (llmenergy scale)"
        ),
        _section_html(
            "Served workloads",
            "served",
            served,
            "each request of a workload replayed against a server, drawn over the power "
            "it ran at and coloured by the joules attributed to it (the guide's "
            "serving section says how they are split)",
        ),
    ]


def _cases_html(table: CaseTable) -> str:
    return (
        f'<h2>Cases</h2><p class="note">{len(table.rows)} row(s); click a header to sort, '
        "hover one for the figure's meaning; ~ estimated, † below the meter's resolution, "
        "✓ converged, ✓< converged but stopped at the trial limit short of the minimum "
        "measured time, ✗ stopped at the trial limit, (Ni) N trials with invalid power "
        "telemetry: never gated, the notes below say why</p>\n" + _case_table_html(table)
    )


def _tail_html(charts: Sequence[DrawnChart]) -> list[str]:
    """The footer, every chart's spec (drawn by the page's script), and that script."""
    return [
        f"<footer>pytest-llmenergy {escape(_version())}; charts: "
        f"{escape(vega.versions())}</footer>",
        '<script type="application/json" id="llmenergy-specs">',
        _script_json({c.key: c.spec for c in charts}),
        "</script>",
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
    ]


def render_report(
    runs: Sequence[Run],
    labels: Sequence[str] | None = None,
    comparisons: Sequence[Comparison] = (),
    routed: Sequence[Routed] | None = None,
    histories: Sequence[BranchHistory] = (),
) -> str:
    """The whole page for ``runs`` (the first is the baseline of ``comparisons``).
    ``routed``: the session's routing decision; None: routed here between the runs'
    systems, if they are two or more, on the Alpaca workload.  ``histories``: a
    branch's figure per commit (``history.branch_history``)."""
    if not runs:
        raise ConfigError("a report needs at least one run")
    vega.check_available()
    names = list(labels) if labels is not None else [r.label for r in runs]
    several = len(runs) > 1
    keys = chart_figures()
    data = [p for run, name in zip(runs, names) for p in points(name, run.cases, keys)]
    charts = draw(data, several)
    table = case_table([(name, run.cases) for run, name in zip(runs, names)])
    ratios = ratio_section(comparisons).charts
    frontier = frontier_section(runs, names)
    slo = slo_section(runs, names)
    routing = routing_section(routed_between(runs) if routed is None else routed)
    scale = scale_section(runs, names)
    served = served_section(runs, names)
    history = history_section(histories)
    title = f"pytest-llmenergy report: {', '.join(names)}"
    parts = [
        *_head_html(title),
        _runs_html(runs, names),
        *_comparisons_html(comparisons, ratios),
        _section_html(
            "History",
            "history",
            history,
            "the figure per commit on the branch, and where it changed (llmenergy report "
            "--history)",
        ),
        "<h2>Charts</h2>",
        _charts_html(charts),
        *_studies_html(frontier, slo, routing, scale, served),
        _cases_html(table),
        *_tail_html(
            (
                *history.charts,
                *charts,
                *ratios,
                *frontier.charts,
                *routing.charts,
                *served.charts,
            )
        ),
    ]
    return "\n".join(parts)


def write_report(
    path: str | os.PathLike[str],
    runs: Sequence[Run],
    labels: Sequence[str] | None = None,
    comparisons: Sequence[Comparison] = (),
    routed: Sequence[Routed] | None = None,
    histories: Sequence[BranchHistory] = (),
) -> Path:
    """Write the page, replacing what is at ``path`` in one step (a report is derived,
    like an export: a reader never sees half a file)."""
    from ..storage.store import AtomicFile

    target = Path(path)
    if not target.parent.is_dir():
        raise ConfigError(f"{path}: folder {target.parent} does not exist")
    if target.is_dir():
        raise ConfigError(f"{path} is a folder; give the report's file name, e.g. report.html")
    AtomicFile(target, derived=True).write(
        render_report(runs, labels, comparisons, routed, histories)
    )
    return target


def _version() -> str:
    """The installed version (read from the package's metadata: this module sits below
    the package's public API and must not import it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-llmenergy")
    except PackageNotFoundError:
        return "unknown"
