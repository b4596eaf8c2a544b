"""t quantiles against printed tables, interval coverage by simulation, Welch's test."""

from __future__ import annotations

import math
import random

import pytest

from pytest_llmenergy.stats import (
    betainc,
    huber_location,
    huber_variance_factor,
    mad_scale,
    summarize,
    t_cdf,
    t_quantile,
    welch_t_test,
)


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [  # two-sided 95 % and 99 % critical values from a printed t table
        (0.975, 1, 12.7062),
        (0.975, 2, 4.3027),
        (0.975, 4, 2.7764),
        (0.975, 10, 2.2281),
        (0.975, 24, 2.0639),
        (0.995, 5, 4.0321),
        (0.95, 9, 1.8331),
        (0.975, 1000, 1.9623),
    ],
)
def test_t_quantile_matches_tables(p: float, df: int, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-4)


def test_t_cdf_known_values_and_symmetry() -> None:
    assert t_cdf(0.0, 3) == 0.5
    assert t_cdf(2.0, 3) == pytest.approx(0.930337, abs=1e-6)
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)  # Cauchy: 1/2 + atan(1)/pi
    assert t_cdf(-1.5, 7.5) == pytest.approx(1 - t_cdf(1.5, 7.5), abs=1e-12)


def test_betainc_edges_and_a_closed_form() -> None:
    assert betainc(2.0, 3.0, 0.0) == 0.0 and betainc(2.0, 3.0, 1.0) == 1.0
    # I_x(1, b) = 1 - (1 - x)^b
    assert betainc(1.0, 3.0, 0.3) == pytest.approx(1 - 0.7**3, rel=1e-12)
    with pytest.raises(ValueError):
        betainc(1.0, 1.0, 1.5)


def test_summary_of_few_values() -> None:
    s = summarize([1.0, 2.0, 3.0])
    assert s.mean == 2.0 and s.stdev == pytest.approx(1.0)
    assert s.half_width == pytest.approx(4.3027 / math.sqrt(3), abs=1e-4)
    assert s.low < 2.0 < s.high
    assert math.isinf(summarize([5.0]).half_width)
    assert summarize([4.0, 4.0]).half_width == 0.0


def test_intervals_cover_the_true_mean_at_their_confidence() -> None:
    rng = random.Random(7)
    runs, covered = 4000, 0
    for _ in range(runs):
        s = summarize([rng.gauss(10.0, 2.0) for _ in range(4)], 0.95)
        covered += s.low <= 10.0 <= s.high
    # binomial sd at p=0.95, n=4000 is 0.0034: 5 sd either side
    assert 0.933 < covered / runs < 0.967
    # the normal quantile (1.96) instead of t (3.18 for 3 df) would cover only ~0.86


def test_welch_matches_a_worked_example() -> None:
    """The first worked example in Wikipedia's article on Welch's t-test: |t| = 2.46,
    df = 24.99, p = 0.021."""
    a = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
    b = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]
    r = welch_t_test(a, b)
    assert r.t == pytest.approx(2.46, abs=0.01)
    assert r.df == pytest.approx(24.99, abs=0.01)
    assert r.p_value == pytest.approx(0.021, abs=0.001)
    assert r.significant(0.95) and not r.significant(0.99)


def test_welch_edge_cases() -> None:
    assert welch_t_test([1.0, 1.0], [1.0, 1.0]).p_value == 1.0
    assert welch_t_test([1.0, 1.0], [2.0, 2.0]).p_value == 0.0
    with pytest.raises(ValueError, match="at least two"):
        welch_t_test([1.0], [1.0, 2.0])


# -- the robust mean of a paired run's pairs ------------------------------------------------
def test_huber_keeps_a_far_value_from_moving_the_centre_and_is_the_mean_without_one() -> None:
    bulk = [0.0, 0.01, -0.01, 0.02, -0.02]
    scale = mad_scale(bulk)
    assert huber_location([*bulk, 1.0], scale) == pytest.approx(0.0, abs=0.01)  # mean: 0.167
    assert huber_location([1.0, 2.0, 3.0, 4.0, 6.0], 10.0) == pytest.approx(3.2)  # all inside
    assert huber_location([3.0, 1.0, 2.0], 0.0) == 2.0  # no scale: the median


def test_the_mad_reads_a_normal_noise_standard_deviation() -> None:
    assert mad_scale([-1.0, 1.0, -1.0, 1.0]) == pytest.approx(1.4826)
    rng = random.Random(3)
    noise = [rng.gauss(0.0, 0.07) for _ in range(20000)]
    assert mad_scale(noise) == pytest.approx(0.07, rel=0.03)


def test_the_variance_factor_is_about_1_05_for_normal_noise_and_grows_with_far_values() -> None:
    rng = random.Random(4)
    normal = [rng.gauss(0.0, 1.0) for _ in range(20000)]
    assert huber_variance_factor(normal) == pytest.approx(1.05, abs=0.02)
    jumps = [*normal[:17000], *(rng.choice((-5.0, 5.0)) for _ in range(3000))]
    assert huber_variance_factor(jumps) > 1.2
    assert huber_variance_factor([]) == 1.0
