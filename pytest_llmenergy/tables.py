"""Generic tables: raw values for machines, formatted cells for people, and rendering.

A ``Table`` keeps two views of every row: raw values for machines (csv, json) and
formatted cells for people (terminal, markdown), so that a figure is rounded only where
it is shown.  Case tables (``case_tables``), comparisons (``compare``), routing tables and
``llmenergy list`` all build ``Table`` objects and hand them to ``render``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import textwrap
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tabulate as tabulate_module
from tabulate import tabulate

from .errors import ConfigError
from .stats import Summary

FORMATS = ("table", "csv", "json", "markdown")
DASH = "\u2014"

Raw = int | float | str | bool | None


@dataclass(frozen=True)
class Table:
    """A titled table with raw values (for csv/json) and display cells (for the terminal).

    ``hidden`` lists keys present in ``rows`` and ``cells`` that only csv and json output:
    machine identity or flags that would clutter a terminal.  ``priorities`` (one per key,
    empty: all 0) say which columns a narrow terminal loses first: the highest numbers;
    priority 0 is never left out.  ``wraps`` names text columns a narrow terminal folds
    onto several lines instead, as (key, narrowest width, priority): at its priority,
    before the columns of that priority are left out (prose that would push figures off
    the terminal: priority 1 or more; a case name, which should stay whole while columns
    can still go: 0).  ``legend`` explains marks and short names, under the table;
    ``legend_keys`` (one per legend line, empty: all shown) names the columns whose marks
    each line explains, so that a line about columns a narrow terminal left out goes too.
    """

    title: str
    keys: tuple[str, ...]
    headers: tuple[str, ...]
    rows: tuple[tuple[Raw, ...], ...]
    cells: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    priorities: tuple[int, ...] = ()
    legend: tuple[str, ...] = ()
    wraps: tuple[tuple[str, int, int], ...] = ()
    legend_keys: tuple[tuple[str, ...], ...] = ()

    def priority(self, index: int) -> int:
        return self.priorities[index] if index < len(self.priorities) else 0


# Characters that change how a terminal or a markdown table shows what follows them: line
# breaks (a row split in two), other control characters (an escape sequence recolours or
# clears the terminal) and the bidirectional controls (they reorder the rest of the line).
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _shows_as_itself(c: str) -> bool:
    return c not in _BIDI_CONTROLS and unicodedata.category(c) not in ("Cc", "Zl", "Zp")


def printable(text: str) -> str:
    """``text`` as a terminal or markdown table shows it: names come from tests and run
    files, so each such character is shown as its escape (``\\n``, ``\\x1b``,
    ``\\u2028``), as pytest shows a test id's; csv and json keep the text as it is."""
    if text.isprintable():
        return text
    return "".join(
        c if _shows_as_itself(c) else c.encode("unicode_escape").decode("ascii") for c in text
    )


def fmt_number(value: float | None, digits: int = 4) -> str:
    """Significant digits, not decimals: joules span µJ/token to kJ/query in one table.

    Numbers too large for ``digits`` are printed whole rather than in exponent notation,
    which reads badly in a column (12345, not 1.234e+04).
    """
    if value is None or math.isnan(value) or math.isinf(value):
        return DASH
    if abs(value) >= 10**digits:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def clean(value: object) -> Raw:
    """NaN and infinities become None so json stays strict and csv cells stay empty."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value  # type: ignore[return-value]


def format_raw(value: Raw) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return fmt_number(value)


def fmt_mean_ci(s: Summary) -> str:
    """Mean ± half-width: the half-width to two significant digits, the mean rounded at
    the same place (digits below it are noise, and cost a narrow terminal its columns) but
    to four significant digits at most; a lone trial has no interval, so only its mean."""
    mean, hw = fmt_number(s.mean), s.half_width
    if mean == DASH or math.isnan(hw) or math.isinf(hw):
        return mean
    hw_text = fmt_number(hw, 2)
    if hw > 0 and abs(s.mean) < 10**4:
        hw_decimals = 1 - math.floor(math.log10(hw))
        decimals = hw_decimals
        if s.mean != 0:
            decimals = min(decimals, 3 - math.floor(math.log10(abs(s.mean))))
        if 0 < decimals <= 12 and abs(s.mean) >= 10**-decimals:
            mean = f"{s.mean:.{decimals}f}"
            if decimals == hw_decimals:
                hw_text = f"{hw:.{decimals}f}"
        elif decimals <= 0:
            mean = f"{s.mean:.0f}"
    return f"{mean} ± {hw_text}"


# -- rendering ---------------------------------------------------------------


def _visible(
    table: Table, left_out: Sequence[int] = ()
) -> tuple[list[str], list[list[str]], list[str]]:
    """Headers, cells and alignment of the shown columns: figures right-aligned so their
    magnitudes line up, text left-aligned (decided on raw values, as cells are all text)."""
    keep = [i for i, k in enumerate(table.keys) if k not in table.hidden and i not in left_out]
    headers = [printable(table.headers[i]) for i in keep]
    cells = [[printable(row[i]) for i in keep] for row in table.cells]

    def numeric(i: int) -> bool:
        return all(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool))
            for v in (row[i] for row in table.rows)
        )

    align = ["right" if numeric(i) else "left" for i in keep]
    return headers, cells, align


def _body(
    table: Table, left_out: Sequence[int] = (), folded: Mapping[int, int] | None = None
) -> str:
    """tabulate pads every header by two characters; a column as wide as its widest cell
    or header is enough beside the two spaces between columns, and a narrow terminal
    keeps another column for it.  ``folded`` maps a column's index to the width its cells
    are folded to (``fold``)."""
    headers, cells, align = _visible(table, left_out)
    if folded:
        keep = [i for i, k in enumerate(table.keys) if k not in table.hidden and i not in left_out]
        for at, index in enumerate(keep):
            if index in folded:
                for row in cells:
                    row[at] = "\n".join(fold(row[at], folded[index]))
    padding = tabulate_module.MIN_PADDING
    tabulate_module.MIN_PADDING = 0
    try:
        return tabulate(cells, headers, tablefmt="simple", disable_numparse=True, colalign=align)
    finally:
        tabulate_module.MIN_PADDING = padding


def _widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def _steps(table: Table) -> list[tuple[str, int, int]]:
    """What a narrow terminal does, in order: ("fold", index, narrowest width) or
    ("drop", index, 0); the highest priority first, folding before leaving out."""
    index = {k: i for i, k in enumerate(table.keys) if k not in table.hidden}
    steps: list[tuple[int, int, tuple[str, int, int]]] = []
    for key, narrowest, priority in table.wraps:
        if key in index:
            i = index[key]
            floor = max(narrowest, len(table.headers[i]))
            steps.append((priority, 1, ("fold", i, floor)))
    for key, i in index.items():
        if table.priority(i) > 0 and key not in {w[0] for w in table.wraps}:
            steps.append((table.priority(i), 0, ("drop", i, 0)))
    steps.sort(key=lambda s: (-s[0], -s[1], -s[2][1]))
    return [step for _, _, step in steps]


def _narrowed(table: Table, width: int) -> tuple[str, list[int]]:
    """The body without the fewest lowest-priority columns that make it fit ``width``,
    its text columns folded (``Table.wraps``) first where their priority says so;
    priority-0 columns stay even when the rest cannot make it fit."""
    left_out: list[int] = []
    floors: dict[int, int] = {}  # folded columns: index -> narrowest width
    body = _body(table)
    for action, index, floor in _steps(table):
        if _widest(body) <= width:
            break
        if action == "drop":
            left_out.append(index)
        else:
            floors[index] = floor
        body = _folded(table, left_out, floors, width)
    return body, sorted(left_out)


def _folded(table: Table, left_out: Sequence[int], floors: Mapping[int, int], width: int) -> str:
    """The body with its folded columns as wide as ``width`` leaves them (each at least
    its floor): the widest folded column gives up a character at a time."""
    body = _body(table, left_out)
    if not floors:
        return body
    keep = [i for i, k in enumerate(table.keys) if k not in table.hidden and i not in left_out]
    shown = [i for i in keep if i in floors]
    widths = {i: _column_width(table, i) for i in shown}
    excess = _widest(body) - width
    while excess > 0:
        wide = [i for i in shown if widths[i] > floors[i]]
        if not wide:
            break
        i = max(wide, key=lambda j: (widths[j], -j))
        widths[i] -= 1
        excess -= 1
    folded = {i: widths[i] for i in shown if widths[i] < _column_width(table, i)}
    return _body(table, left_out, folded) if folded else body


def _column_width(table: Table, index: int) -> int:
    cells = [printable(row[index]) for row in table.cells]
    return max([len(printable(table.headers[index])), *(len(c) for c in cells)])


_BREAKS = frozenset("-_/[,:.=")  # where a word without spaces (a test id, a path) may break


def fold(text: str, width: int) -> list[str]:
    """A table cell in lines of at most ``width``: at spaces, a word too long for a line
    after one of ``- _ / [ , : . =`` (a test id's parts, a path's), and only then
    anywhere."""
    if len(text) <= width:
        return [text]
    pieces: list[tuple[str, str]] = []  # (glue before, text)
    for word in text.split():
        glue = " "
        for part in _parts(word, width):
            pieces.append((glue, part))
            glue = ""
    lines: list[str] = []
    line = ""
    for glue, part in pieces:
        if not line:
            line = part
        elif len(line) + len(glue) + len(part) <= width:
            line += glue + part
        else:
            lines.append(line)
            line = part
    lines.append(line)
    return lines


def _parts(word: str, width: int) -> list[str]:
    """A word as pieces no longer than ``width``, cut after break characters (joined
    again where they fit)."""
    if len(word) <= width:
        return [word]
    pieces, piece = [], ""
    for c in word:
        piece += c
        if c in _BREAKS:
            pieces.append(piece)
            piece = ""
    if piece:
        pieces.append(piece)
    out: list[str] = []
    for piece in pieces:
        while len(piece) > width:  # no break character within reach: cut
            out.append(piece[:width])
            piece = piece[width:]
        out.append(piece)
    return out


def wrap(text: str, width: int | None, indent: str = "  ") -> list[str]:
    """One logical line as lines shorter than ``width`` (a word longer than that stays
    whole); continuation lines start with ``indent``.  The terminal's last column stays
    free, as pytest keeps it free for its progress line: a terminal that wraps on reaching
    it (Windows' console) shows a line that fills it as two, the second empty.  Shown
    ``printable``: a name with a line break or an escape sequence in it stays on its line
    and changes no colour."""
    text = printable(text)
    if width is None or len(text) < width:
        return [text]
    lines = textwrap.wrap(
        text,
        width=max(1, width - 1),
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return lines or [text]


def terminal_width(default: int = 100) -> int:
    """The width to fit: the terminal's, or ``COLUMNS``; never below 40."""
    return max(40, shutil.get_terminal_size((default, 24)).columns)


def line_width(stream: Any) -> int | None:
    """The width prose lines are wrapped to: the terminal's (or COLUMNS) where ``stream``
    is one; a file or a pipe (a CI log, grep) gets each line whole."""
    if not (_is_terminal(stream) or "COLUMNS" in os.environ):
        return None
    return terminal_width()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed
        return False


def _fitted(table: Table, width: int | None) -> tuple[str, list[int], list[str]]:
    """The body, the columns left out, and the legend lines about the columns shown."""
    if width is None:
        return _body(table), [], list(table.legend)
    body, left_out = _narrowed(table, width)
    gone = {table.keys[i] for i in left_out} | set(table.hidden)
    legend = [
        line
        for n, line in enumerate(table.legend)
        if n >= len(table.legend_keys)
        or not table.legend_keys[n]
        or not set(table.legend_keys[n]) <= gone
    ]
    return body, left_out, legend


def _render_text(
    table: Table,
    width: int | None,
    narrow_hint: str,
    fitted: tuple[str, list[int], list[str]],
) -> str:
    body, left_out, legend = fitted
    lines = [*wrap(table.title, width), body]
    extra = list(legend)
    if left_out:
        names = ", ".join(table.headers[i] for i in left_out)
        note = f"columns left out to fit {width} characters: {names}"
        extra.append(f"{note}; {narrow_hint}" if narrow_hint else note)
    for line in [*extra, *table.notes]:
        lines += wrap(line, width)
    return "\n".join(lines)


def _render_markdown(table: Table) -> str:
    headers, cells, align = _visible(table)

    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    body = tabulate(
        [[esc(c) for c in row] for row in cells],
        [esc(h) for h in headers],
        tablefmt="github",
        disable_numparse=True,
        colalign=align,
    )
    parts = [f"### {printable(table.title)}", body]
    if table.legend or table.notes:
        notes = (*table.legend, *table.notes)
        parts.append("\n>\n".join(f"> {printable(note)}" for note in notes))
    return "\n\n".join(parts)


def _render_csv(tables: Sequence[Table]) -> str:
    """One csv for every table, so a spreadsheet gets all groups at once; ``group`` says
    which table a row came from."""
    keys: list[str] = []
    for table in tables:
        keys.extend(k for k in table.keys if k not in keys)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    # csv quotes a field holding a line break only if the break ends its lines, and they
    # end in "\n": a row with a "\r" in it is quoted whole, or readers would split it.
    quoted = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)

    def write(row: list[Raw]) -> None:
        carriage = any(isinstance(v, str) and "\r" in v for v in row)
        (quoted if carriage else writer).writerow(row)

    write(["group", *keys])
    for table in tables:
        for row in table.rows:
            values = dict(zip(table.keys, row))
            cleaned = [clean(values.get(k)) for k in keys]
            write([table.title, *("" if v is None else v for v in cleaned)])
    return out.getvalue()


def _render_json(tables: Sequence[Table]) -> str:
    data = {
        "tables": [
            {
                "title": t.title,
                "columns": list(t.keys),
                "rows": [{k: clean(v) for k, v in zip(t.keys, row)} for row in t.rows],
                "notes": list(t.notes),
                "legend": list(t.legend),
            }
            for t in tables
        ]
    }
    return json.dumps(data, indent=2, allow_nan=False, ensure_ascii=False)


def render(
    tables: Sequence[Table],
    fmt: str = "table",
    *,
    width: int | None = None,
    narrow_hint: str = "",
) -> str:
    """``width`` fits the terminal format to that many characters (columns of the lowest
    priority left out, and said so); csv, json and markdown always keep every column.
    In the terminal format every legend line is printed once, after the last table."""
    if fmt == "table":
        return _render_texts(tables, width, narrow_hint)
    if fmt == "markdown":
        return "\n\n".join(_render_markdown(t) for t in tables)
    if fmt == "csv":
        return _render_csv(tables)
    if fmt == "json":
        return _render_json(tables)
    raise ConfigError(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")


def _render_texts(tables: Sequence[Table], width: int | None, narrow_hint: str) -> str:
    """Each table with its notes, then one legend for them all: a mark means the same in
    every table, so a line explaining it is printed once, at the end, never under one
    table and again below the last."""
    fitted = [_fitted(t, width) for t in tables]
    legend = list(dict.fromkeys(line for _, _, lines in fitted for line in lines))
    if len(tables) == 1:
        return _render_text(tables[0], width, narrow_hint, fitted[0])
    parts = [
        _render_text(t, width, narrow_hint, (body, gone, []))
        for t, (body, gone, _) in zip(tables, fitted)
    ]
    text = "\n\n".join(parts)
    if legend:
        text += "\n\n" + "\n".join(line for x in legend for line in wrap(x, width))
    return text
