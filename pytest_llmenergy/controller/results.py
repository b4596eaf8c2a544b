"""What a benchmark case leaves behind: every trial, and the figures derived from them.

Trials keep plain numbers (no meter objects) so that a result can be written to JSON
and read back as it was; every summary is computed from the trials on demand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..meters.base import Measurement
from ..stats import Summary, summarize
from .rule import ControllerOptions

if TYPE_CHECKING:
    from ..llm.resources import ResourceUsage

PREFILL, DECODE = "prefill", "decode"


@dataclass(frozen=True)
class PhaseRecord:
    seconds: float
    joules: float  # counted domains, gross
    joules_by_domain: Mapping[str, float]


@dataclass(frozen=True)
class Trial:
    """One measured run of the target."""

    index: int  # 1-based, warm-up not counted
    seconds: float
    joules: float  # gross, every counted domain once
    net_joules: float  # gross minus idle power x duration
    joules_by_domain: Mapping[str, float]
    net_joules_by_domain: Mapping[str, float]
    input_tokens: int
    output_tokens: int
    phases: Mapping[str, PhaseRecord] = field(default_factory=dict)

    @classmethod
    def from_measurement(
        cls, index: int, m: Measurement, input_tokens: int, output_tokens: int
    ) -> Trial:
        return cls(
            index=index,
            seconds=m.seconds,
            joules=m.joules,
            net_joules=m.net_joules,
            joules_by_domain=dict(m.by_domain),
            net_joules_by_domain=m.net_by_domain,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            phases={
                name: PhaseRecord(p.seconds, p.joules, dict(p.by_domain))
                for name, p in m.phases.items()
            }
            if len(m.phases) > 1
            else {},
        )


# How a case ended.
CONVERGED = "converged"  # every CI target held
LIMIT = "limit"  # stopped at max_trials without meeting the targets
ROUNDS = "rounds"  # pedantic: a fixed number of rounds, no stopping rule
OOM = "oom"  # ran out of memory; recorded and skipped


@dataclass(frozen=True)
class CaseResult:
    """One benchmark case: its identity, how it was run, every trial, and its status."""

    nodeid: str
    name: str
    labels: Mapping[str, str]  # e.g. model, sweep: for grouping in reports
    input_tokens: int
    output_tokens: int
    status: str
    options: ControllerOptions
    trials: tuple[Trial, ...] = ()
    methods: Mapping[str, str] = field(default_factory=dict)  # domain -> counter/sampled/...
    counted: Mapping[str, bool] = field(default_factory=dict)  # domain -> in the totals?
    backend: str = ""
    reason: str = ""  # for OOM and other non-measurements
    resources: ResourceUsage | None = None

    # -- status --------------------------------------------------------------
    @property
    def converged(self) -> bool:
        return self.status == CONVERGED

    @property
    def measured(self) -> bool:
        return bool(self.trials)

    @property
    def estimated(self) -> bool:
        return any(m == "estimated" for d, m in self.methods.items() if self.counted.get(d, True))

    # -- time and energy -----------------------------------------------------
    @property
    def time(self) -> Summary:
        return summarize([t.seconds for t in self.trials], self.options.confidence)

    @property
    def energy(self) -> Summary:
        return summarize([t.joules for t in self.trials], self.options.confidence)

    @property
    def net_energy(self) -> Summary:
        return summarize([t.net_joules for t in self.trials], self.options.confidence)

    def domain_joules(self) -> dict[str, float]:
        """Mean gross joules per domain."""
        if not self.trials:
            return {}
        names = self.trials[0].joules_by_domain
        return {d: _mean([t.joules_by_domain[d] for t in self.trials]) for d in names}

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def joules_per_input_token(self) -> float:
        return _per(self.energy.mean, self.input_tokens)

    @property
    def joules_per_output_token(self) -> float:
        return _per(self.energy.mean, self.output_tokens)

    @property
    def joules_per_token(self) -> float:
        """Per total (input + output) token, as the research defines energy per token."""
        return _per(self.energy.mean, self.total_tokens)

    @property
    def tokens_per_s(self) -> float:
        return _per(self.total_tokens, self.time.mean)

    @property
    def output_tokens_per_s(self) -> float:
        return _per(self.output_tokens, self.time.mean)

    @property
    def power_w(self) -> float:
        return _per(
            math.fsum(t.joules for t in self.trials), math.fsum(t.seconds for t in self.trials)
        )

    # -- prefill | decode ----------------------------------------------------
    @property
    def has_phases(self) -> bool:
        return bool(self.trials) and all(
            PREFILL in t.phases and DECODE in t.phases for t in self.trials
        )

    def _phase(self, name: str, attr: str) -> float:
        if not self.has_phases:
            return math.nan
        return _mean([getattr(t.phases[name], attr) for t in self.trials])

    @property
    def prefill_seconds(self) -> float:
        """Time to first token."""
        return self._phase(PREFILL, "seconds")

    @property
    def decode_seconds(self) -> float:
        return self._phase(DECODE, "seconds")

    @property
    def prefill_joules(self) -> float:
        return self._phase(PREFILL, "joules")

    @property
    def decode_joules(self) -> float:
        return self._phase(DECODE, "joules")

    @property
    def decode_tokens(self) -> int:
        """Tokens produced after the first one (which the prefill pass produces)."""
        return max(self.output_tokens - 1, 0)

    @property
    def decode_tokens_per_s(self) -> float:
        return _per(self.decode_tokens, self.decode_seconds)

    @property
    def joules_per_decode_token(self) -> float:
        return _per(self.decode_joules, self.decode_tokens)


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def _per(numerator: float, denominator: float) -> float:
    if not denominator or math.isnan(denominator):
        return math.nan
    return numerator / denominator
