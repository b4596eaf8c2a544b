"""Fit the operator-class model to measured runs: one calibration per system and setting.

time = sum over classes c of (a_c * FLOPs_c + b_c * bytes_c) + t_launch * operators, and
energy likewise, with non-negative coefficients (a negative joule per FLOP means
nothing), fitted by non-negative least squares on *relative* residuals (a 10 ms case
counts as much as a 2 s one) over every measured case's prefill and decode phases.
The error estimate a prediction carries is the leave-one-case-out error: each case
predicted by a fit that never saw it.  How the columns share coefficients (the form) is
chosen the same way, by the error on held-out models or cases (``calibrate_auto``).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..results import DECODE, PREFILL, CaseResult
from .features import (
    ATTENTION,
    COLUMNS,
    MATMUL,
    OTHER,
    ROOFLINE_INDEX,
    WORK_CLASSES,
    ModelShape,
    Work,
    case_work,
    load_shape,
    roofline,
    shape_from_config,
)
from .op_profile import check_profile

FORMAT = "llmenergy-calibration"
VERSION = 1
# Case labels that name a hardware setting (a GPU power limit or clock), when present.
SETTING_LABELS = ("setting", "gpu_setting")
BATCH_LABEL = "batch_size"
SPEED_KEY = "speed_reference_s"  # a run's machine record (plugin/keeping.py)


@dataclass(frozen=True)
class Row:
    """One measured phase (or whole case when it was not split) and its work."""

    case: int  # index into the cases, for leave-one-case-out
    phase: str
    time_s: float
    energy_j: float
    x: tuple[float, ...]
    # every pass's FLOPs, bytes and count, for the roofline column (its k is fitted)
    passes: np.ndarray | None = None
    # the roofline column at each balance point the fit tries, worked out once: every
    # held-out fit (one per case or model, when choosing a form too) tries them all
    rooflines: Mapping[float, float] = field(default_factory=dict)

    def vector(self, k: float) -> tuple[float, ...]:
        if not k or self.passes is None:
            return self.x
        i = ROOFLINE_INDEX
        column = self.rooflines.get(k)
        if column is None:
            column = roofline(self.passes, k)
        return (*self.x[:i], column, *self.x[i + 1 :])

    @classmethod
    def of(cls, case: int, phase: str, time_s: float, energy_j: float, work: Work) -> Row:
        passes = work.pass_array()
        columns = {k: roofline(passes, k) for k in ROOFLINE_KS}
        return cls(case, phase, time_s, energy_j, tuple(work.vector()), passes, columns)


@dataclass(frozen=True)
class Point:
    """A measured case, as calibration reports it."""

    model: str
    input_tokens: int
    output_tokens: int
    batch_size: int
    time_s: float
    energy_j: float
    work: Mapping[str, Work]
    profile: Mapping[str, Any] | None
    # mean (seconds, joules) of each phase; empty when the trials were not split
    phases: Mapping[str, tuple[float, float]]


def nnls(a: np.ndarray, b: np.ndarray, iterations: int = 500) -> np.ndarray:
    """Non-negative least squares, Lawson and Hanson's active-set method."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    for _ in range(iterations):
        if passive.all() or (w[~passive] <= 1e-12 * max(1.0, float(np.abs(w).max()))).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            bad = passive & (z <= 0)
            alpha = np.min(x[bad] / (x[bad] - z[bad]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


KERNEL_CLASSES = (MATMUL, ATTENTION)
# Columns only the roofline form fits (the others keep their coefficients at zero).
ROOFLINE_ONLY = ("roofline", "forward_passes")
# Columns that may be missing from older calibration files (taken as zero).
NEWER_COLUMNS = ROOFLINE_ONLY
# Columns older calibration files may have that are no longer modelled: dropped when
# their coefficient is zero, else the file must be made again.
DROPPED_COLUMNS = ("beyond_cache_bytes",)

# How the columns share coefficients.  ``shared``: one cost per FLOP and one per byte
# whatever the class, and one per launch: three numbers, which one model's sizes can
# determine (with a single model, per-class columns all grow with the tokens together
# and the split between them is arbitrary).  ``per_class``: every column its own, for
# calibrations over several models.  ``kernels``: the matrix-multiply and attention
# kernels' cost per FLOP taken from the operator profiles (each kernel call's own time
# against its FLOPs, over every shape profiled: AstraWattch's per-kernel models), the
# rest shared as in ``shared`` and fitted to the windows.
FORMS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "shared": (
        tuple(f"{c}_flops" for c in WORK_CLASSES),
        tuple(f"{c}_bytes" for c in WORK_CLASSES),
        ("launches",),
        ("generations",),
    ),
    "per_class": tuple((c,) for c in COLUMNS if c not in ROOFLINE_ONLY),
    "kernels": (
        tuple(f"{c}_flops" for c in WORK_CLASSES if c not in KERNEL_CLASSES),
        tuple(f"{c}_bytes" for c in WORK_CLASSES),
        ("launches",),
        ("generations",),
    ),
    # ``roofline``: each forward pass costs the larger of its compute and its memory
    # traffic (max(k x FLOPs, bytes), k fitted: the machine's balance), plus launches, a
    # cost per generation and one per forward pass (the generate loop's own work: what
    # made the research's three models differ least).  For GPUs, where a pass is either
    # bound or the other.
    "roofline": (
        ("roofline",),
        ("launches",),
        ("generations",),
        ("forward_passes",),
    ),
}
# The balance points (bytes per FLOP) the roofline form tries.
ROOFLINE_KS = tuple(float(k) for k in np.logspace(-4, 1, 41))


def fit(
    rows: Sequence[Row],
    target: str,
    form: str = "shared",
    fixed: Mapping[str, float] | None = None,
    k: float = 0.0,
    raw: np.ndarray | None = None,
) -> np.ndarray:
    """Coefficients (per COLUMNS) minimizing the relative error of ``target`` per row;
    ``fixed`` columns keep the given coefficients (their share is taken off first).
    ``raw``: the rows' vectors at ``k``, where the caller has them already."""
    fixed = dict(fixed or {})
    groups = FORMS[form]
    tie = np.zeros((len(COLUMNS), len(groups)))
    for j, names in enumerate(groups):
        for name in names:
            tie[COLUMNS.index(name), j] = 1.0
    base = np.array([fixed.get(c, 0.0) for c in COLUMNS])
    if raw is None:
        raw = np.array([r.vector(k) for r in rows], dtype=float)
    x = raw @ tie
    y = np.array([getattr(r, target) for r in rows], dtype=float)
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    a = (x / scale) / y[:, None]
    coef = nnls(a, 1.0 - (raw @ base) / y)
    return tie @ (coef / scale) + base


def kernel_seconds_per_flop(points: Sequence[Point]) -> dict[str, float]:
    """Per kernel class, from the profiles: seconds per FLOP of its calls, fitted with a
    per-call constant (the profiler's own overhead lands there, not in the rate)."""
    out: dict[str, float] = {}
    for cls in KERNEL_CLASSES:
        ops = [
            op
            for p in points
            if p.profile
            for op in p.profile.get("ops", [])
            if op.get("class") == cls and op.get("flops", 0) > 0
        ]
        if len(ops) < 2:
            raise ConfigError(
                f"form 'kernels' needs operator profiles with {cls} kernels (measure the "
                f"calibration runs with --energy-profile-ops)"
            )
        x = np.array([[op["flops"], op["calls"]] for op in ops], dtype=float)
        y = np.array([op["self_cpu_s"] for op in ops], dtype=float)
        scale = x.max(axis=0)
        out[f"{cls}_flops"] = float((nnls(x / scale, y) / scale)[0])
    return out


def _case_shape(
    case: CaseResult, cache: dict[tuple[str, int], ModelShape], elem_bytes: int
) -> ModelShape:
    """From the config kept in the case's profile, else from the model it names."""
    profile = case.op_profile
    if profile and isinstance(profile.get("model_config"), dict):
        name = str(profile.get("model_name") or case.labels.get("model", ""))
        return shape_from_config(profile["model_config"], name, elem_bytes)
    source = case.labels.get("model_source") or case.labels.get("model") or ""
    key = f"{case.labels.get('model', '')}={source}"
    if (key, elem_bytes) not in cache:
        cache[key, elem_bytes] = load_shape(key, elem_bytes)
    return cache[key, elem_bytes]


def _mean(values: Iterable[float]) -> float:
    vals = list(values)
    return math.fsum(vals) / len(vals)


# Labels of imported runs (storage/research.py) that say how the case generated.
KV_CACHE_LABEL, DTYPE_LABEL = "kv_cache", "dtype"
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _tokens(case: CaseResult) -> tuple[int, int]:
    """The tokens the trials really had (an imported trial's prompt may have tokenized to
    more than the case's nominal size), else the case's."""
    n_in = _mean(t.input_tokens for t in case.trials)
    n_out = _mean(t.output_tokens for t in case.trials)
    return max(1, round(n_in)), max(1, round(n_out))


def points_from_cases(
    cases: Iterable[CaseResult], elem_bytes: int = 4, skipped: list[str] | None = None
) -> list[Point]:
    """Every case with undisturbed trials whose model's config can be read."""
    cache: dict[tuple[str, int], ModelShape] = {}
    out: list[Point] = []
    for case in cases:
        if not case.trials:
            continue
        try:
            dtype = case.labels.get(DTYPE_LABEL)
            shape = _case_shape(case, cache, _DTYPE_BYTES.get(dtype or "", elem_bytes))
            batch = int(case.labels.get(BATCH_LABEL, "1"))
        except (ConfigError, ValueError) as exc:
            if skipped is not None:
                skipped.append(f"{case.name}: {exc}")
            continue
        n_in, n_out = _tokens(case)
        kv_cache = case.labels.get(KV_CACHE_LABEL, "on") != "off"
        profile = None
        if case.op_profile is not None:
            profile = check_profile(case.op_profile, case.name)
        out.append(
            Point(
                model=shape.name,
                input_tokens=n_in,
                output_tokens=n_out,
                batch_size=batch,
                time_s=_mean(t.seconds for t in case.trials),
                energy_j=_mean(t.joules for t in case.trials),
                work=case_work(shape, n_in, n_out, batch, kv_cache),
                profile=profile,
                phases={
                    phase: (
                        _mean(t.phases[phase].seconds for t in case.trials),
                        _mean(t.phases[phase].joules for t in case.trials),
                    )
                    for phase in (PREFILL, DECODE)
                }
                if case.has_phases
                else {},
            )
        )
    return out


def rows_for(points: Sequence[Point]) -> list[Row]:
    rows: list[Row] = []
    for i, p in enumerate(points):
        if p.phases and p.output_tokens > 1:
            for phase, (t, e) in p.phases.items():
                if t > 0 and e > 0:
                    rows.append(Row.of(i, phase, t, e, p.work[phase]))
        else:
            total = Work()
            total.add(p.work[PREFILL])
            total.add(p.work[DECODE])
            rows.append(Row.of(i, "total", p.time_s, p.energy_j, total))
    return rows


@dataclass(frozen=True)
class BothFit:
    """Time and energy coefficients (per COLUMNS), the average power, and the roofline
    form's balance point of each (0: not that form)."""

    time: np.ndarray
    energy: np.ndarray
    power_w: float
    time_k: float = 0.0
    energy_k: float = 0.0


def fit_roofline(rows: Sequence[Row], target: str) -> tuple[np.ndarray, float]:
    """The roofline form's coefficients at the balance point that fits best."""
    y = np.array([getattr(r, target) for r in rows], dtype=float)
    best: tuple[float, np.ndarray, float] | None = None
    for k in ROOFLINE_KS:
        raw = np.array([r.vector(k) for r in rows], dtype=float)
        coef = fit(rows, target, "roofline", None, k, raw)
        pred = raw @ coef
        err = float(np.mean(np.abs(pred / y - 1.0)))
        if best is None or err < best[0]:
            best = (err, coef, k)
    assert best is not None
    return best[1], best[2]


def fit_both(rows: Sequence[Row], form: str, fixed: Mapping[str, float]) -> BothFit:
    """Time coefficients, energy coefficients and the average power between them.

    The roofline form fits energy as it fits time, with its own balance point (a GPU's
    power follows what bounds it).  The others:

    Energy is power x the predicted time plus non-negative energy per unit of work
    (``P * T + sum e_c * work_c``): the power is fitted first (one number, hard to get
    wrong), so a meter whose power hardly changes (the estimate, a CPU package) gets
    the time model's accuracy, and classes that draw more power than the average add
    theirs.  Returned folded into one coefficient per column.
    """
    if form == "roofline":
        time_coef, time_k = fit_roofline(rows, "time_s")
        energy_coef, energy_k = fit_roofline(rows, "energy_j")
        ratio = np.array([r.energy_j / r.time_s for r in rows])
        return BothFit(time_coef, energy_coef, float(ratio.mean()), time_k, energy_k)
    time_coef = fit(rows, "time_s", form, fixed)
    t = np.array([np.dot(time_coef, r.x) for r in rows])
    e = np.array([r.energy_j for r in rows])
    ratio = t / e
    power_w = float(ratio.sum() / (ratio * ratio).sum()) if (ratio > 0).any() else 0.0
    base = dict(zip(COLUMNS, power_w * time_coef, strict=True))
    energy_coef = fit(rows, "energy_j", form, base)
    return BothFit(time_coef, energy_coef, power_w)


def predict_work(coef: Sequence[float], work: Mapping[str, Work], k: float = 0.0) -> float:
    return float(sum(np.dot(coef, w.vector(k)) for w in work.values()))


def _errors(pred: Sequence[float], true: Sequence[float]) -> dict[str, float]:
    rel = [(p - t) / t for p, t in zip(pred, true, strict=True)]
    return {
        "mean_abs_rel": _mean(abs(r) for r in rel),
        "rms_rel": math.sqrt(_mean(r * r for r in rel)),
        "max_abs_rel": max(abs(r) for r in rel),
    }


def _enough_rows(points: Sequence[Point]) -> list[Row]:
    """The fit's rows, when there are enough of them for any form."""
    rows = rows_for(points)
    if len(points) < 3 or len(rows) < len(COLUMNS) // 2:
        raise ConfigError(
            f"calibration needs at least 3 measured cases with phases, got {len(points)}; "
            f"measure more token sizes (e.g. --llm-input-tokens=8..2048)"
        )
    return rows


def calibrate_points(points: Sequence[Point], form: str = "shared") -> dict[str, Any]:
    """The coefficients, their in-sample and leave-one-case-out errors, per case and class."""
    rows = _enough_rows(points)
    result: dict[str, Any] = {"columns": list(COLUMNS), "form": form}
    fixed: dict[str, float] = {}
    if form == "kernels":
        fixed = kernel_seconds_per_flop(points)
        result["kernel_s_per_flop"] = fixed
    fits = {"time_s": fit_both(rows, form, fixed)}
    loo_fits = [fit_both([r for r in rows if r.case != i], form, fixed) for i in range(len(points))]
    for target in ("time_s", "energy_j"):
        name = "time" if target == "time_s" else "energy"
        coef, k = getattr(fits["time_s"], name), getattr(fits["time_s"], f"{name}_k")
        pred = [predict_work(coef, p.work, k) for p in points]
        true = [getattr(p, target) for p in points]
        loo = [
            predict_work(getattr(f, name), p.work, getattr(f, f"{name}_k"))
            for f, p in zip(loo_fits, points, strict=True)
        ]
        result[target] = {
            "coefficients": dict(zip(COLUMNS, (float(c) for c in coef), strict=True)),
            "roofline_k": k,
            "in_sample": _errors(pred, true),
            "leave_one_out": _errors(loo, true),
            "predicted": pred,
        }
    result["energy_j"]["power_w"] = fits["time_s"].power_w
    result["cases"] = [
        {
            "model": p.model,
            "input_tokens": p.input_tokens,
            "output_tokens": p.output_tokens,
            "batch_size": p.batch_size,
            "time_s": p.time_s,
            "predicted_time_s": result["time_s"]["predicted"][i],
            "energy_j": p.energy_j,
            "predicted_energy_j": result["energy_j"]["predicted"][i],
        }
        for i, p in enumerate(points)
    ]
    for target in ("time_s", "energy_j"):
        del result[target]["predicted"]
    result["classes"] = class_errors(points, result["time_s"]["coefficients"])
    return result


AUTO = "auto"  # choose the form by held-out error on the runs given
# What ``auto`` falls back to when too few cases can be held out to compare forms.
DEFAULT_FORM = "shared"
LEAVE_ONE_MODEL_OUT, LEAVE_ONE_CASE_OUT = "leave one model out", "leave one case out"
# Held-out errors closer than this (a fraction: half a percentage point) are a tie:
# differences that small are noise on a few dozen cases, and the simpler form then wins.
FORM_TIE = 0.005
MIN_TRAIN_CASES = 3  # a held-out fit needs as many cases as the calibration itself


def form_parameters(form: str) -> int:
    """How many numbers a form fits per target (its balance point or kernel rates
    included): the tie-break between forms that predict as well."""
    extra = {"roofline": 1, "kernels": len(KERNEL_CLASSES)}.get(form, 0)
    return len(FORMS[form]) + extra


def held_out_groups(points: Sequence[Point]) -> tuple[str, list[list[int]]] | None:
    """What a user needs a form to do: predict a model it never saw when the runs hold
    several (each left out in turn), else a case it never saw; None when no held-out
    fit would keep enough cases."""
    models = sorted({p.model for p in points})
    by_model = [[i for i, p in enumerate(points) if p.model == m] for m in models]
    if len(models) > 1 and all(len(points) - len(g) >= MIN_TRAIN_CASES for g in by_model):
        return LEAVE_ONE_MODEL_OUT, by_model
    if len(points) > MIN_TRAIN_CASES:
        return LEAVE_ONE_CASE_OUT, [[i] for i in range(len(points))]
    return None


def _held_out_errors(
    points: Sequence[Point], groups: Sequence[Sequence[int]], form: str
) -> dict[str, float]:
    """Mean |relative error| of time and energy over every held-out case, each predicted
    by a fit (kernel rates included) that never saw its group."""
    time_err: list[float] = []
    energy_err: list[float] = []
    for group in groups:
        train = [p for i, p in enumerate(points) if i not in group]
        fixed = kernel_seconds_per_flop(train) if form == "kernels" else {}
        f = fit_both(rows_for(train), form, fixed)
        for i in group:
            p = points[i]
            time_err.append(abs(predict_work(f.time, p.work, f.time_k) / p.time_s - 1))
            energy_err.append(abs(predict_work(f.energy, p.work, f.energy_k) / p.energy_j - 1))
    return {
        "time_mean_abs_rel": _mean(time_err),
        "energy_mean_abs_rel": _mean(energy_err),
        "cases": len(energy_err),
    }


def pick_form(scores: Mapping[str, Mapping[str, float]]) -> str:
    """The lowest held-out energy error; within FORM_TIE of it, the lowest time error;
    within FORM_TIE of that, the fewest coefficients."""
    energy = {f: s["energy_mean_abs_rel"] for f, s in scores.items()}
    near = [f for f in scores if energy[f] <= min(energy.values()) + FORM_TIE]
    time = {f: scores[f]["time_mean_abs_rel"] for f in near}
    nearer = [f for f in near if time[f] <= min(time.values()) + FORM_TIE]
    return min(nearer, key=lambda f: (form_parameters(f), list(FORMS).index(f)))


def _pct1(value: float) -> str:
    return f"{100 * value:.1f} %"


def form_reason(choice: Mapping[str, Any], chosen: str) -> str:
    """One line: which form, its held-out errors, the others', and why this one."""
    scores = choice["held_out"]
    fitted = {f: s for f, s in scores.items() if "skipped" not in s}
    mine = fitted[chosen]
    best = min(fitted, key=lambda f: fitted[f]["energy_mean_abs_rel"])
    if best == chosen:
        why = "the lowest energy error"
    else:
        faster = mine["time_mean_abs_rel"] < fitted[best]["time_mean_abs_rel"] - FORM_TIE
        why = f"energy error within {100 * FORM_TIE:.1f} points of {best}'s, and " + (
            "a lower time error" if faster else "fewer coefficients"
        )
    others = ", ".join(
        f"{f} {_pct1(s['energy_mean_abs_rel'])}" for f, s in fitted.items() if f != chosen
    )
    unfitted = "".join(
        f"; {f} not fitted: {s['skipped'].removeprefix(f'form {f!r} ')}"
        for f, s in scores.items()
        if "skipped" in s
    )
    return (
        f"form {chosen}: held-out energy error {_pct1(mine['energy_mean_abs_rel'])}"
        + (f" ({others})" if others else "")
        + f", time {_pct1(mine['time_mean_abs_rel'])}, {choice['scheme']} over "
        f"{mine['cases']} cases: {why}{unfitted}"
    )


def calibrate_auto(points: Sequence[Point]) -> dict[str, Any]:
    """The calibration in the form that predicted held-out cases best, with every form's
    held-out errors and the reason in ``form_choice``."""
    _enough_rows(points)
    held = held_out_groups(points)
    if held is None:
        result = calibrate_points(points, DEFAULT_FORM)
        result["form_choice"] = {
            "requested": AUTO,
            "scheme": None,
            "held_out": {},
            "reason": f"form {DEFAULT_FORM} (the default): {len(points)} cases are too few "
            f"to hold any out and compare forms (each held-out fit needs {MIN_TRAIN_CASES} "
            "others); "
            "measure more sizes or models to let calibrate choose",
        }
        return result
    scheme, groups = held
    scores: dict[str, dict[str, Any]] = {}
    for form in FORMS:
        try:
            scores[form] = _held_out_errors(points, groups, form)
        except ConfigError as exc:  # a form these runs cannot fit (kernels, unprofiled)
            scores[form] = {"skipped": str(exc)}
        else:
            if not all(math.isfinite(v) for v in scores[form].values()):
                scores[form] = {"skipped": "its held-out predictions are not finite"}
    fitted = {f: s for f, s in scores.items() if "skipped" not in s}
    if not fitted:
        reasons = "; ".join(f"{f}: {s['skipped']}" for f, s in scores.items())
        raise ConfigError(f"no form could be fitted to these cases ({reasons})")
    chosen = pick_form(fitted)
    result = calibrate_points(points, chosen)
    choice = {"requested": AUTO, "scheme": scheme, "held_out": scores}
    result["form_choice"] = {**choice, "reason": form_reason(choice, chosen)}
    return result


def class_time(coef: Mapping[str, float], work: Work, cls: str) -> float:
    if cls == OTHER:
        return 0.0
    return coef[f"{cls}_flops"] * work.flops[cls] + coef[f"{cls}_bytes"] * work.bytes[cls]


def class_errors(points: Sequence[Point], coef: Mapping[str, float]) -> list[dict[str, Any]]:
    """Per class, over the profiled cases: the model's seconds against the profile's.

    The profile's self CPU times are inflated by the profiler itself, so each case's
    profile is scaled to the case's measured mean time (its shares are kept); the model's
    launch term is split over the classes by the profile's operator calls.
    """
    profiled = [p for p in points if p.profile]
    if not profiled:
        return []
    measured = dict.fromkeys((*WORK_CLASSES, OTHER), 0.0)
    model = dict.fromkeys((*WORK_CLASSES, OTHER), 0.0)
    for p in profiled:
        classes = p.profile["classes"]  # type: ignore[index]
        total_self = sum(c["self_cpu_s"] for c in classes.values()) or 1.0
        calls = sum(c["calls"] for c in classes.values()) or 1
        ops = sum(w.ops for w in p.work.values())
        for cls in measured:
            row = classes.get(cls, {"self_cpu_s": 0.0, "calls": 0})
            measured[cls] += row["self_cpu_s"] / total_self * p.time_s
            launch = coef["launches"] * ops * row["calls"] / calls
            model[cls] += launch + sum(class_time(coef, w, cls) for w in p.work.values())
        model[OTHER] += coef["generations"] * sum(w.generations for w in p.work.values())
    return [
        {
            "class": cls,
            "profiled_s": measured[cls],
            "predicted_s": model[cls],
            "error_rel": (model[cls] - measured[cls]) / measured[cls] if measured[cls] else None,
        }
        for cls in measured
    ]


def calibrate_form(points: Sequence[Point], form: str = AUTO) -> dict[str, Any]:
    """``form``'s calibration, or with AUTO the one chosen by held-out error."""
    if form == AUTO:
        return calibrate_auto(points)
    result = calibrate_points(points, form)
    reason = f"form {form}, as asked (not compared with the others)"
    result["form_choice"] = {"requested": form, "scheme": None, "held_out": {}, "reason": reason}
    return result


def short_model(model: str) -> str:
    """A model's name without its publisher (``tiiuae/falcon-7b``: ``falcon-7b``)."""
    return model.rstrip("/").rsplit("/", 1)[-1]


def named_model(model: str, names: Sequence[str]) -> bool:
    return model in names or short_model(model) in names


def _check_fit_on(runs: Sequence[Any], names: Sequence[str]) -> None:
    """Every name in ``names`` is a model measured in ``runs``, else one line saying which
    are."""
    found = {c.labels.get("model", "") for run in runs for c in run.cases}
    missing = [n for n in names if not any(named_model(m, [n]) for m in found)]
    if missing:
        measured = ", ".join(sorted(short_model(m) for m in found if m)) or "none labelled"
        raise ConfigError(
            f"--fit-on {','.join(missing)}: not measured in these runs; their models: {measured}"
        )


def calibrate_runs(
    runs: Sequence[Any], sources: Sequence[str], form: str = AUTO, fit_on: Sequence[str] = ()
) -> dict[str, Any]:
    """One calibration per (hardware, setting) found in ``runs`` (storage ``Run`` objects);
    ``fit_on``: only the cases of these models (full or short names)."""
    _check_fit_on(runs, fit_on)
    groups: dict[tuple[str, str | None], list[CaseResult]] = {}
    meters: dict[tuple[str, str | None], str] = {}
    speeds: dict[tuple[str, str | None], list[float]] = {}
    skipped: list[str] = []
    for run in runs:
        for case in run.cases:
            if fit_on and not named_model(case.labels.get("model", ""), fit_on):
                continue
            setting = next((case.labels[k] for k in SETTING_LABELS if k in case.labels), None)
            key = (run.hardware, setting)
            groups.setdefault(key, []).append(case)
            meters[key] = run.backend
            speed = run.machine.get(SPEED_KEY)
            if isinstance(speed, int | float) and not isinstance(speed, bool) and speed > 0:
                speeds.setdefault(key, []).append(float(speed))
    calibrations = []
    for (system, setting), cases in sorted(groups.items(), key=lambda kv: str(kv[0])):
        points = points_from_cases(cases, skipped=skipped)
        fitted = calibrate_form(points, form)
        calibrations.append(
            {
                "system": system,
                "setting": setting,
                "meter": meters[(system, setting)],
                "estimated": any(c.estimated for c in cases),
                "models": sorted({p.model for p in points}),
                # how its cases generated: predictions of this system assume the same
                "kv_cache": any(c.labels.get(KV_CACHE_LABEL, "on") != "off" for c in cases),
                "elem_bytes": min(
                    _DTYPE_BYTES.get(c.labels.get(DTYPE_LABEL, ""), 4) for c in cases
                ),
                # the machine's speed when measured (probes/reference.py), to compare with
                # a later run's: a prediction is for the machine as fast as it was then
                SPEED_KEY: _mean(speeds[(system, setting)])
                if speeds.get((system, setting))
                else None,
                **fitted,
            }
        )
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "runs": list(sources),
        "skipped": skipped,
        "calibrations": calibrations,
    }


def load_calibration(path: str) -> dict[str, Any]:
    """A calibration file, checked: one error naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such calibration file; make one with llmenergy calibrate"
        ) from None
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: 100,000 '['
        raise ConfigError(f"{path}: not a calibration file ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{path}: not a calibration file; make one with llmenergy calibrate")
    if data.get("version") != VERSION:
        raise ConfigError(f"{path}: calibration version {data.get('version')} is not {VERSION}")
    cals = data.get("calibrations")
    if not isinstance(cals, list) or not cals:
        raise ConfigError(f"{path}: holds no calibration")
    for cal in cals:
        coef = cal.get("time_s", {}).get("coefficients") if isinstance(cal, dict) else None
        if isinstance(coef, dict):  # older calibrations: other columns
            for target in ("time_s", "energy_j"):
                coefs = cal[target]["coefficients"]
                for column in NEWER_COLUMNS:
                    coefs.setdefault(column, 0.0)
                for column in DROPPED_COLUMNS:
                    if coefs.pop(column, 0.0):
                        raise ConfigError(
                            f"{path}: a calibration charges {column}, which is no longer "
                            "modelled; calibrate again from its runs"
                        )
        if not isinstance(coef, dict) or set(coef) != set(COLUMNS):
            raise ConfigError(f"{path}: a calibration lacks the coefficients {', '.join(COLUMNS)}")
    return data


__all__ = ["MATMUL", "calibrate_runs", "load_calibration", "nnls"]
