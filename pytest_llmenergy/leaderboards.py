"""A run's figures in the shapes the energy leaderboards publish, so that a reader can put
them beside the numbers they know (issue 48, item 4).

- **AI Energy Score** rates a model by its GPU energy per 1,000 queries at batch 1 on an
  H100, in watt-hours; ``ai_energy_score`` gives that figure per model from the run's
  batch-1 cases, with the CPU's and the DRAM's energy beside it and what differs in the
  method said in the record.
- **ML.ENERGY's benchmark** reports, per configuration (model, GPU, batch size), energy
  per output token, energy per response, throughput, power and throughput per watt;
  ``mlenergy_records`` gives one such record per case, and whether it is valid.

Both are plain JSON with a documented schema (docs/exports.md); ``read_mlenergy`` and
``read_ai_energy_score`` read them back, every malformed input a one-line ``ConfigError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ConfigError
from .figures import FIGURES, resolved, value, value_or_none
from .results import CaseResult

J_PER_WH = 3600.0
AI_ENERGY_SCORE_FORMAT = "llmenergy-ai-energy-score"
MLENERGY_FORMAT = "llmenergy-mlenergy-records"
VERSION = 1
AI_ENERGY_SCORE_METHOD = (
    "AI Energy Score: 1,000 prompts of the task's dataset at batch 1 on one H100, the GPU's "
    "energy (CodeCarbon), trained weights, stars within a size class relative to the "
    "leaderboard's other models; here: the run's batch-1 cases (the grid's fixed token "
    "lengths, each case's mean query), the run's own meter, no stars (they rank a model "
    "against others)"
)
MLENERGY_METHOD = (
    "ML.ENERGY: vLLM serving a dataset's requests under continuous batching, the energy of "
    "the steady state (batch full) per output token; here: a server's steady window where "
    "the case had one (steady_j_per_token), else the decode passes' joules per output token "
    "of a static batch (decode_j_per_out_token)"
)


def _mean(values: Sequence[float | None]) -> float | None:
    found = [v for v in values if v is not None and math.isfinite(v)]
    return math.fsum(found) / len(found) if found else None


def _wh_per_1k(joules: float | None) -> float | None:
    return None if joules is None else joules * 1000.0 / J_PER_WH


def _model(case: CaseResult) -> str:
    return case.labels.get("model") or case.name


def ai_energy_score(results: Sequence[CaseResult]) -> dict[str, Any]:
    """Per model, the batch-1 cases' mean GPU, CPU and DRAM energy per query as Wh per
    1,000 queries; a model with no batch-1 case, or no GPU measured, says so."""
    models: dict[str, list[CaseResult]] = {}
    for case in results:
        if case.measured:
            models.setdefault(_model(case), []).append(case)
    rows = []
    for model, cases in models.items():
        single = [c for c in cases if c.queries == 1]
        gpu = _mean([value(c, "gpu_j") for c in single])  # type: ignore[misc]
        rows.append(
            {
                "model": model,
                "batch_size": 1,
                "cases": len(single),
                "gpu_wh_per_1k_queries": _wh_per_1k(gpu),
                "cpu_wh_per_1k_queries": _wh_per_1k(_mean([value(c, "cpu_j") for c in single])),  # type: ignore[misc]
                "dram_wh_per_1k_queries": _wh_per_1k(
                    _mean([value(c, "dram_j") for c in single])  # type: ignore[misc]
                ),
                "total_wh_per_1k_queries": _wh_per_1k(
                    _mean([value(c, "energy_j") for c in single])  # type: ignore[misc]
                ),
                "input_tokens_mean": _mean([float(c.input_tokens) for c in single]),
                "output_tokens_mean": _mean([float(c.output_tokens) for c in single]),
                "estimated": any(c.estimated for c in single),
                "note": _score_note(single, gpu),
            }
        )
    return {"format": AI_ENERGY_SCORE_FORMAT, "version": VERSION, "method": AI_ENERGY_SCORE_METHOD,
            "models": rows}  # fmt: skip


def _score_note(single: Sequence[CaseResult], gpu: float | None) -> str:
    if not single:
        return "no batch-1 case: AI Energy Score's figure is at batch 1"
    if gpu is None:
        return "no GPU measured (a CPU run): the total is the run's counted energy"
    return ""


def mlenergy_records(results: Sequence[CaseResult]) -> dict[str, Any]:
    """One record per measured case: its configuration, ML.ENERGY's figures, validity."""
    records = []
    for case in results:
        if not case.measured:
            continue
        # a case without tokens (a plain function) has none: a blank, not an error
        steady = value_or_none(case, "steady_j_per_token")
        decode = value_or_none(case, "decode_j_per_out_token")
        per_token = steady if steady is not None else decode
        energy = value(case, "energy_j")
        seconds = value(case, "time_s")
        out_per_s = (
            case.output_tokens * case.queries / seconds
            if isinstance(seconds, float) and seconds > 0
            else None
        )
        power = value(case, "power_w")
        reasons = _invalid(case)
        records.append(
            {
                "model": _model(case),
                "case": case.nodeid,
                "batch_size": case.queries,
                "input_tokens": case.input_tokens,
                "output_tokens": case.output_tokens,
                "energy_per_output_token_j": per_token,
                "energy_per_token_source": "steady window" if steady is not None else "decode",
                "energy_per_response_j": energy,
                "output_throughput_tokens_per_s": out_per_s,
                "avg_power_w": power,
                "output_tokens_per_j": (
                    out_per_s / power
                    if out_per_s is not None and isinstance(power, float) and power > 0
                    else None
                ),
                "ttft_s": value(case, "ttft_s"),
                "trials": len(case.trials),
                "meter": case.backend,
                "estimated": case.estimated,
                "valid": not reasons,
                "reasons": reasons,
            }
        )
    return {
        "format": MLENERGY_FORMAT,
        "version": VERSION,
        "method": MLENERGY_METHOD,
        "records": records,
    }


def _invalid(case: CaseResult) -> list[str]:
    """Why a case's record is not one to put beside a leaderboard's (empty: valid)."""
    reasons = []
    if not resolved(FIGURES["energy_j"], case):
        reasons.append("measured over stretches shorter than the meter resolves")
    if case.busy:
        reasons.append("the machine was busy with other work during some trials")
    if not case.converged:
        reasons.append("its confidence intervals did not reach their targets")
    return reasons


# -- reading them back ------------------------------------------------------------------------
_NUMBER_OR_NONE = (int, float, type(None))
_MLENERGY_FIELDS: Mapping[str, tuple[type, ...]] = {
    "model": (str,),
    "case": (str,),
    "batch_size": (int,),
    "input_tokens": (int,),
    "output_tokens": (int,),
    "energy_per_output_token_j": _NUMBER_OR_NONE,
    "energy_per_token_source": (str,),
    "energy_per_response_j": _NUMBER_OR_NONE,
    "output_throughput_tokens_per_s": _NUMBER_OR_NONE,
    "avg_power_w": _NUMBER_OR_NONE,
    "output_tokens_per_j": _NUMBER_OR_NONE,
    "ttft_s": _NUMBER_OR_NONE,
    "trials": (int,),
    "meter": (str,),
    "estimated": (bool,),
    "valid": (bool,),
    "reasons": (list,),
}
_SCORE_FIELDS: Mapping[str, tuple[type, ...]] = {
    "model": (str,),
    "batch_size": (int,),
    "cases": (int,),
    "gpu_wh_per_1k_queries": _NUMBER_OR_NONE,
    "cpu_wh_per_1k_queries": _NUMBER_OR_NONE,
    "dram_wh_per_1k_queries": _NUMBER_OR_NONE,
    "total_wh_per_1k_queries": _NUMBER_OR_NONE,
    "input_tokens_mean": _NUMBER_OR_NONE,
    "output_tokens_mean": _NUMBER_OR_NONE,
    "estimated": (bool,),
    "note": (str,),
}


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
               type(None): "null"}  # fmt: skip


def json_schema(fmt: str) -> dict[str, Any]:
    """The export's JSON schema (draft 2020-12), made from the fields the readers check."""
    key, fields = {MLENERGY_FORMAT: ("records", _MLENERGY_FIELDS),
                   AI_ENERGY_SCORE_FORMAT: ("models", _SCORE_FIELDS)}[fmt]  # fmt: skip
    properties = {
        name: {
            "type": sorted(
                {_JSON_TYPES[t] for t in types} - ({"integer"} if float in types else set())
            )
        }
        for name, types in fields.items()
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["format", "version", "method", key],
        "properties": {
            "format": {"const": fmt},
            "version": {"const": VERSION},
            "method": {"type": "string"},
            key: {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": list(fields),
                    "properties": properties,
                },
            },
        },
    }


def read_mlenergy(text: str, where: str = "the file") -> list[dict[str, Any]]:
    """The records of an ``mlenergy`` export, checked field by field."""
    return _read(text, where, MLENERGY_FORMAT, "records", _MLENERGY_FIELDS)


def read_ai_energy_score(text: str, where: str = "the file") -> list[dict[str, Any]]:
    """The per-model rows of an ``ai-energy-score`` export, checked field by field."""
    return _read(text, where, AI_ENERGY_SCORE_FORMAT, "models", _SCORE_FIELDS)


def _read(
    text: str, where: str, fmt: str, key: str, fields: Mapping[str, tuple[type, ...]]
) -> list[dict[str, Any]]:
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{where}: not JSON ({_first(exc)})") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise ConfigError(f"{where}: not a {fmt} export (its 'format' is not {fmt!r})")
    if data.get("version") != VERSION:
        raise ConfigError(f"{where}: version {data.get('version')!r}; this reads {VERSION}")
    rows = data.get(key)
    if not isinstance(rows, list):
        raise ConfigError(f"{where}: '{key}' is not a list")
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: {key} entry {n} is not an object")
        for name, types in fields.items():
            got = row.get(name)
            bad_bool = isinstance(got, bool) and bool not in types
            if name not in row or not isinstance(got, types) or bad_bool:
                raise ConfigError(
                    f"{where}: {key} entry {n}: '{name}' missing or of the wrong type"
                )
            if isinstance(got, float) and not math.isfinite(got):
                raise ConfigError(f"{where}: {key} entry {n}: '{name}' is not a finite number")
    return rows


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _first(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:120] or type(exc).__name__
