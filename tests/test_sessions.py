"""The session as the unit of replication: the gate's statistics on simulated sessions
whose between-session noise is known."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from pytest_llmenergy.compare import CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.comparison_text import verdict_lines
from pytest_llmenergy.history import learned_noise
from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.sessions import (
    HISTORY,
    PRIOR,
    ROUNDS,
    SideSessions,
    benjamini_hochberg,
    build_tests,
    moderated,
    side_sessions,
)
from pytest_llmenergy.storage.pool import pool_runs
from pytest_llmenergy.storage.runfile import Run
from tests.casefactory import make_case

GATE = parse_gates("j_per_token:5%")
CASES = 18


def session(rng: random.Random, sigma: float, factor: float = 1.0, trials: int = 10) -> list:
    """One session of every case: each case's level moved by the session (log-normal,
    ``sigma``), its trials agreeing within 1 %; ``factor`` is an injected regression."""
    cases = []
    for i in range(CASES):
        level = (1.0 + i / 10) * math.exp(rng.gauss(0.0, sigma)) * factor
        seconds = [level * (1 + rng.gauss(0.0, 0.01)) for _ in range(trials)]
        cases.append(make_case(seconds, input_tokens=8 * (i + 1)))
    return cases


def run_of(cases: list[CaseResult], name: str = "r") -> Run:
    return Run(
        run_id="",
        name=name,
        created="2026-11-23T00:00:00+00:00",
        status="complete",
        hardware="hw",
        machine={},
        commit={"id": "abc", "dirty": False},
        options={},
        meter={},
        cases=tuple(cases),
    )


def test_benjamini_hochberg_against_a_worked_example() -> None:
    p = [0.01, 0.04, 0.03, 0.005, 0.5]
    # sorted: 0.005 (<=0.01), 0.01 (<=0.02), 0.03 (<=0.03), 0.04 (>0.04? no: <=0.04)
    assert benjamini_hochberg(p, 0.05) == [True, True, True, True, False]
    assert benjamini_hochberg([0.02, 0.03], 0.05) == [True, True]
    assert benjamini_hochberg([0.03, 0.2], 0.05) == [False, False]  # 0.03 > 0.05 / 2


def test_moderated_variance_lies_between_its_own_and_the_pool() -> None:
    assert moderated(4.0, 1.0, 1.0, 4.0) == pytest.approx((4 * 1 + 1 * 4) / 5)
    assert moderated(4.0, 0.0, 1.0) == 1.0


def test_side_sessions_are_log_means_with_their_own_variance() -> None:
    side = side_sessions({1: [1.0, 1.0], 2: [math.e, math.e]})
    assert side is not None and side.logs == pytest.approx((0.0, 1.0)) and side.within == (0, 0)
    assert side_sessions({0: [0.0, 0.0]}) is None  # a log needs a positive mean


def test_evidence_is_taken_from_rounds_then_history_then_the_prior() -> None:
    one = SideSessions((0.0,), (0.0,))
    two = SideSessions((0.0, 0.1), (0.0, 0.0))
    tests = build_tests({"a": (two, two), "b": (one, one)})
    assert tests["a"].source == ROUNDS and tests["a"].paired
    assert tests["b"].source == PRIOR
    from pytest_llmenergy.sessions import NoiseEstimate

    hist = {"b": NoiseEstimate(0.01, 3.0, HISTORY)}
    assert build_tests({"b": (one, one)}, history=hist)["b"].source == HISTORY


@pytest.mark.parametrize("sigma", [0.05, 0.12])
def test_single_sessions_with_the_true_noise_rarely_fail_any_case(sigma: float) -> None:
    """A/A: 200 comparisons of 18 cases, sessions differing by ``sigma``; with the noise
    assumed right, any FAIL in at most about 5 % of them (Benjamini-Hochberg at 5 %),
    where Welch on trials fails nearly every one."""
    rng = random.Random(24)
    failed = welch_failed = 0
    for _ in range(200):
        base, head = session(rng, sigma), session(rng, sigma)
        failed += compare_cases(base, head, CompareOptions(gates=GATE, session_noise=sigma)).failed
        welch_failed += compare_cases(
            base, head, CompareOptions(gates=GATE, session_noise=0.001)
        ).failed
    assert failed <= 16  # 5 % of 200 is 10; binomial upper tail
    assert welch_failed >= 150


def test_rounds_learn_the_noise_and_find_a_regression_of_25_percent() -> None:
    """Three alternating rounds a side, merged: the noise comes from the rounds, and a
    uniform +25 % is found in nearly every case when sessions differ by 5 %."""
    rng = random.Random(7)
    found = total = aa_failed = 0
    for _ in range(20):
        base = pool_runs([run_of(session(rng, 0.05)) for _ in range(3)])
        head = pool_runs([run_of(session(rng, 0.05, 1.25)) for _ in range(3)])
        same = pool_runs([run_of(session(rng, 0.05)) for _ in range(3)])
        c = compare_cases(base.cases, head.cases, CompareOptions(gates=GATE))
        assert {d.test.source for d in c.deltas if d.test} == {ROUNDS}
        found += len(c.failures)
        total += len(c.deltas)
        aa_failed += compare_cases(base.cases, same.cases, CompareOptions(gates=GATE)).failed
    assert found / total >= 0.9
    assert aa_failed <= 3


def saved_at(run: Run, day: int, minute: int = 0) -> Run:
    return replace(run, created=f"2026-11-{day:02d}T10:{minute:02d}:00+00:00")


def test_history_of_the_same_code_replaces_the_prior() -> None:
    rng = random.Random(3)
    saved = [saved_at(run_of(session(rng, 0.04), f"base{i}"), 20 + i) for i in range(4)]
    noise = learned_noise(saved, ["j_per_token"])
    assert len(noise) == CASES
    pooled = sum(n.variance for n in noise.values()) / CASES
    assert math.sqrt(pooled) == pytest.approx(0.04, rel=0.4)
    dirty = [replace(r, commit={"id": "abc", "dirty": True}) for r in saved]
    assert learned_noise(dirty, ["j_per_token"]) == {}  # unknown code teaches nothing
    head = session(rng, 0.04, 1.25)
    c = compare_cases(saved[0].cases, head, CompareOptions(gates=GATE, history=noise))
    assert {d.test.source for d in c.deltas if d.test} == {HISTORY}
    assert len(c.failures) >= CASES * 2 // 3


def test_noise_learned_from_back_to_back_saves_is_not_trusted_below_the_prior() -> None:
    """Saves minutes apart agree more than sessions on other days: on a user's 2-case
    suite they agreed within 3 % and unchanged code then FAILed 2 of 8 sessions.  Their
    noise is floored at the assumed one, and the verdict says so."""
    from pytest_llmenergy.comparison_text import evidence_text

    rng = random.Random(5)
    back_to_back = [saved_at(run_of(session(rng, 0.01), f"b{i}"), 24, i) for i in range(3)]
    noise = learned_noise(back_to_back, ["j_per_token"])
    assert noise and all(n.seen_s == 120.0 for n in noise.values())
    later = session(rng, 0.01, 1.18)  # another day's session: 18 % off, same code
    c = compare_cases(back_to_back[0].cases, later, CompareOptions(gates=GATE, history=noise))
    assert not c.failed
    assert all(d.test is not None and d.test.floored for d in c.deltas)
    assert "back to back" in evidence_text(c)
    from pytest_llmenergy.comparison_text import evidence_line

    assert "hours apart" in evidence_line(c)  # not "save it three times" again
    # the same noise learned over days is trusted as it is
    spread = [saved_at(r, 20 + i) for i, r in enumerate(back_to_back)]
    trusted = learned_noise(spread, ["j_per_token"])
    c = compare_cases(spread[0].cases, later, CompareOptions(gates=GATE, history=trusted))
    assert c.failed and not any(d.test is not None and d.test.floored for d in c.deltas)


def test_the_verdict_says_what_it_rests_on_and_what_it_can_see() -> None:
    rng = random.Random(1)
    c = compare_cases(session(rng, 0.1), session(rng, 0.1), CompareOptions(gates=GATE))
    verdict, evidence = verdict_lines(c)
    assert verdict.startswith("energy gate")
    assert "Benjamini-Hochberg" in evidence and "assumed 15%" in evidence
    assert evidence.startswith("gate detects >= ") and "several sessions" in evidence
