"""Which side measures next, and when a paired case has seen enough.

The order.  Inside a case the two sides' trials run in blocks of four, ``ABBA`` or
``BAAB``, each block's pattern drawn at random.  A block gives two pairs, (A, B) and
(B, A): a machine that speeds up or slows down steadily over the block favours the
later trial of the first pair and the earlier one of the second, so the drift cancels
in the pair's mean; drawing the pattern at random keeps anything periodic (a timer, a
neighbour's cron job) from lining up with one side.  Strict alternation (ABAB) would put
the base first in every pair, so a steady drift would read as a regression.

The stopping rule.  Each pair gives one difference of the gated figure, head against
base (its log for a relative gate).  After every block the case is judged on two
one-sided bounds of the differences' mean: it stops as a pass when its upper bound at
``PASS_LEVEL`` (or the run's confidence, if lower) lies below the gate's threshold (it
would not fail), and as a fail when
its lower bound at a level corrected for the number of cases (Bonferroni: all cases hold
at once) lies above it; otherwise at the trial and time limits.  The verdict is not the
stopping rule's: the comparison tests every case on its pairs afterwards, corrected for
many cases.  So a lenient pass costs nothing against false alarms, and a case that
regressed beyond the gate cannot stop as a pass unless it looks like one (a +10 % case
at a 5 % gate, with pairs spread 3.5 % as here, about 4e-5 per look after two blocks:
computed from the t bound, not measured).  Clear cases stop
after one or two blocks; close ones get the trials.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..sessions import POOL_DF, moderated
from ..stats import f_upper, t_quantile
from .channel import BASE, HEAD

BLOCKS = ((BASE, HEAD, HEAD, BASE), (HEAD, BASE, BASE, HEAD))
# Pairs a case measures before the rule may stop it: one block, whose two pairs cancel a
# steady drift together.  Their interval alone is wide (one degree of freedom); the cases
# decided before lend it their noise (``Pool``), so from the second case on a clear case
# stops after one block: a long case (0.6 s a trial) then costs 2 trials a side, not 4.
MIN_PAIRS = 2
# The one-sided level of a pass's bound: lenient, since a pass's bound only stops a case
# and its verdict is the comparison's own test; 0.95 cost a fifth more trials and 0.85
# let more regressions stop as passes (the replays: docs/evidence.md).
PASS_LEVEL = 0.90
# Pairs a case measures before it may stop as a fail: two blocks of its own.  On a machine
# busy with other work one block of a short case read 10x (the math library's threads
# spinning while the other work held a core), and the pool's borrowed noise let it fail.
MIN_FAIL_PAIRS = 4
# Pairs a case measures in a confirming pass (``llmenergy ab --confirm``) before it may
# stop as a pass: as many as a fail needs.  A first-pass FAIL cleared on one block is
# one block's word against the first pass's, and real regressions were cleared that way
# (docs/evidence.md).
MIN_CONFIRM_PAIRS = MIN_FAIL_PAIRS
# A case borrows the pooled noise of the cases before it only as far as its own pairs are
# consistent with it: when its own variance is larger than the pool's beyond this upper
# tail (an F test), it stands on its own pairs alone: otherwise the pool narrows the
# interval of a case whose own two pairs disagree widely, and a regression passes
# (issue 44; docs/evidence.md).
CONSISTENT_P = 0.01
# ... and it may stop as a pass only when its own interval (no borrowing) is within this
# many gates of its mean: a case whose own pairs span tens of percent is measured more,
# and one still that wide at its limit is reported undecided, never passed.
OWN_SPAN_GATES = 4.0


def block(rng: random.Random) -> tuple[str, ...]:
    """The next block's four turns: ABBA or BAAB, at random."""
    return BLOCKS[rng.randrange(2)]


def block_pairs(sides: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """The index pairs of a block's turns: from the first on, a turn and the next one
    of the other side (base then head, or head then base); a turn followed by its own
    side's stays unpaired.  So a pattern, not the code, says which turns pair: ABBA
    and BAAB give (0, 1) and (2, 3)."""
    pairs: list[tuple[int, int]] = []
    i = 0
    while i + 1 < len(sides):
        if sides[i] != sides[i + 1]:
            pairs.append((i, i + 1))
            i += 2
        else:
            i += 1
    return tuple(pairs)


@dataclass(frozen=True)
class GateRule:
    """What a case is decided against: a gate's figure and threshold."""

    metric: str
    threshold: float  # a fraction when relative, else in the figure's unit
    relative: bool
    higher_is_worse: bool = True

    @property
    def limit(self) -> float:
        """The threshold on the scale of the differences (log for a relative gate)."""
        return math.log1p(self.threshold) if self.relative else self.threshold

    def difference(self, base: float, head: float) -> float | None:
        """How much worse head is than base, on the rule's scale (None: no log)."""
        if self.relative:
            if base <= 0 or head <= 0:
                return None
            diff = math.log(head) - math.log(base)
        else:
            diff = head - base
        return diff if self.higher_is_worse else -diff


@dataclass(frozen=True)
class Interval:
    """The mean paired difference and its corrected interval, on the rule's scale."""

    mean: float
    low: float
    high: float
    pairs: int

    def ratio_text(self, relative: bool) -> str:
        if relative:
            return (
                f"head/base {math.exp(self.mean):.3f} "
                f"[{math.exp(self.low):.3f}, {math.exp(self.high):.3f}]"
            )
        return f"head-base {self.mean:+.4g} [{self.low:+.4g}, {self.high:+.4g}]"


@dataclass(frozen=True)
class Pool:
    """The variance of one pair's difference, pooled over the cases decided so far: a
    case with few pairs borrows from it (``POOL_DF`` degrees of freedom), as the
    verdict's test does (``sessions.moderated``)."""

    variance: float
    df: float


def paired_interval(
    diffs: Sequence[float], level: float, pool: Pool | None = None
) -> Interval | None:
    """Two-sided ``level`` t interval of the mean difference (None below two pairs),
    the variance moderated toward ``pool`` when there is one."""
    n = len(diffs)
    if n < 2:
        return None
    mean = statistics.fmean(diffs)
    variance, df = statistics.variance(diffs), float(n - 1)
    if pool is not None and pool.df > 0 and consistent(variance, df, pool):
        variance = moderated(variance, df, pool.variance)
        df += POOL_DF
    half = t_quantile(1.0 - (1.0 - level) / 2.0, df) * math.sqrt(variance / n)
    return Interval(mean, mean - half, mean + half, n)


def consistent(variance: float, df: float, pool: Pool, p: float = CONSISTENT_P) -> bool:
    """Whether a case's own variance could come from the pool's noise: the upper tail of
    F(df, pool.df) at their ratio is at least ``p``."""
    if pool.variance <= 0:
        return variance <= 0
    return f_upper(variance / pool.variance, df, pool.df) >= p


def own_span_ok(diffs: Sequence[float], level: float, rule: GateRule) -> bool:
    """Whether the case's own interval (no borrowed noise) is narrow enough to pass on:
    its half-width at most ``OWN_SPAN_GATES`` gates."""
    own = paired_interval(diffs, level)
    return own is not None and own.high - own.mean <= OWN_SPAN_GATES * abs(rule.limit)


def pooled(diffs: Sequence[Sequence[float]]) -> Pool | None:
    """The pooled variance of the differences of several cases (None: no case with two)."""
    ss = df = 0.0
    for found in diffs:
        if len(found) >= 2:
            ss += statistics.variance(found) * (len(found) - 1)
            df += len(found) - 1
    return Pool(ss / df, df) if df else None


def case_level(confidence: float, cases: int) -> float:
    """Each case's level so that all ``cases`` hold together (Bonferroni)."""
    return 1.0 - (1.0 - confidence) / max(1, cases)


@dataclass(frozen=True)
class Decision:
    stop: bool
    decided: bool  # the bounds said pass or fail (else a limit stopped it)
    why: str
    intervals: Mapping[str, Interval]
    # Gates still open whose case's own pairs span too wide to pass on
    # (``OWN_SPAN_GATES``): measured more, and undecided if the limit comes first.
    too_wide: tuple[str, ...] = ()


def one_sided(level: float) -> float:
    """The two-sided level whose interval's ends are one-sided bounds at ``level``."""
    return 2.0 * level - 1.0


def decide(
    diffs: Mapping[str, Sequence[float]],
    rules: Sequence[GateRule],
    *,
    pass_level: float,
    fail_level: float,
    attempted_pairs: int,
    max_pairs: int,
    measured_s: float,
    min_time_s: float,
    max_time_s: float,
    pools: Mapping[str, Pool] | None = None,
    min_pairs: int = MIN_PAIRS,
) -> Decision:
    """Stop when every gate is decided (after ``min_pairs`` pairs and ``min_time_s``
    measured on each side): a pass when the mean's upper bound at ``pass_level`` lies
    below its threshold, a fail when the lower bound at ``fail_level`` lies above it
    (both one-sided); or at a limit.  ``diffs`` holds each gate's differences, by figure;
    ``measured_s`` is the least either side has measured in this case; ``pools`` the
    pooled variance of each figure's differences over the cases decided before.  The
    intervals returned are two-sided at ``fail_level``'s two-sided twin, for the record."""
    intervals: dict[str, Interval] = {}
    open_rules = []
    too_wide = []
    for rule in rules:
        pool = (pools or {}).get(rule.metric)
        found = diffs.get(rule.metric, ())
        passing = paired_interval(found, one_sided(pass_level), pool)
        failing = paired_interval(found, one_sided(fail_level), pool)
        if failing is not None:
            intervals[rule.metric] = failing
        narrow = own_span_ok(found, one_sided(pass_level), rule)
        passed = narrow and passing is not None and passing.high < rule.limit
        failed = failing is not None and failing.low > rule.limit and len(found) >= MIN_FAIL_PAIRS
        if not (passed or failed):
            open_rules.append(rule)
            if not narrow:
                too_wide.append(rule.metric)
    wide = tuple(too_wide)
    enough = min((len(diffs.get(r.metric, ())) for r in rules), default=0) >= min_pairs
    if enough and measured_s >= min_time_s and not open_rules:
        return Decision(True, True, "decided", intervals)
    if attempted_pairs >= max_pairs:
        return Decision(True, False, f"stopped at {max_pairs} pairs undecided", intervals, wide)
    if max_time_s and measured_s >= max_time_s:
        return Decision(True, False, f"stopped at {max_time_s:g} s undecided", intervals, wide)
    return Decision(False, False, "", intervals, wide)
