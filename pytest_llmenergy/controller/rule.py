"""The stopping rule: repeat a case until every CI target holds, within a trial budget.

The research behind this project repeated each case until the runtime's 95 %
confidence interval was within 0.5 s of the mean, or 25 trials: the ``research`` rule.
On its own that lets a 0.2 s case stop after 3 trials with an interval wider than its
mean, so the ``default`` rule also asks for intervals within 10 % of the runtime and the
energy, and for at least 1 s of measured time per case. A 30 ms case cannot measure 1 s
in 25 trials: the trial limit wins (a user's limit is a promise), and a case is marked
as not converged only when its precision was not reached, so one whose intervals hold at
the limit is converged though it measured less than the minimum time. Long cases on a
noisy machine would then take 25 trials of many seconds, so the ``default`` rule also
stops a case once 15 s are measured (and ``min_trials`` are done), like pytest-
benchmark's ``--benchmark-max-time``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError
from ..figures import FIGURES
from ..meters.validity import DEFAULT_MAX_GAP_S
from ..results import Trial
from ..stats import Summary, summarize
from .targets import CITarget, parse_ci_targets


@dataclass(frozen=True)
class Rule:
    """A named stopping rule: CI targets that must all hold, and the measured time a
    case needs at least, before it may stop (it always stops at the trial limit)."""

    name: str
    targets: tuple[CITarget, ...]
    min_time_s: float
    max_time_s: float | None  # None: only the trial limit
    meaning: str


RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule(
            "default",
            (
                CITarget("time_s", 0.5),
                CITarget("time_s", 0.10, True),
                CITarget("energy_j", 0.10, True),
            ),
            1.0,
            15.0,
            "runtime CI within 0.5 s and 10 %, energy CI within 10 %, at least 1 s and at "
            "most 15 s measured",
        ),
        Rule(
            "research",
            (CITarget("time_s", 0.5),),
            0.0,
            None,
            "the research's: runtime CI within 0.5 s of the mean",
        ),
    )
}
DEFAULT_RULE = "default"
# A trial during which other processes used more than this share of the machine's CPU
# capacity is disturbed: kept, left out of the statistics, and repeated, until the
# machine is found busy (controller/busy.py).
DEFAULT_MAX_BACKGROUND = 0.25
# What a session does once the machine is busy (several disturbed trials in a row):
# "measure" counts its trials anyway, marked busy (never gated, their uncertainty said);
# "repeat" goes on leaving them out, within each case's trial limit and time budget.
BUSY_POLICIES = ("measure", "repeat")
# What stopped a case that did not reach its precision (StopDecision.stopped_by).
TRIAL_LIMIT, TIME_BUDGET = "the trial limit", "the measured-time budget"
# A case with trials counted on a busy machine (controller/busy.py) stops once it has its
# minimum trials and time: how far its figures may be off is bounded by the machine's
# other work, not by its interval, so more trials buy no precision worth their time.
BUSY_MINIMUM = "the busy machine's minimum"


@dataclass(frozen=True)
class ControllerSettings:
    """How cases are repeated.  Empty ``targets`` and a ``min_time_s`` of None take the
    ``rule``'s; given ones replace them."""

    min_trials: int = 3
    max_trials: int = 25
    confidence: float = 0.95
    warmup: int = 1
    targets: tuple[CITarget, ...] = ()
    max_background: float | None = DEFAULT_MAX_BACKGROUND  # None: never judged busy
    rule: str = DEFAULT_RULE
    min_time_s: float | None = None
    # Stop once this much runtime is measured (after min_trials), converged or not.
    # None takes the rule's; 0 means no such limit.
    max_time_s: float | None = None
    # A sampled window with a longer stretch no sample saw (or a device never read) has
    # invalid telemetry: its case is marked, never gated (meters/validity.py).
    max_sample_gap_s: float = DEFAULT_MAX_GAP_S
    # "on": a window of prefill-only passes after each trial whose first-token mark
    # cannot split it on this meter (controller/passes.py); "off": the split stays at
    # the mark (marked, never gated, where it is too short), for a session that gates
    # whole-trial figures only and would rather not spend the windows' time
    prefill_passes: str = "on"
    # what trials on a busy machine become: one of BUSY_POLICIES
    busy: str = "measure"

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ConfigError(
                f"unknown stopping rule {self.rule!r}; choose from: {', '.join(RULES)}"
            )
        if not self.targets:
            object.__setattr__(self, "targets", RULES[self.rule].targets)
        if self.min_time_s is None:
            object.__setattr__(self, "min_time_s", RULES[self.rule].min_time_s)
        if self.max_time_s is None:
            object.__setattr__(self, "max_time_s", RULES[self.rule].max_time_s or 0.0)
        if self.busy not in BUSY_POLICIES:
            raise ConfigError(f"busy must be one of {', '.join(BUSY_POLICIES)}, got {self.busy!r}")
        if self.prefill_passes not in ("on", "off"):
            raise ConfigError(f"prefill_passes must be 'on' or 'off', got {self.prefill_passes!r}")
        if not (isinstance(self.min_trials, int) and self.min_trials >= 1):
            raise ConfigError(f"min_trials must be an integer >= 1, got {self.min_trials!r}")
        if not (isinstance(self.max_trials, int) and self.max_trials >= self.min_trials):
            raise ConfigError(
                f"max_trials must be an integer >= min_trials ({self.min_trials}), "
                f"got {self.max_trials!r}"
            )
        if not (isinstance(self.confidence, float | int) and 0 < self.confidence < 1):
            raise ConfigError(
                f"confidence must be a number in (0, 1) such as 0.95, got {self.confidence!r}"
            )
        if not (isinstance(self.warmup, int) and self.warmup >= 0):
            raise ConfigError(f"warmup must be an integer >= 0, got {self.warmup!r}")
        if self.max_background is not None and not 0 < self.max_background <= 1:
            raise ConfigError(
                "max_background must be a share in (0, 1] such as 0.25, "
                f"got {self.max_background!r}"
            )
        if not (self.min_time_s is not None and self.min_time_s >= 0):
            raise ConfigError(f"min_time_s must be >= 0 seconds, got {self.min_time_s!r}")
        if not (self.max_time_s is not None and self.max_time_s >= 0):
            raise ConfigError(f"max_time_s must be >= 0 seconds, got {self.max_time_s!r}")
        if not (isinstance(self.max_sample_gap_s, float | int) and self.max_sample_gap_s > 0):
            raise ConfigError(
                f"max_sample_gap_s must be > 0 seconds, got {self.max_sample_gap_s!r}"
            )

    @property
    def min_time(self) -> float:
        return self.min_time_s or 0.0

    @property
    def max_time(self) -> float | None:
        """The measured-time budget of a case; None: none."""
        return self.max_time_s or None

    def disturbed(self, background_cpu: float | None) -> bool:
        """Was a trial with this background CPU share taken on a busy machine?"""
        return (
            self.max_background is not None
            and background_cpu is not None
            and background_cpu > self.max_background
        )

    def describe(self) -> str:
        targets = " and ".join(str(t) for t in self.targets)
        least = f", at least {self.min_time:g} s measured" if self.min_time else ""
        if self.max_time:
            least += f", stopping at {self.max_time:g} s measured"
        return (
            f"{self.min_trials}-{self.max_trials} trials after {self.warmup} warm-up, "
            f"until the {self.confidence:.0%} CI half-width meets {targets}{least}"
        )


# What @pytest.mark.llmenergy(...) accepts, and how each value is checked.
MARKER_KWARGS = ("min_trials", "max_trials", "confidence", "warmup", "ci_target")


def with_overrides(base: ControllerSettings, overrides: Mapping[str, Any]) -> ControllerSettings:
    """``base`` with a marker's kwargs applied; unknown or bad ones are a ConfigError."""
    unknown = sorted(set(overrides) - set(MARKER_KWARGS))
    if unknown:
        raise ConfigError(
            f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"allowed: {', '.join(MARKER_KWARGS)}"
        )
    changes: dict[str, Any] = {k: v for k, v in overrides.items() if k != "ci_target"}
    if "ci_target" in overrides:
        changes["targets"] = parse_ci_targets(overrides["ci_target"])
    limit = changes.get("max_trials")
    if isinstance(limit, int) and not isinstance(limit, bool) and "min_trials" not in changes:
        changes["min_trials"] = min(base.min_trials, limit)
    return replace(base, **changes)  # __post_init__ checks every value


@dataclass(frozen=True)
class StopDecision:
    """What the rule said after a trial, and why."""

    stop: bool
    converged: bool  # every CI target holds (the precision was reached)
    summaries: Mapping[str, Summary] = field(default_factory=dict)  # figure key -> summary
    unmet: tuple[CITarget, ...] = ()
    measured_s: float = 0.0  # runtime of the counted trials, for the rule's minimum
    # When it stops without its precision: TRIAL_LIMIT, TIME_BUDGET or BUSY_MINIMUM;
    # else "".
    stopped_by: str = ""

    def why(self) -> str:
        """``stopped at the trial limit: energy_j ±14.2% (wanted <= 10%)``; "" if it
        converged.  The run file keeps it as the case's reason."""
        if not self.stop or self.converged:
            return ""
        unmet: list[str] = []
        for t in self.unmet:
            s = self.summaries[t.metric]
            if s.n < 2 or not math.isfinite(s.half_width):
                if f"{t.metric} has no interval" not in unmet:
                    unmet.append(f"{t.metric} has no interval")
            elif t.relative:
                wanted = f"{t.value * 100:.3g}%"  # 0.1 %, not "0%"
                unmet.append(f"{t.metric} ±{s.relative_half_width:.1%} (wanted <= {wanted})")
            else:
                unmet.append(f"{t.metric} ±{s.half_width:.3g} {t.unit} (wanted <= {t.value:g})")
        return f"stopped at {self.stopped_by or TRIAL_LIMIT}: {', '.join(unmet)}"


def _enough_trials(options: ControllerSettings, measured: int) -> bool:
    """Enough counted trials for the rule to stop on its statistics: an interval needs
    two, and the user's minimum is a promise."""
    return measured >= max(2, options.min_trials)


def _at_trial_limit(options: ControllerSettings, measured: int, disturbed: int) -> bool:
    """The trial limit is reached: disturbed trials count against it too."""
    return measured + disturbed >= options.max_trials


def may_stop(
    options: ControllerSettings, measured: int, disturbed: int = 0, disturbed_s: float = 0.0
) -> bool:
    """Whether the rule could stop after this many trials (``disturbed_s``: the seconds
    of the disturbed ones): below the minimum, the limit and the time budget it cannot,
    whatever its statistics (``decide`` says so too, at the cost of its statistics after
    every trial)."""
    over_budget = bool(options.max_time) and disturbed_s >= (options.max_time or 0.0)
    return (
        _enough_trials(options, measured)
        or _at_trial_limit(options, measured, disturbed)
        or over_budget
    )


def decide(
    options: ControllerSettings,
    trials: Sequence[Trial],
    disturbed: int = 0,
    counted: Mapping[str, bool] | None = None,
    conversions: Mapping[str, float] | None = None,
    disturbed_s: float = 0.0,
) -> StopDecision:
    """Stop when, and only when, there are ``min_trials``, every target holds and the
    minimum time is measured; or at ``max_trials`` measured in all (``disturbed`` ones
    count against the limit but not in the statistics), even where the targets hold and
    only the minimum time is missing (users set the limit to bound a session's length);
    or at the measured-time budget, which the ``disturbed_s`` seconds of the disturbed
    trials have one of their own (a busy machine does not make a case run to the trial
    limit); or, with trials counted on a busy machine, at the minimum trials and time
    (``BUSY_MINIMUM``).  A target's values are its figure's (``Figure.values_of``), so
    one in the figure's unit means what it says: ``counted`` (the meter's domains: in
    the totals?) is for one family's joules, ``conversions`` (the session's factors per
    kWh) for co2_g and cost.  A target whose figure a trial lacks never holds."""
    n = len(trials)
    summaries: dict[str, Summary] = {}
    for target in options.targets:
        if target.metric in summaries:
            continue
        values = FIGURES[target.metric].values_of(trials, counted=counted, conversions=conversions)
        summaries[target.metric] = summarize(values or [], options.confidence)
    unmet = tuple(t for t in options.targets if not t.holds(summaries[t.metric]))
    measured_s = math.fsum(t.seconds * t.passes for t in trials)  # whole windows
    enough = _enough_trials(options, n)
    held = not unmet and enough
    short = held and measured_s < options.min_time  # precise, but too little time yet
    # the budget bounds the measured trials and, apart, the disturbed ones: a case on a
    # busy machine runs at most about twice its budget, never to the trial limit
    budget = options.max_time
    over_budget = budget is not None and (
        (measured_s >= budget and enough) or disturbed_s >= budget
    )
    at_limit = _at_trial_limit(options, n, disturbed)
    busy_done = enough and measured_s >= options.min_time and any(t.busy for t in trials)
    stop = (held and not short) or over_budget or at_limit or busy_done
    stopped_by = ""
    if stop and not held:
        stopped_by = TIME_BUDGET if over_budget else TRIAL_LIMIT if at_limit else BUSY_MINIMUM
    return StopDecision(
        stop=stop,
        converged=held,
        summaries=summaries,
        unmet=unmet,
        measured_s=measured_s,
        stopped_by=stopped_by,
    )


def progress_line(options: ControllerSettings, n: int, decision: StopDecision) -> str:
    """``trial 4: time_s 1.234 s ±0.021 (<= 0.5 s)`` for ``-v`` output."""
    parts = []
    by_metric: dict[str, list[CITarget]] = {}
    for target in options.targets:  # one part per figure, however many targets it has
        by_metric.setdefault(target.metric, []).append(target)
    for metric, targets in by_metric.items():
        s = decision.summaries[metric]
        unit = targets[0].unit
        if s.n == 0:
            parts.append(f"{metric}: not measured by these trials")
        elif math.isinf(s.half_width):
            parts.append(f"{metric} {s.mean:.4g} {unit} (no CI yet)")
        else:
            limits = ", ".join(
                f"{'<=' if t.holds(s) else '>'} {t.limit(s):.3g} {unit}" for t in targets
            )
            parts.append(f"{metric} {s.mean:.4g} {unit} ±{s.half_width:.3g} ({limits})")
    if decision.measured_s < options.min_time:
        parts.append(f"measured {decision.measured_s:.3g} s (< {options.min_time:g} s)")
    return f"trial {n}: " + "; ".join(parts)
