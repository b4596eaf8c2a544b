"""Comparing runs: per-case deltas, energy gates for CI, and runs side by side.

A gate such as ``energy_per_token:5%`` fails a case only when the metric got worse by
more than the threshold *and* Welch's t-test on the two runs' trials says the
difference is significant at the configured confidence: noise must not fail CI.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .controller.results import DECODE, PREFILL, CaseResult, Trial
from .errors import ConfigError
from .report import Table, clean, fmt_mean_ci, fmt_number
from .stats import Summary, summarize, welch_t_test


@dataclass(frozen=True)
class Metric:
    """A per-trial figure; for every metric here, higher is worse."""

    key: str
    label: str
    unit: str  # "s", "J" or "W": which suffixes a gate's threshold may carry
    value: Callable[[Trial], float | None]


def _phase(name: str, attr: str) -> Callable[[Trial], float | None]:
    def value(t: Trial) -> float | None:
        phase = t.phases.get(name)
        return None if phase is None else getattr(phase, attr)

    return value


def _per(tokens: Callable[[Trial], int]) -> Callable[[Trial], float | None]:
    def value(t: Trial) -> float | None:
        n = tokens(t)
        return t.joules / n if n else None

    return value


METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        Metric(
            "energy_per_token", "J/token", "J", _per(lambda t: t.input_tokens + t.output_tokens)
        ),
        Metric("energy_per_input_token", "J/in-token", "J", _per(lambda t: t.input_tokens)),
        Metric("energy_per_output_token", "J/out-token", "J", _per(lambda t: t.output_tokens)),
        Metric("joules", "J/query", "J", lambda t: t.joules),
        Metric("net_joules", "net J/query", "J", lambda t: t.net_joules),
        Metric("seconds", "runtime s", "s", lambda t: t.seconds),
        Metric("prefill_seconds", "TTFT s", "s", _phase(PREFILL, "seconds")),
        Metric("prefill_joules", "prefill J", "J", _phase(PREFILL, "joules")),
        Metric("decode_joules", "decode J", "J", _phase(DECODE, "joules")),
        Metric("power", "avg W", "W", lambda t: t.joules / t.seconds if t.seconds > 0 else None),
    )
}
ALIASES = {"time": "seconds", "energy": "joules", "j_per_token": "energy_per_token"}
DEFAULT_METRICS = ("energy_per_token", "joules", "seconds")
_UNITS = {"s": {"s": 1.0, "ms": 1e-3}, "J": {"j": 1.0, "mj": 1e-3, "kj": 1e3}, "W": {"w": 1.0}}
_GATE = re.compile(r"^\s*([a-z_]+)\s*:\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(%|[a-z]*)\s*$", re.I)
GATE_EXAMPLES = "energy_per_token:5%, joules:10%, seconds:0.5"


def metric(name: str) -> Metric:
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in METRICS:
        raise ConfigError(f"unknown metric {name!r}; choose from: {', '.join(METRICS)}")
    return METRICS[key]


@dataclass(frozen=True)
class Gate:
    """``metric:threshold``: how much worse a case may get before it fails."""

    metric: str
    threshold: float  # a fraction of the baseline mean when relative, else the metric's unit
    relative: bool

    def allowed(self, baseline_mean: float) -> float:
        return self.threshold * abs(baseline_mean) if self.relative else self.threshold

    def exceeded(self, baseline_mean: float, current_mean: float) -> bool:
        return current_mean - baseline_mean > self.allowed(baseline_mean)

    def __str__(self) -> str:
        if self.relative:
            return f"{self.metric}:{self.threshold * 100:g}%"
        return f"{self.metric}:{self.threshold:g}{METRICS[self.metric].unit}"


def parse_gate(text: str) -> Gate:
    match = _GATE.match(text)
    if not match:
        raise ConfigError(f"bad gate {text!r}: expected METRIC:THRESHOLD such as {GATE_EXAMPLES}")
    try:
        m = metric(match[1])
    except ConfigError as exc:
        raise ConfigError(f"bad gate {text!r}: {exc}") from None
    number, unit = float(match[2]), match[3].lower()
    if unit == "%":
        return Gate(m.key, number / 100.0, relative=True)
    scale = _UNITS[m.unit].get(unit or m.unit.lower())
    if scale is None:
        units = ", ".join(_UNITS[m.unit])
        raise ConfigError(f"bad gate {text!r}: {m.key} takes a threshold in {units} or %")
    return Gate(m.key, number * scale, relative=False)


def parse_gates(texts: str | Iterable[str]) -> tuple[Gate, ...]:
    """Comma- or space-separated gates, or a list of them."""
    if isinstance(texts, str):
        texts = [texts]
    parts = [p for text in texts for p in re.split(r"[,\s]+", text) if p]
    if not parts:
        raise ConfigError(f"no gate given: expected one or more of {GATE_EXAMPLES}")
    return tuple(parse_gate(p) for p in parts)


# -- one case, one metric --------------------------------------------------------------
FAIL = "FAIL"
NOT_SIGNIFICANT = "not significant"
TOO_FEW = "too few trials"
OK = "ok"


@dataclass(frozen=True)
class Delta:
    """How one metric of one case moved from the baseline run to the current one."""

    nodeid: str
    name: str
    metric: str
    baseline: Summary
    current: Summary
    p_value: float | None  # Welch, two-sided; None with fewer than two trials on a side
    confidence: float
    gate: Gate | None = None

    @property
    def change(self) -> float:
        return self.current.mean - self.baseline.mean

    @property
    def relative_change(self) -> float:
        return self.change / abs(self.baseline.mean) if self.baseline.mean else math.nan

    @property
    def significant(self) -> bool:
        return self.p_value is not None and self.p_value < 1.0 - self.confidence

    @property
    def exceeded(self) -> bool:
        return self.gate is not None and self.gate.exceeded(self.baseline.mean, self.current.mean)

    @property
    def failed(self) -> bool:
        return self.exceeded and self.significant

    @property
    def verdict(self) -> str:
        if self.gate is None:
            return ""
        if not self.exceeded:
            return OK
        if self.p_value is None:
            return TOO_FEW
        return FAIL if self.significant else NOT_SIGNIFICANT


def _values(case: CaseResult, m: Metric) -> list[float] | None:
    values = [m.value(t) for t in case.trials]
    if not values or any(v is None for v in values):
        return None
    return [float(v) for v in values if v is not None]


def delta(
    baseline: CaseResult,
    current: CaseResult,
    metric_key: str,
    *,
    confidence: float = 0.95,
    gate: Gate | None = None,
) -> Delta | None:
    """None when either case lacks the metric (no trials, or no prefill/decode split)."""
    m = METRICS[metric_key]
    a, b = _values(baseline, m), _values(current, m)
    if a is None or b is None:
        return None
    p = welch_t_test(a, b).p_value if len(a) >= 2 and len(b) >= 2 else None
    return Delta(
        nodeid=current.nodeid,
        name=current.name,
        metric=m.key,
        baseline=summarize(a, confidence),
        current=summarize(b, confidence),
        p_value=p,
        confidence=confidence,
        gate=gate,
    )


# -- two runs ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    baseline_label: str
    current_label: str
    confidence: float
    gates: tuple[Gate, ...]
    deltas: tuple[Delta, ...]
    only_in_baseline: tuple[str, ...] = ()
    only_in_current: tuple[str, ...] = ()

    @property
    def failures(self) -> list[Delta]:
        return [d for d in self.deltas if d.failed]

    @property
    def failed(self) -> bool:
        return bool(self.failures)


def compare_cases(
    baseline: Sequence[CaseResult],
    current: Sequence[CaseResult],
    *,
    gates: Sequence[Gate] = (),
    metrics: Sequence[str] | None = None,
    confidence: float = 0.95,
    baseline_label: str = "baseline",
    current_label: str = "current",
) -> Comparison:
    """Cases are matched by node id.  With gates, their metrics are compared; else ``metrics``."""
    before = {c.nodeid: c for c in baseline if c.measured}
    after = [c for c in current if c.measured]
    checks: list[tuple[str, Gate | None]] = (
        [(g.metric, g) for g in gates]
        if gates
        else [(metric(k).key, None) for k in (metrics or DEFAULT_METRICS)]
    )
    deltas = []
    for case in after:
        base = before.get(case.nodeid)
        if base is None:
            continue
        for key, gate in checks:
            d = delta(base, case, key, confidence=confidence, gate=gate)
            if d is not None:
                deltas.append(d)
    now = {c.nodeid for c in after}
    return Comparison(
        baseline_label=baseline_label,
        current_label=current_label,
        confidence=confidence,
        gates=tuple(gates),
        deltas=tuple(deltas),
        only_in_baseline=tuple(sorted(set(before) - now)),
        only_in_current=tuple(sorted(now - set(before))),
    )


def _signed_percent(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{value * 100:+.1f} %"


def comparison_table(c: Comparison) -> Table:
    """One row per case and metric: baseline, current, change, p, significant, verdict."""
    gated = bool(c.gates)
    keys = ["case", "metric", "baseline", "current", "change", "p_value", "significant"]
    headers = ["case", "metric", c.baseline_label, c.current_label, "change", "p", "significant"]
    if gated:
        keys += ["threshold", "verdict"]
        headers += ["gate", "verdict"]
    rows, cells = [], []
    for d in c.deltas:
        raw: list[object] = [
            d.name,
            d.metric,
            d.baseline.mean,
            d.current.mean,
            clean(d.relative_change),
            d.p_value,
            d.significant,
        ]
        shown = [
            d.name,
            METRICS[d.metric].label,
            fmt_mean_ci(d.baseline),
            fmt_mean_ci(d.current),
            _signed_percent(d.relative_change),
            "—" if d.p_value is None else f"{d.p_value:.3g}",
            "yes" if d.significant else "no",
        ]
        if gated:
            raw += [str(d.gate), d.verdict]
            shown += [str(d.gate), d.verdict]
        rows.append(tuple(raw))
        cells.append(tuple(shown))
    notes = [
        f"significant: Welch's t-test on the trials, p < {1 - c.confidence:.2g} "
        f"({c.confidence:.0%} confidence)"
    ]
    if gated:
        notes.append(
            "a case fails only when it is worse by more than the gate and the change is significant"
        )
    if c.only_in_baseline:
        notes.append(f"only in {c.baseline_label}: {', '.join(c.only_in_baseline)}")
    if c.only_in_current:
        notes.append(f"only in {c.current_label}: {', '.join(c.only_in_current)}")
    return Table(
        title=f"{c.current_label} against {c.baseline_label}",
        keys=tuple(keys),
        headers=tuple(headers),
        rows=tuple(rows),
        cells=tuple(cells),
        notes=tuple(notes),
    )


def verdict_line(c: Comparison) -> str:
    failures = c.failures
    if not c.deltas:
        return (
            f"nothing compared: no case of this run has the compared figures in "
            f"{c.baseline_label} (different case ids, or a metric these cases lack)"
        )
    if not c.gates:
        return f"compared {len(c.deltas)} figures against {c.baseline_label}"
    gates = ", ".join(str(g) for g in c.gates)
    if failures:
        cases = sorted({d.name for d in failures})
        return (
            f"energy gate FAILED ({gates}): {len(failures)} significant regression(s) in "
            f"{len(cases)} case(s): {', '.join(cases)}"
        )
    noise = sum(1 for d in c.deltas if d.verdict == NOT_SIGNIFICANT)
    untested = sum(1 for d in c.deltas if d.verdict == TOO_FEW)
    extra = f"; {noise} over the threshold but not significant" if noise else ""
    if untested:
        extra += f"; {untested} over the threshold with too few trials to test"
    return f"energy gate passed ({gates}): no significant regression{extra}"


# -- several runs, side by side (e.g. across hardware) ------------------------------------
@dataclass(frozen=True)
class Lineup:
    """Runs to put side by side, each with its label and cases."""

    labels: tuple[str, ...]
    cases: tuple[tuple[CaseResult, ...], ...]


def side_by_side(lineup: Lineup, metric_key: str, *, confidence: float = 0.95) -> Table:
    """The same case ids across runs, with each later run's ratio to the first."""
    m = metric(metric_key)
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
    first = lineup.labels[0]
    keys = ["case", "nodeid", "tokens_in", "tokens_out", *lineup.labels]
    headers = ["case", "node id", "in", "out", *lineup.labels]
    for label in lineup.labels[1:]:
        keys.append(f"{label}/{first}")
        headers.append(f"{label} / {first}")
    rows, cells = [], []
    estimated = False
    for case in order:
        means: list[float | None] = []
        for cases in by_run:
            other = cases.get(case.nodeid)
            values = _values(other, m) if other is not None else None
            means.append(summarize(values, confidence).mean if values else None)
            estimated = estimated or bool(other is not None and other.estimated)
        ratios = [(x / means[0]) if (x is not None and means[0]) else None for x in means[1:]]
        rows.append(
            (case.name, case.nodeid, case.input_tokens, case.output_tokens, *means, *ratios)
        )
        cells.append(
            (
                case.name,
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
    )
