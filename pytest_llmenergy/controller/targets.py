"""Confidence-interval targets: when is a case measured well enough?

``time:0.5s`` means the 95 % (or configured) confidence interval of the mean runtime
has a half-width of at most 0.5 s; ``energy:2%`` means the half-width of the energy
interval is at most 2 % of the mean energy.  Several targets must all hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ConfigError
from ..stats import Summary

METRICS = ("time", "energy")
_UNITS = {
    "time": {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "": 1.0},
    "energy": {"j": 1.0, "kj": 1e3, "": 1.0},
}
_PATTERN = re.compile(r"^\s*(\w+)\s*:\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(%|[a-z]*)\s*$", re.I)
EXAMPLES = "time:0.5s, time:2%, energy:1J, energy:2%"


@dataclass(frozen=True)
class CITarget:
    metric: str  # "time" (seconds) or "energy" (joules)
    value: float  # seconds or joules, or a fraction of the mean when relative
    relative: bool = False

    def holds(self, summary: Summary) -> bool:
        if summary.n < 2:
            return False
        if self.relative:
            return summary.relative_half_width <= self.value
        return summary.half_width <= self.value

    def limit(self, summary: Summary) -> float:
        """The half-width this target allows, in the metric's unit, for this summary."""
        return self.value * abs(summary.mean) if self.relative else self.value

    def __str__(self) -> str:
        if self.relative:
            return f"{self.metric}:{self.value * 100:g}%"
        return f"{self.metric}:{self.value:g}{'s' if self.metric == 'time' else 'J'}"


def parse_ci_target(text: str) -> CITarget:
    match = _PATTERN.match(text)
    if not match:
        raise ConfigError(f"bad CI target {text!r}: expected one of the forms {EXAMPLES}")
    metric, number, unit = match.group(1).lower(), float(match.group(2)), match.group(3).lower()
    if metric not in METRICS:
        raise ConfigError(
            f"bad CI target {text!r}: the metric must be time or energy (e.g. {EXAMPLES})"
        )
    if unit == "%":
        if not 0 < number < 100:
            raise ConfigError(f"bad CI target {text!r}: a percentage must be in (0, 100)")
        return CITarget(metric, number / 100.0, relative=True)
    if unit not in _UNITS[metric]:
        units = "s, ms, us or ns" if metric == "time" else "J or kJ"
        raise ConfigError(f"bad CI target {text!r}: {metric} takes {units} or %")
    if not number > 0:
        raise ConfigError(f"bad CI target {text!r}: the half-width must be positive")
    return CITarget(metric, number * _UNITS[metric][unit])


def parse_ci_targets(texts: str | Iterable[str]) -> tuple[CITarget, ...]:
    """Comma- or space-separated targets, or a list of them; duplicates of a metric allowed."""
    if isinstance(texts, str):
        texts = [texts]
    parts = [p for text in texts for p in re.split(r"[,\s]+", text) if p]
    if not parts:
        raise ConfigError(f"no CI target given: expected one or more of {EXAMPLES}")
    return tuple(parse_ci_target(p) for p in parts)
