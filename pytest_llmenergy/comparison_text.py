"""A comparison as text: its table, the evidence and verdict lines, and runs side by side.

The statistics (which cases got worse, by how much, with what confidence) are
``compare.py``'s; this module only says them, so the terminal, the HTML report and
``llmenergy ab`` print one wording of every verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .compare import (
    EXACT_EVIDENCE,
    INVALID_TELEMETRY,
    NOT_SIGNIFICANT,
    OTHER_EXECUTION,
    OTHER_MODEL,
    TOO_FEW,
    UNCONFIRMED,
    UNDECIDED,
    UNRESOLVED,
    UNSTABLE,
    Comparison,
    detectable,
    number_or_none,
)
from .figures import figure
from .results import CaseResult, distinct_names
from .sessions import HISTORY, PRIOR, ROUNDS
from .stats import summarize
from .tables import Table, clean, fmt_mean_ci, fmt_number


def _signed_percent(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{value * 100:+.1f} %"


# The change of a figure normalized by the machine's speed is not current / baseline of
# the means beside it: the legend says so wherever such a row is shown.
SPEED_LEGEND = (
    "change: current / baseline - 1 as the gate judges it, the machine's speed taken out "
    "(the means are as measured)"
)


def comparison_table(c: Comparison) -> Table:
    """One row per case and metric: baseline, current, change, p, significant, verdict."""
    gated = bool(c.gates)
    keys = ["case", "metric", "baseline", "current", "change", "p_value", "significant"]
    headers = ["case", "figure", "baseline", "current", "change", "p", "significant"]
    # a narrow terminal keeps what a reader looks for first (the case, its means, the
    # change and the verdict): it drops whether the change is significant (the verdict
    # says so), then p, then the figure where every row has the same one (the gate
    # names it), then the gate, and only then folds the case names
    one_figure = len({d.metric for d in c.deltas}) <= 1
    priorities = [0, 2 if one_figure else 0, 0, 0, 0, 3, 4]
    if gated:
        keys += ["threshold", "verdict"]
        headers += ["gate", "verdict"]
        priorities += [1, 0]
    rows, cells = [], []
    for d in c.deltas:
        raw: list[object] = [
            d.nodeid,  # csv/json: the whole node id, the same in every run
            d.metric,
            d.baseline.mean,
            d.current.mean,
            clean(d.judged_change),
            d.shown_p,
            d.significant,
        ]
        shown = [
            d.name,
            d.metric,
            fmt_mean_ci(d.baseline),
            fmt_mean_ci(d.current),
            _signed_percent(d.judged_change),
            "—" if d.shown_p is None else f"{d.shown_p:.3g}",
            "yes" if d.significant else "no",
        ]
        if gated:
            verdict = c.shown_verdict(d)
            gate = "—" if d.gate is None else str(d.gate)
            raw += [None if d.gate is None else str(d.gate), verdict]
            shown += [gate, verdict]
        rows.append(tuple(raw))
        cells.append(tuple(shown))
    legend: tuple[str, ...] = (
        "p: sessions compared, not trials (the noise between sessions counted: "
        f"{evidence_text(c)})"
        + (
            f"; gated: the p of a worsening, adjusted for the {len(c.deltas)} gated figures "
            f"(Benjamini-Hochberg); significant: p <= {1 - c.confidence:.2g} "
            f"({c.confidence:.0%} confidence)"
            if gated
            else f"; significant: p < {1 - c.confidence:.2g} ({c.confidence:.0%} confidence)"
        ),
    )
    if any(d.speed != 1.0 for d in c.deltas):
        legend += (SPEED_LEGEND,)
    notes = []
    if gated:
        notes.append(
            "a case fails only when it is worse by more than the gate and the change is significant"
        )
    if c.only_in_baseline:
        notes.append(f"only in {c.baseline_label}: {', '.join(c.only_in_baseline)}")
    if c.only_in_current:
        notes.append(f"only in {c.current_label}: {', '.join(c.only_in_current)}")
    return Table(
        title=f"{c.current_label} (current) against {c.baseline_label} (baseline)",
        keys=tuple(keys),
        headers=tuple(headers),
        rows=tuple(rows),
        cells=tuple(cells),
        notes=tuple(notes),
        priorities=tuple(priorities),
        legend=legend,
        legend_keys=(("p_value", "significant"), ("change",)),  # said where shown
        wraps=(("case", 16, 0),),
    )


def evidence_text(c: Comparison) -> str:
    """Where the between-session noise came from, in words."""
    sources = {d.test.source for d in c.deltas if d.test is not None}
    parts = []
    if ROUNDS in sources and c.paired_processes == 1:
        parts.append(
            "one process pair of a paired run (llmenergy ab), each case a robust (Huber) "
            "mean of its pairs of trials measured side by side, the processes' offset it "
            "measured allowed for"
        )
    elif ROUNDS in sources and c.paired_processes:
        parts.append(
            f"{c.paired_processes} process pairs of a paired run (llmenergy ab), paired "
            "process by process, each a robust (Huber) mean of its pairs of trials measured "
            "side by side"
        )
    elif ROUNDS in sources and c.paired_trials:
        parts.append(
            "pairs of trials measured side by side (llmenergy ab; a case that looks worse"
            " is measured up to its pair limit)"
        )
    elif ROUNDS in sources:
        paired = any(d.test is not None and d.test.paired for d in c.deltas)
        parts.append("the runs' own sessions" + (", paired round by round" if paired else ""))
    if HISTORY in sources:
        floored = any(d.test is not None and d.test.floored for d in c.deltas)
        parts.append(
            "saved runs of the same code"
            + (
                f" (saved back to back: not trusted below the assumed {c.session_noise:.0%})"
                if floored
                else ""
            )
        )
    if PRIOR in sources:
        parts.append(f"assumed {c.session_noise:.0%} (--energy-session-noise)")
    if any(d.exact for d in c.deltas):
        parts.append(f"counted, exact: {EXACT_EVIDENCE}")
    return "; ".join(parts) or "none"


def evidence_line(c: Comparison) -> str:
    """What the verdict rests on, the smallest regression it could see, and what would
    make it see more."""
    gated = sum(1 for d in c.deltas if d.gate is not None)
    if not gated:
        return ""
    if all(d.exact for d in c.deltas if d.gate is not None):
        return (
            f"gate on counted work: {gated} gated figure(s), counted, exact: "
            f"{EXACT_EVIDENCE}; any worsening beyond the gate fails"
        )
    found = detectable(c)
    sees = f"detects >= {found:.0%} here" if math.isfinite(found) else "detects nothing here"
    text = (
        f"gate {sees} (median case, 80 % power): {gated} gated figure(s), Benjamini-Hochberg "
        f"at {1 - c.confidence:.2g} false discovery rate; between-session noise: "
        f"{evidence_text(c)}"
    )
    if c.speed_note:
        text += f"; {c.speed_note}"
    thresholds = [g.threshold for g in c.gates if g.relative]
    blind = bool(thresholds) and math.isfinite(found) and found > max(thresholds)
    side_by_side = c.paired_trials or c.paired_processes
    if blind and not c.paired_trials:
        text += f"; it cannot see a regression of its own threshold ({max(thresholds):.0%})"
    if blind and c.paired_processes:
        text += "; more process pairs (llmenergy ab --processes) see smaller regressions"
    if (blind and not side_by_side) or any(
        d.test is not None and d.test.source == PRIOR for d in c.deltas
    ):
        floored = any(d.test is not None and d.test.floored for d in c.deltas)
        sessions = (
            "the baseline in sessions hours apart (saves within an hour of each other teach "
            "no less than the assumed noise)"
            if floored
            else "the baseline in several sessions (--energy-save=NAME three times, then "
            "--energy-compare=NAME learns the noise)"
        )
        text += (
            "; to see smaller regressions, measure base and head side by side "
            f"(llmenergy ab BASE_DIR HEAD_DIR), or {sessions}"
        )
    return text


# The options these sentences name are pytest's; ``llmenergy compare`` and ``report`` say
# them by their own names (a user of the command has no --energy-strict to give it).
COMMAND_FLAGS = {"--energy-strict": "--strict", "--energy-session-noise": "--session-noise"}


def said_by_command(text: str) -> str:
    """``text`` with the pytest options it names as the ``llmenergy`` commands name them."""
    for pytest_flag, flag in COMMAND_FLAGS.items():
        text = text.replace(pytest_flag, flag)
    return text


def verdict_lines(c: Comparison, strict: bool = False) -> list[str]:
    """The gate's verdict, then (gated) what it rests on and the smallest regression it
    could have seen."""
    evidence = evidence_line(c) if c.gates and c.deltas else ""
    return [verdict_line(c, strict), *([evidence] if evidence else []), *why_lines(c)]


def why_lines(c: Comparison) -> list[str]:
    """One line per failed case: why it got worse (``explain``)."""
    failing = {d.name for d in c.failures}  # a paired run's unconfirmed ones are not
    return [f"why {w.name}: {w.line}" for w in c.explanations if w.name in failing]


def verdict_line(c: Comparison, strict: bool = False) -> str:
    """One line; ``strict``: what the gate could not judge fails it, and the line says
    so first."""
    line = _verdict(c)
    return f"FAILED (strict): {line}" if strict and c.unsure and not c.failed else line


def _listed(names: Sequence[str], limit: int = 8) -> str:
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" and {more} more" if more > 0 else "")


def _nothing_compared(c: Comparison, gates: str) -> str:
    """Why a gate judged nothing, and what to do."""
    if c.shared:
        figures = ", ".join(dict.fromkeys(g.metric for g in c.gates))
        why = (
            f"the {c.shared} case(s) in both runs have no {figures} per trial; gate on a "
            "figure they have (llmenergy metrics lists them)"
        )
        if any(g.figure.exact for g in c.gates):
            why += "; counted work is kept only by runs with --energy-count-work"
    elif c.only_in_current:
        why = (
            f"none of the {len(c.only_in_current)} case(s) of {c.current_label} is in "
            f"{c.baseline_label} (renamed tests, or other tests); compare with a run of the "
            "same tests, or save a new baseline"
        )
    else:
        why = f"{c.current_label} measured no case; run the gated tests, or drop the gate"
    return f"energy gate FAILED ({gates}): nothing compared: {why}"


def _one_sided(c: Comparison) -> str:
    """The cases a gate did not judge because one run lacks them."""
    sides = ((c.baseline_label, c.only_in_baseline), (c.current_label, c.only_in_current))
    parts = [f"only in {label}: {_listed(names)}" for label, names in sides if names]
    if not parts:
        return ""
    return f"; not judged, on one side only: {'; '.join(parts)} (--energy-strict fails on this)"


def _verdict(c: Comparison) -> str:
    failures = c.failures
    gates = ", ".join(str(g) for g in c.gates)
    if c.all_busy:
        n = len(c.busy_unmeasured)
        return (
            f"energy gate inconclusive: other processes kept the machine busy during every "
            f"trial of {n} case(s), so nothing was compared; rerun on a quiet machine "
            "(--energy-strict fails the session on this)"
        )
    if c.compared_nothing:
        return _nothing_compared(c, gates)
    if c.not_comparable and not any(d.gate is not None for d in c.deltas):
        return f"not gated: {c.not_comparable}"
    if not c.deltas:
        return (
            f"nothing compared: no case of {c.current_label} has the compared figures in "
            f"{c.baseline_label} (different case ids, or a metric these cases lack)"
        )
    if not c.gates:
        return f"compared {len(c.deltas)} figures against {c.baseline_label}"
    unjudged = (
        f"; only counted work gated, the rest not: {c.not_comparable}" if c.meters_differ else ""
    )
    if failures:
        cases = sorted({d.name for d in failures})
        return (
            f"energy gate FAILED ({gates}): {len(failures)} significant regression(s) in "
            f"{len(cases)} case(s): {', '.join(cases)}{unjudged}"
        )
    extra = _not_gated(c, unjudged)
    inconclusive = _inconclusive(c)
    if inconclusive:
        return (
            f"energy gate inconclusive ({gates}): {inconclusive} "
            f"(--energy-strict fails the session on this){extra}{_one_sided(c)}"
        )
    return f"energy gate passed ({gates}): no significant regression{extra}{_one_sided(c)}"


def _not_gated(c: Comparison, unjudged: str) -> str:
    """What a passing gate left out, and why: figures over the threshold but not
    significant or too few to test, cases below resolution, rejected, of another model
    or execution, undecided or unconfirmed (each ``; ...``, empty if none); ``unjudged``
    where the meters differ, after the resolution's."""
    below = sum(1 for d in c.deltas if d.verdict == UNRESOLVED)
    noise = sum(1 for d in c.deltas if d.verdict == NOT_SIGNIFICANT)
    untested = sum(1 for d in c.deltas if d.verdict == TOO_FEW)
    extra = f"; {noise} over the threshold but not significant" if noise else ""
    if untested:
        extra += f"; {untested} over the threshold with too few trials to test"
    if below:
        extra += f"; {below} not gated: shorter than the meter resolves"
    extra += unjudged
    unstable = sorted({d.name for d in c.deltas if d.verdict == UNSTABLE})
    if unstable:
        extra += (
            f"; {len(unstable)} case(s) not gated: configurations rejected for their steady "
            f"window (ML.ENERGY's rules, --llm-min-steady, --llm-min-batch-fill): "
            f"{_listed(unstable)}"
        )
    invalid = sorted({d.name for d in c.deltas if d.verdict == INVALID_TELEMETRY})
    if invalid:
        extra += (
            f"; {len(invalid)} case(s) not gated: invalid power telemetry "
            f"(--energy-max-sample-gap): {_listed(invalid)}"
        )
    other = sum(1 for d in c.deltas if d.verdict == OTHER_MODEL)
    if other:
        extra += f"; {other} not gated: the model of that name has another config"
    executions = sum(1 for d in c.deltas if d.verdict == OTHER_EXECUTION)
    if executions:
        extra += (
            f"; {executions} not gated: the models ran in another execution (eager against "
            "compiled, --llm-execution)"
        )
    undecided = sorted({d.name for d in c.deltas if d.verdict == UNDECIDED})
    if undecided:
        extra += (
            f"; {len(undecided)} undecided: their own pairs still spanned several gates at "
            f"their limit (more --energy-max-trials, or a quieter machine): {_listed(undecided)}"
        )
    unconfirmed = sorted({d.name for d in c.deltas if d.verdict == UNCONFIRMED})
    if unconfirmed:
        extra += (
            f"; {len(unconfirmed)} failed at first but not again in fresh processes: "
            f"{_listed(unconfirmed)}"
        )
    return extra


def _inconclusive(c: Comparison) -> str:
    """Why cases that look worse were not judged: a busy machine, or its speed's drift
    (empty if none)."""
    busy = sorted({d.name for d in c.inconclusive if d.busy})
    drifted = sorted({d.name for d in c.inconclusive if not d.busy})
    if busy or drifted:
        why = []
        if busy:
            why.append(
                f"the machine was busy with other work during {len(busy)} case(s) that "
                f"look worse: {', '.join(busy)}; rerun on a quiet machine"
            )
        if drifted:
            why.append(
                f"{len(drifted)} case(s) are worse by less than the gate plus the "
                f"machine's own speed difference ({c.drift:.0%}{c.drift_note}): "
                f"{', '.join(drifted)}; compare runs made in one job (the example "
                "workflow alternates them)"
            )
        return "; ".join(why)
    return ""


# -- several runs, side by side (e.g. across hardware) ------------------------------------
@dataclass(frozen=True)
class Lineup:
    """Runs to put side by side, each with its label and cases.  Tables head the runs'
    columns ``#1 base``, ``#2``, ... and name them in a legend (``#1 = 0001_main, the
    baseline``): run labels (autosave names, hardware keys) are too long for a terminal's
    columns."""

    labels: tuple[str, ...]
    cases: tuple[tuple[CaseResult, ...], ...]
    # each run's hardware (its storage folder's name), named in the legend where the runs
    # were made on different machines and a label does not already say which
    machines: tuple[str, ...] = ()

    @property
    def short(self) -> tuple[str, ...]:
        return tuple(f"#{i + 1}" + (" base" if i == 0 else "") for i in range(len(self.labels)))

    @property
    def legend(self) -> tuple[str, ...]:
        return tuple(
            f"#{i + 1} = {label}{self._on(i)}" + (", the baseline" if i == 0 else "")
            for i, label in enumerate(self.labels)
        )

    def _on(self, i: int) -> str:
        """`` on MACHINE`` where the runs' machines differ ("" where they do not)."""
        if len(set(self.machines)) < 2 or not self.machines[i]:
            return ""
        return "" if self.machines[i] in self.labels[i] else f" on {self.machines[i]}"


def side_by_side(lineup: Lineup, metric_key: str, *, confidence: float = 0.95) -> Table:
    """The same case ids across runs, with each later run's ratio to the first."""
    m = figure(metric_key, per_trial=True)
    by_run = [{c.nodeid: c for c in cases if c.measured} for cases in lineup.cases]
    order: list[CaseResult] = []
    seen: set[str] = set()
    for cases in by_run:
        for nodeid, case in cases.items():
            if nodeid not in seen:
                seen.add(nodeid)
                order.append(case)
    order.sort(
        key=lambda c: (
            c.nodeid.split("[", 1)[0],
            c.labels.get("model", ""),
            c.input_tokens,
            c.output_tokens,
            c.nodeid,
        )
    )
    names = distinct_names([c.nodeid for c in order])
    first = lineup.labels[0]
    keys = ["case", "nodeid", "tokens_in", "tokens_out", *lineup.labels]
    headers = ["case", "node id", "in", "out", *lineup.short]
    priorities = [0, 0, 1, 1, *([0] * len(lineup.labels))]
    for label, short in zip(lineup.labels[1:], lineup.short[1:]):
        keys.append(f"{label}/{first}")
        headers.append(f"{short}/#1")
        priorities.append(0)
    rows, cells = [], []
    estimated = False
    for case in order:
        means: list[float | None] = []
        for cases in by_run:
            other = cases.get(case.nodeid)
            if m.exact:  # counted: the case's one value
                means.append(number_or_none(m.value(other)) if other is not None else None)
                continue
            values = m.trial_values(other) if other is not None else None
            means.append(summarize(values, confidence).mean if values else None)
            estimated = estimated or bool(other is not None and other.estimated)
        ratios = [(x / means[0]) if (x is not None and means[0]) else None for x in means[1:]]
        rows.append(
            (case.name, case.nodeid, case.input_tokens, case.output_tokens, *means, *ratios)
        )
        cells.append(
            (
                names[case.nodeid],
                case.nodeid,
                str(case.input_tokens),
                str(case.output_tokens),
                *(fmt_number(x) for x in means),
                *("—" if r is None else f"{r:.3g}\u00d7" for r in ratios),
            )
        )
    notes = []
    if estimated:
        notes.append("some runs are estimates (no energy sensor); compare them with care")
    return Table(
        title=f"{m.label} ({m.key}), side by side",
        keys=tuple(keys),
        headers=tuple(headers),
        rows=tuple(rows),
        cells=tuple(cells),
        notes=tuple(notes),
        hidden=("nodeid",),  # in csv/json: tells apart same-named tests of two files
        priorities=tuple(priorities),
        legend=lineup.legend,
        wraps=(("case", 16, 0),),  # folded only once in and out are left out
    )
