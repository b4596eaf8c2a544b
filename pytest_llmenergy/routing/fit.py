"""Energy and time of a query at any token count, from the sizes a system measured.

Two models, as energy-modelling work uses them:

- ``Curve``: along one sweep (input tokens at a fixed output, or the reverse), the
  measured means made non-decreasing and joined by power laws (straight lines in
  log-log space), so a threshold can fall on any token count between measured sizes.
- ``FittedModel``: least squares over every measured size on the terms
  1, n_in, n_out, n_in·n_out, n_out²; it prices sizes outside a sweep, and its error
  against the measurements says how far to trust it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import BOTH, INPUT, OUTPUT
from .profile import Point, Profile, ProfileError

TERMS = ("1", "n_in", "n_out", "n_in*n_out", "n_out^2")


def features(n_in: np.ndarray, n_out: np.ndarray) -> np.ndarray:
    n_in = np.asarray(n_in, dtype=float)
    n_out = np.asarray(n_out, dtype=float)
    return np.stack([np.ones_like(n_in), n_in, n_out, n_in * n_out, n_out * n_out], axis=-1)


def non_decreasing(values: Sequence[float], weights: Sequence[float]) -> np.ndarray:
    """The closest non-decreasing sequence (weighted least squares, pool adjacent violators).

    More tokens never cost less; a dip between two sizes is measurement noise.
    """
    blocks: list[list[float]] = []  # [mean, weight, length]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.repeat([b[0] for b in blocks], [int(b[2]) for b in blocks])


@dataclass(frozen=True)
class FitError:
    """How far a fitted model is from the measured means, over the measured sizes."""

    mean_abs_pct: float
    max_abs_pct: float

    @classmethod
    def of(cls, predicted: np.ndarray, measured: np.ndarray) -> FitError:
        rel = np.abs(predicted - measured) / measured * 100
        return cls(float(rel.mean()), float(rel.max()))


@dataclass(frozen=True)
class FittedModel:
    """E(n_in, n_out) and T(n_in, n_out) as sums of the ``TERMS``."""

    energy_coef: tuple[float, ...]
    time_coef: tuple[float, ...]
    energy_error: FitError
    time_error: FitError
    dropped: tuple[str, ...] = ()  # terms the measured sizes cannot tell apart, fixed at 0

    def energy_j(self, n_in: np.ndarray, n_out: np.ndarray) -> np.ndarray:
        return features(n_in, n_out) @ np.asarray(self.energy_coef)

    def seconds(self, n_in: np.ndarray, n_out: np.ndarray) -> np.ndarray:
        return features(n_in, n_out) @ np.asarray(self.time_coef)


def _least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Relative least squares: sizes span three decades, and a joule at 8 tokens matters
    as much, in proportion, as a kilojoule at 2048."""
    a = x / y[:, None]
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(a / scale, np.ones_like(y), rcond=None)
    return coef / scale


_CROSS = TERMS.index("n_in*n_out")


def fit_model(points: Sequence[Point]) -> FittedModel:
    """Least squares on every measured size.

    An input sweep and an output sweep that cross at one size cannot tell n_in·n_out
    apart from the other terms (it is zero along both lines, relative to the crossing);
    least squares would then pick an arbitrary share for it.  It is left out instead:
    away from the sweeps, input and output costs add up.
    """
    n_in = np.array([p.input_tokens for p in points], dtype=float)
    n_out = np.array([p.output_tokens for p in points], dtype=float)
    energy = np.array([p.mean_joules for p in points])
    time = np.array([p.mean_seconds for p in points])
    x = features(n_in, n_out)
    keep = np.ones(len(TERMS), dtype=bool)
    scale = np.abs(x).max(axis=0)
    if np.linalg.matrix_rank(x / np.where(scale > 0, scale, 1.0)) < len(TERMS):
        keep[_CROSS] = False
    e_coef, t_coef = np.zeros(len(TERMS)), np.zeros(len(TERMS))
    e_coef[keep] = _least_squares(x[:, keep], energy)
    t_coef[keep] = _least_squares(x[:, keep], time)
    return FittedModel(
        tuple(float(c) for c in e_coef),
        tuple(float(c) for c in t_coef),
        FitError.of(x @ e_coef, energy),
        FitError.of(x @ t_coef, time),
        tuple(t for t, k in zip(TERMS, keep) if not k),
    )


class Curve:
    """A non-decreasing function of one token count, through the measured sizes.

    Between measured sizes it is a power law through the two neighbours.  Beyond them it
    follows the fitted model along this axis, ``p0 + p1*n + p2*n^2``, from the edge value,
    and only as far as the model keeps rising: past the largest size it adds the model's
    highest rise so far, below the smallest it subtracts the model's deepest fall (so a
    fit that bends back never makes more tokens cheaper).  Never below zero.
    """

    def __init__(self, sizes: np.ndarray, values: np.ndarray, poly: Sequence[float]) -> None:
        self.sizes = np.asarray(sizes, dtype=float)
        self.values = np.asarray(values, dtype=float)
        self.poly = tuple(float(c) for c in poly)  # p0, p1, p2 of the fit along this axis
        self._log_n = np.log(self.sizes)
        self._log_v = np.log(self.values)

    def _fit(self, n: np.ndarray | float) -> np.ndarray:
        p0, p1, p2 = self.poly
        return p0 + p1 * n + p2 * n * n

    def _extreme(self, a: np.ndarray, b: np.ndarray, highest: bool) -> np.ndarray:
        """The fit's highest (or lowest) value on each interval [a, b]: at an end, or at
        the vertex when it lies inside and opens the right way."""
        ends = (
            np.maximum(self._fit(a), self._fit(b))
            if highest
            else np.minimum(self._fit(a), self._fit(b))
        )
        p2 = self.poly[2]
        if p2 == 0 or (p2 > 0) == highest:
            return ends
        vertex = -self.poly[1] / (2 * p2)
        inside = self._fit(np.clip(vertex, a, b))
        return np.maximum(ends, inside) if highest else np.minimum(ends, inside)

    def __call__(self, n: np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=float)
        lo, hi = self.sizes[0], self.sizes[-1]
        out = np.exp(np.interp(np.log(np.clip(n, lo, hi)), self._log_n, self._log_v))
        below, above = n < lo, n > hi
        if below.any():
            edge = np.full(int(below.sum()), lo)
            fall = self._fit(lo) - self._extreme(n[below], edge, highest=False)
            out[below] = np.maximum(self.values[0] - fall, 0.0)
        if above.any():
            edge = np.full(int(above.sum()), hi)
            rise = self._extreme(edge, n[above], highest=True) - self._fit(hi)
            out[above] = self.values[-1] + rise
        return out


@dataclass(frozen=True)
class Sweep:
    """Sizes measured along one axis with the other held at ``fixed`` tokens."""

    axis: str  # INPUT: input tokens vary; OUTPUT: output tokens vary
    fixed: int
    sizes: tuple[int, ...]
    energy: Curve
    time: Curve


def _sweep(profile: Profile, axis: str, fitted: FittedModel) -> Sweep | None:
    """The longest run of sizes along ``axis`` at one value of the other axis, from the
    points labelled with that sweep when there are any."""
    labelled = [p for p in profile.points if p.sweep == axis]
    along: dict[int, list[Point]] = {}
    for p in labelled or profile.points:
        other = p.output_tokens if axis == INPUT else p.input_tokens
        along.setdefault(other, []).append(p)
    fixed, points = max(along.items(), key=lambda kv: (len(kv[1]), -kv[0]))
    if len(points) < 2:
        return None

    def size(p: Point) -> int:
        return p.input_tokens if axis == INPUT else p.output_tokens

    merged: dict[int, Point] = {}
    for p in sorted(points, key=size):  # one size measured in both sweeps: pool its trials
        q = merged.get(size(p))
        merged[size(p)] = (
            p
            if q is None
            else Point(
                p.input_tokens, p.output_tokens, q.seconds + p.seconds, q.joules + p.joules, p.sweep
            )
        )
    points = list(merged.values())
    if size(points[0]) < 1:
        points = points[1:]  # log-log has no room for zero tokens; the fit prices them
        if len(points) < 2:
            return None
    sizes = np.array([size(p) for p in points], dtype=float)
    weights = [p.trials for p in points]
    energy = non_decreasing([p.mean_joules for p in points], weights)
    time = non_decreasing([p.mean_seconds for p in points], weights)
    return sweep_of(axis, fixed, sizes, energy, time, fitted)


def sweep_of(
    axis: str,
    fixed: int,
    sizes: np.ndarray,
    energy: np.ndarray,
    time: np.ndarray,
    fitted: FittedModel,
) -> Sweep:
    """A sweep's curves through these sizes, their slopes past the ends the fit's."""
    return Sweep(
        axis,
        fixed,
        tuple(int(s) for s in sizes),
        Curve(sizes, energy, along_axis(fitted.energy_coef, axis, fixed)),
        Curve(sizes, time, along_axis(fitted.time_coef, axis, fixed)),
    )


def along_axis(coef: Sequence[float], axis: str, fixed: int) -> tuple[float, float, float]:
    """The fitted surface on one axis, the other held at ``fixed``: p0 + p1*n + p2*n^2."""
    c1, c_in, c_out, c_cross, c_out2 = coef
    if axis == INPUT:  # linear in n_in
        return c1 + c_out * fixed + c_out2 * fixed**2, c_in + c_cross * fixed, 0.0
    return c1 + c_in * fixed, c_out + c_cross * fixed, c_out2


@dataclass(frozen=True)
class SystemModel:
    """Everything the optimizer asks of one system: a query's joules and seconds."""

    profile: Profile
    fitted: FittedModel
    input_sweep: Sweep | None
    output_sweep: Sweep | None

    @property
    def system(self) -> str:
        return self.profile.system

    def sweep(self, by: str) -> Sweep:
        sweep = self.input_sweep if by == INPUT else self.output_sweep
        if sweep is None:
            raise ProfileError(
                f"system {self.system!r}, model {self.profile.model!r} has no {by} sweep: "
                f"measure two or more {by} token sizes at one {_other(by)} size"
            )
        return sweep

    def costs(self, by: str, n_in: np.ndarray, n_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(joules, seconds) per query.

        By input (output), a query costs what the input (output) sweep measured at its
        size, as the research charges it; by both, the fitted surface prices each pair.
        """
        if by == BOTH:
            energy = np.maximum(self.fitted.energy_j(n_in, n_out), 0.0)
            time = np.maximum(self.fitted.seconds(n_in, n_out), 0.0)
            return energy, time
        sweep = self.sweep(by)
        n = n_in if by == INPUT else n_out
        return sweep.energy(n), sweep.time(n)


def _other(by: str) -> str:
    return OUTPUT if by == INPUT else INPUT


def build_model(profile: Profile) -> SystemModel:
    if not profile.points:
        raise ProfileError(f"system {profile.system!r}, model {profile.model!r}: no trials")
    fitted = fit_model(profile.points)
    return SystemModel(
        profile, fitted, _sweep(profile, INPUT, fitted), _sweep(profile, OUTPUT, fitted)
    )
