"""``llmenergy ab --processes auto``: after one process pair, whether processes differ
beyond their pairs' noise, and which cases a second process pair measures
(``sessions.plan_processes``), on synthetic first process pairs."""

from __future__ import annotations

import math
import random

from pytest_llmenergy.sessions import FirstPair, ProcessPlan, plan_processes

GATE = math.log1p(0.05)


def _first_pairs(
    rng: random.Random,
    offset: float,
    *,
    cases: int = 18,
    noise: float = 0.05,
    changed: dict[int, float] | None = None,
) -> dict[str, FirstPair]:
    """Each case's 4 pairs of log differences: its process pair's offset (sd ``offset``,
    one draw per case, alike for its pairs), each pair's own noise (``noise`` times a
    case's own level, 0.5-2), and a change in ``changed`` cases."""
    out = {}
    for c in range(cases):
        level = noise * rng.choice((0.5, 1.0, 2.0))
        shift = rng.gauss(0.0, offset) + math.log1p((changed or {}).get(c, 0.0))
        pairs = tuple(shift + rng.gauss(0.0, level) for _ in range(4))
        centre = sum(pairs) / 4
        spread = sum((p - centre) ** 2 for p in pairs) / 3
        out[f"case{c}"] = FirstPair(pairs, centre, spread / 4, GATE)
    return out


def _plans(offset: float, seeds: range, **kw: object) -> list[ProcessPlan]:
    return [
        plan_processes(_first_pairs(random.Random(s), offset, **kw), 0.9, 0.05)  # type: ignore[arg-type]
        for s in seeds
    ]


def test_processes_that_differ_get_a_second_process_pair_for_every_case() -> None:
    """Offsets of 10 % per case beside a process pair's own noise of about 2.5 %."""
    for plan in _plans(0.10, range(20)):
        assert plan.differ, plan
        assert len(plan.second) == 18
        assert 0.02 < plan.offset < 0.25  # a median absolute deviation of 18 cases
        assert plan.line().startswith("processes differ by ")
        assert plan.line().endswith(": a second process pair")


def test_processes_that_hardly_differ_get_one_process_pair() -> None:
    """No offsets: at most about one run in ten (the decision's level) reads a
    difference; with pairs' noise well inside the gate, no case needs a second pair."""
    plans = _plans(0.0, range(40), noise=0.01)
    assert sum(p.differ for p in plans) <= 6, [p.ratio for p in plans]
    quiet = [p for p in plans if not p.differ]
    assert all(not p.second and not p.clear_fails for p in quiet)
    assert all(p.line().endswith(": one process pair") for p in quiet)
    assert "processes hardly differ (" in quiet[0].line()


def test_a_few_changed_cases_do_not_tip_it_and_are_not_left_at_one_pair() -> None:
    """Three of 18 cases 20 % worse, no offsets: the spread is read around the median,
    so the decision is as without them; each changed case fails on its one pair beyond
    any offset the run allows, or gets a second pair, never a pass."""
    changed = {0: 0.2, 7: 0.2, 13: 0.2}
    plain = _plans(0.0, range(40), noise=0.01)
    tipped = _plans(0.0, range(40), noise=0.01, changed=changed)
    assert sum(p.differ for p in tipped) <= sum(p.differ for p in plain) + 2
    for plan in tipped:
        if not plan.differ:
            for c in changed:
                assert f"case{c}" in plan.second | plan.clear_fails, plan
            assert plan.clear_fails  # +20 % at 1 % noise needs no second look
            assert "a second for the" not in plan.line() or plan.second


def test_a_case_near_the_gate_gets_a_second_pair_when_processes_hardly_differ() -> None:
    """A +4.5 % case beside a 5 % gate: within its own noise of it, so an offset could
    move its verdict either way."""
    cases = _first_pairs(random.Random(3), 0.0, noise=0.01)
    near = (0.045, 0.035, 0.055, 0.045)
    cases["near"] = FirstPair(near, 0.045, 0.0082**2 / 4, GATE)
    plan = plan_processes(cases, 0.9, 0.05)
    assert not plan.differ
    assert plan.second == {"near"}
    assert "a second for the 1 case(s)" in plan.line()


def test_too_few_cases_to_tell_get_a_second_process_pair() -> None:
    cases = dict(list(_first_pairs(random.Random(1), 0.0, noise=0.01).items())[:2])
    plan = plan_processes(cases, 0.9, 0.05)
    assert plan.second == set(cases)
    assert "too few cases" in plan.line()
