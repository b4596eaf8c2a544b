"""Small-sample statistics: Student t intervals and Welch's test, without scipy.

Trials are few (3 to 25), so intervals use the t distribution, not the normal one.
The t distribution's CDF is the regularized incomplete beta function, evaluated by
its continued fraction; quantiles are found by bisection on that CDF, which is exact
to far below anything a benchmark can resolve.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

_EPS = 1e-15
_TINY = 1e-300


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of I_x(a, b) (modified Lentz); converges fast for x < (a+1)/(a+b+2)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 500):
        m2 = 2 * m
        # even step
        num = m * (b - m) * x / ((a + m2 - 1.0) * (a + m2))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + num / (c if abs(c) > _TINY else _TINY)
        result *= d * c
        # odd step
        num = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + num / (c if abs(c) > _TINY else _TINY)
        step = d * c
        result *= step
        if abs(step - 1.0) < _EPS:
            break
    return result


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def f_upper(ratio: float, df1: float, df2: float) -> float:
    """The upper tail of the F(df1, df2) distribution at ``ratio``: how likely a variance
    ratio this large is when both variances estimate the same one."""
    x = df1 * ratio / (df1 * ratio + df2)
    return 1.0 - betainc(df1 / 2.0, df2 / 2.0, x)


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (df may be fractional)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@lru_cache(maxsize=1024)
def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (cached: the controller asks for the same few after
    every trial)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Summary:
    """Mean and the two-sided confidence interval of the mean, from n independent trials.

    ``half_width`` is infinite below two trials: one trial says nothing about spread.
    """

    n: int
    mean: float
    stdev: float
    half_width: float
    confidence: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def relative_half_width(self) -> float:
        if self.mean == 0:
            return 0.0 if self.half_width == 0 else math.inf
        return self.half_width / abs(self.mean)


def summarize(values: Sequence[float], confidence: float = 0.95) -> Summary:
    n = len(values)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.inf, confidence)
    mean = math.fsum(values) / n
    if n == 1:
        return Summary(1, mean, math.nan, math.inf, confidence)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    stdev = math.sqrt(var)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * stdev / math.sqrt(n)
    return Summary(n, mean, stdev, half, confidence)


@dataclass(frozen=True)
class WelchResult:
    """Welch's two-sample t-test of mean(b) against mean(a)."""

    t: float
    df: float
    p_value: float  # two-sided

    def significant(self, confidence: float) -> bool:
        return self.p_value < 1.0 - confidence


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> WelchResult:
    """Unequal variances allowed; needs two values on each side."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's t-test needs at least two values on each side")
    sa, sb = summarize(a), summarize(b)
    va, vb = sa.stdev**2 / sa.n, sb.stdev**2 / sb.n
    diff = sb.mean - sa.mean
    if va + vb == 0:
        if diff == 0:
            return WelchResult(0.0, math.inf, 1.0)
        return WelchResult(math.copysign(math.inf, diff), math.inf, 0.0)
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1))
    p = 2.0 * (1.0 - t_cdf(abs(t), df))
    return WelchResult(t, df, min(1.0, max(0.0, p)))


# -- robust location: a paired run's pairs are heavy-tailed (docs/evidence.md) -------------
# Huber's tuning constant: 95 % as efficient as the mean where the noise is normal.
HUBER_K = 1.345
# The median absolute deviation, times this, estimates a normal noise's standard deviation.
MAD_TO_SD = 1.4826
# ...with about 37 % of the efficiency of the sample standard deviation: its degrees of
# freedom, counted as a share of the sample's.
MAD_EFFICIENCY = 0.37


def mad_scale(deviations: Sequence[float]) -> float:
    """A noise's standard deviation read from the median absolute deviation of
    ``deviations`` (already centred): one far value cannot inflate it."""
    if not deviations:
        return 0.0
    return MAD_TO_SD * statistics.median(abs(d) for d in deviations)


def huber_location(values: Sequence[float], scale: float) -> float:
    """Huber's M-estimate of the centre of ``values``: the mean of the values within
    ``HUBER_K * scale`` of it, the farther ones counted as if at that distance
    (iteratively reweighted, from the median).  ``scale`` 0: the median."""
    centre = statistics.median(values)
    if scale <= 0.0 or len(values) < 3:
        return centre if scale <= 0.0 else statistics.fmean(values)
    bound = HUBER_K * scale
    for _ in range(100):
        weights = [1.0 if abs(v - centre) <= bound else bound / abs(v - centre) for v in values]
        moved = math.fsum(w * v for w, v in zip(weights, values)) / math.fsum(weights)
        if abs(moved - centre) <= 1e-12 * scale:
            return moved
        centre = moved
    return centre


def huber_variance_factor(standardized: Sequence[float]) -> float:
    """How much more variance a Huber estimate has than a mean of normal noise of the
    same scale, from the standardized residuals: E[psi^2] / E[psi']^2 (the sandwich
    estimate; about 1.05 for normal noise).  1.0 without residuals."""
    if not standardized:
        return 1.0
    inside = sum(1 for u in standardized if abs(u) <= HUBER_K) / len(standardized)
    if inside == 0.0:
        return 1.0
    psi2 = math.fsum(min(HUBER_K, abs(u)) ** 2 for u in standardized) / len(standardized)
    return psi2 / inside**2
