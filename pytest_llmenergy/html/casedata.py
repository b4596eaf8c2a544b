"""What the HTML report shows, as plain records: run headers, chart points, table rows
and comparison rows.  Every figure comes from the registry (``figures.FIGURES``) and is
shown as the terminal tables show it (``report.cell``), so the page and the tables speak
one vocabulary.  Nothing here knows HTML.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..case_tables import batch_note, cell, invalid_note, rejected_note
from ..compare import Comparison, Delta
from ..figures import FIGURES, Figure
from ..results import CONVERGED, LIMIT, CaseResult
from ..scale import scale_of
from ..serving_rules import rejections
from ..stats import t_quantile
from ..storage.runfile import Run
from ..tables import DASH, clean, fmt_mean_ci

Record = dict[str, Any]


# -- naming ------------------------------------------------------------------------------
def case_name(case: CaseResult) -> str:
    """How the report names a case: the one place to change when case naming changes."""
    return case.name


def case_group(case: CaseResult) -> str:
    """What a chart's colour tells apart: the model, else the test function."""
    return case.labels.get("model") or case.nodeid.split("[", 1)[0].rsplit("::", 1)[-1]


def group_title(data: Sequence[Record]) -> str:
    """The colour legend's title: it names what ``case_group`` gave the points, so a
    test's name is never shown as a model."""
    labelled = {bool(p["model"]) for p in data}
    if labelled == {True}:
        return "model"
    return "test (no model label)" if labelled == {False} else "model, or test (no model label)"


# -- run headers -------------------------------------------------------------------------
def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _commit_text(commit: Mapping[str, Any]) -> str:
    ident = commit.get("id")
    if not isinstance(ident, str) or not ident:
        return "unknown"
    text = ident[:12] + (" (uncommitted changes)" if commit.get("dirty") is True else "")
    branch = commit.get("branch")
    return text + (f" on {branch}" if isinstance(branch, str) and branch else "")


def _machine_text(machine: Mapping[str, Any]) -> str:
    cpu = _mapping(machine.get("cpu"))
    cores = cpu.get("logical_cores")
    text = str(cpu.get("model") or "unknown CPU")
    text += f" ({cores} logical cores)" if isinstance(cores, int) else ""
    gpus = machine.get("gpus")
    names = [str(_mapping(g).get("name") or "GPU") for g in gpus] if isinstance(gpus, list) else []
    return text + (f"; GPUs {', '.join(names)}" if names else "; no GPU")


def _rule_text(options: Mapping[str, Any], run: Run) -> str:
    rule = options.get("rule")
    parts = [f"rule {rule}" if isinstance(rule, str) and rule else "rule default"]
    confidence = run.confidence
    if confidence is not None:
        parts.append(f"{confidence:.0%} confidence")
    targets = options.get("ci_target")
    if isinstance(targets, list) and targets:
        parts.append("targets " + ", ".join(str(t) for t in targets))
    for key, word in (("min_trials", "at least"), ("max_trials", "at most")):
        value = options.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"{word} {value} trials")
    return ", ".join(parts)


def _scale_text(run: Run, label: str) -> str:
    scale = scale_of(run, label)  # as the scale table names it
    return scale.text + (" under torchrun" if scale.world_size > 1 else "")


def run_header(run: Run, label: str) -> list[tuple[str, str]]:
    """(field, text) pairs: what a reader needs to trust or doubt the run's figures."""
    cases = run.cases
    measured = [c for c in cases if c.measured]
    converged = sum(1 for c in cases if c.status == CONVERGED)
    limit = sum(1 for c in cases if c.status == LIMIT)
    short = sum(1 for c in cases if c.short_of_time)
    domains = _mapping(_mapping(run.meter).get("domains"))
    estimated = any(c.estimated for c in cases) or any(
        _mapping(d).get("method") == "estimated" for d in domains.values()
    )
    meter = _mapping(run.meter)
    busy = sum(len(c.busy_trials) for c in cases)
    rejected = sum(len(c.rejected) for c in cases)
    throttled = sum(len(c.throttled) for c in cases)
    left_out = [
        f"{n} {word}"
        for n, word in ((busy, "busy"), (rejected, "rejected"), (throttled, "throttled"))
        if n
    ]
    return [
        ("run", f"{label} ({run.status})"),
        ("date", run.created + (f" to {run.finished}" if run.finished else "")),
        ("hardware", run.hardware or "unknown"),
        ("machine", _machine_text(_mapping(run.machine))),
        ("scale", _scale_text(run, label)),
        ("meter", str(meter.get("description") or run.backend or "unknown")),
        (
            "figures",
            "estimated (CPU time \u00d7 TDP, no energy sensor): marked ~"
            if estimated
            else "measured",
        ),
        ("commit", _commit_text(_mapping(run.commit))),
        ("stopping", _rule_text(_mapping(run.options), run)),
        (
            "cases",
            f"{len(cases)}: {converged} converged"
            + (f" ({short} short of the minimum time: \u2713<)" if short else "")
            + f", {limit} at the trial limit, "
            f"{len(cases) - len(measured)} not measured",
        ),
        (
            "trials left out",
            ", ".join(left_out) if left_out else "none (no busy, rejected or throttled trial)",
        ),
    ]


# -- chart points ------------------------------------------------------------------------
def figure_interval(f: Figure, case: CaseResult) -> tuple[float | None, float | None]:
    summary = f.summary(case)
    if summary is None or not math.isfinite(summary.half_width):
        return None, None
    return clean(summary.low), clean(summary.high)  # type: ignore[return-value]


def points(run_label: str, cases: Sequence[CaseResult], keys: Sequence[str]) -> list[Record]:
    """One record per measured case: identity, tokens, and each figure with its interval
    (``KEY``, ``KEY_lo``, ``KEY_hi``); the charts pick their fields from these."""
    out: list[Record] = []
    for case in cases:
        if not case.measured:
            continue
        record: Record = {
            "run": run_label,
            "case": case_name(case),
            "nodeid": case.nodeid,
            "group": case_group(case),
            "model": case.labels.get("model", ""),
            "sweep": case.labels.get("sweep", ""),
            "tokens_in": case.input_tokens,
            "tokens_out": case.output_tokens,
            "queries": case.queries,
            "trials": len(case.trials),
            "estimated": case.estimated,
        }
        for key in keys:
            f = FIGURES[key]
            record[key] = clean(f.value(case))
            record[f"{key}_lo"], record[f"{key}_hi"] = figure_interval(f, case)
        out.append(record)
    return out


# -- the case table ----------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    key: str
    label: str
    title: str  # the figure's meaning, shown on hover over the header
    numeric: bool


@dataclass(frozen=True)
class CaseTable:
    columns: tuple[Column, ...]
    rows: tuple[tuple[tuple[str, Any], ...], ...]  # per cell: (shown text, sort value)
    # One line per case the terminal's table notes too: why its telemetry was invalid.
    notes: tuple[str, ...] = ()


def case_table(runs: Sequence[tuple[str, Sequence[CaseResult]]]) -> CaseTable:
    """Every figure of the registry that some case has, one row per case and run."""
    cases = [c for _, run_cases in runs for c in run_cases]
    keys = [
        k for k, f in FIGURES.items() if k != "name" and any(f.value(c) is not None for c in cases)
    ]
    several = len(runs) > 1
    columns = [Column("case", "case", "the case (its test and parameter id)", False)]
    if several:
        columns.insert(0, Column("run", "run", "the run the case belongs to", False))
    for key in keys:
        f = FIGURES[key]
        unit = f" [{f.unit}]" if f.unit and f.unit not in f.label else ""
        columns.append(Column(key, f.label, f"{key}{unit}: {f.meaning}", f.numeric))
    rows = []
    notes = []
    for label, run_cases in runs:
        rejected = rejections(run_cases)  # ML.ENERGY's rules, over the run's groups
        for case in run_cases:
            head: list[tuple[str, Any]] = [(case_name(case), case_name(case))]
            if several:
                head.insert(0, (label, label))
            cells = [(cell(FIGURES[k], case), clean(FIGURES[k].value(case))) for k in keys]
            rows.append(tuple(head + cells))
            found = [invalid_note(case, case_name(case))] if case.invalid_telemetry else []
            if case.nodeid in rejected:
                found.append(rejected_note(case_name(case), rejected[case.nodeid]))
            if (note := batch_note(case, case_name(case))) is not None:
                found.append(note)
            notes += [f"{label}: {note}" if several else note for note in found]
    return CaseTable(tuple(columns), tuple(rows), tuple(notes))


# -- comparisons -------------------------------------------------------------------------
def ratio_interval(d: Delta) -> tuple[float, float, float] | None:
    """current / baseline as judged (``Delta.judged_ratio``: the machine's speed taken
    out) with its interval: the gate's own test between sessions (sessions.py: the log
    ratio, its standard error with the noise between sessions counted) where there is
    one, else a t interval on the trials' log means (delta method, Welch's degrees of
    freedom), back-transformed.  None where a mean is not positive or a side has a
    single trial."""
    a, b = d.baseline, d.current
    ratio = d.judged_ratio  # the one ratio: the machine's speed taken out, as judged
    if not math.isfinite(ratio) or a.n < 2 or b.n < 2:
        return None
    if d.test is not None and math.isfinite(d.test.se):
        df = d.test.df if math.isfinite(d.test.df) else 1e9
        half = t_quantile(0.5 + d.confidence / 2, df) * d.test.se
        return ratio, ratio * math.exp(-half), ratio * math.exp(half)
    va, vb = (a.stdev / a.mean) ** 2 / a.n, (b.stdev / b.mean) ** 2 / b.n
    if va + vb == 0:
        return ratio, ratio, ratio
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    half = t_quantile(0.5 + d.confidence / 2, df) * math.sqrt(va + vb)
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)


def _direction(d: Delta) -> str:
    """worse, better or same: significant changes only, by the figure's better side."""
    better_low = FIGURES[d.metric].lower_is_better
    if not d.significant or better_low is None or d.change == 0:
        return "same"
    return "worse" if (d.change > 0) == better_low else "better"


def change_text(d: Delta) -> str:
    """The change beside the ratio, as a signed percentage: ``judged_ratio`` - 1."""
    change = d.judged_change
    return DASH if not math.isfinite(change) else f"{change * 100:+.1f} %"


def speed_text(d: Delta) -> str:
    """How much the machine's speed alone moved the figure (current's session against
    the baseline's), blank where the figure was not normalized: the ratio and change
    have it taken out, the two means do not."""
    return "" if d.speed == 1.0 else f"{d.speed:.3g}\u00d7"


def comparison_rows(c: Comparison) -> list[Record]:
    """One record per case and figure of a comparison: the single adaptation point for
    what ``compare`` computes (add a field here and to ``COMPARISON_COLUMNS`` and it shows
    as a column; ``KEY_value`` is what the column sorts by, else its text)."""
    rows: list[Record] = []  # d.name: the shortest part of the node id that tells cases apart
    for d in c.deltas:
        ratio = ratio_interval(d)
        rows.append(
            {
                "case": d.name,
                "nodeid": d.nodeid,
                "figure": d.metric,
                "baseline": fmt_mean_ci(d.baseline),
                "current": fmt_mean_ci(d.current),
                "ratio": DASH if ratio is None else f"{ratio[0]:.3g}\u00d7",
                "ratio_ci": DASH if ratio is None else f"{ratio[1]:.3g}\u2013{ratio[2]:.3g}",
                "ratio_value": None if ratio is None else ratio[0],
                "ratio_ci_value": None if ratio is None else ratio[1],
                "ratio_hi_value": None if ratio is None else ratio[2],
                "baseline_value": clean(d.baseline.mean),
                "current_value": clean(d.current.mean),
                "change_value": clean(d.judged_change),
                "p_value": d.shown_p,
                "change": change_text(d),
                "speed": speed_text(d),
                "speed_value": None if d.speed == 1.0 else d.speed,
                "p": DASH if d.shown_p is None else f"{d.shown_p:.3g}",
                "gate": "" if d.gate is None else str(d.gate),
                "detects": DASH
                if d.gate is None or not math.isfinite(d.detectable)
                else f">= {d.detectable:.0%}",
                "detects_value": clean(d.detectable) if d.gate is not None else None,
                "verdict": c.shown_verdict(d) if c.gates else "",
                "direction": _direction(d),
            }
        )
    return rows


COMPARISON_COLUMNS: tuple[tuple[str, str], ...] = (
    ("case", "case"),
    ("figure", "figure"),
    ("baseline", "baseline ± CI"),
    ("current", "current ± CI"),
    ("ratio", "ratio"),
    ("ratio_ci", "ratio CI"),
    ("change", "change"),
    ("speed", "machine speed"),
    ("p", "p (sessions)"),
    ("gate", "gate"),
    ("detects", "gate detects"),
    ("verdict", "verdict"),
)
