"""Held-out error tables: fit on some measured cases, predict others the fit never saw.

Three splits, each per system (a saved run's hardware folder):

- ``sweep``: fit on the input sweep, predict the output sweep; and the reverse.
- ``model``: fit on every model but one, predict that one (leave one model out).
- ``system``: fit on one system, predict another with the same GPU (leave one system
  out), where there is one.
- ``chosen`` (``fit_on``): fit on the models named, predict each other model of the
  system; the protocol a user follows when calibrating on a few models of their own.

Beside them, the figures AstraWattch reports for its operator-level predictions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .calibrate import (
    BothFit,
    Point,
    fit_both,
    named_model,
    points_from_cases,
    predict_work,
    rows_for,
    short_model,
)

SPLITS = ("sweep", "model", "system")
# AstraWattch (its paper's evaluation): energy prediction error of 2-12 % across its
# models and GPUs, the yardstick issue 28 sets beside these tables.
ASTRAWATTCH = "AstraWattch reports 2-12 % energy error on held-out models and GPUs"


@dataclass(frozen=True)
class Held:
    """One held-out group: what was fitted on what, and the errors on what it predicted."""

    split: str
    system: str
    fitted_on: str
    predicted: str
    cases: int
    time_mean_abs_err: float
    time_mean_err: float
    energy_mean_abs_err: float
    energy_mean_err: float

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class _System:
    name: str
    gpu: str
    points: tuple[Point, ...]
    sweeps: tuple[str, ...]  # per point


def _fit(split: str, system: str, train: Sequence[Point], form: str) -> BothFit:
    if len(train) < 3:
        raise ConfigError(f"{split} split on {system}: only {len(train)} cases to fit on")
    return fit_both(rows_for(train), form, {})


def _held(
    split: str,
    system: str,
    fitted: str,
    predicted: str,
    f: BothFit,
    test: Sequence[Point],
) -> Held:
    """The errors of one fit on cases it never saw."""
    t_err = [(predict_work(f.time, p.work, f.time_k) - p.time_s) / p.time_s for p in test]
    e_err = [(predict_work(f.energy, p.work, f.energy_k) - p.energy_j) / p.energy_j for p in test]
    n = len(test)
    return Held(
        split=split,
        system=system,
        fitted_on=fitted,
        predicted=predicted,
        cases=n,
        time_mean_abs_err=math.fsum(abs(e) for e in t_err) / n,
        time_mean_err=math.fsum(t_err) / n,
        energy_mean_abs_err=math.fsum(abs(e) for e in e_err) / n,
        energy_mean_err=math.fsum(e_err) / n,
    )


def _systems(runs: Sequence[Any], skipped: list[str]) -> list[_System]:
    out = []
    for run in runs:
        cases = [c for c in run.cases if c.trials]
        points, sweeps = [], []
        for case in cases:
            found = points_from_cases([case], skipped=skipped)
            if found:
                points.append(found[0])
                sweeps.append(case.labels.get("sweep", ""))
        gpus = run.machine.get("gpus") if isinstance(run.machine, Mapping) else None
        gpu = ""
        if isinstance(gpus, list) and gpus and isinstance(gpus[0], Mapping):
            gpu = str(gpus[0].get("name", ""))
        if points:
            out.append(_System(run.hardware, gpu, tuple(points), tuple(sweeps)))
    return out


CHOSEN = "chosen"  # the split of ``fit_on``: fitted on the models named


def _chosen(s: _System, fit_on: Sequence[str], form: str) -> list[Held]:
    """Fitted on the ``fit_on`` models, each other model predicted, then all of them."""
    models = sorted({p.model for p in s.points})
    missing = [n for n in fit_on if not any(n in (m, short_model(m)) for m in models)]
    if missing:
        raise ConfigError(
            f"--fit-on {','.join(missing)}: not measured on {s.name}; its models: "
            f"{', '.join(short_model(m) for m in models)}"
        )
    train = [p for p in s.points if named_model(p.model, fit_on)]
    others = [m for m in models if not named_model(m, fit_on)]
    if not others:
        raise ConfigError(f"--fit-on names every model of {s.name}: nothing is left to predict")
    fitted = ", ".join(short_model(m) for m in models if named_model(m, fit_on))
    f = _fit(CHOSEN, s.name, train, form)  # one fit, every other model predicted from it
    rows = [
        _held(CHOSEN, s.name, fitted, short_model(m), f, [p for p in s.points if p.model == m])
        for m in others
    ]
    test = [p for p in s.points if not named_model(p.model, fit_on)]
    rows.append(_held(CHOSEN, s.name, fitted, "all the others", f, test))
    return rows


def held_out(
    runs: Sequence[Any],
    splits: Sequence[str] = SPLITS,
    form: str = "shared",
    fit_on: Sequence[str] = (),
) -> tuple[list[Held], list[str]]:
    """Every split's rows over ``runs`` (storage ``Run`` objects, one system each), and
    the cases that could not be used (their model's config unknown).  ``fit_on`` adds
    the ``chosen`` split: fitted on those models (full or short names)."""
    skipped: list[str] = []
    systems = _systems(runs, skipped)
    rows: list[Held] = []
    for s in systems:
        if fit_on:
            rows += _chosen(s, fit_on, form)
        if "sweep" in splits:
            for fit_sweep, other in (("input", "output"), ("output", "input")):
                train = [p for p, w in zip(s.points, s.sweeps, strict=True) if w == fit_sweep]
                test = [p for p, w in zip(s.points, s.sweeps, strict=True) if w == other]
                if len(train) >= 3 and test:
                    f = _fit("sweep", s.name, train, form)
                    fitted, predicted = f"{fit_sweep} sweep", f"{other} sweep"
                    rows.append(_held("sweep", s.name, fitted, predicted, f, test))
        if "model" in splits:
            models = sorted({p.model for p in s.points})
            for held in models if len(models) > 1 else ():
                train = [p for p in s.points if p.model != held]
                test = [p for p in s.points if p.model == held]
                others = ", ".join(short_model(m) for m in models if m != held)
                f = _fit("model", s.name, train, form)
                rows.append(_held("model", s.name, others, short_model(held), f, test))
    if "system" in splits:
        for s in systems:
            peers = [o for o in systems if o is not s and s.gpu and o.gpu == s.gpu]
            if not peers:
                continue
            f = _fit("system", s.name, s.points, form)  # once, for every peer and model
            for other in peers:
                for model in sorted({p.model for p in other.points}):
                    test = [p for p in other.points if p.model == model]
                    rows.append(_held("system", other.name, s.name, short_model(model), f, test))
    if not rows:
        raise ConfigError(
            f"no held-out split ({', '.join(splits)}) could be made: the sweep split needs "
            "runs with both sweeps, the model split several models on one system, the system "
            "split two systems with the same GPU (e.g. llmenergy import "
            "examples/wilkins2024/*.csv)"
            + (f"; not usable: {'; '.join(skipped[:3])}" if skipped else "")
        )
    return rows, skipped
