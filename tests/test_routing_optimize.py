"""The optimizer against exhaustive search: every order of systems and every set of cut
points (or every box, routing by both), with and without capacity limits; baselines,
savings, the Pareto front and the threshold curve against direct sums over queries."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.routing import BOTH, INPUT, OUTPUT
from pytest_llmenergy.routing.fit import SystemModel, build_model
from pytest_llmenergy.routing.optimize import (
    MEASURED,
    Baseline,
    Capacity,
    Decision,
    Router,
    RoutingError,
    Totals,
    best_ranges,
    pareto,
    parse_capacity,
)
from pytest_llmenergy.routing.policy import Policy, Rule
from pytest_llmenergy.routing.profile import Point, Profile
from pytest_llmenergy.routing.workload import Workload

SIZES = (1, 2, 4, 8, 16, 32, 64)
INF = math.inf


# -- exhaustive search ---------------------------------------------------------------------
def exhaustive(
    cost: np.ndarray,
    count: np.ndarray,
    busy: np.ndarray,
    caps: Sequence[tuple[float, float]],
    cuts_allowed: Sequence[int] | None = None,
) -> float:
    """Cheapest assignment of one contiguous (maybe empty) range of groups per system: every
    order of the systems, every set of cut points (from ``cuts_allowed``), caps checked."""
    systems, groups = cost.shape
    p_cost = np.concatenate([np.zeros((systems, 1)), np.cumsum(cost, axis=1)], axis=1).tolist()
    p_busy = np.concatenate([np.zeros((systems, 1)), np.cumsum(busy, axis=1)], axis=1).tolist()
    p_count = np.concatenate([[0], np.cumsum(count)]).tolist()
    allowed = range(groups + 1) if cuts_allowed is None else sorted(cuts_allowed)
    best = INF
    for order in itertools.permutations(range(systems)):
        for inner in itertools.combinations_with_replacement(allowed, systems - 1):
            cuts = (0, *inner, groups)
            total = 0.0
            for k, s in enumerate(order):
                lo, hi = cuts[k], cuts[k + 1]
                q_cap, b_cap = caps[s]
                seconds = p_busy[s][hi] - p_busy[s][lo]
                if p_count[hi] - p_count[lo] > q_cap or seconds > b_cap + 1e-9 * max(1, b_cap):
                    break
                total += p_cost[s][hi] - p_cost[s][lo]
            else:
                best = min(best, total)
    return best


def random_caps(rng: np.random.Generator, count: np.ndarray, busy: np.ndarray) -> list:
    caps = []
    for s in range(busy.shape[0]):
        kind = rng.integers(0, 4)
        q_cap = float(rng.integers(0, count.sum() + 1)) if kind in (1, 3) else INF
        b_cap = float(rng.uniform(0, busy[s].sum())) if kind in (2, 3) else INF
        caps.append((q_cap, b_cap))
    return caps


def test_best_ranges_equals_exhaustive_search() -> None:
    """2, 3 and 4 systems, up to 6 groups, random capacity limits (often infeasible)."""
    rng = np.random.default_rng(10)
    seen_infeasible = seen_capped = 0
    for trial in range(150):
        systems, groups = int(rng.integers(2, 5)), int(rng.integers(1, 7))
        cost = rng.uniform(0, 10, size=(systems, groups))
        count = rng.integers(1, 5, size=groups)
        busy = rng.uniform(0.1, 3, size=(systems, groups))
        caps = [(INF, INF)] * systems if trial % 3 == 0 else random_caps(rng, count, busy)
        total, order, cuts = best_ranges(cost, count, busy, caps)
        expected = exhaustive(cost, count, busy, caps)
        if math.isinf(expected):
            seen_infeasible += 1
            assert math.isinf(total)
            continue
        seen_capped += any(c != (INF, INF) for c in caps)
        assert total == pytest.approx(expected, rel=1e-12, abs=1e-12)
        # the returned split is a real one, within the caps, and costs what it says
        assert sorted(order) == list(range(systems))
        assert cuts[0] == 0 and cuts[-1] == groups and list(cuts) == sorted(cuts)
        recomputed = 0.0
        for s, (lo, hi) in zip(order, itertools.pairwise(cuts)):
            recomputed += cost[s, lo:hi].sum()
            assert count[lo:hi].sum() <= caps[s][0]
            assert busy[s, lo:hi].sum() <= caps[s][1] * (1 + 1e-9) + 1e-12
        assert recomputed == pytest.approx(total)
    assert seen_infeasible >= 5 and seen_capped >= 30  # both kinds were exercised


def test_best_ranges_with_every_system_capped_to_nothing_is_infeasible() -> None:
    cost = np.ones((2, 3))
    total, order, cuts = best_ranges(cost, np.ones(3, dtype=int), cost, [(0, INF), (INF, 0.0)])
    assert math.isinf(total) and order == () and cuts == ()


# -- models and workloads ------------------------------------------------------------------
def random_profile(rng: np.random.Generator, system: str, sizes: Sequence[int] = SIZES) -> Profile:
    """Labelled input and output sweeps of a noisy cost that grows with i·o/32 (i along
    the input sweep, o along the output sweep); a small fixed part comes with a steep
    slope, so that the cheapest system changes with the size."""
    u, v = rng.uniform(0.05, 0.95, size=2)
    e_fixed, e_slope, e_power = 60 * u, 3 * (1 - u) * rng.uniform(0.7, 1.3), rng.uniform(0.8, 1.2)
    t_fixed, t_slope, t_power = 2 * v, 0.1 * (1 - v) * rng.uniform(0.7, 1.3), rng.uniform(0.8, 1.2)
    points = []
    for sweep in (INPUT, OUTPUT):
        for n in sizes:
            i, o = (n, 32) if sweep == INPUT else (32, n)
            k = int(rng.integers(1, 4))
            energy = e_fixed + e_slope * (i * o / 32) ** e_power
            time = t_fixed + t_slope * (i * o / 32) ** t_power
            points.append(
                Point(
                    i,
                    o,
                    tuple(float(x) for x in time * rng.uniform(0.9, 1.1, size=k)),
                    tuple(float(x) for x in energy * rng.uniform(0.9, 1.1, size=k)),
                    sweep,
                )
            )
    points.sort(key=lambda p: (p.input_tokens, p.output_tokens, p.sweep))
    return Profile(system, "m", tuple(points))


def random_models(rng: np.random.Generator, systems: int) -> list[SystemModel]:
    return [build_model(random_profile(rng, f"S{k} + x")) for k in range(systems)]


def random_workload(rng: np.random.Generator, n: int = 300, high: int = 40) -> Workload:
    return Workload(
        "random",
        rng.integers(1, high + 1, size=n).astype(np.int64),
        rng.integers(1, high + 1, size=n).astype(np.int64),
    )


def power_w(p: Profile) -> float:
    joules = sum(j for pt in p.points for j in pt.joules)
    seconds = sum(s for pt in p.points for s in pt.seconds)
    return joules / seconds


def per_query(
    models: Sequence[SystemModel], w: Workload, by: str, lam: float, p_ref: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cost, joules, seconds) per system and query, straight from the models."""
    pairs = [m.costs(by, w.input_tokens, w.output_tokens) for m in models]
    energy = np.array([e for e, _ in pairs])
    time = np.array([t for _, t in pairs])
    return lam * energy + (1 - lam) * p_ref * time, energy, time


def by_key(values: np.ndarray, per_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct token counts, and each system's sum over the queries at each count."""
    keys, index = np.unique(values, return_inverse=True)
    sums = np.array([np.bincount(index, weights=row, minlength=len(keys)) for row in per_q])
    return keys, sums


def check_policy_reproduces(
    decision: Decision, models: Sequence[SystemModel], w: Workload, by: str
) -> None:
    """The policy file, applied query by query, gives the totals the decision reports."""
    _, energy, time = per_query(models, w, by, 1.0, 1.0)
    names = [m.system for m in models]
    picked = decision.policy.assign(w.input_tokens, w.output_tokens)
    system = np.array([names.index(decision.policy.systems[i]) for i in picked])
    queries = np.arange(len(w))
    assert decision.totals.energy_j == pytest.approx(energy[system, queries].sum(), rel=1e-9)
    assert decision.totals.runtime_s == pytest.approx(time[system, queries].sum(), rel=1e-9)
    assert dict(decision.totals.queries) == {
        name: int((system == k).sum()) for k, name in enumerate(names)
    }
    for k, name in enumerate(names):
        assert decision.totals.busy_s[name] == pytest.approx(time[k, system == k].sum(), abs=1e-9)
    assert decision.policy.expected["energy_j"] == decision.totals.energy_j
    assert decision.policy.expected["queries"] == len(w)


# -- routing by input or output, end to end ------------------------------------------------
CASES = [(by, systems, lam) for by in (INPUT, OUTPUT) for systems in (2, 3) for lam in (0, 0.3, 1)]


def problem(by: str, systems: int, lam: float) -> tuple[list[SystemModel], Workload]:
    rng = np.random.default_rng([systems, int(lam * 10), by == INPUT])
    return random_models(rng, systems), random_workload(rng)


@pytest.mark.parametrize(("by", "systems", "lam"), CASES)
def test_router_equals_exhaustive_search_over_range_policies(
    by: str, systems: int, lam: float
) -> None:
    models, w = problem(by, systems, lam)
    router = Router(models, w, by=by)
    p_ref = max(power_w(m.profile) for m in models)
    assert router.p_ref_w == pytest.approx(p_ref)
    decision = router.solve(lam)
    cost, _, _ = per_query(models, w, by, lam, p_ref)
    keys, sums = by_key(w.input_tokens if by == INPUT else w.output_tokens, cost)
    none = [(INF, INF)] * systems
    expected = exhaustive(sums, np.ones(len(keys)), np.zeros_like(sums), none)
    assert decision.totals.cost_j == pytest.approx(expected, rel=1e-9)
    check_policy_reproduces(decision, models, w, by)
    assert decision.policy.lam == lam and decision.policy.by == by
    assert decision.queries == len(w) == sum(decision.totals.queries.values())


def test_the_random_problems_are_not_trivial() -> None:
    """Most of the problems above are won by splitting the queries, not by one system."""
    split = 0
    for by, systems, lam in CASES:
        models, w = problem(by, systems, lam)
        split += len(Router(models, w, by=by).solve(lam).policy.rules) > 1
    assert split >= len(CASES) * 3 // 4


def test_routing_splits_where_the_costs_cross() -> None:
    """By hand: A costs n joules, B 2·sqrt(n); A is cheaper up to n = 4 (a tie at 4)."""

    def sweep(system: str, joules: Callable[[int], float]) -> Profile:
        points = tuple(Point(n, 32, (1.0,), (float(joules(n)),), INPUT) for n in SIZES)
        return Profile(system, "m", points)

    a, b = build_model(sweep("A", lambda n: n)), build_model(sweep("B", lambda n: 2 * n**0.5))
    n = np.arange(1, 41)
    w = Workload("w", n, np.zeros_like(n))
    decision = Router([a, b], w).solve(1.0)
    rule, rest = decision.policy.rules
    assert rule.system == "A" and rule.max_input_tokens in (3, 4) and rest == Rule("B")
    expected = sum(min(k, 2 * k**0.5) for k in range(1, 41))
    assert decision.totals.energy_j == pytest.approx(expected)
    # the other order of systems routes the same way
    swapped = Router([b, a], w).solve(1.0)
    assert swapped.totals.energy_j == pytest.approx(expected)


@pytest.mark.parametrize("by", [INPUT, OUTPUT])
def test_capacities_are_met_and_the_capped_optimum_is_found(by: str) -> None:
    rng = np.random.default_rng(21 if by == INPUT else 22)
    models = random_models(rng, 3)
    w = random_workload(rng)
    router = Router(models, w, by=by)
    free = router.solve(1.0)
    # the busiest system gets the tightest cap, so that the caps bind
    names = sorted((m.system for m in models), key=lambda s: -free.totals.queries[s])
    assert free.totals.queries[names[0]] > 0.3 * len(w)
    caps_text = [f"{names[0]}=30%", f"{names[1]}=busy:40%", f"{names[2]}=0.5"]
    decision = router.solve(1.0, [parse_capacity(text) for text in caps_text])
    order = [m.system for m in models]
    _, energy, time = per_query(models, w, by, 1.0, 1.0)
    busy_all = dict(zip(order, time.sum(axis=1)))
    limits = {
        names[0]: (math.floor(0.3 * len(w)), INF),
        names[1]: (INF, 0.4 * busy_all[names[1]]),
        names[2]: (0.5 * len(w), INF),
    }
    caps = [limits[s] for s in order]
    values = w.input_tokens if by == INPUT else w.output_tokens
    _, sums = by_key(values, energy)
    _, busy = by_key(values, time)
    _, count = by_key(values, np.ones((1, len(w))))
    expected = exhaustive(sums, count[0], busy, caps)
    assert decision.totals.energy_j == pytest.approx(expected, rel=1e-9)
    assert decision.totals.energy_j >= free.totals.energy_j * (1 - 1e-12)
    assert decision.totals.queries[names[0]] <= 0.3 * len(w)
    assert decision.totals.busy_s[names[1]] <= 0.4 * busy_all[names[1]] * (1 + 1e-9)
    assert decision.totals.queries[names[2]] <= 0.5 * len(w)
    check_policy_reproduces(decision, models, w, by)
    # absolute busy seconds: half what the busiest system worked without limits
    text = f"{names[0]}={free.totals.busy_s[names[0]] / 2:.3f}s"
    limit = float(text.rsplit("=", 1)[1][:-1])
    decision = router.solve(1.0, [parse_capacity(text)])
    assert decision.totals.busy_s[names[0]] <= limit * (1 + 1e-9)
    caps = [(INF, limit) if s == names[0] else (INF, INF) for s in order]
    assert decision.totals.energy_j == pytest.approx(exhaustive(sums, count[0], busy, caps))


def test_impossible_or_unknown_capacities_are_routing_errors() -> None:
    rng = np.random.default_rng(5)
    models = random_models(rng, 2)
    router = Router(models, random_workload(rng))
    a, b = (m.system for m in models)
    with pytest.raises(RoutingError, match="no policy meets the capacity limits"):
        router.solve(1.0, [Capacity(a, query_share=0.4), Capacity(b, query_share=0.4)])
    with pytest.raises(RoutingError, match="capacity for 'Z', which is not routed to"):
        router.solve(1.0, [Capacity("Z", query_share=0.4)])
    # one system may take everything: capping the other to nothing is fine
    only_b = router.solve(1.0, [Capacity(a, query_share=0.0)])
    assert only_b.totals.queries[a] == 0 and only_b.policy.rules == (Rule(b),)


def test_measured_boundaries_put_thresholds_on_measured_sizes() -> None:
    """The research's grid: thresholds only at measured sizes (or the largest count)."""
    rng = np.random.default_rng(31)
    sizes = (1, 6, 20, 64)
    models = [build_model(random_profile(rng, s, sizes)) for s in ("A", "B", "C")]
    w = random_workload(rng)
    costlier = 0
    for lam in (0.0, 0.5, 1.0):
        decision = Router(models, w, boundaries=MEASURED).solve(lam)
        free = Router(models, w).solve(lam)
        limits = [r.max_input_tokens for r in decision.policy.rules[:-1]]
        assert set(limits) <= {*sizes, int(w.input_tokens.max())}
        p_ref = max(power_w(m.profile) for m in models)
        cost, _, _ = per_query(models, w, INPUT, lam, p_ref)
        keys, sums = by_key(w.input_tokens, cost)
        cuts = {0, len(keys), *(int(np.searchsorted(keys, s, side="right")) for s in sizes)}
        none = [(INF, INF)] * 3
        expected = exhaustive(sums, np.ones(len(keys)), np.zeros_like(sums), none, sorted(cuts))
        assert decision.totals.cost_j == pytest.approx(expected, rel=1e-9)
        assert free.totals.cost_j <= decision.totals.cost_j * (1 + 1e-12)
        costlier += free.totals.cost_j < decision.totals.cost_j * (1 - 1e-9)
        check_policy_reproduces(decision, models, w, INPUT)
    assert costlier  # the grid did restrict the choice


# -- routing by both -----------------------------------------------------------------------
def exhaustive_box(
    cost: np.ndarray,
    time: np.ndarray,
    w: Workload,
    caps: Sequence[tuple[float, float]],
    bounds: Sequence[int] | None = None,
) -> float:
    """Every box (input <= a and output <= b) over the workload's counts (or ``bounds``),
    either system inside, plus the empty box; caps checked on both sides."""
    a = np.unique(w.input_tokens if bounds is None else bounds)[:, None, None]
    b = np.unique(w.output_tokens if bounds is None else bounds)[None, :, None]
    inside = (w.input_tokens <= a) & (w.output_tokens <= b)  # (a, b, query)
    best = INF
    for inner in (0, 1):
        outer = 1 - inner
        total = (inside * cost[inner]).sum(-1) + (~inside * cost[outer]).sum(-1)
        n_in = inside.sum(-1)
        ok = (n_in <= caps[inner][0]) & (len(w) - n_in <= caps[outer][0])
        ok &= (inside * time[inner]).sum(-1) <= caps[inner][1] * (1 + 1e-9)
        ok &= (~inside * time[outer]).sum(-1) <= caps[outer][1] * (1 + 1e-9)
        best = min(best, float(np.where(ok, total, INF).min()))
        if len(w) <= caps[outer][0] and time[outer].sum() <= caps[outer][1] * (1 + 1e-9):
            best = min(best, float(cost[outer].sum()))  # the empty box
    return best


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_routing_by_both_equals_exhaustive_search_over_boxes(lam: float) -> None:
    rng = np.random.default_rng([7, int(lam * 10)])
    models = random_models(rng, 2)
    w = random_workload(rng, n=250, high=30)
    router = Router(models, w, by=BOTH)
    cost, _, time = per_query(models, w, BOTH, lam, router.p_ref_w)
    decision = router.solve(lam)
    assert decision.totals.cost_j == pytest.approx(exhaustive_box(cost, time, w, [(INF, INF)] * 2))
    check_policy_reproduces(decision, models, w, BOTH)
    # capped: the system that took most queries takes at most a quarter of them
    k = max((0, 1), key=lambda k: decision.totals.queries[models[k].system])
    name = models[k].system
    assert decision.totals.queries[name] > 0.25 * len(w)
    capped = router.solve(lam, [Capacity(name, query_share=0.25)])
    caps = [(INF, INF), (INF, INF)]
    caps[k] = (math.floor(0.25 * len(w)), INF)
    assert capped.totals.cost_j == pytest.approx(exhaustive_box(cost, time, w, caps))
    assert capped.totals.queries[name] <= 0.25 * len(w)
    check_policy_reproduces(capped, models, w, BOTH)
    busy = router.solve(lam, [Capacity(name, busy_share=0.3)])
    caps[k] = (INF, 0.3 * time[k].sum())
    assert busy.totals.cost_j == pytest.approx(exhaustive_box(cost, time, w, caps))
    assert busy.totals.busy_s[name] <= 0.3 * time[k].sum() * (1 + 1e-9)
    check_policy_reproduces(busy, models, w, BOTH)


def test_routing_by_both_with_a_box_has_two_bounds_and_infeasible_caps_fail() -> None:
    rng = np.random.default_rng(8)
    models = random_models(rng, 2)
    w = random_workload(rng, n=200, high=30)
    router = Router(models, w, by=BOTH)
    a, b = (m.system for m in models)
    half = router.solve(1.0, [Capacity(a, query_share=0.5), Capacity(b, query_share=0.5)])
    box, rest = half.policy.rules  # neither may take all: a real box
    assert box.max_input_tokens is not None and box.max_output_tokens is not None
    assert rest.max_input_tokens is None and rest.max_output_tokens is None
    assert max(half.totals.queries.values()) <= 100
    with pytest.raises(RoutingError, match="no policy meets"):
        router.solve(1.0, [Capacity(a, query_share=0.3), Capacity(b, query_share=0.3)])


def test_measured_boundaries_by_both_use_measured_sizes() -> None:
    rng = np.random.default_rng(9)
    sizes = (1, 6, 20, 64)
    models = [build_model(random_profile(rng, s, sizes)) for s in ("A", "B")]
    w = random_workload(rng, n=200, high=30)
    costlier = 0
    for lam in (0.0, 1.0):
        router = Router(models, w, by=BOTH, boundaries=MEASURED)
        decision = router.solve(lam)
        for rule in decision.policy.rules:
            assert rule.max_input_tokens in (None, *sizes, int(w.input_tokens.max()))
            assert rule.max_output_tokens in (None, *sizes, int(w.output_tokens.max()))
        cost, _, time = per_query(models, w, BOTH, lam, router.p_ref_w)
        expected = exhaustive_box(cost, time, w, [(INF, INF)] * 2, sizes)
        assert decision.totals.cost_j == pytest.approx(expected)
        check_policy_reproduces(decision, models, w, BOTH)
        free = Router(models, w, by=BOTH).solve(lam)
        assert free.totals.cost_j <= decision.totals.cost_j * (1 + 1e-12)
        costlier += free.totals.cost_j < decision.totals.cost_j * (1 - 1e-9)
    assert costlier  # the grid did restrict the choice


# -- baselines, savings, curves ------------------------------------------------------------
def test_baselines_are_per_query_sums_and_size_blind_shares() -> None:
    rng = np.random.default_rng(12)
    models = random_models(rng, 3)
    w = random_workload(rng)
    lam = 0.4
    router = Router(models, w, by=OUTPUT, p_ref_w=250.0)
    decision = router.solve(lam)
    cost, energy, time = per_query(models, w, OUTPUT, lam, 250.0)
    *single, unaware = decision.baselines
    for k, (m, base) in enumerate(zip(models, single)):
        assert base.name == f"all on {m.system}"
        assert base.totals.energy_j == pytest.approx(energy[k].sum())
        assert base.totals.runtime_s == pytest.approx(time[k].sum())
        assert base.totals.cost_j == pytest.approx(cost[k].sum())
        assert base.totals.queries[m.system] == len(w)
        assert decision.totals.cost_j <= base.totals.cost_j * (1 + 1e-12)
    shares = [decision.totals.queries[m.system] / len(w) for m in models]
    assert unaware.totals.energy_j == pytest.approx(float(np.dot(shares, energy.sum(axis=1))))
    assert unaware.totals.runtime_s == pytest.approx(float(np.dot(shares, time.sum(axis=1))))
    assert unaware.totals.cost_j == pytest.approx(float(np.dot(shares, cost.sum(axis=1))))
    assert dict(unaware.totals.queries) == dict(decision.totals.queries)
    saving = decision.saving(single[0])
    assert saving == pytest.approx(1 - decision.totals.energy_j / energy[0].sum())
    assert decision.saving(single[0], "runtime_s") == pytest.approx(
        1 - decision.totals.runtime_s / time[0].sum()
    )


def totals(energy: float, runtime: float) -> Totals:
    return Totals(energy, runtime, energy, {"A": 1}, {"A": runtime}, {"A": energy})


def decision_of(energy: float, runtime: float) -> Decision:
    policy = Policy("m", INPUT, (Rule("A"),))
    return Decision(policy, totals(energy, runtime), (), 1)


def test_saving_by_hand_and_against_nothing() -> None:
    d = decision_of(80.0, 30.0)
    assert d.saving(Baseline("b", totals(100.0, 20.0))) == pytest.approx(0.2)
    assert d.saving(Baseline("b", totals(100.0, 20.0)), "runtime_s") == pytest.approx(-0.5)
    assert math.isnan(d.saving(Baseline("zero", totals(0.0, 0.0))))


def test_pareto_keeps_only_non_dominated_points_by_energy() -> None:
    points = [(5, 5), (3, 9), (4, 4), (6, 1), (4, 6), (7, 1), (3, 9), (2, 10), (8, 0.5), (5, 4)]
    front = pareto([decision_of(e, t) for e, t in points])
    got = [(d.totals.energy_j, d.totals.runtime_s) for d in front]
    expected = sorted(
        {p for p in points if not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)}
    )
    assert got == expected == [(2, 10), (3, 9), (4, 4), (6, 1), (8, 0.5)]
    assert pareto([]) == []


def test_threshold_curve_matches_direct_sums() -> None:
    rng = np.random.default_rng(13)
    models = random_models(rng, 3)
    w = random_workload(rng)
    router = Router(models, w)
    _, energy, time = per_query(models, w, INPUT, 1.0, 1.0)
    thresholds, e, t = router.threshold_curve(low=2, high=0)
    assert thresholds[0] == -1
    np.testing.assert_array_equal(thresholds[1:], np.unique(w.input_tokens))
    for k, th in enumerate(thresholds):
        low = w.input_tokens <= th
        assert e[k] == pytest.approx(energy[2, low].sum() + energy[0, ~low].sum())
        assert t[k] == pytest.approx(time[2, low].sum() + time[0, ~low].sum())
    with pytest.raises(RoutingError, match="by input or by output"):
        Router(models[:2], w, by=BOTH).threshold_curve()


def test_sweep_solves_each_lambda_and_is_deterministic() -> None:
    rng = np.random.default_rng(14)
    models = random_models(rng, 3)
    w = random_workload(rng)
    decisions = Router(models, w).sweep([0.0, 0.5, 1.0])
    assert [d.policy.lam for d in decisions] == [0.0, 0.5, 1.0]
    again = Router(models, w).sweep([0.0, 0.5, 1.0])
    assert [d.policy for d in decisions] == [d.policy for d in again]
    # pure energy never spends more energy than the time-weighted policies
    assert decisions[2].totals.energy_j <= min(d.totals.energy_j for d in decisions) + 1e-9
    assert decisions[0].totals.runtime_s <= min(d.totals.runtime_s for d in decisions) + 1e-9


# -- bad questions -------------------------------------------------------------------------
def test_bad_router_arguments_are_routing_errors() -> None:
    rng = np.random.default_rng(15)
    models = random_models(rng, 3)
    w = random_workload(rng)
    with pytest.raises(RoutingError, match="bad --by 'tokens'"):
        Router(models, w, by="tokens")
    with pytest.raises(RoutingError, match="bad boundaries"):
        Router(models, w, boundaries="grid")
    with pytest.raises(RoutingError, match="two or more systems"):
        Router(models[:1], w)
    with pytest.raises(RoutingError, match="--by both routes between two systems"):
        Router(models, w, by=BOTH)
    with pytest.raises(RoutingError, match="no queries"):
        Router(models, Workload("empty", np.array([], np.int64), np.array([], np.int64)))
    with pytest.raises(RoutingError, match="reference power"):
        Router(models, w, p_ref_w=0.0)
    router = Router(models, w)
    for lam in (-0.1, 1.5, math.nan):
        with pytest.raises(RoutingError, match="bad lambda"):
            router.solve(lam)


# -- capacity strings ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SYS=40%", Capacity("SYS", query_share=0.4)),
        ("SYS=0.4", Capacity("SYS", query_share=0.4)),
        ("SYS=100%", Capacity("SYS", query_share=1.0)),
        ("SYS=busy:25%", Capacity("SYS", busy_share=0.25)),
        ("SYS=3600s", Capacity("SYS", busy_s=3600.0)),
        ("Swing AMD+A100=30%", Capacity("Swing AMD+A100", query_share=0.3)),
        (" M1-Pro =12.5% ", Capacity("M1-Pro", query_share=0.125)),
    ],
)
def test_parse_capacity_accepts(text: str, expected: Capacity) -> None:
    got = parse_capacity(text)
    assert got.system == expected.system
    for field in ("query_share", "busy_share", "busy_s"):
        want = getattr(expected, field)
        assert getattr(got, field) == (pytest.approx(want) if want is not None else None)


@pytest.mark.parametrize(
    "text",
    [
        "SYS=",
        "SYS=abc",
        "SYS=150%",
        "SYS=1.5",
        "SYS=busy:10s",
        "SYS=busy:0.2",
        "=40%",
        "SYS",
        "SYS=1.2.3%",
        "SYS=.%",
        "SYS=-5%",
    ],
)
def test_parse_capacity_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="bad capacity"):
        parse_capacity(text)


def test_capacity_allows_spaces_around_the_equals_sign() -> None:
    assert parse_capacity("Swing AMD+A100 = 40 %") == Capacity("Swing AMD+A100", query_share=0.4)
