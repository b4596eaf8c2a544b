"""Cost models: isotonic smoothing against a reference, the least-squares surface on known
coefficients, power-law curves between measured sizes, and how sweeps are picked."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest

from pytest_llmenergy.routing import BOTH, INPUT, OUTPUT
from pytest_llmenergy.routing.fit import (
    Curve,
    FitError,
    build_model,
    fit_model,
    non_decreasing,
)
from pytest_llmenergy.routing.profile import Point, Profile, ProfileError

COEF = np.array([5.0, 0.02, 0.9, 0.001, 0.0004])  # a + b n_in + c n_out + d n_in n_out + e n_out²


def surface(coef: np.ndarray, n_in: float, n_out: float) -> float:
    a, b, c, d, e = coef
    return float(a + b * n_in + c * n_out + d * n_in * n_out + e * n_out * n_out)


def sweeps(
    energy: Callable[[float, float], float],
    time: Callable[[float, float], float],
    sizes: tuple[int, ...] = (8, 16, 64, 128, 256),
    fixed: int = 32,
) -> list[Point]:
    """An input sweep at ``fixed`` output tokens and an output sweep at ``fixed`` input."""
    points = [Point(n, fixed, (time(n, fixed),), (energy(n, fixed),), INPUT) for n in sizes]
    points += [Point(fixed, n, (time(fixed, n),), (energy(fixed, n),), OUTPUT) for n in sizes]
    return points


def as_profile(points: list[Point], system: str = "A") -> Profile:
    key = lambda p: (p.input_tokens, p.output_tokens, p.sweep)  # noqa: E731
    return Profile(system, "m", tuple(sorted(points, key=key)))


# -- isotonic smoothing --------------------------------------------------------------------
def isotonic_reference(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The min-max formula: y_i = max over j <= i of min over k >= i of the mean of j..k."""
    n = len(values)

    def mean(j: int, k: int) -> float:
        w = weights[j : k + 1]
        return float((values[j : k + 1] * w).sum() / w.sum())

    return np.array(
        [max(min(mean(j, k) for k in range(i, n)) for j in range(i + 1)) for i in range(n)]
    )


def test_non_decreasing_equals_the_min_max_reference() -> None:
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        values = rng.normal(size=n).round(1)  # rounding makes ties common
        weights = rng.integers(1, 5, size=n).astype(float)
        got = non_decreasing(values, weights)
        assert got.shape == (n,)
        np.testing.assert_allclose(got, isotonic_reference(values, weights), atol=1e-12)


def test_non_decreasing_beats_every_sequence_on_a_grid() -> None:
    """Minimal weighted squared error among non-decreasing sequences (grid search, n <= 4),
    non-decreasing, and each constant block keeps its weighted mean."""
    rng = np.random.default_rng(2)
    grid = np.linspace(-2.0, 2.0, 41)
    candidates = {
        n: np.array(list(itertools.combinations_with_replacement(grid, n))) for n in (2, 3, 4)
    }
    for _ in range(40):
        n = int(rng.integers(2, 5))
        values = rng.uniform(-1.5, 1.5, size=n)
        weights = rng.integers(1, 4, size=n).astype(float)
        got = non_decreasing(values, weights)
        assert np.all(np.diff(got) >= 0)
        sse = float((weights * (got - values) ** 2).sum())
        best = float((weights * (candidates[n] - values) ** 2).sum(axis=1).min())
        assert sse <= best + 1e-12
        for level in np.unique(got):
            block = got == level
            mean = (values[block] * weights[block]).sum() / weights[block].sum()
            assert level == pytest.approx(mean)


def test_non_decreasing_keeps_sorted_input() -> None:
    np.testing.assert_array_equal(non_decreasing([1.0, 2.0, 2.0, 5.0], [1, 1, 1, 1]), [1, 2, 2, 5])
    np.testing.assert_allclose(non_decreasing([3.0, 1.0], [1.0, 3.0]), [1.5, 1.5])


# -- the fitted surface --------------------------------------------------------------------
def test_fit_recovers_the_coefficients_of_an_exact_surface() -> None:
    """The two sweeps plus one size off both lines pin every term."""
    energy = lambda i, o: surface(COEF, i, o)  # noqa: E731
    time = lambda i, o: surface(COEF / 7, i, o)  # noqa: E731
    points = [*sweeps(energy, time), Point(200, 200, (time(200, 200),), (energy(200, 200),))]
    fitted = fit_model(points)
    np.testing.assert_allclose(fitted.energy_coef, COEF, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(fitted.time_coef, COEF / 7, rtol=1e-8, atol=1e-12)
    assert fitted.energy_error.max_abs_pct < 1e-9 and fitted.time_error.max_abs_pct < 1e-9
    assert fitted.energy_j(np.array([300.0]), np.array([5.0]))[0] == pytest.approx(
        surface(COEF, 300, 5)
    )


def test_two_crossing_sweeps_leave_the_cross_term_out() -> None:
    """On the lines n_out = 32 and n_in = 32, (n_in - 32)(n_out - 32) is zero: the sweeps
    cannot tell n_in*n_out from the other terms, so it is left out (fixed at 0) and the
    fit is exact for a surface without it, and off by exactly that term for one with it."""
    additive = COEF.copy()
    additive[3] = 0.0
    fitted = fit_model(sweeps(lambda i, o: surface(additive, i, o), lambda i, o: 1 + i + o))
    assert fitted.dropped == ("n_in*n_out",)
    np.testing.assert_allclose(fitted.energy_coef, additive, rtol=1e-8, atol=1e-12)
    truth = fit_model(sweeps(lambda i, o: surface(COEF, i, o), lambda i, o: 1 + i + o))
    assert truth.dropped == ("n_in*n_out",) and truth.energy_error.max_abs_pct < 1e-9
    diff = np.array(truth.energy_coef) - COEF
    direction = np.array([32.0 * 32.0, -32.0, -32.0, 1.0, 0.0])  # (n_in - 32)(n_out - 32)
    np.testing.assert_allclose(diff, -COEF[3] * direction, rtol=1e-6, atol=1e-9)
    with_off_line_point = [*sweeps(lambda i, o: surface(COEF, i, o), lambda i, o: 1 + i)]
    with_off_line_point.append(Point(200, 200, (1.0,), (surface(COEF, 200, 200),)))
    assert fit_model(with_off_line_point).dropped == ()


def test_fit_error_is_mean_and_max_absolute_percentage() -> None:
    err = FitError.of(np.array([110.0, 90.0, 100.0, 51.0]), np.array([100.0, 100.0, 100.0, 50.0]))
    assert err.mean_abs_pct == pytest.approx((10 + 10 + 0 + 2) / 4)
    assert err.max_abs_pct == pytest.approx(10.0)


def test_fit_error_of_a_perturbed_surface_matches_its_coefficients() -> None:
    """With noise the fit is inexact: its error is what its own coefficients predict, and
    the residuals (relative) are orthogonal to every term (least squares optimum)."""
    rng = np.random.default_rng(3)
    points = sweeps(lambda i, o: surface(COEF, i, o), lambda i, o: surface(COEF, i, o) / 3)
    noisy = [
        Point(p.input_tokens, p.output_tokens, p.seconds, (p.joules[0] * rng.uniform(0.9, 1.1),))
        for p in points
    ]
    fitted = fit_model(noisy)
    coef = np.array(fitted.energy_coef)
    measured = np.array([p.mean_joules for p in noisy])
    predicted = np.array([surface(coef, p.input_tokens, p.output_tokens) for p in noisy])
    pct = np.abs(predicted - measured) / measured * 100
    assert fitted.energy_error.mean_abs_pct == pytest.approx(pct.mean())
    assert fitted.energy_error.max_abs_pct == pytest.approx(pct.max())
    assert fitted.energy_error.max_abs_pct > 0.1
    terms = np.array(
        [
            [
                1,
                p.input_tokens,
                p.output_tokens,
                p.input_tokens * p.output_tokens,
                p.output_tokens**2,
            ]
            for p in noisy
        ],
        dtype=float,
    )
    residual = (predicted - measured) / measured
    scaled = terms / measured[:, None]
    scale = np.abs(scaled).max(axis=0)
    np.testing.assert_allclose((scaled / scale).T @ residual, 0.0, atol=1e-9)


# -- curves along one sweep ----------------------------------------------------------------
def linear(slope: float) -> tuple[float, float, float]:
    """The fit along the axis, p0 + p1*n + p2*n^2: a straight line through 0."""
    return (0.0, slope, 0.0)


def test_curve_passes_through_points_and_is_a_power_law_between() -> None:
    sizes = np.array([8.0, 32.0, 128.0])
    values = np.array([2.0, 8.0, 50.0])
    curve = Curve(sizes, values, linear(0.1))
    np.testing.assert_allclose(curve(sizes), values)
    # halfway in log-log: the geometric means
    assert curve(np.array([16.0]))[0] == pytest.approx(math.sqrt(2.0 * 8.0))
    assert curve(np.array([64.0]))[0] == pytest.approx(math.sqrt(8.0 * 50.0))
    # a quarter of the way from 32 to 128 (n = 32 * 4**0.25): v = 8 * (50/8)**0.25
    assert curve(np.array([32 * 4**0.25]))[0] == pytest.approx(8 * (50 / 8) ** 0.25)
    dense = curve(np.linspace(0, 400, 4001))
    assert np.all(np.diff(dense) >= -1e-12)


def test_curve_beyond_the_ends_follows_the_fitted_slope_and_stays_non_negative() -> None:
    curve = Curve(np.array([8.0, 64.0]), np.array([3.0, 20.0]), linear(0.25))
    # above: the edge value plus the fitted rise from the edge
    np.testing.assert_allclose(curve(np.array([100.0, 164.0])), [20 + 0.25 * 36, 20 + 25])
    # below: the edge value minus the fitted drop, floored at zero
    np.testing.assert_allclose(curve(np.array([4.0, 0.0])), [3 - 1.0, 3 - 2.0])
    steep = Curve(np.array([8.0, 64.0]), np.array([1.0, 20.0]), linear(1.0))
    np.testing.assert_allclose(steep(np.array([0, 5, 7])), [0.0, 0.0, 0.0])
    # a fitted slope that falls is not followed: beyond the ends the curve stays flat
    falling = Curve(np.array([8.0, 64.0]), np.array([3.0, 20.0]), linear(-1.0))
    np.testing.assert_allclose(falling(np.array([0.0, 1000.0])), [3.0, 20.0])


def test_measured_dips_are_smoothed_before_the_curve() -> None:
    """A dip in measured means is noise: the curve pools it (weighted by trials)."""
    points = [
        Point(8, 32, (1.0,), (10.0,), INPUT),
        Point(16, 32, (2.0, 2.0), (30.0, 30.0), INPUT),
        Point(32, 32, (1.5,), (24.0,), INPUT),  # below the 16-token mean
        Point(64, 32, (3.0,), (60.0,), INPUT),
        Point(32, 8, (1.0,), (11.0,), OUTPUT),
        Point(32, 64, (4.0,), (70.0,), OUTPUT),
    ]
    sweep = build_model(as_profile(points)).sweep(INPUT)
    assert sweep.sizes == (8, 16, 32, 64) and sweep.fixed == 32
    pooled = (2 * 30.0 + 24.0) / 3
    np.testing.assert_allclose(sweep.energy.values, [10.0, pooled, pooled, 60.0])
    np.testing.assert_allclose(sweep.time.values, [1.0, 5.5 / 3, 5.5 / 3, 3.0])


def test_curves_built_from_a_profile_are_non_decreasing() -> None:
    """Noisy measurements: non-decreasing from zero tokens to the largest measured size;
    a noise-free linear surface: beyond it too."""
    rng = np.random.default_rng(4)
    sizes = (1, 4, 8, 32, 128)
    for _ in range(20):
        base, slope = rng.uniform(1, 10), rng.uniform(0.01, 1)
        noise = {(i, o): rng.uniform(0.8, 1.2, size=2) for i in sizes for o in (*sizes, 32)}
        energy = lambda i, o: (base + slope * (i + 2 * o)) * noise[(i, o)][0]  # noqa: B023, E731
        time = lambda i, o: (base + slope * (3 * i + o)) * noise[(i, o)][1]  # noqa: B023, E731
        model = build_model(as_profile(sweeps(energy, time, sizes=sizes)))
        n = np.arange(0, 129)
        for by in (INPUT, OUTPUT):
            for cost in model.costs(by, n, n):
                assert np.all(cost >= 0) and np.all(np.diff(cost) >= -1e-9)
    exact = lambda i, o: 3.0 + 0.5 * i + 2 * o  # noqa: E731
    model = build_model(as_profile(sweeps(exact, exact, sizes=sizes)))
    n = np.arange(0, 2000)
    for by in (INPUT, OUTPUT):
        for cost in model.costs(by, n, n):
            assert np.all(cost >= 0) and np.all(np.diff(cost) >= -1e-9)


# The extrapolation follows the fitted quadratic only as far as it keeps rising.
def test_curve_above_the_ends_never_falls_for_a_concave_fit() -> None:
    root = lambda i, o: 10 * math.sqrt(o) + 0.01 * i  # noqa: E731
    points = sweeps(root, lambda i, o: 1 + 0.05 * o + 0.001 * i, sizes=(8, 16, 64, 128))
    e, _ = build_model(as_profile(points)).costs(OUTPUT, np.zeros(3000), np.arange(3000))
    assert np.all(np.diff(e) >= 0)


def test_curve_below_the_ends_never_rises_for_a_convex_fit() -> None:
    bowl = lambda i, o: 50 - 2 * o + 0.1 * o * o + 0.01 * i  # noqa: E731
    points = sweeps(bowl, lambda i, o: 1 + 0.05 * o + 0.001 * i, sizes=(16, 64, 128))
    e, _ = build_model(as_profile(points)).costs(OUTPUT, np.zeros(20), np.arange(20))
    assert np.all(np.diff(e) >= 0)


# -- sweeps and per-query costs ------------------------------------------------------------
def test_costs_by_input_output_and_both() -> None:
    energy = lambda i, o: surface(COEF, i, o)  # noqa: E731
    time = lambda i, o: surface(COEF, i, o) / 4  # noqa: E731
    points = [*sweeps(energy, time), Point(200, 200, (time(200, 200),), (energy(200, 200),))]
    model = build_model(as_profile(points))
    n_in, n_out = np.array([8, 16, 256]), np.array([16, 8, 300])
    e_in, t_in = model.costs(INPUT, n_in, n_out)
    np.testing.assert_allclose(e_in, [energy(n, 32) for n in n_in])  # on the input sweep
    np.testing.assert_allclose(t_in, [time(n, 32) for n in n_in])
    e_out, _ = model.costs(OUTPUT, n_in, n_out[:2])[0], None
    np.testing.assert_allclose(e_out, [energy(32, n) for n in n_out[:2]])
    e_both, t_both = model.costs(BOTH, n_in, n_out)
    np.testing.assert_allclose(e_both, [energy(i, o) for i, o in zip(n_in, n_out)])
    np.testing.assert_allclose(t_both, [time(i, o) for i, o in zip(n_in, n_out)])
    assert model.system == "A"


def test_costs_by_both_are_never_negative() -> None:
    """A fitted surface that falls below zero far from the measurements is floored."""
    coef = np.array([200.0, -0.5, 0.5, 0.0, 0.0])
    energy = lambda i, o: surface(coef, i, o)  # noqa: E731
    points = sweeps(energy, energy, sizes=(8, 16, 64, 128))
    extra = Point(100, 100, (energy(100, 100),), (energy(100, 100),))
    model = build_model(as_profile([*points, extra]))
    e, t = model.costs(BOTH, np.array([8, 2000]), np.array([8, 8]))
    assert e[0] == pytest.approx(energy(8, 8)) and e[1] == 0.0 and t[1] == 0.0


def test_missing_sweep_is_a_clear_profile_error() -> None:
    only_input = [Point(n, 32, (1.0,), (n + 1.0,), INPUT) for n in (8, 16, 64)]
    model = build_model(as_profile(only_input, "M1"))
    assert model.input_sweep is not None and model.output_sweep is None
    with pytest.raises(ProfileError, match=r"'M1'.*no output sweep.*two or more output token"):
        model.sweep(OUTPUT)
    with pytest.raises(ProfileError, match="no output sweep"):
        model.costs(OUTPUT, np.array([1]), np.array([1]))
    with pytest.raises(ProfileError, match="no trials"):
        build_model(Profile("A", "m", ()))


def test_labelled_sweeps_win_over_inferred_ones() -> None:
    """The output sweep at 38 input tokens crosses output 32; labelled, its (38, 32) point
    stays out of the input sweep."""
    input_sweep = [Point(n, 32, (1.0,), (float(n),), INPUT) for n in (8, 16, 64)]
    output_sweep = [Point(38, n, (1.0,), (float(n),), OUTPUT) for n in (8, 16, 32, 64)]
    model = build_model(as_profile(input_sweep + output_sweep))
    assert model.sweep(INPUT).sizes == (8, 16, 64) and model.sweep(INPUT).fixed == 32
    assert model.sweep(OUTPUT).sizes == (8, 16, 32, 64) and model.sweep(OUTPUT).fixed == 38
    unlabelled = [
        Point(p.input_tokens, p.output_tokens, p.seconds, p.joules)
        for p in (input_sweep + output_sweep)
    ]
    inferred = build_model(as_profile(unlabelled))
    assert inferred.sweep(INPUT).sizes == (8, 16, 38, 64)  # the crossing point joins


def test_zero_token_sizes_are_left_to_the_fit() -> None:
    """Log-log has no place for zero tokens; the curve starts at the first size >= 1."""
    points = [Point(n, 32, (1.0,), (n + 5.0,), INPUT) for n in (0, 8, 16)]
    points += [Point(32, n, (1.0,), (n + 5.0,), OUTPUT) for n in (8, 16)]
    model = build_model(as_profile(points))
    assert model.sweep(INPUT).sizes == (8, 16)
    e, _ = model.costs(INPUT, np.array([0, 8]), np.array([0, 0]))
    assert 0 <= e[0] <= e[1] == pytest.approx(13.0)


def test_curve_extrapolates_to_the_fits_vertex_and_no_further() -> None:
    """Fit 2n - 0.01n^2 along the axis peaks at n = 100 (f = 100); f(64) = 87.04."""
    curve = Curve(np.array([8.0, 64.0]), np.array([3.0, 20.0]), (0.0, 2.0, -0.01))
    np.testing.assert_allclose(
        curve(np.array([80.0, 100.0, 200.0, 5000.0])),
        [20 + (160 - 64) - 87.04, 20 + 100 - 87.04, 20 + 100 - 87.04, 20 + 100 - 87.04],
    )
    # below 8, the fit falls from f(8) = 15.36 to f(0) = 0: 3 - 15.36 floors at zero
    np.testing.assert_allclose(curve(np.array([7.0, 0.0])), [3 - (15.36 - 13.51), 0.0])
