"""Confidence-interval targets: when is a case measured well enough?

``time_s:0.5s`` means the 95 % (or configured) confidence interval of the mean runtime
has a half-width of at most 0.5 s; ``energy_j:2%`` means the half-width of the energy
interval is at most 2 % of the mean energy.  Any figure with a value per trial can be a
target (``llmenergy metrics`` lists them); several targets must all hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..conversions import CONVERSION_OPTIONS
from ..errors import ConfigError
from ..figures import FIGURES, canonical, format_amount, parse_figure_threshold
from ..results import TRIALS
from ..stats import Summary
from ..values import words

EXAMPLES = "time_s:0.5s, time_s:2%, energy_j:1J, energy_j:2%"


@dataclass(frozen=True)
class CITarget:
    metric: str  # a figure key with a per-trial value
    value: float  # in the figure's unit, or a fraction of the mean when relative
    relative: bool = False

    def __post_init__(self) -> None:
        # Saved runs of 0.1.0 say "time" and "energy": read them as the figures they meant.
        object.__setattr__(self, "metric", canonical(self.metric, warn=False))

    @property
    def unit(self) -> str:
        return FIGURES[self.metric].unit

    def holds(self, summary: Summary) -> bool:
        if summary.n < 2:
            return False
        if self.relative:
            return summary.relative_half_width <= self.value
        return summary.half_width <= self.value

    def limit(self, summary: Summary) -> float:
        """The half-width this target allows, in the figure's unit, for this summary."""
        return self.value * abs(summary.mean) if self.relative else self.value

    def __str__(self) -> str:
        return format_amount(FIGURES[self.metric], self.value, self.relative)


def parse_ci_target(text: str) -> CITarget:
    f, value, relative = parse_figure_threshold(text, EXAMPLES, percent_range=(0.0, 100.0))
    if f.exact:
        raise ConfigError(
            f"bad {text!r}: {f.key} is counted once after the trials, exactly: it has no "
            "confidence interval to narrow (gate it instead)"
        )
    if f.source != TRIALS:
        raise ConfigError(
            f"bad {text!r}: {f.key} is measured after the trials, in windows of its own, "
            "so the stopping rule cannot wait for it (gate it instead)"
        )
    return CITarget(f.key, value, relative)


def check_conversions(targets: Iterable[CITarget], conversions: Mapping[str, float]) -> None:
    """A target on gCO2e or money needs the session's factor per kWh: without it the
    figure has no value, and every case would run to its trial limit."""
    for t in targets:
        key = FIGURES[t.metric].conversion
        if key is not None and key not in conversions:
            raise ConfigError(
                f"the CI target {t} needs {CONVERSION_OPTIONS[key]}: without it {t.metric} has "
                "no value and no case could reach the target"
            )


def parse_ci_targets(texts: str | Iterable[str]) -> tuple[CITarget, ...]:
    """Comma- or space-separated targets, or a list of them; duplicates of a metric allowed."""
    return tuple(parse_ci_target(p) for p in words(texts, "CI target", EXAMPLES))
