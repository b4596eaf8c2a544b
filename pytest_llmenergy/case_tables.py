"""Energy-per-token tables: what a session measured, grouped and sorted like pytest-benchmark's.

Every column is a figure of :mod:`pytest_llmenergy.figures`; this module only decides how a
figure is shown in a case table (a mean with its CI, a trial count with its mark, the ``~``
of an estimate) and how cases are grouped and sorted.  Generic tables and their rendering
live in :mod:`pytest_llmenergy.tables`.

Data-only columns
    ``Table.hidden`` names keys that csv and json carry but the terminal and markdown do
    not show. Case tables always carry ``name`` (so a machine can tell rows apart even when
    the terminal does not print it), ``nodeid`` (the whole node id, unique across files and
    classes, for machines and other runs) and ``estimated`` (a bool: the row's energy is a
    CPU-time x TDP estimate, shown in the terminal as a ``~`` before the figure).  The
    terminal's name is the shortest part of the node id that tells the table's rows apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .errors import ConfigError
from .figures import (
    DEFAULT_COLUMNS,
    FIGURES,
    MARK_RESOLVED_MULTIPLE,
    REMOVED,
    RESOLVED_MULTIPLE,
    Figure,
    canonical,
    resolved,
)
from .results import CONVERGED, LIMIT, OOM, ROUNDS, CaseResult, distinct_names
from .serving_rules import Rejection, rejections
from .tables import DASH, Raw, Table, clean, fmt_mean_ci, format_raw
from .values import items

DEFAULT_GROUP_BY: tuple[str, ...] = ("sweep", "model")
DEFAULT_SORT = "tokens"

ESTIMATED_MARK = "~"
ESTIMATED_NOTE = (
    "~ estimated: no energy sensor measured these cases (CPU time \u00d7 TDP); "
    "use a hardware meter for real figures"
)
ALL_CASES = "all cases"
_STATUS_MARKS = {CONVERGED: " \u2713", LIMIT: " \u2717", ROUNDS: ""}
SHORT_MARK = " \u2713<"  # converged, but at the trial limit short of the minimum time
HELD_TEXT = "\u2713 the CI targets held (the precision was reached)"
LIMIT_TEXT = (
    "\u2717 stopped at the trial limit or time budget before they held (the notes say which target)"
)
TRIALS_LEGEND = f"trials: {HELD_TEXT}, {LIMIT_TEXT}"  # both marks in the table
HELD_LEGEND = f"trials: {HELD_TEXT}"  # only the first
SHORT_LEGEND = (
    "\u2713<: the CI targets held, but the case stopped at the trial limit with less than "
    "the minimum measured time (the notes say how much; --energy-max-trials raises the limit)"
)
UNRESOLVED_MARK = "\u2020"  # dagger


def unresolved_legend(resolution_s: float) -> str:
    return (
        f"\u2020 measured over stretches shorter than {RESOLVED_MULTIPLE:g}x the meter's "
        f"resolution ({resolution_s * 1e3:.3g} ms), or a phase split at its first-token "
        f"mark shorter than {MARK_RESOLVED_MULTIPLE:g}x: not resolved, never gated (a "
        "case's prefill_pass splits a short prefill properly)"
    )


BUSY_MARK = "b"
BUSY_LEGEND = (
    "+Nb: N more trials were taken while other processes kept the CPUs busy; they are kept "
    "in the run file but left out of every figure, and no gate fails on such a case"
)
BUSY_COUNTED_MARK = "B"
BUSY_COUNTED_LEGEND = (
    "(NB): N of its trials were counted while other processes kept the CPUs busy "
    "throughout (--energy-busy=measure): its figures may read high, and no gate fails "
    "on such a case"
)
REJECTED_MARK = "x"
REJECTED_LEGEND = (
    "+Nx: N more trials were rejected: the target did not do the case (e.g. a server "
    "counted other tokens than asked); kept in the run file, left out of every figure"
)
THROTTLED_MARK = "t"
THROTTLED_LEGEND = (
    "+Nt: N more trials ran while the GPU was slowed by heat or a power brake; they are "
    "kept in the run file but left out of every figure"
)
UNSTABLE_MARK = "u"
UNSTABLE_LEGEND = (
    "(Nu): N of the trials were server bursts without a steady window worth measuring "
    "(ML.ENERGY's rules: shorter than --llm-min-steady, a mean batch under "
    "--llm-min-batch-fill): the configuration is rejected, with its group's larger "
    "concurrencies; the notes say why; no gate judges it"
)
INVALID_MARK = "i"
INVALID_LEGEND = (
    "(Ni): N of the trials had invalid power telemetry (a device never read, a longer "
    "stretch than --energy-max-sample-gap without a sample, or an edge of the window "
    "unsampled): the notes say why; no gate judges such a case"
)
# Carried in csv/json only; see the module docstring.
_ESTIMATED_KEY = "estimated"
_NODEID_KEY = "nodeid"  # the case's whole node id: unique and stable across runs


def invalid_note(r: CaseResult, name: str) -> str:
    """One line: why the case's telemetry was not valid (its first invalid trial's reason)."""
    invalid = r.invalid_telemetry
    reason = invalid[0].telemetry.reason if invalid[0].telemetry is not None else ""
    return f"{name}: invalid telemetry ({len(invalid)} of {len(r.trials)}), not gated: {reason}"


def batch_note(r: CaseResult, name: str) -> str | None:
    """One line where the server's running-requests gauge was set aside in some bursts
    for the client's count (serving/steady.py): what the gauge read, what the batch is."""
    noted = [t for t in r.trials if t.steady_batch_note]
    if not noted:
        return None
    return f"{name}: {len(noted)} of {len(r.trials)} bursts: {noted[0].steady_batch_note}"


def rejected_note(name: str, rejection: Rejection) -> str:
    """One line: why ML.ENERGY's rules reject the configuration (serving_rules.py)."""
    return f"{name}: rejected, not gated: {rejection.reason}"


# -- how a figure is shown in a case table ------------------------------------------
def cell(f: Figure, r: CaseResult) -> str:
    """The figure as people read it: mean ± CI, trial count with its mark, ~ estimates."""
    if f.key == "trials":
        if r.status == OOM or not r.measured:
            return DASH
        n_hot, n_rejected, n_busy = len(r.throttled), len(r.rejected), len(r.busy_trials)
        busy = f" +{n_busy}{BUSY_MARK}" if n_busy else ""
        busy += f" +{n_hot}{THROTTLED_MARK}" if n_hot else ""
        busy += f" +{n_rejected}{REJECTED_MARK}" if n_rejected else ""
        mark = SHORT_MARK if r.short_of_time else _STATUS_MARKS.get(r.status, "")
        unstable = f" ({len(r.unstable)}{UNSTABLE_MARK})" if r.unstable else ""
        counted_busy = r.busy_counted
        unstable += f" ({len(counted_busy)}{BUSY_COUNTED_MARK})" if counted_busy else ""
        invalid = r.invalid_telemetry
        unstable += f" ({len(invalid)}{INVALID_MARK})" if invalid else ""
        return f"{len(r.trials)}{mark}{unstable}{busy}"
    summary = f.summary(r) if f.with_ci else None
    text = fmt_mean_ci(summary) if summary is not None else format_raw(clean(f.value(r)))
    if f.energy and r.estimated and text != DASH:
        text = ESTIMATED_MARK + text
    if text != DASH and not resolved(f, r):
        text += UNRESOLVED_MARK
    return text


# -- option parsing ----------------------------------------------------------
def parse_columns(text: str) -> tuple[str, ...]:
    """Figure keys (old names warn); any figure can be a column."""
    keys = items(text)
    if not keys:
        raise ConfigError(f"no column given; choose from: {', '.join(FIGURES)}")
    return tuple(dict.fromkeys(canonical(k) for k in keys))


_GROUP_KEYS = ("sweep", "model", "test", "backend")
GROUP_CHOICES = (*_GROUP_KEYS, "param:NAME", "none")
_PARAM = "param:"


def parse_group_by(text: str) -> tuple[str, ...]:
    keys = items(text)
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


def sort_choices() -> list[str]:
    return ["tokens", *(k for k, f in FIGURES.items() if f.numeric or k == "name")]


def parse_sort(text: str) -> str:
    """``tokens``, ``name`` or a figure; ``-`` in front sorts descending."""
    key = text.strip()
    descending = key.startswith("-")
    bare = key[1:] if descending else key
    if bare not in ("tokens", "name"):
        if bare in REMOVED:
            raise ConfigError(f"{bare!r} is gone: {REMOVED[bare]}")
        try:
            bare = canonical(bare)
        except ConfigError:
            bare = ""
    if bare not in sort_choices():
        raise ConfigError(
            f"unknown sort {key!r}; choose from: {', '.join(sort_choices())} "
            "(a leading - sorts descending)"
        )
    return f"-{bare}" if descending else bare


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


def _tokens_order(r: CaseResult) -> tuple[int, int, int, str]:
    return (r.input_tokens, r.output_tokens, r.queries, r.name)


def _sorted(results: list[CaseResult], sort: str) -> list[CaseResult]:
    """Rows without the figure (an OOM case, a run without phases) go last either way."""
    descending = sort.startswith("-")
    key = sort.lstrip("-")
    base = sorted(results, key=_tokens_order)
    if key == "tokens":
        return base[::-1] if descending else base
    if key == "name":
        return sorted(base, key=lambda r: r.name, reverse=descending)
    f = FIGURES[key]
    present = [r for r in base if f.value(r) is not None]
    missing = [r for r in base if f.value(r) is None]
    present.sort(key=lambda r: f.value(r), reverse=descending)  # type: ignore[arg-type,return-value]
    return present + missing


def _note_for(r: CaseResult, name: str) -> str | None:
    if r.measured and r.status == LIMIT and r.reason:
        return f"{name}: \u2717 {r.reason}"
    if r.measured and r.status != OOM:  # a short case: one note for all (short_note)
        return None
    if not r.reason and r.disturbed and len(r.rejected) == len(r.disturbed):
        return f"{name}: not measured: every trial was rejected: {r.rejected[0].rejected}"
    if not r.reason and r.disturbed:
        return f"{name}: not measured: {busy_reason(r)}"
    return f"{name}: {r.reason or 'not measured'}"


def short_note(results: Sequence[CaseResult], names: Mapping[str, str]) -> str | None:
    """One line for a table's short cases, however many: how far below the minimum time
    they fell, and the trial limit that would have reached it for all of them (a line
    per case repeated the same words on almost every row of a quick session's table)."""
    short = [r for r in results if r.measured and r.short_of_time]
    if not short:
        return None
    needed = max(_trials_needed(r) for r in short)
    minimum = {r.options.min_time for r in short}
    below = f"the {minimum.pop():g} s minimum" if len(minimum) == 1 else "their minimum time"
    measured = sorted(r.measured_s for r in short)
    if len(short) == 1:
        fix = f"; --energy-max-trials={needed} would measure it" if needed else ""
        return (
            f"{names[short[0].nodeid]}: stopped at the trial limit with "
            f"{measured[0]:.2g} s measured, below {below}{fix}"
        )
    fix = f"; --energy-max-trials={needed} would measure them all" if needed else ""
    span = f"{measured[0]:.2g}-{measured[-1]:.2g}"
    which = f"all {len(short)}" if len(short) == len(results) else f"{len(short)} of {len(results)}"
    return f"{which} cases stopped at the trial limit with {span} s measured, below {below}{fix}"


def _trials_needed(r: CaseResult) -> int:
    """The trial limit that would have reached the minimum time at the case's pace (0:
    more trials would not)."""
    per_trial_s = r.measured_s / len(r.trials)
    needed = math.ceil(r.options.min_time / per_trial_s) if per_trial_s > 0 else 0
    return needed if needed > len(r.trials) else 0


def busy_reason(r: CaseResult) -> str:
    """Why a case has no undisturbed trial, and what to do."""
    on_gpu = {n.describe(): None for t in r.disturbed if t.gpu for n in t.gpu.neighbours}
    if on_gpu:
        return (
            f"all {len(r.disturbed)} trials were disturbed by other processes on the measured "
            f"GPUs ({', '.join(on_gpu)}); stop them and rerun, or --energy-gpu-isolation=off "
            "to measure with them (their work counted as this case's)"
        )
    share = r.max_background_cpu or 0.0
    return (
        f"all {len(r.disturbed)} trials were disturbed by other processes (up to "
        f"{share:.0%} of the CPUs); rerun on a quiet machine, or allow more with "
        "--energy-max-background"
    )


@dataclass(frozen=True)
class _LegendScope:
    """What the legend lines several tables share are worded from: every table's cases,
    so that a line reads the same whichever table it comes from, and the terminal prints
    it once (``trials: ✓ …`` and ``trials: ✓ …, ✗ …`` were two lines for one mark)."""

    results: tuple[CaseResult, ...]
    ci_keys: tuple[str, ...]  # the figures with an interval any table shows
    resolution_s: float | None  # the coarsest meter among the cases it did not resolve


def _scope(groups: Sequence[tuple[list[CaseResult], list[str]]]) -> _LegendScope:
    """The scope of the tables of ``groups``: (their cases, their shown columns)."""
    coarse = [s for results, shown in groups for s in _coarse(results, shown)]
    return _LegendScope(
        results=tuple(r for results, _ in groups for r in results),
        ci_keys=tuple(dict.fromkeys(k for _, shown in groups for k in shown if FIGURES[k].with_ci)),
        resolution_s=max(coarse) if coarse else None,
    )


def _coarse(results: list[CaseResult], shown: list[str]) -> list[float]:
    """The resolutions of the meters of the cases with a figure in ``shown`` they did
    not resolve."""
    return [
        r.resolution_s
        for r in results
        if r.resolution_s is not None and not all(resolved(FIGURES[k], r) for k in shown)
    ]


def _build_table(
    title: str,
    results: list[CaseResult],
    shown: list[str],
    rejected: Mapping[str, Rejection],
    scope: _LegendScope,
) -> Table:
    hidden = [k for k in ("name",) if k not in shown]
    figures = [FIGURES[k] for k in [*shown, *hidden]]
    keys = (*(f.key for f in figures), _ESTIMATED_KEY, _NODEID_KEY)
    headers = (*(f.label for f in figures), _ESTIMATED_KEY, _NODEID_KEY)
    rows: tuple[tuple[Raw, ...], ...] = tuple(
        (*(clean(f.value(r)) for f in figures), r.estimated, r.nodeid) for r in results
    )
    names = distinct_names([r.nodeid for r in results])
    cells = tuple(
        (
            *(names[r.nodeid] if f.key == "name" else cell(f, r) for f in figures),
            "yes" if r.estimated else "no",
            r.nodeid,
        )
        for r in results
    )
    legend = _legend(results, shown, scope)
    return Table(
        title=title,
        keys=keys,
        headers=headers,
        rows=rows,
        cells=cells,
        notes=tuple(_notes(results, names, rejected)),
        hidden=(*hidden, _ESTIMATED_KEY, _NODEID_KEY),
        # a row's name, when shown, is what a narrow terminal keeps longest
        priorities=(*(0 if f.key == "name" else f.priority for f in figures), 0, 0),
        legend=tuple(line for line, _ in legend),
        legend_keys=tuple(keys for _, keys in legend),
    )


def _shown_columns(results: list[CaseResult], chosen: Sequence[str], explicit: bool) -> list[str]:
    """The columns a table shows: those asked for, with the rows' identity; by default
    only figures some row has, and the test's name where title and tokens do not tell
    the rows apart."""
    shown = list(chosen)
    if explicit and not {"name", "tokens_in", "tokens_out"} & set(shown):
        # the rows' identity, as pytest-benchmark always shows the Name column
        several = any(r.queries != 1 for r in results)
        identity = ["tokens_in", "tokens_out", *(["queries"] if several else [])]
        shown = list(dict.fromkeys([*identity, *shown]))
    if not explicit:
        shown = [k for k in shown if any(FIGURES[k].value(r) is not None for r in results)]
        if all(r.queries == 1 for r in results):  # one query per trial: nothing to say
            shown = [k for k in shown if k != "queries"]
        # An LLM case is named by its table's title (model, sweep) and its tokens; any
        # other row, or rows its tokens do not tell apart, need the test's name.
        tokens = [(r.input_tokens, r.output_tokens, r.queries) for r in results]
        unnamed = len(set(tokens)) < len(tokens) or any("model" not in r.labels for r in results)
        if "name" not in shown and unnamed:
            shown.insert(0, "name")
    return shown


def _legend(
    results: list[CaseResult], shown: list[str], scope: _LegendScope
) -> list[tuple[str, tuple[str, ...]]]:
    """Each legend line with the columns whose marks it explains: a narrow terminal that
    leaves those columns out leaves the line out too.  A line is there when this table
    has what it explains, worded from ``scope`` (every table's cases)."""
    legend: list[tuple[str, tuple[str, ...]]] = []
    with_ci = [k for k in shown if FIGURES[k].with_ci]
    if with_ci and results:
        level = results[0].options.confidence
        labels = ", ".join(FIGURES[k].label for k in scope.ci_keys)
        line = f"{labels}: per query, mean ± half-width of the {level:.0%} confidence interval"
        legend.append((line, tuple(with_ci)))
    trials = ("trials",) if "trials" in shown else ()
    marks = _marks(scope.results)
    for wanted, line in (
        (bool(_marks(results)), f"trials: {', '.join(marks)}"),
        (any(r.short_of_time for r in results), SHORT_LEGEND),
        (any(r.busy_trials for r in results), BUSY_LEGEND),
        (any(r.busy_counted for r in results), BUSY_COUNTED_LEGEND),
        (any(r.throttled for r in results), THROTTLED_LEGEND),
        (any(r.rejected for r in results), REJECTED_LEGEND),
        (any(r.unstable for r in results), UNSTABLE_LEGEND),
        (any(r.invalid_telemetry for r in results), INVALID_LEGEND),
    ):
        if trials and wanted:
            legend.append((line, trials))
    unresolved = [k for k in shown if any(not resolved(FIGURES[k], r) for r in results)]
    if _coarse(results, shown) and scope.resolution_s is not None:
        legend.append((unresolved_legend(scope.resolution_s), tuple(unresolved)))
    energy = tuple(k for k in shown if FIGURES[k].energy)
    if any(r.estimated for r in results) and energy:
        legend.append((ESTIMATED_NOTE, energy))
    return legend


def _marks(results: Iterable[CaseResult]) -> list[str]:
    """The ✓ and ✗ the trials column of ``results`` shows, as the legend explains them."""
    results = list(results)
    held = any(r.status == CONVERGED and not r.short_of_time for r in results)
    stopped = any(r.status == LIMIT for r in results)
    return [text for shown, text in ((held, HELD_TEXT), (stopped, LIMIT_TEXT)) if shown]


def _notes(
    results: list[CaseResult], names: Mapping[str, str], rejected: Mapping[str, Rejection]
) -> list[str]:
    """The notes below a table: why a case did not converge, was short of time,
    rejected, or read its telemetry or batch wrongly."""
    notes = [n for n in (_note_for(r, names[r.nodeid]) for r in results) if n is not None]
    short = short_note(results, names)
    notes += [short] if short else []
    notes += [
        rejected_note(names[r.nodeid], rejected[r.nodeid]) for r in results if r.nodeid in rejected
    ]
    notes += [invalid_note(r, names[r.nodeid]) for r in results if r.invalid_telemetry]
    notes += [n for n in (batch_note(r, names[r.nodeid]) for r in results) if n is not None]
    return notes


def default_columns(gated: Sequence[str] = ()) -> tuple[str, ...]:
    """The default columns, plus any gated figure they lack: a gate's figure is always
    on the table that shows the cases it judges."""
    return tuple(dict.fromkeys([*DEFAULT_COLUMNS, *gated]))


def case_tables(
    results: Iterable[CaseResult],
    *,
    columns: Sequence[str] | None = None,
    group_by: Sequence[str] = DEFAULT_GROUP_BY,
    sort: str = DEFAULT_SORT,
    gated: Sequence[str] = (),
) -> list[Table]:
    """One table per group. With the default columns, a column empty in a whole table is
    dropped (no GPU column on a CPU-only machine); columns the user named are all kept,
    after the rows' tokens unless they name those or ``name``."""
    explicit = columns is not None
    chosen = parse_columns(",".join(columns)) if columns is not None else default_columns(gated)
    groups = parse_group_by(",".join(group_by)) if group_by else ()
    sort = parse_sort(sort)

    results = list(results)
    rejected = rejections(results)  # ML.ENERGY's rules over the whole run's groups
    grouped: dict[tuple[str, ...], tuple[str, list[CaseResult]]] = {}
    for r in results:
        parts = [_group_part(k, r) for k in groups]
        values = tuple(value for _, value in parts)
        grouped.setdefault(values, (_title(parts), []))[1].append(r)
    ordered = [(title, _sorted(members, sort)) for _, (title, members) in sorted(grouped.items())]
    shown = [_shown_columns(members, chosen, explicit) for _, members in ordered]
    scope = _scope([(members, columns) for (_, members), columns in zip(ordered, shown)])
    return [
        _build_table(title, members, columns, rejected, scope)
        for (title, members), columns in zip(ordered, shown)
    ]
