"""Every command-line option, its ini twin, and how its text is checked.

One table (``OPTIONS``) drives ``--help``, the ini keys and the parsing, so an option
cannot exist without its ini twin.  The command line wins over the ini file.  A bad
value stops the session with one line naming the option and what was expected.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from . import report
from .compare import GATE_EXAMPLES, Gate, parse_gates
from .controller.rule import ControllerOptions
from .controller.targets import parse_ci_targets
from .errors import ConfigError
from .llm.grid import Grid, make_grid, parse_token_list
from .llm.loader import DTYPES
from .meters import MeterOptions
from .routing import BY_CHOICES, INPUT
from .storage.store import DEFAULT_STORAGE, check_run_name

if TYPE_CHECKING:
    from .routing.workload import Workload


@dataclass(frozen=True)
class Option:
    """One command-line option and its ini twin."""

    flag: str
    ini: str
    help: str
    metavar: str
    parse: Callable[[str], Any] = str
    want: str = "a value"  # completes "expected ..." in the error message
    multiple: bool = False  # repeatable on the command line; comma lists in the ini
    const: str | None = None  # the value of the bare flag (``--energy-shuffle``)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


# -- value parsers: raise ValueError (or ConfigError) on bad text -----------------------
def parse_seconds(text: str) -> float:
    text = text.strip().lower()
    scale = 1.0
    if text.endswith("ms"):
        text, scale = text[:-2], 1e-3
    elif text.endswith("s"):
        text = text[:-1]
    return float(text) * scale


def parse_gpus(text: str) -> tuple[int, ...]:
    gpus = tuple(int(part) for part in text.split(",") if part.strip())
    if not gpus or any(g < 0 for g in gpus):
        raise ValueError(text)
    return gpus


def _positive_seconds(text: str) -> float:
    value = parse_seconds(text)
    if not value > 0:
        raise ValueError(text)
    return value


def _non_negative_seconds(text: str) -> float:
    value = parse_seconds(text)
    if not value >= 0:
        raise ValueError(text)
    return value


def _watts(text: str) -> float:
    value = float(text.strip().lower().removesuffix("w"))
    if not value > 0:
        raise ValueError(text)
    return value


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError(text)
        return value

    return parse


def _confidence(text: str) -> float:
    text = text.strip()
    value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    if not 0 < value < 1:
        raise ValueError(text)
    return value


def _switch(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n for n in re.split(r"[,\s]+", text) if n)
    if not names:
        raise ValueError(text)
    return names


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip() not in choices:
            raise ValueError(text)
        return text.strip()

    return parse


def _weight(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError(text)
    return value


def _workload(text: str) -> Workload:
    """Read now, so a bad row stops the session at start, not after the measurements."""
    from .routing.workload import load_workload

    return load_workload(text.strip())


OPTIONS: tuple[Option, ...] = (
    # -- measuring ---------------------------------------------------------------------
    Option(
        "--energy-backend",
        "llmenergy_backend",
        "energy meter: auto (default), nvml, rapl, pyjoules, powermetrics, estimate, "
        "or one registered through the pytest_llmenergy_meters hook",
        "NAME",
        str.strip,
        "a backend name",
    ),
    Option(
        "--energy-gpus",
        "llmenergy_gpus",
        "GPUs to measure, as indices among the CUDA-visible ones, e.g. 0,1 (default: all)",
        "LIST",
        parse_gpus,
        "comma-separated GPU indices such as 0,1",
    ),
    Option(
        "--energy-sample-interval",
        "llmenergy_sample_interval",
        "seconds between power samples for sampling meters, e.g. 0.1 or 100ms "
        "(default: 0.1 for NVML, 0.2 for powermetrics)",
        "SECONDS",
        _positive_seconds,
        "a positive number of seconds such as 0.1 or 100ms",
    ),
    Option(
        "--energy-idle",
        "llmenergy_idle",
        "measure idle power for SECONDS at session start and report net energy too "
        "(default: 0, off)",
        "SECONDS",
        _non_negative_seconds,
        "a number of seconds >= 0 such as 5",
    ),
    Option(
        "--energy-cpu-tdp",
        "llmenergy_cpu_tdp",
        "CPU TDP in watts for the estimate meter (default: from the CPU model table)",
        "WATTS",
        _watts,
        "a positive number of watts such as 65",
    ),
    # -- repeating ---------------------------------------------------------------------
    Option(
        "--energy-min-trials",
        "llmenergy_min_trials",
        "measured trials of a case at least (default: 3)",
        "N",
        _int_at_least(1),
        "an integer >= 1",
    ),
    Option(
        "--energy-max-trials",
        "llmenergy_max_trials",
        "measured trials of a case at most (default: 25)",
        "N",
        _int_at_least(1),
        "an integer >= 1",
    ),
    Option(
        "--energy-confidence",
        "llmenergy_confidence",
        "confidence level of the intervals (default: 0.95)",
        "LEVEL",
        _confidence,
        "a level in (0, 1) such as 0.95 or 95%",
    ),
    Option(
        "--energy-warmup",
        "llmenergy_warmup",
        "unmeasured warm-up runs before a case's trials (default: 1)",
        "N",
        _int_at_least(0),
        "an integer >= 0",
    ),
    Option(
        "--energy-ci-target",
        "llmenergy_ci_target",
        "repeat a case until its CI half-width meets every TARGET: time:0.5s, time:2%%, "
        "energy:1J, energy:2%% (repeatable or comma-separated; default: time:0.5s)",
        "TARGET",
        parse_ci_targets,
        "targets such as time:0.5s, time:2%, energy:1J or energy:2%",
        multiple=True,
    ),
    Option(
        "--energy-shuffle",
        "llmenergy_shuffle",
        "run energy benchmark cases in random order: on, off, or auto (default: on for "
        "tests that use energy_benchmark)",
        "on|off",
        _choice("on", "off", "auto", "true", "false"),
        "on, off or auto",
        const="on",
    ),
    Option(
        "--energy-seed",
        "llmenergy_seed",
        "seed of the random case order (default: a new one each run, printed in the header)",
        "N",
        _int_at_least(0),
        "an integer >= 0",
    ),
    # -- showing -----------------------------------------------------------------------
    Option(
        "--energy-columns",
        "llmenergy_columns",
        "columns of the energy tables, comma-separated, from: " + ", ".join(report.COLUMNS),
        "LIST",
        report.parse_columns,
        "column names such as tokens_in,tokens_out,joules,j_per_token",
    ),
    Option(
        "--energy-group-by",
        "llmenergy_group_by",
        "one energy table per: sweep, model, test, backend, param:NAME, or none "
        "(comma-separated; default: sweep,model)",
        "KEYS",
        report.parse_group_by,
        "group keys such as sweep,model or none",
    ),
    Option(
        "--energy-sort",
        "llmenergy_sort",
        "row order of the energy tables: tokens (default), name, or a column; -COLUMN "
        "sorts descending",
        "COLUMN",
        report.parse_sort,
        "tokens, name or a column name",
    ),
    # -- keeping -----------------------------------------------------------------------
    Option(
        "--energy-save",
        "llmenergy_save",
        "save this run in the storage folder as NNNN_NAME.json",
        "NAME",
        check_run_name,
        "a name of letters, digits, '.', '_' and '-'",
    ),
    Option(
        "--energy-autosave",
        "llmenergy_autosave",
        "save this run in the storage folder, named after the commit and the time",
        "on|off",
        _switch,
        "on or off",
        const="on",
    ),
    Option(
        "--energy-json",
        "llmenergy_json",
        "also write this run to PATH (which must not exist yet)",
        "PATH",
        str.strip,
        "a file path",
    ),
    Option(
        "--energy-storage",
        "llmenergy_storage",
        f"storage folder of saved runs, one subfolder per hardware (default: {DEFAULT_STORAGE})",
        "DIR",
        str.strip,
        "a folder path",
    ),
    Option(
        "--energy-compare",
        "llmenergy_compare",
        "compare each case with a saved run: its number, name or path (default: the "
        "latest run saved on this hardware)",
        "RUN",
        str.strip,
        "a saved run's number, name or path",
        const="latest",
    ),
    Option(
        "--energy-compare-fail",
        "llmenergy_compare_fail",
        f"fail the session when a case regresses beyond a gate and significantly: "
        f"{GATE_EXAMPLES} (repeatable; implies --energy-compare)".replace("%", "%%"),
        "EXPR",
        parse_gates,
        f"gates such as {GATE_EXAMPLES}",
        multiple=True,
    ),
    # -- deciding ----------------------------------------------------------------------
    Option(
        "--energy-route-workload",
        "llmenergy_route_workload",
        "workload of the routing section (shown when the session compares with a run from "
        "other hardware): alpaca (default), alpaca-paper, or a CSV / JSONL file of "
        "input_tokens,output_tokens",
        "SPEC",
        _workload,
        "alpaca, alpaca-paper, or a CSV / JSONL file of input_tokens,output_tokens",
    ),
    Option(
        "--energy-route-by",
        "llmenergy_route_by",
        "route on input tokens (default), output tokens, or both",
        "input|output|both",
        _choice(*BY_CHOICES),
        "input, output or both",
    ),
    Option(
        "--energy-route-lambda",
        "llmenergy_route_lambda",
        "weight of energy against time when routing: 1 energy only (default), 0 time only",
        "L",
        _weight,
        "a weight between 0 and 1",
    ),
    Option(
        "--energy-plots",
        "llmenergy_plots",
        "write figures (PNG) to DIR at the end: energy per token and runtime per model; "
        "with a run from other hardware, workload totals against the threshold and the "
        "Pareto front (needs matplotlib)",
        "DIR",
        str.strip,
        "a folder",
    ),
    # -- running models ----------------------------------------------------------------
    Option(
        "--llm-model",
        "llmenergy_models",
        "model to benchmark: a built-in tiny model (tiny-llama, tiny-mistral, tiny-falcon), "
        "a Hugging Face id or a local path (repeatable; default: the three tiny models)",
        "MODEL",
        _names,
        "model names",
        multiple=True,
    ),
    Option(
        "--llm-input-tokens",
        "llmenergy_input_tokens",
        "input sizes of the input sweep, e.g. 8,64,512 or 8..2048 (powers of two)",
        "LIST",
        parse_token_list,
        "token counts >= 1 such as 8,64,512 or 8..2048",
    ),
    Option(
        "--llm-output-tokens",
        "llmenergy_output_tokens",
        "output sizes of the output sweep, e.g. 8,64,512 or 8..4096 (powers of two)",
        "LIST",
        parse_token_list,
        "token counts >= 1 such as 8,64,512 or 8..4096",
    ),
    Option(
        "--llm-grid",
        "llmenergy_grid",
        "case grid: default (the research's token sizes on the tiny models), paper (its "
        "7B models too), quick (a smoke test)",
        "NAME",
        _choice("default", "paper", "quick"),
        "default, paper or quick",
    ),
    Option(
        "--llm-dtype",
        "llmenergy_dtype",
        "model weights' dtype: auto, float32, float16, bfloat16 (default: auto)",
        "DTYPE",
        _choice(*DTYPES),
        "auto, float32, float16 or bfloat16",
    ),
    Option(
        "--llm-device",
        "llmenergy_device",
        "where the model runs: auto (device_map=auto with a GPU, else cpu), cpu, cuda, "
        "cuda:N, mps (default: auto)",
        "DEVICE",
        str.strip,
        "a device",
    ),
    Option(
        "--llm-trust-remote-code",
        "llmenergy_trust_remote_code",
        "allow models whose repository ships Python code to run it (default: off)",
        "on|off",
        _switch,
        "on or off",
        const="on",
    ),
)

BY_FLAG = {o.flag: o for o in OPTIONS}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmenergy", "LLM energy measurement (pytest-llmenergy)")
    for option in OPTIONS:
        kwargs: dict[str, Any] = {
            "dest": option.dest,
            "default": None,
            "metavar": option.metavar,
            "help": f"{option.help}. ini: {option.ini}",
        }
        if option.multiple:
            kwargs["action"] = "append"
        if option.const is not None:
            kwargs.update(nargs="?", const=option.const)
        group.addoption(option.flag, **kwargs)
        parser.addini(
            option.ini, help=f"{option.help} (= {option.flag})".replace("%%", "%"), default=""
        )


def _raw(config: pytest.Config, option: Option) -> tuple[str, str] | None:
    """The option's text and where it came from: the command line wins over the ini file."""
    value = config.getoption(option.dest, default=None)
    if isinstance(value, list):
        value = ",".join(value)
    if value is not None:
        return str(value), f"{option.flag}={value}"
    ini = config.getini(option.ini)
    if isinstance(ini, list):
        ini = ",".join(ini)
    if ini not in ("", None):
        return str(ini).strip(), f"{option.ini} = {ini} (ini)"
    return None


def option_value(config: pytest.Config, flag: str) -> Any:
    """The parsed value of one option, or None when it was not given anywhere."""
    option = BY_FLAG[flag]
    raw = _raw(config, option)
    if raw is None:
        return None
    text, origin = raw
    try:
        return option.parse(text)
    except ConfigError as exc:
        raise pytest.UsageError(f"{origin}: {exc}") from None
    except ValueError:
        raise pytest.UsageError(f"{origin}: expected {option.want}") from None


@dataclass(frozen=True)
class LLMSettings:
    grid: Grid
    dtype: str = "auto"
    device: str = "auto"
    trust_remote_code: bool = False


@dataclass(frozen=True)
class ReportSettings:
    columns: tuple[str, ...] | None = None  # None: the default columns, empty ones dropped
    group_by: tuple[str, ...] = report.DEFAULT_GROUP_BY
    sort: str = report.DEFAULT_SORT


@dataclass(frozen=True)
class KeepSettings:
    """Where the run is saved, and what it is compared with."""

    save: str | None = None
    autosave: bool = False
    json_path: str | None = None
    storage: str = DEFAULT_STORAGE
    compare: str | None = None  # a run spec, or "latest"
    gates: tuple[Gate, ...] = ()

    @property
    def saving(self) -> bool:
        return bool(self.save or self.autosave)


@dataclass(frozen=True)
class RouteOptions:
    """The routing section and the figures at the end of a session."""

    workload: Workload | None = None  # None: Alpaca, read when first needed
    by: str = INPUT
    lam: float = 1.0
    plots_dir: str | None = None


@dataclass(frozen=True)
class PluginOptions:
    """Everything the options say, parsed and checked once."""

    backend: str = "auto"
    meter: MeterOptions = field(default_factory=MeterOptions)
    idle_s: float = 0.0
    controller: ControllerOptions = field(default_factory=ControllerOptions)
    shuffle: str = "auto"  # on, off, auto: shuffle when there are energy benchmark cases
    seed: int = 0
    seed_given: bool = False
    llm: LLMSettings = field(default_factory=lambda: LLMSettings(make_grid("default")))
    report: ReportSettings = field(default_factory=ReportSettings)
    keep: KeepSettings = field(default_factory=KeepSettings)
    route: RouteOptions = field(default_factory=RouteOptions)


def read_options(config: pytest.Config) -> PluginOptions:
    def get(flag: str, default: Any = None) -> Any:
        value = option_value(config, flag)
        return default if value is None else value

    base = ControllerOptions()
    min_trials = get("--energy-min-trials")
    max_trials = get("--energy-max-trials")
    if max_trials is not None and min_trials is None:
        min_trials = min(base.min_trials, max_trials)
    try:
        controller = ControllerOptions(
            min_trials=min_trials if min_trials is not None else base.min_trials,
            max_trials=max_trials if max_trials is not None else base.max_trials,
            confidence=get("--energy-confidence", base.confidence),
            warmup=get("--energy-warmup", base.warmup),
            targets=get("--energy-ci-target", base.targets),
        )
    except ConfigError as exc:
        raise pytest.UsageError(f"--energy-min-trials/--energy-max-trials: {exc}") from None

    seed = get("--energy-seed")
    shuffle = get("--energy-shuffle", "auto")
    shuffle = {"true": "on", "false": "off"}.get(shuffle, shuffle)
    try:
        grid = make_grid(
            get("--llm-grid", "default"),
            models=get("--llm-model"),
            input_tokens=get("--llm-input-tokens"),
            output_tokens=get("--llm-output-tokens"),
        )
    except ConfigError as exc:
        raise pytest.UsageError(f"--llm-grid: {exc}") from None
    return PluginOptions(
        backend=get("--energy-backend", "auto") or "auto",
        meter=MeterOptions(
            gpus=get("--energy-gpus"),
            sample_interval_s=get("--energy-sample-interval"),
            cpu_tdp_w=get("--energy-cpu-tdp"),
        ),
        idle_s=get("--energy-idle", 0.0),
        controller=controller,
        shuffle=shuffle,
        seed=seed if seed is not None else int.from_bytes(os.urandom(4), "little") % 10**6,
        seed_given=seed is not None,
        llm=LLMSettings(
            grid=grid,
            dtype=get("--llm-dtype", "auto"),
            device=get("--llm-device", "auto") or "auto",
            trust_remote_code=get("--llm-trust-remote-code", False),
        ),
        report=ReportSettings(
            columns=get("--energy-columns"),
            group_by=get("--energy-group-by", report.DEFAULT_GROUP_BY),
            sort=get("--energy-sort", report.DEFAULT_SORT),
        ),
        keep=_keep_settings(get),
        route=RouteOptions(
            workload=get("--energy-route-workload"),
            by=get("--energy-route-by", INPUT),
            lam=get("--energy-route-lambda", 1.0),
            plots_dir=get("--energy-plots") or None,
        ),
    )


def _keep_settings(get: Callable[..., Any]) -> KeepSettings:
    gates = get("--energy-compare-fail", ())
    compare = get("--energy-compare") or None
    if gates and compare is None:
        compare = "latest"
    return KeepSettings(
        save=get("--energy-save"),
        autosave=get("--energy-autosave", False),
        json_path=get("--energy-json") or None,
        storage=get("--energy-storage") or DEFAULT_STORAGE,
        compare=compare,
        gates=gates,
    )
