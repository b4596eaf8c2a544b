"""Predict a case's time and energy from a calibration and a model's config alone.

The error estimate is the calibration's leave-one-case-out RMS relative error: how far
cases the fit had not seen were off, on the system it was fitted on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..results import DECODE, PREFILL
from .features import COLUMNS, ModelShape, case_work


@dataclass(frozen=True)
class Prediction:
    """One predicted case; ``predicted`` always, so it is never taken for a measurement."""

    model: str
    system: str
    setting: str | None
    input_tokens: int
    output_tokens: int
    batch_size: int
    ttft_s: float
    decode_s: float
    time_s: float
    time_err_s: float
    energy_j: float
    energy_err_j: float
    predicted: bool = True

    @property
    def j_per_token(self) -> float:
        return self.energy_j / (self.batch_size * (self.input_tokens + self.output_tokens))

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["j_per_token"] = self.j_per_token
        return out


def choose(
    calibration: Mapping[str, Any], system: str | None = None, setting: str | None = None
) -> Mapping[str, Any]:
    """The calibration for ``system`` (and ``setting``); the only one when not named."""
    cals = list(calibration["calibrations"])
    if system is not None:
        cals = [c for c in cals if c["system"] == system]
    if setting is not None:
        cals = [c for c in cals if c.get("setting") == setting]
    if len(cals) == 1:
        return cals[0]
    known = ", ".join(
        f"{c['system']}" + (f" (setting {c['setting']})" if c.get("setting") else "")
        for c in calibration["calibrations"]
    )
    if not cals:
        raise ConfigError(f"no calibration for that system/setting; the file has: {known}")
    raise ConfigError(
        f"the file holds several calibrations ({known}); choose with --system/--setting"
    )


def predict(
    cal: Mapping[str, Any],
    shape: ModelShape,
    input_tokens: Sequence[int],
    output_tokens: Sequence[int],
    batch_size: int = 1,
    kv_cache: bool = True,
) -> list[Prediction]:
    """Every (input, output) combination of the given sizes; ``kv_cache`` False: generated
    without a KV cache, as the research's cases (the calibration's ``kv_cache``)."""
    coef = {t: [cal[t]["coefficients"][c] for c in COLUMNS] for t in ("time_s", "energy_j")}
    k = {t: cal[t].get("roofline_k", 0.0) for t in ("time_s", "energy_j")}
    err = {t: cal[t]["leave_one_out"]["rms_rel"] for t in ("time_s", "energy_j")}
    out = []
    for n_in in input_tokens:
        for n_out in output_tokens:
            work = case_work(shape, n_in, n_out, batch_size, kv_cache)
            phase_s = {
                p: sum(
                    a * x for a, x in zip(coef["time_s"], work[p].vector(k["time_s"]), strict=True)
                )
                for p in (PREFILL, DECODE)
            }
            energy = sum(
                a * x
                for p in (PREFILL, DECODE)
                for a, x in zip(coef["energy_j"], work[p].vector(k["energy_j"]), strict=True)
            )
            time_s = phase_s[PREFILL] + phase_s[DECODE]
            out.append(
                Prediction(
                    model=shape.name,
                    system=cal["system"],
                    setting=cal.get("setting"),
                    input_tokens=n_in,
                    output_tokens=n_out,
                    batch_size=batch_size,
                    ttft_s=phase_s[PREFILL],
                    decode_s=phase_s[DECODE],
                    time_s=time_s,
                    time_err_s=time_s * err["time_s"],
                    energy_j=energy,
                    energy_err_j=energy * err["energy_j"],
                )
            )
    return out


PREDICTED_SUFFIX = " (predicted)"


def to_profile_csv(rows: Sequence[Prediction]) -> str:
    """The CSV ``llmenergy route --profile`` reads, one row per predicted size."""
    lines = ["system,model,input_tokens,output_tokens,seconds,joules"]
    for r in rows:
        lines.append(
            f"{r.system},{r.model}{PREDICTED_SUFFIX},{r.input_tokens},{r.output_tokens},"
            f"{r.time_s!r},{r.energy_j!r}"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Checked:
    """A measured case beside its prediction: the held-out error table's rows."""

    model: str
    setting: str | None
    input_tokens: int
    output_tokens: int
    batch_size: int
    time_s: float
    predicted_time_s: float
    energy_j: float
    predicted_energy_j: float

    @property
    def time_err(self) -> float:
        return (self.predicted_time_s - self.time_s) / self.time_s

    @property
    def energy_err(self) -> float:
        return (self.predicted_energy_j - self.energy_j) / self.energy_j


def check_against(
    cal: Mapping[str, Any], cases: Sequence[Any], skipped: list[str] | None = None
) -> list[Checked]:
    """Predict every measured case of ``cases`` (``CaseResult``) from its model's config
    and set the prediction beside the measurement (mean of the undisturbed trials)."""
    from .calibrate import SETTING_LABELS, points_from_cases

    rows = []
    for case in cases:
        found = points_from_cases([case], skipped=skipped)
        (point,) = found or (None,)
        if point is None:
            continue
        coef = {t: [cal[t]["coefficients"][c] for c in COLUMNS] for t in ("time_s", "energy_j")}
        pred = {
            t: sum(
                a * x
                for w in point.work.values()
                for a, x in zip(coef[t], w.vector(cal[t].get("roofline_k", 0.0)), strict=True)
            )
            for t in coef
        }
        rows.append(
            Checked(
                model=point.model,
                setting=next((case.labels[k] for k in SETTING_LABELS if k in case.labels), None),
                input_tokens=point.input_tokens,
                output_tokens=point.output_tokens,
                batch_size=point.batch_size,
                time_s=point.time_s,
                predicted_time_s=pred["time_s"],
                energy_j=point.energy_j,
                predicted_energy_j=pred["energy_j"],
            )
        )
    return rows


def error_table(rows: Sequence[Checked]) -> list[dict[str, Any]]:
    """Per model (and setting): cases, mean |error| and mean signed error of time and energy."""
    groups: dict[tuple[str, str | None], list[Checked]] = {}
    for r in rows:
        groups.setdefault((r.model, r.setting), []).append(r)
    out = []
    for (model, setting), rs in groups.items():
        n = len(rs)
        out.append(
            {
                "model": model,
                "setting": setting,
                "cases": n,
                "time_mean_abs_err": sum(abs(r.time_err) for r in rs) / n,
                "time_mean_err": sum(r.time_err for r in rs) / n,
                "energy_mean_abs_err": sum(abs(r.energy_err) for r in rs) / n,
                "energy_mean_err": sum(r.energy_err for r in rs) / n,
            }
        )
    return out
