"""Which queries go where: the cheapest assignment of token ranges to systems.

A query's cost on a system is ``lam * E + (1 - lam) * p_ref_w * T`` joules: lam = 1 is
pure energy, lam = 0 pure time (priced at ``p_ref_w``, by default the largest average
power among the systems, so both terms are joules).

Routing by input or output tokens, each system takes one contiguous range of token
counts (two systems: one threshold).  The optimizer tries every order of the systems
and, for each, finds the best split points by dynamic programming over the distinct
token counts of the workload, so its cost does not grow with the number of queries
once they are counted.  Capacity limits (largest share of queries, or of busy
seconds) bound each system's range; the result is the best policy that meets them.
Routing by both, two systems: the efficient system takes the queries inside a box
(input <= a and output <= b), the best box over every pair of distinct counts.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from . import BOTH, BY_CHOICES, INPUT, OUTPUT
from .fit import SystemModel
from .policy import Policy, Rule
from .workload import Workload

TOKENS, MEASURED = "tokens", "measured"
BOUNDARY_CHOICES = (TOKENS, MEASURED)
MAX_SYSTEMS = 6  # orders tried: 6! = 720
_DENSE_LIMIT = 20_000_000  # (input, output) pairs counted in one bincount up to this size


class RoutingError(ConfigError):
    """A routing question without an answer; the message says what to change."""


@dataclass(frozen=True)
class Capacity:
    """The most one system may take: a share of the queries and/or of busy seconds.

    ``busy_share`` is a share of the seconds the whole workload would keep that system
    busy; ``busy_s`` is absolute seconds.
    """

    system: str
    query_share: float | None = None
    busy_share: float | None = None
    busy_s: float | None = None


_CAPACITY = re.compile(
    r"^(?P<system>.+?)\s*=\s*(?P<busy>busy:)?(?P<value>[0-9.]+)\s*(?P<unit>%|s)?$"
)
CAPACITY_EXAMPLES = "SYSTEM=40% (share of queries), SYSTEM=busy:25% (share of busy seconds), "
CAPACITY_EXAMPLES += "SYSTEM=3600s (busy seconds)"


def parse_capacity(text: str) -> Capacity:
    match = _CAPACITY.match(text.strip())
    value = float("nan")
    if match and match["value"].count(".") <= 1 and match["value"] != ".":
        value = float(match["value"])
    if not match or math.isnan(value) or (match["busy"] and match["unit"] != "%"):
        raise ConfigError(f"bad capacity {text!r}: give {CAPACITY_EXAMPLES}")
    system = match["system"].strip()
    if match["unit"] == "s":
        return Capacity(system, busy_s=value)
    share = value / 100 if match["unit"] == "%" else value
    if not 0 <= share <= 1:
        raise ConfigError(f"bad capacity {text!r}: a share lies between 0 and 100%")
    return (
        Capacity(system, busy_share=share) if match["busy"] else Capacity(system, query_share=share)
    )


@dataclass(frozen=True)
class Totals:
    """The workload under one assignment."""

    energy_j: float
    runtime_s: float  # busy seconds summed over systems
    cost_j: float
    queries: Mapping[str, int]
    busy_s: Mapping[str, float]
    energy_by_system_j: Mapping[str, float]

    @property
    def makespan_s(self) -> float:
        """Busy seconds of the busiest system: the runtime when systems work in parallel."""
        return max(self.busy_s.values(), default=0.0)


@dataclass(frozen=True)
class Baseline:
    name: str
    totals: Totals


@dataclass(frozen=True)
class Decision:
    """A policy, what it costs on the workload, and what it saves against the baselines."""

    policy: Policy
    totals: Totals
    baselines: tuple[Baseline, ...]
    queries: int

    def saving(self, baseline: Baseline, what: str = "energy_j") -> float:
        """Fraction saved against ``baseline`` (negative: the policy costs more)."""
        ref = getattr(baseline.totals, what)
        return 1 - getattr(self.totals, what) / ref if ref else math.nan


def _histogram(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values and their counts, in O(n) when the values are small integers."""
    if len(values) == 0:
        return values.astype(np.int64), values.astype(np.int64)
    if values.min() < 0:
        raise RoutingError("token counts cannot be negative")
    counts = np.bincount(values)
    keys = np.flatnonzero(counts)
    return keys, counts[keys]


class Router:
    """One model, two or more systems, one workload: policies at any lam and capacity."""

    def __init__(
        self,
        models: Sequence[SystemModel],
        workload: Workload,
        by: str = INPUT,
        p_ref_w: float | None = None,
        boundaries: str = TOKENS,
    ) -> None:
        if by not in BY_CHOICES:
            raise RoutingError(f"bad --by {by!r}: give one of {', '.join(BY_CHOICES)}")
        if boundaries not in BOUNDARY_CHOICES:
            raise RoutingError(
                f"bad boundaries {boundaries!r}: give one of {', '.join(BOUNDARY_CHOICES)}"
            )
        if len(models) < 2:
            raise RoutingError("routing needs two or more systems")
        if len(models) > MAX_SYSTEMS:
            raise RoutingError(f"routing handles up to {MAX_SYSTEMS} systems at once")
        if by == BOTH and len(models) != 2:
            raise RoutingError(
                "--by both routes between two systems; pick two with --system, "
                "or route by input or output"
            )
        if len(workload) == 0:
            raise RoutingError("the workload has no queries")
        self.models = tuple(models)
        self.systems = tuple(m.system for m in models)
        self.model = models[0].profile.model
        self.workload = workload
        self.by = by
        self.boundaries = boundaries
        powers = [m.profile.average_power_w for m in models]
        self.p_ref_w = float(p_ref_w) if p_ref_w is not None else max(powers)
        if not (self.p_ref_w > 0 and math.isfinite(self.p_ref_w)):
            raise RoutingError(f"bad reference power {self.p_ref_w!r} W: give a power > 0")
        self.n = len(workload)
        if by == BOTH:
            self._count_pairs()
        else:
            self._count_one()

    # -- the workload, counted ---------------------------------------------------------
    def _count_one(self) -> None:
        values = self.workload.input_tokens if self.by == INPUT else self.workload.output_tokens
        keys, counts = _histogram(values)
        zeros = np.zeros_like(keys)
        n_in, n_out = (keys, zeros) if self.by == INPUT else (zeros, keys)
        costs = [m.costs(self.by, n_in, n_out) for m in self.models]
        energy = np.array([c[0] for c in costs])  # (systems, keys)
        time = np.array([c[1] for c in costs])
        groups, limits = self._groups(keys, self.by)
        self.keys = keys
        self.count = np.bincount(groups, weights=counts).astype(np.int64)
        self.energy = np.array([np.bincount(groups, weights=counts * e) for e in energy])
        self.time = np.array([np.bincount(groups, weights=counts * t) for t in time])
        self.limits = limits  # the largest token count of each group

    def _groups(self, keys: np.ndarray, axis: str) -> tuple[np.ndarray, np.ndarray]:
        """Which keys may be split apart: every distinct count, or only at measured sizes
        (the research's grid).  Returns each key's group and each group's largest count."""
        if self.boundaries == TOKENS:
            return np.arange(len(keys)), keys
        cuts = np.array(sorted({s for m in self.models for s in m.sweep(axis).sizes}))
        groups = np.searchsorted(cuts, keys, side="left")
        used, groups = np.unique(groups, return_inverse=True)
        limits = np.array([cuts[g] if g < len(cuts) else keys.max() for g in used])
        return groups, limits

    def _count_pairs(self) -> None:
        n_in, n_out = self.workload.input_tokens, self.workload.output_tokens
        if n_in.min() < 0 or n_out.min() < 0:
            raise RoutingError("token counts cannot be negative")
        width = int(n_out.max()) + 1
        if (int(n_in.max()) + 1) * width <= _DENSE_LIMIT:
            codes, counts = _histogram(n_in * width + n_out)
        else:
            codes, counts = np.unique(n_in * width + n_out, return_counts=True)
        pair_in, pair_out = codes // width, codes % width
        keys_in, keys_out = np.unique(pair_in), np.unique(pair_out)
        g_in, lim_in = self._groups(keys_in, INPUT)
        g_out, lim_out = self._groups(keys_out, OUTPUT)
        gi = g_in[np.searchsorted(keys_in, pair_in)]
        go = g_out[np.searchsorted(keys_out, pair_out)]
        shape = (len(lim_in), len(lim_out))
        flat = gi * shape[1] + go
        size = shape[0] * shape[1]
        self.count = np.bincount(flat, weights=counts, minlength=size).reshape(shape)
        energy, time = [], []
        for m in self.models:
            e, t = m.costs(BOTH, pair_in, pair_out)
            energy.append(np.bincount(flat, weights=counts * e, minlength=size).reshape(shape))
            time.append(np.bincount(flat, weights=counts * t, minlength=size).reshape(shape))
        self.energy, self.time = np.array(energy), np.array(time)
        self.limits = (lim_in, lim_out)

    # -- deciding ----------------------------------------------------------------------
    def cost(self, lam: float) -> np.ndarray:
        return lam * self.energy + (1 - lam) * self.p_ref_w * self.time

    def solve(self, lam: float = 1.0, capacities: Sequence[Capacity] = ()) -> Decision:
        if not 0 <= lam <= 1:
            raise RoutingError(f"bad lambda {lam!r}: give a weight between 0 and 1")
        unknown = [c.system for c in capacities if c.system not in self.systems]
        if unknown:
            raise RoutingError(
                f"capacity for {unknown[0]!r}, which is not routed to; systems: "
                f"{', '.join(self.systems)}"
            )
        caps = self._caps(capacities)
        if self.by == BOTH:
            assign, rules = self._solve_box(lam, caps)
        else:
            assign, rules = self._solve_ranges(lam, caps)
        totals = self.totals(assign, lam)
        policy = Policy(
            model=self.model,
            by=self.by,
            rules=rules,
            lam=float(lam),
            p_ref_w=self.p_ref_w,
            workload=self.workload.name,
            expected={
                "queries": self.n,
                "energy_j": totals.energy_j,
                "runtime_s": totals.runtime_s,
                "queries_by_system": dict(totals.queries),
            },
        )
        return Decision(policy, totals, self.baselines(totals, lam), self.n)

    def _caps(self, capacities: Sequence[Capacity]) -> list[tuple[float, float]]:
        """Per system: (most queries, most busy seconds)."""
        caps = [[math.inf, math.inf] for _ in self.systems]
        for c in capacities:
            i = self.systems.index(c.system)
            if c.query_share is not None:
                caps[i][0] = min(caps[i][0], math.floor(c.query_share * self.n + 1e-9))
            if c.busy_share is not None:
                caps[i][1] = min(caps[i][1], c.busy_share * float(self.time[i].sum()))
            if c.busy_s is not None:
                caps[i][1] = min(caps[i][1], c.busy_s)
        return [(q, b) for q, b in caps]

    def _infeasible(self) -> RoutingError:
        return RoutingError(
            "no policy meets the capacity limits: together the systems cannot take every "
            "query; raise a limit or route to another system"
        )

    def _solve_ranges(
        self, lam: float, caps: Sequence[tuple[float, float]]
    ) -> tuple[np.ndarray, tuple[Rule, ...]]:
        total, order, cuts = best_ranges(self.cost(lam), self.count, self.time, caps)
        if not math.isfinite(total):
            raise self._infeasible()
        assign = np.empty(len(self.count), dtype=np.int64)
        rules = []
        for system, (lo, hi) in zip(order, itertools.pairwise(cuts)):
            assign[lo:hi] = system
            if hi > lo:
                rules.append((system, int(self.limits[hi - 1])))
        key = "max_input_tokens" if self.by == INPUT else "max_output_tokens"
        built = [Rule(self.systems[s], **{key: limit}) for s, limit in rules[:-1]]
        built.append(Rule(self.systems[rules[-1][0]]))
        return assign, tuple(built)

    def _solve_box(
        self, lam: float, caps: Sequence[tuple[float, float]]
    ) -> tuple[np.ndarray, tuple[Rule, ...]]:
        cost = self.cost(lam)
        best = (math.inf, 0, 0, 0)
        for inner in (0, 1):
            outer = 1 - inner
            inside = _prefix2(cost[inner] - cost[outer])
            total = float(cost[outer].sum()) + inside
            q_in = _prefix2(self.count)
            busy_in = _prefix2(self.time[inner])
            busy_out = float(self.time[outer].sum()) - _prefix2(self.time[outer])
            ok = (q_in <= caps[inner][0]) & (self.n - q_in <= caps[outer][0])
            ok &= (busy_in <= caps[inner][1] * (1 + 1e-12)) & (
                busy_out <= caps[outer][1] * (1 + 1e-12)
            )
            total = np.where(ok, total, math.inf)
            i, o = np.unravel_index(int(np.argmin(total)), total.shape)
            if total[i, o] < best[0]:
                best = (float(total[i, o]), inner, int(i), int(o))
        value, inner, i, o = best
        if not math.isfinite(value):
            raise self._infeasible()
        outer = 1 - inner
        assign = np.full(self.count.shape, outer, dtype=np.int64)
        assign[:i, :o] = inner
        lim_in, lim_out = self.limits
        if i == 0 or o == 0:
            return assign, (Rule(self.systems[outer]),)
        rules = (
            Rule(self.systems[inner], int(lim_in[i - 1]), int(lim_out[o - 1])),
            Rule(self.systems[outer]),
        )
        return assign, rules

    # -- what a policy costs -----------------------------------------------------------
    def totals(self, assign: np.ndarray, lam: float) -> Totals:
        pick = [assign == s for s in range(len(self.systems))]
        energy = [float(self.energy[s][pick[s]].sum()) for s in range(len(pick))]
        busy = [float(self.time[s][pick[s]].sum()) for s in range(len(pick))]
        queries = [int(self.count[pick[s]].sum()) for s in range(len(pick))]
        e, t = math.fsum(energy), math.fsum(busy)
        return Totals(
            energy_j=e,
            runtime_s=t,
            cost_j=lam * e + (1 - lam) * self.p_ref_w * t,
            queries=dict(zip(self.systems, queries)),
            busy_s=dict(zip(self.systems, busy)),
            energy_by_system_j=dict(zip(self.systems, energy)),
        )

    def baselines(self, totals: Totals, lam: float) -> tuple[Baseline, ...]:
        """Every query on one system; and workload-unaware: the policy's shares of queries
        sent to each system without looking at their size (the expected totals)."""
        single = [
            Baseline(f"all on {s}", self.totals(np.full(self.count.shape, i), lam))
            for i, s in enumerate(self.systems)
        ]
        shares = [totals.queries[s] / self.n for s in self.systems]
        e = math.fsum(w * b.totals.energy_j for w, b in zip(shares, single))
        t = math.fsum(w * b.totals.runtime_s for w, b in zip(shares, single))
        unaware = Totals(
            energy_j=e,
            runtime_s=t,
            cost_j=lam * e + (1 - lam) * self.p_ref_w * t,
            queries={s: round(w * self.n) for s, w in zip(self.systems, shares)},
            busy_s={s: w * b.totals.runtime_s for s, w, b in zip(self.systems, shares, single)},
            energy_by_system_j={
                s: w * b.totals.energy_j for s, w, b in zip(self.systems, shares, single)
            },
        )
        return (*single, Baseline("workload-unaware (same shares, size-blind)", unaware))

    def threshold_curve(self, low: int = 0, high: int = 1) -> tuple[np.ndarray, ...]:
        """Workload energy and runtime with ``low`` below each threshold, ``high`` above:
        (thresholds, energy_j, runtime_s); threshold -1 sends everything to ``high``."""
        if self.by == BOTH:
            raise RoutingError("a threshold curve is for routing by input or by output")
        pe = np.concatenate([[0.0], np.cumsum(self.energy[low])])
        pt = np.concatenate([[0.0], np.cumsum(self.time[low])])
        qe = np.concatenate([[0.0], np.cumsum(self.energy[high])])
        qt = np.concatenate([[0.0], np.cumsum(self.time[high])])
        thresholds = np.concatenate([[-1], self.limits])
        return thresholds, pe + (qe[-1] - qe), pt + (qt[-1] - qt)

    def sweep(self, lams: Sequence[float], capacities: Sequence[Capacity] = ()) -> list[Decision]:
        return [self.solve(lam, capacities) for lam in lams]


def pareto(decisions: Sequence[Decision]) -> list[Decision]:
    """The decisions no other beats on both energy and runtime, by energy."""
    front: list[Decision] = []
    for d in sorted(decisions, key=lambda d: (d.totals.energy_j, d.totals.runtime_s)):
        if not front or d.totals.runtime_s < front[-1].totals.runtime_s:
            front.append(d)
    return front


def _prefix2(a: np.ndarray) -> np.ndarray:
    """P[i, j] = sum of a[:i, :j], with a zero first row and column."""
    out = np.zeros((a.shape[0] + 1, a.shape[1] + 1))
    out[1:, 1:] = a.cumsum(axis=0).cumsum(axis=1)
    return out


def best_ranges(
    cost: np.ndarray,
    count: np.ndarray,
    busy: np.ndarray,
    caps: Sequence[tuple[float, float]],
) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
    """Cheapest split of groups 0..G-1 into one contiguous (maybe empty) range per system.

    Returns (total cost, order of systems, cuts): system ``order[k]`` takes groups
    ``cuts[k]:cuts[k+1]``.  For each order, f_k(g) = min over g' <= g of
    f_{k-1}(g') + P_k(g) - P_k(g'), with g' no further back than the capacity allows;
    the minimum is a running minimum, or a sliding-window one under capacity limits.
    """
    systems, groups = cost.shape
    prefix = np.zeros((systems, groups + 1))
    prefix[:, 1:] = np.cumsum(cost, axis=1)
    queries = np.concatenate([[0], np.cumsum(count)])
    seconds = np.zeros((systems, groups + 1))
    seconds[:, 1:] = np.cumsum(busy, axis=1)
    positions = np.arange(groups + 1)
    best: tuple[float, tuple[int, ...], tuple[int, ...]] = (math.inf, (), ())
    for order in itertools.permutations(range(systems)):
        f = np.full(groups + 1, math.inf)
        f[0] = 0.0
        choices = []
        for s in order:
            h = f - prefix[s]
            q_cap, b_cap = caps[s]
            if math.isinf(q_cap) and math.isinf(b_cap):
                run = np.minimum.accumulate(h)
                arg = np.maximum.accumulate(np.where(h <= run, positions, 0))
            else:
                start = np.zeros(groups + 1, dtype=np.int64)
                if not math.isinf(q_cap):
                    start = np.searchsorted(queries, queries - q_cap, side="left")
                if not math.isinf(b_cap):
                    slack = b_cap + 1e-9 * max(1.0, b_cap)
                    start = np.maximum(
                        start, np.searchsorted(seconds[s], seconds[s] - slack, side="left")
                    )
                run, arg = _window_min(h, start)
            f = run + prefix[s]
            choices.append(arg)
        if f[groups] < best[0]:
            cuts = [groups]
            g = groups
            for arg in reversed(choices):
                g = int(arg[g])
                cuts.append(g)
            best = (float(f[groups]), order, tuple(reversed(cuts)))
    return best


def _window_min(h: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """min of h[start[g]:g+1] and where, for every g; ``start`` never decreases."""
    run = np.full(len(h), math.inf)
    arg = np.zeros(len(h), dtype=np.int64)
    window: deque[int] = deque()
    values = h.tolist()
    starts = start.tolist()
    for g, v in enumerate(values):
        while window and values[window[-1]] >= v:
            window.pop()
        window.append(g)
        while window and window[0] < starts[g]:
            window.popleft()
        if window:
            run[g] = values[window[0]]
            arg[g] = window[0]
    return run, arg
