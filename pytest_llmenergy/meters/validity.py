"""Whether a sampling meter's power telemetry can carry a window's figure.

A sampled figure is an integral of the samples: a device that was never read adds no
joules, a long hole between samples is bridged by a straight line, and a window whose
edges no sample came near is extrapolated.  Each makes the figure wrong without making it
noisy, so no statistical test notices.  Following SemiAnalysis InferenceX's validity flags
(every GPU observed, sample gaps of at most 1 s, the window fully covered, trapezoid
integration, the energy counter cross-checked against the integrated power), one window
is judged here from its own samples; a case with an invalid trial is marked and never
gated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .readings import Measurement, Method, PowerSample
from .sampling import integrate_instant

# The longest stretch of a window no sample may see (--energy-max-sample-gap's default).
DEFAULT_MAX_GAP_S = 1.0
# How far a domain's counter and its integrated samples may differ, relative to the
# counter, where a meter keeps both.
COUNTER_TOLERANCE = 0.05


@dataclass(frozen=True)
class Telemetry:
    """One window's power telemetry, judged; ``reason`` is empty when it is valid."""

    devices: tuple[str, ...]  # the sampled domains the meter measures
    read: tuple[str, ...]  # those with at least one sample in the window
    max_gap_s: float  # the longest time between two samples of one device
    covered: bool  # every read device was sampled near both edges of the window
    # The largest relative difference between a domain's counter and its samples'
    # integral; None where no domain has both.
    counter_vs_integral: float | None = None
    reason: str = ""

    @property
    def valid(self) -> bool:
        return not self.reason


def judge(
    m: Measurement,
    max_gap_s: float = DEFAULT_MAX_GAP_S,
    counter_tolerance: float = COUNTER_TOLERANCE,
) -> Telemetry | None:
    """The window's telemetry judged, or None where there are no samples to judge: a
    meter that does not sample (its figures rest on counters or a model), or a window
    that does not carry its samples (a torchrun job's, merged from its ranks' joules).
    A sampling meter's own window always has two: its edges read every device."""
    if not m.samples:
        return None
    devices = tuple(name for name, d in m.domains.items() if d.method is Method.SAMPLED)
    counted = [name for name, d in m.domains.items() if d.method is Method.COUNTER]
    by_domain = {name: _own(m.samples, name) for name in (*devices, *counted)}
    if not devices and not any(by_domain[name] for name in counted):
        return None
    read = tuple(name for name in devices if by_domain[name])
    problems = [f"{name} never read" for name in devices if name not in read]
    max_gap_s_seen, worst = 0.0, ""
    uncovered: list[str] = []
    for name in read:
        own = by_domain[name]
        gap_s = max((_start(b) - a.t for a, b in itertools.pairwise(own)), default=0.0)
        if gap_s > max_gap_s_seen:
            max_gap_s_seen, worst = gap_s, name
        if _start(own[0]) - m.t_start > max_gap_s or m.t_end - own[-1].t > max_gap_s:
            uncovered.append(name)
    if max_gap_s_seen > max_gap_s:
        problems.append(
            f"{worst} went {max_gap_s_seen:.3g} s without a sample (at most {max_gap_s:g} s)"
        )
    if uncovered:
        problems.append(f"{', '.join(uncovered)} not sampled within {max_gap_s:g} s of an edge")
    differences = [
        _difference(m, name, samples) for name in counted if (samples := by_domain[name])
    ]
    difference = max(differences, default=None)
    if difference is not None and difference > counter_tolerance:
        problems.append(
            f"counter and integrated power differ by {difference:.1%} "
            f"(at most {counter_tolerance:.0%})"
        )
    return Telemetry(
        devices=devices,
        read=read,
        max_gap_s=max_gap_s_seen,
        covered=not uncovered,
        counter_vs_integral=difference,
        reason="; ".join(problems),
    )


def _own(samples: Sequence[PowerSample], name: str) -> list[PowerSample]:
    """The samples that read this domain (a failed read leaves it out of its sample)."""
    return [s for s in samples if name in s.power_w and math.isfinite(s.power_w[name])]


def _start(s: PowerSample) -> float:
    """When the sample's view begins: an interval average sees back to ``t - span_s``."""
    return s.t - s.span_s


def _difference(m: Measurement, name: str, samples: Sequence[PowerSample]) -> float:
    """|counter - trapezoid integral| / counter for one domain over the whole window."""
    integral_j = integrate_instant(samples, m.t_start, m.t_end, [name])[name]
    counter_j = m.by_domain.get(name, 0.0)
    if counter_j == 0:
        return 0.0 if integral_j == 0 else math.inf
    return abs(counter_j - integral_j) / abs(counter_j)
