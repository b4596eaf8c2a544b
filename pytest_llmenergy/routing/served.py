"""Routing on a served workload: each request's attributed joules, not a query alone.

A workload replayed against a server (``llm_workload``) keeps every request's joules as
attributed in the batch it ran in (``serving/attribution.py``), with its input and
output lengths.  Those are the costs a production router meets: batching shares each
decode step's fixed cost among the requests of the batch, so a served request costs a
fraction of what the same query costs alone, and the fraction depends on the batch.

A system's served profile is its requests, one trial each; its model is a least-squares
fit of their joules on the terms of ``fit.TERMS`` (absolute errors: a request's joules
are noisy, and their mean is what a workload totals).  Routing by input (output) tokens
prices a query on that fit at the served requests' mean output (input) length, as the
one-at-a-time sweeps price it at their fixed length.

A request's seconds are its share of the server's busy time: its latency x the window's
length / every request's latency summed, so the requests' seconds add up to the window.
Its joules are net of idle power: a server that stays on pays idle power whichever
requests it is sent, so idle power moves no threshold.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..results import CaseResult, Trial
from ..storage.runfile import Run
from . import INPUT, OUTPUT
from .fit import (
    TERMS,
    FitError,
    FittedModel,
    Sweep,
    SystemModel,
    features,
    non_decreasing,
    sweep_of,
)
from .profile import Point, Profile, model_of, served_case

# Terms beyond these need requests that tell them apart (the matrix at full rank).
_BASE_TERMS = ("1", "n_in", "n_out")
# The smallest joules a curve may hold: log-log interpolation needs values above zero.
_FLOOR_J = 1e-9


@dataclass(frozen=True)
class ServedRequest:
    """One completed, attributed request: its lengths, busy-time share and joules."""

    input_tokens: int
    output_tokens: int
    seconds: float
    joules: float


def _busy_shares(trial: Trial) -> list[float]:
    """Each request's share of the window's seconds, by its latency."""
    total = math.fsum(q.latency_s for q in trial.requests)
    if total <= 0:
        return [0.0] * len(trial.requests)
    return [q.latency_s * trial.seconds / total for q in trial.requests]


def served_requests(case: CaseResult) -> Iterator[ServedRequest]:
    """The requests that completed as asked with joules above zero (failed, cut or
    miscounted ones, and shares net of idle that fell to zero or below, are left out)."""
    for trial in case.trials:
        for q, seconds in zip(trial.requests, _busy_shares(trial)):
            joules = q.energy_j
            if q.status or joules is None or q.input_tokens is None:
                continue
            if joules > 0 and seconds > 0:
                yield ServedRequest(q.input_tokens, q.output_tokens, seconds, joules)


def _left_out(cases: Sequence[CaseResult]) -> int:
    kept = sum(1 for c in cases for _ in served_requests(c))
    return sum(len(t.requests) for c in cases for t in c.trials) - kept


def served_profiles_from_run(run: Run, system: str | None = None) -> list[Profile]:
    """A saved run's served workloads, one profile per model (none: no workload)."""
    source = str(run.path or run.label)
    return served_profiles_from_cases(run.cases, system or run.hardware or run.label, source)


def served_profiles_from_cases(
    cases: Sequence[CaseResult], system: str, source: str
) -> list[Profile]:
    """One profile per model of the cases that replayed a workload: each request a trial."""
    by_model: dict[str, list[CaseResult]] = defaultdict(list)
    for case in cases:
        if served_case(case):
            by_model[model_of(case)].append(case)
    profiles = []
    for model, group in by_model.items():
        points = _points([r for c in group for r in served_requests(c)])
        if not points:
            continue
        left = _left_out(group)
        note = f"{left} requests left out (failed, cut, or not above idle)" if left else ""
        profiles.append(
            Profile(
                system,
                model,
                points,
                source,
                confidence=min(c.options.confidence for c in group),
                estimated=any(c.estimated for c in group),
                served=True,
                note=note,
            )
        )
    return profiles


def _points(requests: Sequence[ServedRequest]) -> tuple[Point, ...]:
    """Requests of the same lengths pooled as the trials of one point."""
    sizes: dict[tuple[int, int], list[ServedRequest]] = defaultdict(list)
    for r in requests:
        sizes[(r.input_tokens, r.output_tokens)].append(r)
    return tuple(
        Point(n_in, n_out, tuple(r.seconds for r in rs), tuple(r.joules for r in rs))
        for (n_in, n_out), rs in sorted(sizes.items())
    )


# -- the model ---------------------------------------------------------------------------
def _trial_arrays(points: Sequence[Point]) -> tuple[np.ndarray, ...]:
    """(n_in, n_out, seconds, joules), one entry per request."""
    rows = [
        (p.input_tokens, p.output_tokens, s, j) for p in points for s, j in zip(p.seconds, p.joules)
    ]
    return tuple(np.array(col, dtype=float) for col in zip(*rows))


def _terms_kept(x: np.ndarray) -> np.ndarray:
    """All five terms when the requests tell them apart, else 1, n_in, n_out."""
    scale = np.abs(x).max(axis=0)
    scaled = x / np.where(scale > 0, scale, 1.0)
    if np.linalg.matrix_rank(scaled) == len(TERMS) and len(x) > 2 * len(TERMS):
        return np.ones(len(TERMS), dtype=bool)
    return np.array([t in _BASE_TERMS for t in TERMS])


def _ols(x: np.ndarray, y: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Ordinary least squares on the kept columns (scaled), the rest at zero."""
    cols = x[:, keep]
    scale = np.abs(cols).max(axis=0)
    scale[scale == 0] = 1.0
    coef = np.zeros(len(TERMS))
    fitted, *_ = np.linalg.lstsq(cols / scale, y, rcond=None)
    coef[keep] = fitted / scale
    return coef


def fit_served(points: Sequence[Point]) -> FittedModel:
    """A request's joules and seconds on its lengths, by least squares over every request;
    the error is against each size's mean, as the one-at-a-time fit reports it."""
    n_in, n_out, seconds, joules = _trial_arrays(points)
    x = features(n_in, n_out)
    keep = _terms_kept(x)
    e_coef, t_coef = _ols(x, joules, keep), _ols(x, seconds, keep)
    at = features(
        np.array([p.input_tokens for p in points]), np.array([p.output_tokens for p in points])
    )
    return FittedModel(
        tuple(float(c) for c in e_coef),
        tuple(float(c) for c in t_coef),
        FitError.of(at @ e_coef, np.array([p.mean_joules for p in points])),
        FitError.of(at @ t_coef, np.array([p.mean_seconds for p in points])),
        tuple(t for t, k in zip(TERMS, keep) if not k),
    )


def _served_sweep(profile: Profile, axis: str, fitted: FittedModel) -> Sweep | None:
    """The fit along ``axis`` at the requests' mean length on the other axis, through
    every served length of ``axis`` (None: fewer than two)."""
    n_in, n_out, _, _ = _trial_arrays(profile.points)
    along, other = (n_in, n_out) if axis == INPUT else (n_out, n_in)
    sizes = np.unique(along[along >= 1])
    if len(sizes) < 2:
        return None
    fixed = round(float(other.mean()))
    pair = (
        (sizes, np.full_like(sizes, fixed))
        if axis == INPUT
        else (np.full_like(sizes, fixed), sizes)
    )
    weights = [int(np.sum(along == s)) for s in sizes]
    energy = non_decreasing(np.maximum(fitted.energy_j(*pair), _FLOOR_J), weights)
    time = non_decreasing(np.maximum(fitted.seconds(*pair), _FLOOR_J), weights)
    return sweep_of(axis, fixed, sizes, energy, time, fitted)


def build_served_model(profile: Profile) -> SystemModel:
    """The router's view of a served profile: the fit, and a curve along each axis."""
    fitted = fit_served(profile.points)
    return SystemModel(
        profile,
        fitted,
        _served_sweep(profile, INPUT, fitted),
        _served_sweep(profile, OUTPUT, fitted),
    )
