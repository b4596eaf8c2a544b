"""Comparing runs: per-case deltas and energy gates for CI (their text: ``comparison_text``).

A gate such as ``j_per_token:5%`` fails a case only when the figure got worse by
more than the threshold *and* the worsening is significant once the variance between
sessions is counted (see ``sessions.py``: a session's trials agree far better than two
sessions do), with the false discovery rate over every gated case held at one minus the
confidence (Benjamini-Hochberg): noise must not fail CI, and many cases must not either.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from functools import cached_property

from .explain import Why, why
from .figures import (
    DEFAULT_COMPARE_METRICS,
    FIGURES,
    Figure,
    figure,
    format_amount,
    parse_figure_threshold,
    resolved,
)
from .results import PREFILL_PASSES, CaseResult, Trial, distinct_names
from .serving_rules import rejections
from .sessions import (
    DEFAULT_SESSION_NOISE,
    FirstPair,
    NoiseEstimate,
    ProcessNoise,
    SideSessions,
    Test,
    benjamini_hochberg,
    bh_adjusted,
    build_tests,
    side_sessions,
)
from .stats import (
    MAD_EFFICIENCY,
    Summary,
    huber_location,
    huber_variance_factor,
    mad_scale,
    summarize,
)
from .values import words

GATE_EXAMPLES = "j_per_token:5%, energy_j:10%, time_s:0.5s"


@dataclass(frozen=True)
class Gate:
    """``figure:threshold``: how much worse a case may get before it fails.  Worse is
    higher for most figures, lower for throughput (the figure's ``lower_is_better``)."""

    metric: str  # a figure key with a per-trial value
    threshold: float  # a fraction of the baseline mean when relative, else the figure's unit
    relative: bool

    @property
    def figure(self) -> Figure:
        return FIGURES[self.metric]

    def allowed(self, baseline_mean: float) -> float:
        return self.threshold * abs(baseline_mean) if self.relative else self.threshold

    def worsening(self, baseline_mean: float, current_mean: float) -> float:
        """How much worse the current mean is, in the figure's unit (negative: better)."""
        change = current_mean - baseline_mean
        return -change if self.figure.lower_is_better is False else change

    def exceeded(self, baseline_mean: float, current_mean: float) -> bool:
        return self.worsening(baseline_mean, current_mean) > self.allowed(baseline_mean)

    def __str__(self) -> str:
        return format_amount(self.figure, self.threshold, self.relative)


def parse_gate(text: str) -> Gate:
    f, value, relative = parse_figure_threshold(text, GATE_EXAMPLES)
    return Gate(f.key, value, relative)


def parse_gates(texts: str | Iterable[str]) -> tuple[Gate, ...]:
    """Comma- or space-separated gates, or a list of them."""
    return tuple(parse_gate(p) for p in words(texts, "gate", GATE_EXAMPLES))


# -- one case, one metric --------------------------------------------------------------
FAIL = "FAIL"
NOT_SIGNIFICANT = "not significant"
TOO_FEW = "too few trials"
BUSY = "inconclusive: machine busy"
DRIFT = "inconclusive: machine speed"
UNRESOLVED = "below resolution"
UNSTABLE = "rejected: no steady window (ML.ENERGY's rules)"
# A sampling meter's trial without every device read, with a hole in its samples, or
# with an edge of its window unsampled (meters/validity.py): shown, never gated.
INVALID_TELEMETRY = "invalid telemetry"
OTHER_MODEL = "another model config"
OTHER_EXECUTION = "another execution"  # eager against compiled (--llm-execution)
# A paired run's FAIL that fresh processes of both sides did not repeat (llmenergy ab).
UNCONFIRMED = "not confirmed"
# A paired run's case whose own pairs still spanned several gates when its limit came: it
# passed nothing (``pairing.turns.OWN_SPAN_GATES``).
UNDECIDED = "undecided: its pairs disagree"
# What a gate on a counted figure rests on (``Figure.exact``).
EXACT_EVIDENCE = (
    "no noise (the same code, inputs and library versions count the same work in every "
    "session, on every machine)"
)
OK = "ok"


@dataclass(frozen=True)
class Delta:
    """How one metric of one case moved from the baseline run to the current one."""

    nodeid: str
    name: str
    metric: str
    baseline: Summary
    current: Summary
    # Two-sided, with the variance between sessions counted (sessions.Test); None with
    # fewer than two trials on a side.
    p_value: float | None
    confidence: float
    gate: Gate | None = None
    # Either run had many trials of this case disturbed by other work on the machine
    # (``mostly_busy``): what looks like a regression may be the machine, so it cannot
    # fail a gate.
    busy: bool = False
    # Measured, on either side, over stretches shorter than the meter resolves: the
    # figure is shown but never gated.
    unresolved: bool = False
    # A server's bursts, on either side, without a steady window worth measuring (their
    # batch never held all requests, or not for long enough): shown, never gated.
    unstable: bool = False
    # Either side's power telemetry was not valid (meters/validity.py): shown, never gated.
    invalid_telemetry: bool = False
    # How much the machine's own speed differed beyond its reference's noise (a
    # fraction, see probes/reference.py): a regression within the gate plus this is one
    # the machine could explain.
    drift: float = 0.0
    # The two runs' cases ran models of the same name but another config (see
    # llm.loader.config_hash): shown, never gated.
    other_model: bool = False
    # The two cases' models generated otherwise: eager against compiled (the case label
    # ``execution``, absent: eager), which changes time and energy by design.
    other_execution: bool = False
    # The session-level test behind p_value, and whether the worsening survived the
    # correction for many cases (Benjamini-Hochberg over the comparison's gated deltas).
    test: Test | None = None
    discovered: bool = False
    # The smallest relative regression this comparison could have found here.
    detectable: float = math.nan
    # Gated: the one-sided p of a worsening, adjusted for the many gated cases
    # (Benjamini-Hochberg): the case is significant exactly when it is <= 1 - confidence.
    p_adjusted: float | None = None
    # How much the machine's speed alone moved this figure from the baseline's session(s)
    # to the current's (from the speed reference, see ``session_speeds``): the test and
    # the gate judge the current figure divided by it.  1: not normalized.
    speed: float = 1.0
    # A paired run's FAIL that a second pass in fresh processes did not repeat: each
    # process has an offset of its own that its pairs cannot cancel (llmenergy ab).
    unconfirmed: bool = False
    # A counted figure (``Figure.exact``): one value per side, no noise, so any change
    # is real and a worsening beyond the gate fails with no test.
    exact: bool = False
    # A paired run's case that stopped at its limit with its own pairs spanning several
    # gates: not passed on the noise it borrowed from other cases.
    undecided: bool = False

    @property
    def change(self) -> float:
        return self.current.mean - self.baseline.mean

    @property
    def relative_change(self) -> float:
        """The means' change as measured, the machine's speed left in (``judged_change``
        is the one tables show)."""
        return self.change / abs(self.baseline.mean) if self.baseline.mean else math.nan

    @property
    def judged_ratio(self) -> float:
        """current / baseline as the test judges it: the machine's speed taken out
        (``speed``), from the test's log ratio where there is one (the sessions' log
        means, a paired run's pairs), else from the means; NaN unless both are positive.
        The one ratio every table shows, so its ratio and change always agree."""
        if self.test is not None and math.isfinite(self.test.log_ratio):
            return math.exp(self.test.log_ratio)
        if self.baseline.mean > 0 and self.current.mean > 0:
            return self.current.mean / self.speed / self.baseline.mean
        return math.nan

    @property
    def judged_change(self) -> float:
        """``judged_ratio`` - 1 as a fraction: the change tables show beside the ratio;
        with a mean not positive, the means' change with the speed taken out."""
        ratio = self.judged_ratio
        if math.isfinite(ratio):
            return ratio - 1.0
        if not self.baseline.mean:
            return math.nan
        return (self.current.mean / self.speed - self.baseline.mean) / abs(self.baseline.mean)

    @property
    def shown_p(self) -> float | None:
        """The p a table shows: the one the verdict was decided on (gated: the
        worsening's, adjusted for the many cases), else the two-sided p."""
        return self.p_adjusted if self.gate is not None else self.p_value

    @property
    def significant(self) -> bool:
        if self.exact:
            return self.change != 0
        if self.gate is not None:
            return self.discovered
        return self.p_value is not None and self.p_value < 1.0 - self.confidence

    @property
    def exceeded(self) -> bool:
        current = self.current.mean / self.speed
        return self.gate is not None and self.gate.exceeded(self.baseline.mean, current)

    @property
    def drifted(self) -> bool:
        """Worse beyond the gate, but not beyond the gate plus the machine's speed drift."""
        if self.gate is None or self.drift <= 0 or self.exact:
            return False
        worse = self.gate.worsening(self.baseline.mean, self.current.mean)
        return worse <= self.gate.allowed(self.baseline.mean) + self.drift * abs(self.baseline.mean)

    @property
    def failed(self) -> bool:
        if self.exact:  # the machine's business, speed or meter cannot move it
            return self.exceeded and not (
                self.other_model or self.other_execution or self.unconfirmed
            )
        return (
            self.exceeded
            and self.significant
            and not (
                self.busy
                or self.unresolved
                or self.unstable
                or self.invalid_telemetry
                or self.drifted
                or self.other_model
                or self.other_execution
                or self.unconfirmed
            )
        )

    @property
    def inconclusive(self) -> bool:
        """It would have failed, but the machine was busy or ran at another speed."""
        return not self.exact and self.exceeded and self.significant and (self.busy or self.drifted)

    @property
    def verdict(self) -> str:
        if self.gate is None:
            return ""
        if self.other_model:
            return OTHER_MODEL
        if self.other_execution:
            return OTHER_EXECUTION
        if self.unresolved:
            return UNRESOLVED
        if self.unstable:
            return UNSTABLE
        if self.invalid_telemetry:
            return INVALID_TELEMETRY
        if self.undecided and not self.failed:
            return UNDECIDED
        if not self.exceeded:
            return OK
        if self.exact:
            return UNCONFIRMED if self.unconfirmed else FAIL
        if self.p_value is None:
            return TOO_FEW
        if not self.significant:
            return NOT_SIGNIFICANT
        if self.busy:
            return BUSY
        if self.drifted:
            return DRIFT
        return UNCONFIRMED if self.unconfirmed else FAIL


def session_values(
    f: Figure, case: CaseResult, pairs: Set[int] | None = None
) -> dict[int, list[float]] | None:
    """The figure's trial values, by the session each trial was measured in (a pooled
    run keeps several; a single run has one).  ``pairs``: by the pair each trial belongs
    to in a paired run (``llmenergy ab``), only these pairs: each pair is a session of
    its own, so the test pairs the two sides trial by trial."""
    values = f.trial_values(case)
    if values is None:
        return None
    out: dict[int, list[float]] = {}
    for trial, value in zip(figure_trials(f, case), values):
        if pairs is None:
            out.setdefault(trial.session, []).append(value)
        elif trial.pair in pairs:
            out.setdefault(trial.pair, []).append(value)
    return out


def figure_trials(f: Figure, case: CaseResult) -> tuple[Trial, ...]:
    """The trials a figure's values come from, in the same order (``trial_values``):
    the prefill passes for a prefill-pass figure, else the case's trials."""
    return case.prefill_passes if f.source == PREFILL_PASSES else case.trials


def case_sessions(
    f: Figure,
    case: CaseResult,
    log_offsets: Mapping[int, float] | None = None,
    pairs: Set[int] | None = None,
) -> SideSessions | None:
    by_session = session_values(f, case, pairs)
    return side_sessions(by_session, log_offsets) if by_session else None


def common_pairs(base: CaseResult, head: CaseResult) -> frozenset[int]:
    """The pairs both sides of a paired run measured (their trials' ``pair``)."""
    return frozenset(t.pair for t in base.trials if t.pair) & frozenset(
        t.pair for t in head.trials if t.pair
    )


# How a figure follows the machine's speed: times, and the joules, grams and money of
# CPU work, grow on a slower machine; throughputs fall; power stays.
SPEED_EXPONENT = {"s": 1, "J": 1, "g": 1, "money": 1, "tokens/s": -1}
# A session's speed is the median of its cases' readings: with fewer cases, one slow
# reading would move it (and a lone case's own reading did not help in A/A runs).
MIN_SPEED_CASES = 5


def session_speeds(cases: Iterable[CaseResult]) -> dict[int, float]:
    """Per session, the log of the machine-speed reference (probes/reference.py): the
    median over the cases of their reading in that session.  Sessions of unchanged code
    differ here mostly by a factor common to all cases, and the reference follows it
    (correlation 0.86-0.95 in A/A runs; docs/evidence.md)."""
    readings: dict[int, list[float]] = {}
    for case in cases:
        seen: dict[int, float] = {}
        for t in case.trials:
            ref = t.reference_s if t.reference_s is not None else case.reference_s
            if ref is not None and ref > 0:
                seen[t.session] = ref
        for session, ref in seen.items():
            readings.setdefault(session, []).append(math.log(ref))
    return {s: statistics.median(v) for s, v in readings.items() if len(v) >= MIN_SPEED_CASES}


def speed_exponent(f: Figure, *cases: CaseResult) -> int:
    """How the figure of these cases follows the CPU's speed; 0 where it need not: GPU
    energy and time, and a server's (which may run elsewhere)."""
    for case in cases:
        if any(d.startswith("gpu") for d in case.counted) or any(t.requests for t in case.trials):
            return 0
    return SPEED_EXPONENT.get(f.unit, 0)


def speed_offsets(
    case: CaseResult, speeds: Mapping[int, float], exponent: int, center: float
) -> dict[int, float] | None:
    """Each session's log offset, or None unless every session of the case has a speed."""
    sessions = {t.session for t in case.trials}
    if not exponent or not sessions or not sessions <= speeds.keys():
        return None
    return {s: exponent * (speeds[s] - center) for s in sessions}


def speed_note(base: Mapping[int, float], head: Mapping[int, float]) -> str:
    if not base or not head:
        return ""
    b, h = math.exp(statistics.fmean(base.values())), math.exp(statistics.fmean(head.values()))
    return (
        f"normalized by the machine's speed (reference {b * 1e3:.2f} ms in the baseline, "
        f"{h * 1e3:.2f} ms now, {h / b - 1:+.0%}; CPU-measured figures only)"
    )


def delta(
    baseline: CaseResult,
    current: CaseResult,
    metric_key: str,
    *,
    confidence: float = 0.95,
    gate: Gate | None = None,
    drift: float = 0.0,
    session_noise: float = DEFAULT_SESSION_NOISE,
) -> Delta | None:
    """One case alone (no correction for others; ``compare_cases`` does that).  None when
    either case lacks the metric (no trials, or no prefill/decode split)."""
    found = compare_cases(
        [baseline],
        [current],
        CompareOptions(
            gates=(gate,) if gate is not None else (),
            metrics=(metric_key,),
            confidence=confidence,
            drift=drift,
            session_noise=session_noise,
        ),
    ).deltas
    return found[0] if found else None


def _other_model(a: CaseResult, b: CaseResult) -> bool:
    """Both cases know their model's config hash, and the hashes differ."""
    ha, hb = a.labels.get("model_config"), b.labels.get("model_config")
    return bool(ha and hb and ha != hb)


def _other_execution(a: CaseResult, b: CaseResult) -> bool:
    """The two cases ran their models in another execution (eager when unlabelled)."""
    return a.labels.get("execution", "eager") != b.labels.get("execution", "eager")


def _exact(gate: Gate) -> bool:
    return figure(gate.metric, per_trial=True, warn=False).exact


def other_hardware(baseline: str, current: str) -> str:
    """One line when two runs come from other hardware (their storage folders' names:
    CPU, GPUs, meter), as pytest-benchmark warns of another machine_info; else ""."""
    if not baseline or not current or baseline == current:
        return ""
    return (
        f"other hardware: {baseline} against {current}, so what changed includes the "
        "machine, whose speed is not taken out"
    )


def unlike_meters(
    baseline: Mapping[str, str],
    current: Mapping[str, str],
    *,
    baseline_label: str = "baseline",
    current_label: str = "this run",
) -> str:
    """Empty when two runs' meters measure alike, else one line saying how they differ,
    e.g. ``baseline: TDP 20 W, this run: TDP 40 W; energies not comparable``."""
    keys = [k for k in dict.fromkeys([*baseline, *current]) if baseline.get(k) != current.get(k)]
    if not keys:
        return ""

    def side(identity: Mapping[str, str]) -> str:
        return ", ".join(f"{k} {identity.get(k) or 'none'}" for k in keys)

    return (
        f"{baseline_label}: {side(baseline)}, {current_label}: {side(current)}; "
        "energies not comparable"
    )


# -- two runs ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Regressed:
    """A case that failed its gate, on both sides: what its explanation is read from."""

    name: str
    baseline: CaseResult
    current: CaseResult


def explain_regressions(regressed: Iterable[Regressed]) -> tuple[Why, ...]:
    """Each failed case's explanation: its line and its tables."""
    return tuple(why(r.name, r.baseline, r.current) for r in regressed)


@dataclass(frozen=True)
class Comparison:
    baseline_label: str
    current_label: str
    confidence: float
    gates: tuple[Gate, ...]
    deltas: tuple[Delta, ...]
    only_in_baseline: tuple[str, ...] = ()
    only_in_current: tuple[str, ...] = ()
    # Why the two runs' figures cannot be compared at all (other meter settings): then
    # the figures are shown but nothing is gated.
    not_comparable: str = ""
    drift: float = 0.0  # the machine's speed difference the gates allowed for
    drift_note: str = ""  # how it was measured, for the verdict line
    # Cases of the current run with no undisturbed trial: the machine was busy throughout.
    busy_unmeasured: tuple[str, ...] = ()
    session_noise: float = DEFAULT_SESSION_NOISE  # assumed where nothing else tells
    speed_note: str = ""  # how the figures were normalized by the machine's speed
    # The runs are the two sides of one paired run, tested pair of trials by pair.
    paired_trials: bool = False
    # ... or on the means of this many process pairs of a paired run (0: not so).
    paired_processes: int = 0
    shared: int = 0  # cases measured in both runs
    # The failed cases on both sides, what ``explanations`` reads.
    regressed: tuple[Regressed, ...] = ()

    @cached_property
    def explanations(self) -> tuple[Why, ...]:
        """Why each failed case got worse (``explain``), by case name: more work or the
        same work done slower, and what moved most.  Built when asked, from the cases:
        presentation, not the comparison's statistics."""
        return explain_regressions(self.regressed)

    @property
    def failures(self) -> list[Delta]:
        return [d for d in self.deltas if d.failed]

    @property
    def inconclusive(self) -> list[Delta]:
        return [d for d in self.deltas if d.inconclusive]

    @property
    def all_busy(self) -> bool:
        """Nothing compared because the machine was busy through every case of this run:
        inconclusive (the machine's fault, not the code's), as a busy case is."""
        return not (self.deltas or self.only_in_current or self.shared) and bool(
            self.busy_unmeasured
        )

    @property
    def compared_nothing(self) -> bool:
        """A gate that judged no figure of any case: renamed tests, another suite, or a
        figure the cases lack.  It fails, or renaming the tests would pass any gate."""
        return bool(self.gates) and not self.deltas and not self.all_busy

    @property
    def unsure(self) -> bool:
        """Something a gate could not judge: what ``--energy-strict`` fails on (cases on
        one side only among it: a gate must not pass by leaving cases out)."""
        one_sided = self.only_in_baseline or self.only_in_current
        undecided = any(d.verdict == UNDECIDED for d in self.deltas)
        return bool(self.gates) and bool(
            self.inconclusive
            or self.busy_unmeasured
            or self.meters_differ
            or one_sided
            or undecided
        )

    def shown_verdict(self, d: Delta) -> str:
        """A figure's verdict as tables show it: ``not gated`` where other meters left it
        unjudged."""
        return "not gated" if self.not_comparable and d.gate is None else d.verdict

    @property
    def meters_differ(self) -> bool:
        """Gates left unjudged because the runs' meters measure differently (a gate on
        counted work is judged all the same)."""
        return bool(self.not_comparable) and not all(_exact(g) for g in self.gates)

    @property
    def failed(self) -> bool:
        return bool(self.failures) or self.compared_nothing

    def fails(self, strict: bool) -> bool:
        """The gate's decision; ``strict`` (``--energy-strict``, ``compare --strict``):
        what it could not judge fails it too."""
        return self.failed or (strict and self.unsure)


@dataclass(frozen=True)
class CompareOptions:
    """How ``compare_cases`` compares two runs.

    With ``gates``, their figures are compared; else ``metrics``.  ``not_comparable``
    (why the runs' energies differ in kind) shows the gates' figures without gating
    them.  ``history`` (key ``nodeid figure``) is the between-session noise learned from
    earlier runs of the same code; without it and without several sessions per side,
    ``session_noise`` is assumed.  ``normalize``: CPU-measured figures are divided by
    each session's machine speed (``session_speeds``) before they are tested.
    ``paired``: the two runs are the sides of one paired run (``llmenergy ab``): each case
    is tested on its pairs of trials, which shared the machine's speed, so nothing is
    normalized."""

    gates: Sequence[Gate] = ()
    metrics: Sequence[str] | None = None
    confidence: float = 0.95
    baseline_label: str = "baseline"
    current_label: str = "current"
    not_comparable: str = ""
    drift: float = 0.0
    drift_note: str = ""
    session_noise: float = DEFAULT_SESSION_NOISE
    history: Mapping[str, NoiseEstimate] | None = None
    normalize: bool = True
    # The runs come from other hardware (``other_hardware``): said beside the evidence.
    hardware_note: str = ""
    paired: bool = False
    # With ``paired``: the sides were measured in this many process pairs, one after the
    # other (``llmenergy ab --processes``), each numbered as a session: each case is
    # tested on its process pairs' means, paired process by process, since a process's
    # offset does not cancel over its own pairs of trials.  0: tested on the pairs.
    processes: int = 0
    # With ``processes``: the variance of a process's offset that the run measured after
    # its first process pair (``sessions.plan_processes``): a case measured in one
    # process pair only is tested on it with at least this offset allowed for.
    process_offset: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "gates", tuple(self.gates))
        if self.metrics is not None:
            object.__setattr__(self, "metrics", tuple(self.metrics))

    @property
    def by_speed(self) -> bool:
        """Whether figures are normalized by the sessions' machine speed."""
        return self.normalize and not self.paired

    def checks(self) -> list[tuple[str, Gate | None]]:
        """Each compared figure, with its gate (None: shown, not gated)."""
        if not self.gates:
            keys = self.metrics or DEFAULT_COMPARE_METRICS
            return [(figure(k, per_trial=True).key, None) for k in keys]
        # Other meters: energies are not gated, counted work still is (no meter counts it).
        return [
            (g.metric, None if self.not_comparable and not _exact(g) else g) for g in self.gates
        ]


@dataclass(frozen=True)
class _Speeds:
    """Each side's sessions' machine speed (their log, ``session_speeds``); empty when
    figures are not normalized."""

    base: Mapping[int, float]
    head: Mapping[int, float]

    @classmethod
    def of(cls, base: Iterable[CaseResult], head: Iterable[CaseResult], wanted: bool) -> _Speeds:
        return cls(session_speeds(base), session_speeds(head)) if wanted else cls({}, {})

    @property
    def center(self) -> float:
        """The baseline's mean speed: the offsets are taken from it."""
        return statistics.fmean(self.base.values()) if self.base else 0.0


@dataclass(frozen=True)
class _Found:
    """One figure of one case, found in both runs: what its delta is built from."""

    key: str  # where its between-session noise is kept (``noise_key``)
    base: CaseResult
    case: CaseResult
    figure: Figure
    gate: Gate | None
    values: tuple[Sequence[float], Sequence[float]]  # baseline's, current's
    # How much the machine's speed alone moved the figure (1: not normalized).
    speed: float = 1.0
    # The test's two sides, by session (or pair); None: shown, never tested.
    sessions: tuple[SideSessions, SideSessions] | None = None
    budget: tuple[int, int] | None = None  # a paired case's pairs, and its pair limit
    normalized: bool = False
    paired: bool = False  # tested pair of trials by pair


@dataclass(frozen=True)
class _Correction:
    """A gated figure's part in the correction for many cases (Benjamini-Hochberg)."""

    discovered: bool = False
    detectable: float = math.nan
    p_adjusted: float | None = None


def compare_cases(
    baseline: Sequence[CaseResult],
    current: Sequence[CaseResult],
    options: CompareOptions | None = None,
) -> Comparison:
    """Cases are matched by node id and compared as ``options`` say (``CompareOptions``)."""
    o = options or CompareOptions()
    checks = o.checks()
    # A case whose every trial a busy machine disturbed has no measured figure, but its
    # counted work is as good as any: no load changes what is counted.
    counts = any(figure(k, per_trial=True, warn=False).exact for k, _ in checks)

    def usable(c: CaseResult) -> bool:
        return c.measured or (counts and c.work is not None)

    before = {c.nodeid: c for c in baseline if usable(c)}
    after = sorted((c for c in current if usable(c)), key=_case_order)
    # Cases are named in tables and messages by the shortest part of their node id that
    # tells them apart (test_a.py::test_small, TestK::test_small).
    names = distinct_names([c.nodeid for c in current])
    speeds = _Speeds.of(before.values(), after, o.by_speed)
    found = _found(before, after, checks, speeds, o.paired and not o.processes)
    # a server's configurations that ML.ENERGY's rules reject, on either side
    rejected = frozenset(rejections(baseline)) | frozenset(rejections(current))
    deltas = _deltas(found, names, o, rejected)
    now = {c.nodeid for c in after}
    return Comparison(
        baseline_label=o.baseline_label,
        current_label=o.current_label,
        confidence=o.confidence,
        gates=tuple(o.gates),
        deltas=deltas,
        only_in_baseline=tuple(sorted(set(before) - now)),
        only_in_current=tuple(sorted(now - set(before))),
        not_comparable=o.not_comparable,
        drift=o.drift,
        drift_note=o.drift_note,
        busy_unmeasured=tuple(names[c.nodeid] for c in current if not c.measured and c.busy),
        session_noise=o.session_noise,
        speed_note="; ".join(
            note
            for note in (
                speed_note(speeds.base, speeds.head)
                if any(m.normalized for m in found)
                else _unnormalized_note(before.values(), after, o.by_speed, checks),
                o.hardware_note,
            )
            if note
        ),
        paired_trials=any(m.paired for m in found),
        paired_processes=o.processes if o.paired else 0,
        shared=len(now & set(before)),
        regressed=_regressed(deltas, before, after, names),
    )


def _found(
    before: Mapping[str, CaseResult],
    after: Sequence[CaseResult],
    checks: Sequence[tuple[str, Gate | None]],
    speeds: _Speeds,
    paired: bool,
) -> list[_Found]:
    """The figures both runs have, case by case in the current run's order."""
    out = []
    for case in after:
        base = before.get(case.nodeid)
        if base is None:
            continue
        for key, gate in checks:
            f = figure(key, per_trial=True, warn=False)
            if f.exact:
                found = _find_exact(base, case, f, gate)
            else:
                found = _find_measured(base, case, f, gate, speeds, paired)
            if found is not None:
                out.append(found)
    return out


def _find_exact(base: CaseResult, case: CaseResult, f: Figure, gate: Gate | None) -> _Found | None:
    """A counted figure: compared as it is, no sessions, no test."""
    a, b = number_or_none(f.value(base)), number_or_none(f.value(case))
    if a is None or b is None:
        return None
    return _Found(noise_key(case.nodeid, f.key), base, case, f, gate, ([a], [b]))


def _find_measured(
    base: CaseResult,
    case: CaseResult,
    f: Figure,
    gate: Gate | None,
    speeds: _Speeds,
    paired: bool,
) -> _Found | None:
    """A measured figure, its sessions (or pairs) offset by their machine speed."""
    if not (base.measured and case.measured):
        return None
    a, b = f.trial_values(base), f.trial_values(case)
    if a is None or b is None:
        return None
    exponent = speed_exponent(f, base, case)
    base_off = speed_offsets(base, speeds.base, exponent, speeds.center)
    head_off = speed_offsets(case, speeds.head, exponent, speeds.center)
    if base_off is None or head_off is None:
        base_off = head_off = None
    both = common_pairs(base, case) if paired else None
    if both is not None and len(both) < 2:
        both = None  # too few pairs: the runs' own sessions, as unpaired
    sides = (case_sessions(f, base, base_off, both), case_sessions(f, case, head_off, both))
    speed = 1.0
    if base_off is not None and head_off is not None:
        shift = statistics.fmean(head_off.values()) - statistics.fmean(base_off.values())
        speed = math.exp(shift)
    budget = None
    if both is not None:
        limit = min(base.options.max_trials, case.options.max_trials)
        budget = (len(both), max(limit, len(both)))
    return _Found(
        noise_key(case.nodeid, f.key),
        base,
        case,
        f,
        gate,
        (a, b),
        speed=speed,
        sessions=(sides[0], sides[1]) if sides[0] is not None and sides[1] is not None else None,
        budget=budget,
        normalized=base_off is not None,
        paired=both is not None,
    )


def _deltas(
    found: Sequence[_Found],
    names: Mapping[str, str],
    o: CompareOptions,
    rejected: frozenset[str] = frozenset(),
) -> tuple[Delta, ...]:
    """Each found figure's delta, built once: every figure tested, then the gated ones
    corrected together for the many cases."""
    sides = {m.key: m.sessions for m in found if m.sessions is not None}
    within = {}
    if o.processes:
        within = process_noises(found)
    tests = build_tests(
        sides,
        history=o.history,
        session_noise=o.session_noise,
        processes=within,
        process_offset=o.process_offset,
    )
    p_values = [_p_two_sided(m, tests.get(m.key)) for m in found]
    corrections = _corrections(found, tests, p_values, 1.0 - o.confidence)
    return tuple(
        _delta(
            m,
            names[m.case.nodeid],
            tests.get(m.key),
            p,
            corrections.get(i, _Correction()),
            o,
            m.case.nodeid in rejected,
        )
        for i, (m, p) in enumerate(zip(found, p_values))
    )


def process_noises(found: Sequence[_Found]) -> dict[str, ProcessNoise]:
    """Each case's noise inside its process pairs, and each process pair's difference:
    Huber's estimate of its pairs' log differences rather than their mean, because a
    pair whose two trials straddle a jump in the machine's speed lies far off, and such
    pairs make the spread heavy-tailed (measured: docs/evidence.md).  The scale is the
    case's own (its pairs' median absolute deviation around their process pair's
    median), the variance factor is
    pooled over the cases.  What the two sides of a pair share in time cancels here, as
    in the pairs' means.  A case without a process pair of two pairs is left out."""
    fitted = {}
    residuals: list[float] = []
    for m in found:
        sessions = _session_differences(m.figure, m.base, m.case)
        if not any(len(d) >= 2 for d in sessions.values()):
            continue
        scale = mad_scale([x - statistics.median(d) for d in sessions.values() for x in d])
        centres = {s: huber_location(d, scale) for s, d in sessions.items()}
        if scale > 0:
            residuals += [(x - centres[s]) / scale for s, d in sessions.items() for x in d]
        fitted[m.key] = (sessions, scale, centres)
    factor = huber_variance_factor(residuals)
    noises = {}
    for key, (sessions, scale, centres) in fitted.items():
        sizes = [len(d) for d in sessions.values()]
        variance = statistics.fmean(factor * scale**2 / n for n in sizes)
        df = max(1.0, MAD_EFFICIENCY * sum(n - 1 for n in sizes))
        noises[key] = ProcessNoise(variance, df, tuple(centres[s] for s in sorted(sessions)))
    return noises


def first_process_pair(
    baseline: Sequence[CaseResult], current: Sequence[CaseResult], options: CompareOptions
) -> dict[str, tuple[str, FirstPair]]:
    """By gated figure of a paired run's first process pair: its case's node id, and
    what ``sessions.plan_processes`` judges the next process pairs on (worse positive,
    the gate in log units)."""
    o = replace(options, processes=1)
    before = {c.nodeid: c for c in baseline if c.measured}
    after = [c for c in current if c.measured]
    found = [
        m
        for m in _found(before, after, o.checks(), _Speeds.of([], [], False), False)
        if m.gate is not None and not m.figure.exact
    ]
    noises = process_noises(found)
    out = {}
    for m in found:
        noise = noises.get(m.key)
        sessions = _session_differences(m.figure, m.base, m.case)
        if noise is None or len(sessions) != 1 or len(noise.differences) != 1 or not m.values[0]:
            continue
        sign = -1.0 if m.figure.lower_is_better is False else 1.0
        assert m.gate is not None
        base_mean = abs(statistics.fmean(m.values[0]))
        if base_mean <= 0:
            continue
        threshold = math.log1p(m.gate.allowed(base_mean) / base_mean)
        (differences,) = sessions.values()
        out[m.key] = (
            m.case.nodeid,
            FirstPair(
                tuple(sign * d for d in differences),
                sign * noise.differences[0],
                noise.variance,
                threshold,
            ),
        )
    return out


def _session_differences(f: Figure, base: CaseResult, head: CaseResult) -> dict[int, list[float]]:
    """By session (process pair) both sides measured: its pairs' log differences."""
    by_pair = [_pair_means(f, c) for c in (base, head)]
    found = {}
    for session in sorted(set(by_pair[0]) & set(by_pair[1])):
        a, b = by_pair[0][session], by_pair[1][session]
        diffs = [math.log(b[p] / a[p]) for p in sorted(set(a) & set(b)) if a[p] > 0 and b[p] > 0]
        if diffs:
            found[session] = diffs
    return found


def _pair_means(f: Figure, case: CaseResult) -> dict[int, dict[int, float]]:
    """By session, by pair: the mean of the figure's values of the pair's trials."""
    values = f.trial_values(case)
    found: dict[int, dict[int, list[float]]] = {}
    for trial, value in zip(figure_trials(f, case), values or ()):
        if trial.pair:
            found.setdefault(trial.session, {}).setdefault(trial.pair, []).append(value)
    return {s: {p: statistics.fmean(v) for p, v in pairs.items()} for s, pairs in found.items()}


def _p_two_sided(m: _Found, test: Test | None) -> float | None:
    """The two-sided p of a measured figure; None with fewer than two trials on a side,
    without a test, or for a counted figure."""
    enough = len(m.values[0]) >= 2 and len(m.values[1]) >= 2
    return test.p_two_sided if enough and test is not None and not m.figure.exact else None


def _corrections(
    found: Sequence[_Found],
    tests: Mapping[str, Test],
    p_values: Sequence[float | None],
    alpha: float,
) -> dict[int, _Correction]:
    """By the index of each gated figure with a p at all: whether its worsening survives
    the correction (Benjamini-Hochberg over them), its adjusted p, and the smallest
    regression it could have shown."""
    gated = [i for i, m in enumerate(found) if m.gate is not None and p_values[i] is not None]
    worse = [_p_worse(found[i].figure, tests[found[i].key]) for i in gated]
    rejected = benjamini_hochberg(worse, alpha) if worse else []
    adjusted = bh_adjusted(worse)
    m = max(1, len(gated))
    out = {}
    for i, hit, p_adj in zip(gated, rejected, adjusted):
        gate = found[i].gate
        assert gate is not None
        detectable = _design_test(tests[found[i].key], found[i].budget).detectable(alpha / m)
        if gate.relative:
            detectable = max(detectable, gate.threshold)
        out[i] = _Correction(hit, detectable, p_adj)
    return out


def _regressed(
    deltas: Iterable[Delta],
    before: Mapping[str, CaseResult],
    after: Iterable[CaseResult],
    names: Mapping[str, str],
) -> tuple[Regressed, ...]:
    """The failed cases, once each, with both sides."""
    by_id = {c.nodeid: c for c in after}
    failed_ids = dict.fromkeys(d.nodeid for d in deltas if d.failed)
    return tuple(Regressed(names[i], before[i], by_id[i]) for i in failed_ids if i in before)


def _design_test(test: Test, budget: tuple[int, int] | None) -> Test:
    """The test a paired case would have had, had it looked worse: a paired run stops a
    case early only when it looks like a pass (``pairing/turns.py``), and measures one
    that looks worse up to its pair limit; so what a paired run can see is set by that
    limit, not by the pairs a passing case needed."""
    if budget is None or budget[0] >= budget[1] or budget[0] < 2:
        return test
    pairs, limit = budget
    return replace(test, se=test.se * math.sqrt(pairs / limit), df=test.df + (limit - pairs))


def _unnormalized_note(
    base: Iterable[CaseResult],
    head: Sequence[CaseResult],
    wanted: bool,
    checks: Sequence[tuple[str, Gate | None]],
) -> str:
    """Why CPU-measured figures were not normalized by the machine's speed, when they
    could have been: too few cases to read a session's speed from."""
    if not wanted or not head:
        return ""
    sample = next(iter(head))
    if not any(speed_exponent(figure(k, per_trial=True, warn=False), sample) for k, _ in checks):
        return ""
    fewest = min(len(list(base)), len(head))
    if fewest >= MIN_SPEED_CASES:
        return ""
    return (
        f"not normalized by the machine's speed: {fewest} case(s), and a session's speed is "
        f"read from {MIN_SPEED_CASES} or more"
    )


def noise_key(nodeid: str, metric: str) -> str:
    """How a case's figure is named where its between-session noise is kept."""
    return f"{nodeid} {metric}"


def _delta(
    m: _Found,
    name: str,
    test: Test | None,
    p_value: float | None,
    correction: _Correction,
    o: CompareOptions,
    rejected: bool = False,
) -> Delta:
    """A measured figure's delta, with its test and its part in the correction;
    ``rejected``: a server configuration ML.ENERGY's rules reject (serving_rules.py)."""
    if m.figure.exact:
        return _exact_delta(m, name, o.confidence)
    base, case = m.base, m.case
    return Delta(
        nodeid=case.nodeid,
        name=name,
        metric=m.figure.key,
        baseline=summarize(m.values[0], o.confidence),
        current=summarize(m.values[1], o.confidence),
        p_value=p_value,
        confidence=o.confidence,
        gate=m.gate,
        busy=mostly_busy(base) or mostly_busy(case),
        unresolved=not (resolved(m.figure, base) and resolved(m.figure, case)),
        unstable=bool(base.unstable or case.unstable or rejected),
        invalid_telemetry=bool(base.invalid_telemetry or case.invalid_telemetry),
        drift=o.drift if m.speed == 1.0 else 0.0,  # a normalized figure has the speed taken out
        other_model=_other_model(base, case),
        other_execution=_other_execution(base, case),
        test=test,
        discovered=correction.discovered,
        detectable=correction.detectable,
        p_adjusted=correction.p_adjusted,
        speed=m.speed,
    )


def number_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _exact_delta(m: _Found, name: str, confidence: float) -> Delta:
    """A counted figure's delta: the two case values, no p; it sees exactly its gate."""
    gate = m.gate
    return Delta(
        nodeid=m.case.nodeid,
        name=name,
        metric=m.figure.key,
        baseline=summarize(m.values[0], confidence),
        current=summarize(m.values[1], confidence),
        p_value=None,
        confidence=confidence,
        gate=gate,
        other_model=_other_model(m.base, m.case),
        other_execution=_other_execution(m.base, m.case),
        detectable=(gate.threshold if gate.relative else 0.0) if gate is not None else math.nan,
        exact=True,
    )


# A case whose trials were disturbed this often (a share of its kept trials) was measured
# on a busy machine: a gate does not fail it.  Fewer disturbed trials were left out and
# repeated, so the kept ones were measured undisturbed.
BUSY_SHARE = 0.25


def mostly_busy(case: CaseResult) -> bool:
    return len(case.busy_trials) > BUSY_SHARE * max(1, len(case.trials))


def _p_worse(f: Figure, test: Test) -> float:
    """The one-sided p of a worsening: higher is worse but for throughputs."""
    return test.p_worse(higher_is_worse=f.lower_is_better is not False)


def _case_order(c: CaseResult) -> tuple[str, str, int, int, str]:
    """Test, model, then sizes: a comparison reads like the energy tables, not in the
    random order the cases ran."""
    return (c.nodeid.split("[", 1)[0], c.labels.get("model", ""), *_sizes(c), c.nodeid)


def _sizes(c: CaseResult) -> tuple[int, int]:
    return (c.input_tokens, c.output_tokens)


def detectable(c: Comparison) -> float:
    """The median smallest regression the gated cases could have shown (NaN: none)."""
    found = sorted(d.detectable for d in c.deltas if d.gate is not None and d.detectable >= 0)
    return found[len(found) // 2] if found else math.nan
