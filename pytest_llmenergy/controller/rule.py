"""The stopping rule: repeat a case until every CI target holds, within a trial budget.

The research behind this project repeated each case until the runtime's 95 %
confidence interval was within 0.5 s of the mean, or 25 trials; those are the defaults.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError
from ..figures import FIGURES
from ..results import Trial
from ..stats import Summary, summarize
from .targets import CITarget, parse_ci_targets

DEFAULT_TARGETS: tuple[CITarget, ...] = (CITarget("time_s", 0.5),)


@dataclass(frozen=True)
class ControllerOptions:
    min_trials: int = 3
    max_trials: int = 25
    confidence: float = 0.95
    warmup: int = 1
    targets: tuple[CITarget, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
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
        if not self.targets:
            raise ConfigError("at least one CI target is needed, e.g. time_s:0.5s")

    def describe(self) -> str:
        targets = " and ".join(str(t) for t in self.targets)
        return (
            f"{self.min_trials}-{self.max_trials} trials after {self.warmup} warm-up, "
            f"until the {self.confidence:.0%} CI half-width meets {targets}"
        )


# What @pytest.mark.llmenergy(...) accepts, and how each value is checked.
MARKER_KWARGS = ("min_trials", "max_trials", "confidence", "warmup", "ci_target")


def with_overrides(base: ControllerOptions, overrides: Mapping[str, Any]) -> ControllerOptions:
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
    if "max_trials" in changes and "min_trials" not in changes:
        changes["min_trials"] = min(base.min_trials, changes["max_trials"])
    return replace(base, **changes)  # __post_init__ checks every value


@dataclass(frozen=True)
class StopDecision:
    """What the rule said after a trial, and why."""

    stop: bool
    converged: bool  # every target holds
    summaries: Mapping[str, Summary] = field(default_factory=dict)  # figure key -> summary
    unmet: tuple[CITarget, ...] = ()


def decide(options: ControllerOptions, trials: Sequence[Trial]) -> StopDecision:
    """Stop when, and only when, there are ``min_trials`` and every target holds, or at
    ``max_trials``.  A target whose figure a trial lacks (no phases) never holds."""
    n = len(trials)
    summaries: dict[str, Summary] = {}
    for target in options.targets:
        if target.metric in summaries:
            continue
        f = FIGURES[target.metric]
        values = [f.trial(t) for t in trials] if f.trial is not None else []
        clean = [float(v) for v in values if v is not None]
        summaries[target.metric] = summarize(
            clean if len(clean) == len(values) else [], options.confidence
        )
    unmet = tuple(t for t in options.targets if not t.holds(summaries[t.metric]))
    converged = not unmet and n >= max(2, options.min_trials)
    stop = converged or n >= options.max_trials
    return StopDecision(stop=stop, converged=converged, summaries=summaries, unmet=unmet)


def progress_line(options: ControllerOptions, n: int, decision: StopDecision) -> str:
    """``trial 4: time_s 1.234 s ±0.021 (<= 0.5 s)`` for ``-v`` output."""
    parts = []
    for target in options.targets:
        s = decision.summaries[target.metric]
        unit = target.unit
        if s.n == 0:
            parts.append(f"{target.metric}: not measured by these trials")
        elif math.isinf(s.half_width):
            parts.append(f"{target.metric} {s.mean:.4g} {unit} (no CI yet)")
        else:
            relation = "<=" if target.holds(s) else ">"
            parts.append(
                f"{target.metric} {s.mean:.4g} {unit} ±{s.half_width:.3g} "
                f"({relation} {target.limit(s):.3g} {unit})"
            )
    return f"trial {n}: " + "; ".join(parts)
