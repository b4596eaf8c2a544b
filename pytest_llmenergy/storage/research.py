"""The research's published measurements as saved runs: ``llmenergy import CSV...``.

Wilkins et al. (2024) published one CSV per sweep (``examples/wilkins2024/``), one row per
trial: runtime, CPU and GPU joules, tokens, model and system.  Each system becomes one
run in its own hardware folder (named after the system), with every trial, the CPU and
GPU joules as two domains and where they came from, so every command that reads runs
(show, compare, route, calibrate, predict) reads these too.

How the research generated, which a prediction must know: ``use_cache=False`` (every
output token is a whole forward pass over the prompt and the tokens so far) and
bfloat16 weights (``cuda/cuda-output-tokens-test.py`` in its artifact); the runs' case
labels say so (``kv_cache``, ``dtype``).
"""

from __future__ import annotations

import argparse
import csv
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..commandline import Command, Outcome
from ..controller.rule import ControllerSettings
from ..controller.targets import CITarget
from ..errors import ConfigError
from ..results import ROUNDS, CaseResult, Trial
from .machine import _slug
from .runfile import COMPLETE, MAX_MAGNITUDE, Run, dumps
from .store import STORAGE_HELP, Storage, check_run_name

# The research's model names, and the hub ids their configs are built in under
# (predict/configs.py), so features are computed without downloading anything.
MODELS: Mapping[str, str] = {
    "Llama-2 (7B)": "meta-llama/Llama-2-7b-hf",
    "Mistral (7B)": "mistralai/Mistral-7B-v0.1",
    "Falcon (7B)": "tiiuae/falcon-7b",
}
CPU_DOMAIN, GPU_DOMAIN = "cpu:package", "gpu:0"
# Every column a row needs; the output size's column says which sweep the file is.
_NEEDED = (
    "Phase",
    "Runtime (s)",
    "CPU Energy (J)",
    "GPU Energy (J)",
    "Number of Input Tokens",
    "Iteration",
    "Model",
    "System",
    "Total Number of Tokens",
)
_SWEEP_COLUMNS = {"Output Token Limit": "input", "Number of Output Tokens": "output"}
_RESEARCH_RULE = ControllerSettings(
    min_trials=1,
    max_trials=100,
    warmup=1,
    rule="research",
    targets=(CITarget("time_s", 0.5, False),),
)
SOURCE = (
    "Wilkins et al. 2024, 'Hybrid Heterogeneous Clusters Can Lower the Energy Consumption "
    "of LLM Inference Workloads': github.com/grantwilkins/energy-inference "
    "@5c2cfa4a9bdbccc6a037ece3d2eb64322db115ea, plots/heterogeneous-datacenter/e2dc-artifacts/"
)


@dataclass(frozen=True)
class Row:
    """One trial of the research: the nominal sizes and what the trial really had."""

    system: str
    model: str
    sweep: str
    input_tokens: int  # nominal (the sweep's size)
    output_tokens: int
    actual_input_tokens: int
    actual_output_tokens: int
    seconds: float
    cpu_j: float
    gpu_j: float
    where: str  # "FILE row N", for errors and provenance
    # Why the trial cannot count (the published data has negative CPU joules in some
    # rows: a meter error); kept in the run as a rejected trial, left out of figures.
    rejected: str = ""


# A count beyond this is no token count or iteration (and 1e300 would make a 300-digit int).
_MAX_COUNT = 10**9


def _number(
    row: Mapping[str, str], column: str, where: str, kind: type = float, signed: bool = False
) -> Any:
    """A finite number (``inf``, ``nan`` and ``1e400`` are not), >= 0 unless ``signed``;
    an ``int`` column takes whole numbers only."""
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {column} is {_cell(text)}, not a number") from None
    expected = "a whole number >= 0" if kind is int else "a number >= 0"
    if not math.isfinite(value) or (value < 0 and not signed):
        raise ConfigError(f"{where}: {column} is {_cell(text)}; expected {expected}")
    if kind is int:
        if not value.is_integer() or value > _MAX_COUNT:
            raise ConfigError(
                f"{where}: {column} is {_cell(text)}; expected a whole number from 0 to "
                f"{_MAX_COUNT:,}"
            )
        return int(value)
    if abs(value) > MAX_MAGNITUDE:  # the run file would refuse it: never write it
        raise ConfigError(
            f"{where}: {column} is {_cell(text)}; no measurement is that large "
            f"(at most {MAX_MAGNITUDE:g})"
        )
    return value


def _cell(text: str) -> str:
    """A cell's text in a message: quoted, one line, short."""
    return repr(text[:40]) + ("…" if len(text) > 40 else "")


def read_rows(path: str | Path) -> list[Row]:
    """The trials of one of the research's CSVs (warm-up and start-up rows left out)."""
    path = Path(path)
    try:
        # utf-8-sig: a spreadsheet's "CSV UTF-8" starts with a byte-order mark
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            sweep_column = next((c for c in _SWEEP_COLUMNS if c in header), None)
            missing = [c for c in _NEEDED if c not in header]
            if missing or sweep_column is None:
                lacking = ", ".join(missing or ["Output Token Limit or Number of Output Tokens"])
                raise ConfigError(
                    f"{path}: not one of the research's measurement CSVs (no column {lacking}); "
                    "give all-input-stats.csv or all-output-stats.csv (examples/wilkins2024/)"
                )
            sweep = _SWEEP_COLUMNS[sweep_column]
            rows = []
            for line, raw in enumerate(reader, start=2):
                row = _row(raw, sweep, sweep_column, f"{path} row {line}")
                if row is not None:
                    rows.append(row)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{path}: cannot be read as CSV ({exc})") from None
    if not rows:
        raise ConfigError(f"{path}: holds no trial (rows whose Phase contains 'inference')")
    return rows


def _row(raw: Mapping[str, str], sweep: str, size_column: str, where: str) -> Row | None:
    if None in raw or any(v is None for v in raw.values()):
        raise ConfigError(f"{where}: has another number of fields than the header")
    if "inference" not in raw["Phase"]:
        return None  # tokenizer / model load: start-up costs, not trials
    if _number(raw, "Iteration", where, int) == 0:
        return None  # the warm-up trial, which the research left out too
    system, model = raw["System"].strip(), raw["Model"].strip()
    if not system or not model:
        raise ConfigError(f"{where}: System and Model must not be empty")
    n_in = _number(raw, "Number of Input Tokens", where, int)
    n_out = _number(raw, size_column, where, int)
    total = _number(raw, "Total Number of Tokens", where, int)
    if min(n_in, n_out) < 1:
        raise ConfigError(f"{where}: token counts must be at least 1, got {n_in} in, {n_out} out")
    # The input sweep asked for N prompt tokens and 32 out; the prompt tokenized to more
    # or fewer (the total says how many).  The output sweep's prompt is counted exactly
    # and its output may end early (at the end-of-text token).
    if sweep == "input":
        actual_in, actual_out = max(1, total - n_out), n_out
    else:
        actual_in, actual_out = n_in, max(1, total - n_in)
    seconds = _number(raw, "Runtime (s)", where)
    if seconds <= 0:
        raise ConfigError(f"{where}: Runtime (s) is {seconds!r}; expected a duration > 0")
    cpu_j = _number(raw, "CPU Energy (J)", where, signed=True)
    gpu_j = _number(raw, "GPU Energy (J)", where, signed=True)
    negative = [f"{name} {j:g} J" for name, j in (("CPU", cpu_j), ("GPU", gpu_j)) if j < 0]
    return Row(
        system=system,
        model=model,
        sweep=sweep,
        input_tokens=n_in,
        output_tokens=n_out,
        actual_input_tokens=actual_in,
        actual_output_tokens=actual_out,
        seconds=seconds,
        cpu_j=cpu_j,
        gpu_j=gpu_j,
        where=where,
        rejected=f"{where}: negative energy in the published data ({', '.join(negative)})"
        if negative
        else "",
    )


def _case(rows: Sequence[Row], model: str) -> CaseResult:
    first = rows[0]
    short = model.rstrip("/").rsplit("/", 1)[-1]
    case_id = f"{short}-in{first.input_tokens}-out{first.output_tokens}"
    test = f"test_{first.sweep}_tokens"
    trials = [
        Trial(
            index=i,
            seconds=r.seconds,
            joules=r.cpu_j + r.gpu_j,
            net_joules=r.cpu_j + r.gpu_j,
            joules_by_domain={CPU_DOMAIN: r.cpu_j, GPU_DOMAIN: r.gpu_j},
            net_joules_by_domain={CPU_DOMAIN: r.cpu_j, GPU_DOMAIN: r.gpu_j},
            input_tokens=r.actual_input_tokens,
            output_tokens=r.actual_output_tokens,
            rejected=r.rejected,
        )
        for i, r in enumerate(rows, start=1)
    ]
    return CaseResult(
        nodeid=f"benchmarks/{test}.py::{test}[{case_id}]",
        name=f"{test}[{case_id}]",
        labels={
            "sweep": first.sweep,
            "model": model,
            "research_model": first.model,
            "kv_cache": "off",
            "dtype": "bfloat16",
        },
        input_tokens=first.input_tokens,
        output_tokens=first.output_tokens,
        status=ROUNDS,
        options=_RESEARCH_RULE,
        trials=tuple(t for t in trials if not t.rejected),
        disturbed=tuple(t for t in trials if t.rejected),
        methods={CPU_DOMAIN: "counter", GPU_DOMAIN: "counter"},
        counted={CPU_DOMAIN: True, GPU_DOMAIN: True},
        backend="imported",
    )


def _parts(system: str) -> tuple[str, str]:
    """``Palmetto Intel+A100`` -> (``Intel``, ``A100``); ``M1-Pro`` is one chip."""
    head, plus, gpu = system.partition("+")
    if not plus:
        return system, system
    return (head.split()[-1] if head.split() else head), gpu.strip()


def system_runs(rows: Iterable[Row], sources: Sequence[str], created: str) -> list[Run]:
    """One run per system: its cases, each the trials of one model and size."""
    by_system: dict[str, dict[tuple[str, str, int, int], list[Row]]] = {}
    for r in rows:
        key = (r.model, r.sweep, r.input_tokens, r.output_tokens)
        by_system.setdefault(r.system, {}).setdefault(key, []).append(r)
    runs = []
    for system, groups in sorted(by_system.items()):
        cpu, gpu = _parts(system)
        cases = tuple(
            _case(groups[k], MODELS.get(k[0], k[0]))
            for k in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3]))
        )
        meter = {
            "backend": "imported",
            "identity": {"meter": "imported", "system": system},
            "description": (
                "the research's own meters: GPU joules from NVML, CPU joules from RAPL or "
                "AMD uProf; on Apple silicon both from powermetrics"
            ),
            "notes": [],
            "domains": {
                CPU_DOMAIN: {"method": "counter", "counted": True},
                GPU_DOMAIN: {"method": "counter", "counted": True},
            },
            "idle_power_w": {},
        }
        runs.append(
            Run(
                run_id="",
                name="",
                created=created,
                finished=created,
                status=COMPLETE,
                hardware=_slug(system, brand=False) or "imported",
                machine={
                    "system": system,
                    "cpu": {"model": cpu},
                    "gpus": [{"name": gpu}],
                    "imported": {"source": SOURCE, "files": list(sources)},
                },
                commit={},
                options={"rule": "research", "confidence": 0.95},
                meter=meter,
                cases=cases,
                command=("llmenergy", "import", *sources),
            )
        )
    return runs


def import_csvs(paths: Sequence[str], storage: Storage, name: str) -> list[tuple[str, Run]]:
    """Read every CSV (all rows checked before anything is written), then save one run
    per system.  Returns (where it was saved, the run)."""
    from .recorder import utc_now

    rows = [row for path in paths for row in read_rows(path)]
    runs = system_runs(rows, [str(p) for p in paths], utc_now())
    saved = []
    for run in runs:
        target = storage.claim(run.hardware, name)
        number = re.match(r"^(\d+)_", target.path.name)
        stored = replace(run, run_id=number[1] if number else "", name=name)
        target.write(dumps(stored))
        saved.append((str(target.path), stored))
    return saved


def _import_arguments(imp: argparse.ArgumentParser) -> None:
    imp.add_argument(
        "csvs",
        nargs="+",
        metavar="CSV",
        help="all-input-stats.csv, all-output-stats.csv (examples/wilkins2024/)",
    )
    imp.add_argument("--name", default="research", help="the runs' name (default: research)")
    imp.add_argument("--storage", default=argparse.SUPPRESS, metavar="DIR", help=STORAGE_HELP)


def import_command(args: argparse.Namespace, storage: Storage) -> Outcome:
    check_run_name(args.name)
    saved = import_csvs(args.csvs, storage, args.name)
    lines = [
        f"{run.hardware}/{run.run_id}: {run.machine['system']}, {len(run.cases)} cases, "
        f"{sum(len(c.trials) for c in run.cases)} trials, models "
        + ", ".join(sorted({c.labels["model"] for c in run.cases}))
        for _, run in saved
    ]
    return Outcome("\n".join(lines), [f"wrote {path}" for path, _ in saved])


COMMANDS: tuple[Command, ...] = (
    Command(
        "import",
        "the research's measurement CSVs as saved runs, one per system",
        _import_arguments,
        import_command,
    ),
)
