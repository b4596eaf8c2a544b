"""Energy-per-token tables: what a session measured, grouped and sorted like pytest-benchmark's.

A ``Table`` keeps two views of every row: raw values for machines (csv, json) and formatted
cells for people (terminal, markdown), so that a figure is rounded only where it is shown.
``Table`` is generic: other reports (comparisons) build their own and hand them to ``render``.

Data-only columns
    ``Table.hidden`` names keys that csv and json carry but the terminal and markdown do
    not show. Case tables always carry ``name`` (so a machine can tell rows apart even when
    the terminal does not print it) and ``estimated`` (a bool: the row's energy is a CPU-time
    x TDP estimate, shown in the terminal as a ``~`` before the figure).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tabulate import tabulate

from .controller.results import CONVERGED, LIMIT, OOM, ROUNDS, CaseResult
from .errors import ConfigError
from .stats import Summary

FORMATS = ("table", "csv", "json", "markdown")
DEFAULT_GROUP_BY: tuple[str, ...] = ("sweep", "model")
DEFAULT_SORT = "tokens"

DASH = "—"
ESTIMATED_MARK = "~"
ESTIMATED_NOTE = (
    "~ estimated: no energy sensor measured these cases (CPU time \u00d7 TDP); "
    "use a hardware meter for real figures"
)
ALL_CASES = "all cases"

Raw = int | float | str | bool | None


@dataclass(frozen=True)
class Table:
    """A titled table with raw values (for csv/json) and display cells (for the terminal).

    ``hidden`` lists keys present in ``rows`` and ``cells`` that only csv and json output:
    machine identity or flags that would clutter a terminal.
    """

    title: str
    keys: tuple[str, ...]
    headers: tuple[str, ...]
    rows: tuple[tuple[Raw, ...], ...]
    cells: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()


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


# -- columns -----------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """How one figure is read from a case and shown.

    ``cell`` exists for figures whose display needs more than the raw value (a mean with
    its CI, a trial count with its status); without it the raw value is formatted.
    ``energy`` columns get the estimated marker; only ``numeric`` ones can be sorted on.
    """

    key: str
    header: str
    help: str
    raw: Callable[[CaseResult], object]
    cell: Callable[[CaseResult], str] | None = None
    energy: bool = False
    numeric: bool = True

    def value(self, r: CaseResult) -> Raw:
        return clean(self.raw(r))

    def display(self, r: CaseResult) -> str:
        text = self.cell(r) if self.cell is not None else _format_raw(self.value(r))
        if self.energy and r.estimated and text != DASH:
            return ESTIMATED_MARK + text
        return text


def _format_raw(value: Raw) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return fmt_number(value)


def fmt_mean_ci(s: Summary) -> str:
    """Mean ± half-width; a lone trial has no interval, so only its mean is shown."""
    mean = fmt_number(s.mean)
    if mean == DASH or math.isnan(s.half_width) or math.isinf(s.half_width):
        return mean
    return f"{mean} ± {fmt_number(s.half_width, 2)}"


def _with_ci(summary: Callable[[CaseResult], Summary]) -> Callable[[CaseResult], str]:
    return lambda r: fmt_mean_ci(summary(r))


_STATUS_MARKS = {CONVERGED: " ✓", LIMIT: " ✗", ROUNDS: ""}


def _trials_cell(r: CaseResult) -> str:
    """Whether the count met the CI targets matters as much as the count itself."""
    if r.status == OOM or not r.measured:
        return DASH
    return f"{len(r.trials)}{_STATUS_MARKS.get(r.status, '')}"


def _family(domain: str) -> str:
    if domain.startswith("gpu:"):
        return "gpu"
    if domain.startswith(("cpu:dram", "dram")):
        return "dram"
    if domain.startswith("cpu:"):
        return "cpu"
    return "other"


def _family_joules(family: str) -> Callable[[CaseResult], float | None]:
    """Only counted domains: an uncounted one (cpu:all, a core inside a package) would count
    the same joules twice."""

    def raw(r: CaseResult) -> float | None:
        values = [
            j
            for d, j in r.domain_joules().items()
            if r.counted.get(d, True) and _family(d) == family
        ]
        return math.fsum(values) if values else None

    return raw


def _resource(attr: str, scale: float = 1.0) -> Callable[[CaseResult], float | None]:
    def raw(r: CaseResult) -> float | None:
        if r.resources is None:
            return None
        return getattr(r.resources, attr) / scale

    return raw


COLUMNS: dict[str, Column] = {
    c.key: c
    for c in (
        Column("name", "name", "the test's name with its id", lambda r: r.name, numeric=False),
        Column("tokens_in", "in", "input (prompt) tokens", lambda r: r.input_tokens),
        Column("tokens_out", "out", "output (generated) tokens", lambda r: r.output_tokens),
        Column(
            "trials",
            "trials",
            "trials run; ✓ converged, ✗ hit the trial limit",
            lambda r: len(r.trials) if r.measured else None,
            cell=_trials_cell,
        ),
        Column(
            "status", "status", "converged, limit, rounds or oom", lambda r: r.status, numeric=False
        ),
        Column(
            "seconds",
            "s ± CI",
            "seconds per query, mean ± CI half-width",
            lambda r: r.time.mean,
            cell=_with_ci(lambda r: r.time),
        ),
        Column(
            "joules",
            "J/query ± CI",
            "joules per query (counted domains), mean ± CI half-width",
            lambda r: r.energy.mean,
            cell=_with_ci(lambda r: r.energy),
            energy=True,
        ),
        Column(
            "net_joules",
            "net J ± CI",
            "joules per query above idle power, mean ± CI half-width",
            lambda r: r.net_energy.mean,
            cell=_with_ci(lambda r: r.net_energy),
            energy=True,
        ),
        Column(
            "j_per_token",
            "J/token",
            "joules per input + output token",
            lambda r: r.joules_per_token,
            energy=True,
        ),
        Column(
            "j_per_in_token",
            "J/in-token",
            "joules per input token",
            lambda r: r.joules_per_input_token,
            energy=True,
        ),
        Column(
            "j_per_out_token",
            "J/out-token",
            "joules per output token",
            lambda r: r.joules_per_output_token,
            energy=True,
        ),
        Column(
            "prefill_j",
            "prefill J",
            "joules of the prefill pass",
            lambda r: r.prefill_joules,
            energy=True,
        ),
        Column(
            "decode_j",
            "decode J",
            "joules of the decode passes",
            lambda r: r.decode_joules,
            energy=True,
        ),
        Column("prefill_s", "TTFT s", "seconds to the first token", lambda r: r.prefill_seconds),
        Column("decode_s", "decode s", "seconds of the decode passes", lambda r: r.decode_seconds),
        Column(
            "tokens_per_s", "tokens/s", "input + output tokens per second", lambda r: r.tokens_per_s
        ),
        Column(
            "decode_tokens_per_s",
            "decode tokens/s",
            "tokens per second after the first one",
            lambda r: r.decode_tokens_per_s,
        ),
        Column("watts", "avg W", "mean power over all trials", lambda r: r.power_w, energy=True),
        Column(
            "gpu_j", "GPU J", "joules per query of the GPUs", _family_joules("gpu"), energy=True
        ),
        Column(
            "cpu_j",
            "CPU J",
            "joules per query of the CPU packages",
            _family_joules("cpu"),
            energy=True,
        ),
        Column(
            "dram_j", "DRAM J", "joules per query of the DRAM", _family_joules("dram"), energy=True
        ),
        Column(
            "peak_rss_mib",
            "peak RSS MiB",
            "peak resident memory of the process",
            _resource("peak_rss_bytes", 2**20),
        ),
        Column("cpu_s", "CPU s", "CPU seconds of the process", _resource("cpu_seconds")),
    )
}

DEFAULT_COLUMNS: tuple[str, ...] = (
    "tokens_in",
    "tokens_out",
    "trials",
    "seconds",
    "joules",
    "j_per_in_token",
    "j_per_out_token",
    "prefill_j",
    "decode_j",
    "tokens_per_s",
    "watts",
    "gpu_j",
    "cpu_j",
    "dram_j",
)

# Carried in csv/json only; see the module docstring.
_ESTIMATED_KEY = "estimated"


# -- option parsing ----------------------------------------------------------

_GROUP_KEYS = ("sweep", "model", "test", "backend")
GROUP_CHOICES = (*_GROUP_KEYS, "param:NAME", "none")
_PARAM = "param:"


def _split(text: str) -> list[str]:
    """Comma-separated, blanks ignored, first occurrence wins (a repeat adds nothing)."""
    items: list[str] = []
    for part in text.split(","):
        item = part.strip()
        if item and item not in items:
            items.append(item)
    return items


def parse_columns(text: str) -> tuple[str, ...]:
    keys = _split(text)
    choices = ", ".join(COLUMNS)
    if not keys:
        raise ConfigError(f"no column given; choose from: {choices}")
    for key in keys:
        if key not in COLUMNS:
            raise ConfigError(f"unknown column {key!r}; choose from: {choices}")
    return tuple(keys)


def parse_group_by(text: str) -> tuple[str, ...]:
    keys = _split(text)
    choices = ", ".join(GROUP_CHOICES)
    if not keys:
        raise ConfigError(f"no group given; choose from: {choices}")
    if "none" in keys:
        if len(keys) > 1:
            raise ConfigError(f"group 'none' stands alone; choose from: {choices}")
        return ()
    for key in keys:
        known = key in _GROUP_KEYS or (key.startswith(_PARAM) and len(key) > len(_PARAM))
        if not known:
            raise ConfigError(f"unknown group {key!r}; choose from: {choices}")
    return tuple(keys)


def _sort_choices() -> list[str]:
    return ["tokens", "name", *(k for k, c in COLUMNS.items() if c.numeric)]


def parse_sort(text: str) -> str:
    key = text.strip()
    bare = key[1:] if key.startswith("-") else key
    if bare not in _sort_choices():
        raise ConfigError(
            f"unknown sort {key!r}; choose from: {', '.join(_sort_choices())} "
            "(a leading - sorts descending)"
        )
    return key


# -- building case tables ----------------------------------------------------


def _group_part(key: str, r: CaseResult) -> tuple[str, str]:
    """(title word, value); an empty value leaves the part out of the title."""
    if key == "test":
        return "test", r.nodeid.split("[", 1)[0]
    if key == "backend":
        return "backend", r.backend
    if key.startswith(_PARAM):
        name = key[len(_PARAM) :]
        return name, r.labels.get(name, "")
    return key, r.labels.get(key, "")


def _title(parts: Sequence[tuple[str, str]]) -> str:
    shown = [f"{word} {value}" for word, value in parts if value]
    return " · ".join(shown) if shown else ALL_CASES


def _tokens_order(r: CaseResult) -> tuple[int, int, str]:
    return (r.input_tokens, r.output_tokens, r.name)


def _sorted(results: list[CaseResult], sort: str) -> list[CaseResult]:
    """Rows without the figure (an OOM case, a run without phases) go last either way."""
    descending = sort.startswith("-")
    key = sort.lstrip("-")
    base = sorted(results, key=_tokens_order)
    if key == "tokens":
        return base[::-1] if descending else base
    if key == "name":
        return sorted(base, key=lambda r: r.name, reverse=descending)
    column = COLUMNS[key]
    present = [r for r in base if column.value(r) is not None]
    missing = [r for r in base if column.value(r) is None]
    present.sort(key=lambda r: column.value(r), reverse=descending)  # type: ignore[arg-type,return-value]
    return present + missing


def _note_for(r: CaseResult) -> str | None:
    if r.measured and r.status != OOM:
        return None
    return f"{r.name}: {r.reason or 'not measured'}"


def _build_table(
    title: str, results: list[CaseResult], chosen: tuple[str, ...], explicit: bool
) -> Table:
    shown = list(chosen)
    if not explicit:
        shown = [k for k in shown if any(COLUMNS[k].value(r) is not None for r in results)]
        # Without names a non-LLM table could have rows that nothing tells apart.
        tokens = [(r.input_tokens, r.output_tokens) for r in results]
        if "name" not in shown and len(set(tokens)) < len(tokens):
            shown.insert(0, "name")
    hidden = [k for k in ("name",) if k not in shown]
    columns = [COLUMNS[k] for k in [*shown, *hidden]]
    keys = (*(c.key for c in columns), _ESTIMATED_KEY)
    headers = (*(c.header for c in columns), _ESTIMATED_KEY)
    rows = tuple((*(c.value(r) for c in columns), r.estimated) for r in results)
    cells = tuple(
        (*(c.display(r) for c in columns), "yes" if r.estimated else "no") for r in results
    )
    notes: list[str] = []
    if any(r.estimated for r in results) and any(COLUMNS[k].energy for k in shown):
        notes.append(ESTIMATED_NOTE)
    notes.extend(n for n in map(_note_for, results) if n is not None)
    return Table(
        title=title,
        keys=keys,
        headers=headers,
        rows=rows,
        cells=cells,
        notes=tuple(notes),
        hidden=(*hidden, _ESTIMATED_KEY),
    )


def case_tables(
    results: Iterable[CaseResult],
    *,
    columns: Sequence[str] | None = None,
    group_by: Sequence[str] = DEFAULT_GROUP_BY,
    sort: str = DEFAULT_SORT,
) -> list[Table]:
    """One table per group. With the default columns, a column empty in a whole table is
    dropped (no GPU column on a CPU-only machine); columns the user named are all kept."""
    explicit = columns is not None
    chosen = parse_columns(",".join(columns)) if columns is not None else DEFAULT_COLUMNS
    groups = parse_group_by(",".join(group_by)) if group_by else ()
    sort = parse_sort(sort)

    grouped: dict[tuple[str, ...], tuple[str, list[CaseResult]]] = {}
    for r in results:
        parts = [_group_part(k, r) for k in groups]
        values = tuple(value for _, value in parts)
        grouped.setdefault(values, (_title(parts), []))[1].append(r)
    return [
        _build_table(title, _sorted(members, sort), chosen, explicit)
        for _, (title, members) in sorted(grouped.items())
    ]


# -- rendering ---------------------------------------------------------------


def _visible(table: Table) -> tuple[list[str], list[list[str]], list[str]]:
    """Headers, cells and alignment of the shown columns: figures right-aligned so their
    magnitudes line up, text left-aligned (decided on raw values, as cells are all text)."""
    keep = [i for i, k in enumerate(table.keys) if k not in table.hidden]
    headers = [table.headers[i] for i in keep]
    cells = [[row[i] for i in keep] for row in table.cells]

    def numeric(i: int) -> bool:
        return all(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool))
            for v in (row[i] for row in table.rows)
        )

    align = ["right" if numeric(i) else "left" for i in keep]
    return headers, cells, align


def _render_text(table: Table) -> str:
    headers, cells, align = _visible(table)
    body = tabulate(cells, headers, tablefmt="simple", disable_numparse=True, colalign=align)
    lines = [table.title, body]
    lines.extend(table.notes)
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
    parts = [f"### {table.title}", body]
    if table.notes:
        parts.append("\n>\n".join(f"> {note}" for note in table.notes))
    return "\n\n".join(parts)


def _render_csv(tables: Sequence[Table]) -> str:
    """One csv for every table, so a spreadsheet gets all groups at once; ``group`` says
    which table a row came from."""
    keys: list[str] = []
    for table in tables:
        keys.extend(k for k in table.keys if k not in keys)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["group", *keys])
    for table in tables:
        for row in table.rows:
            values = dict(zip(table.keys, row))
            cleaned = [clean(values.get(k)) for k in keys]
            writer.writerow([table.title, *("" if v is None else v for v in cleaned)])
    return out.getvalue()


def _render_json(tables: Sequence[Table]) -> str:
    data = {
        "tables": [
            {
                "title": t.title,
                "columns": list(t.keys),
                "rows": [{k: clean(v) for k, v in zip(t.keys, row)} for row in t.rows],
                "notes": list(t.notes),
            }
            for t in tables
        ]
    }
    return json.dumps(data, indent=2, allow_nan=False, ensure_ascii=False)


def render(tables: Sequence[Table], fmt: str = "table") -> str:
    if fmt == "table":
        return "\n\n".join(_render_text(t) for t in tables)
    if fmt == "markdown":
        return "\n\n".join(_render_markdown(t) for t in tables)
    if fmt == "csv":
        return _render_csv(tables)
    if fmt == "json":
        return _render_json(tables)
    raise ConfigError(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")
