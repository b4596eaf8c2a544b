"""Every pytest option, declared once: flag, ini twin, parser, destination and default.

An ``Option`` names the settings dataclass and field its value goes to; the default is
that field's own default, and the help text's choices come from the registries (backends,
built-in models, figures, grids), so nothing here repeats what is declared elsewhere.
The command line wins over the ini file.  A bad value stops the session with one line
naming the option and what was expected.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .. import values
from ..axes import Axis, parse_axis_choices
from ..compare import GATE_EXAMPLES, Gate, parse_gates
from ..controller.rule import DEFAULT_MAX_BACKGROUND, MARKER_KWARGS, RULES, ControllerOptions
from ..controller.targets import EXAMPLES as CI_TARGET_EXAMPLES
from ..controller.targets import parse_ci_targets
from ..conversions import Intensity, Price, parse_intensity, parse_price
from ..errors import ConfigError
from ..export import EXPORT_EXAMPLES, EXPORT_FORMATS, parse_exports
from ..figures import FIGURES
from ..gpu.settings import (
    CLOCK_EXAMPLES,
    POWER_EXAMPLES,
    AxisSpec,
    axis_record,
    parse_clocks,
    parse_power_limits,
    parse_slowdowns,
)
from ..llm.grid import (
    BATCH_AXIS,
    CONCURRENCY_AXIS,
    GRIDS,
    INPUT_AXIS,
    OUTPUT_AXIS,
    TINY_MODEL_NAMES,
    Grid,
    make_grid,
)
from ..llm.loader import DTYPES, PARALLEL
from ..meters import BUILTIN_BACKENDS, MeterOptions, sample_interval_defaults
from ..report import DEFAULT_GROUP_BY, DEFAULT_SORT, GROUP_CHOICES, parse_group_by, parse_sort
from ..report import parse_columns as parse_report_columns
from ..routing import BY_CHOICES, INPUT
from ..serving.engine import ENGINES
from ..serving.serve_settings import ServeSettings, engine_choice, parse_args
from ..sessions import DEFAULT_SESSION_NOISE, parse_session_noise
from ..storage.store import DEFAULT_STORAGE, check_run_name

if TYPE_CHECKING:
    from ..routing.workload import Workload

INI_PREFIX = "llmenergy_"


# -- the settings each feature reads -----------------------------------------------------
@dataclass(frozen=True)
class MeasureSettings:
    backend: str = "auto"
    idle_s: float = 0.0
    dist_timeout_s: float = 300.0  # under torchrun: how long a rank waits for the others
    profile_ops: bool = False  # an unmeasured torch.profiler run after each case's trials


@dataclass(frozen=True)
class OrderSettings:
    shuffle: str = "auto"  # on, off, auto: shuffle when there are energy benchmark cases
    seed: int | None = None  # None: a new one each run, chosen here and printed
    interleave: int = 1  # visits of every energy case; 1: its trials back to back
    seed_given: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed_given", self.seed is not None)
        if self.seed is None:
            object.__setattr__(self, "seed", int.from_bytes(os.urandom(4), "little") % 10**6)


@dataclass(frozen=True)
class ReportSettings:
    columns: tuple[str, ...] | None = None  # None: the default columns, empty ones dropped
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    sort: str = DEFAULT_SORT
    carbon: Intensity | None = None  # gCO2e per kWh, for the co2 figures
    price: Price | None = None  # money per kWh, for the cost figures


@dataclass(frozen=True)
class KeepSettings:
    """Where the run is saved, and what it is compared with."""

    save: str | None = None
    autosave: bool = False
    json_path: str | None = None
    storage: str = DEFAULT_STORAGE
    compare: str | None = None  # a run spec, or "latest"
    gates: tuple[Gate, ...] = ()
    exports: tuple[tuple[str, Path], ...] = ()  # (format, path) written at the end
    report_path: str | None = None  # the HTML report, replaced at the end
    strict: bool = False  # an inconclusive gate (busy machine) fails the session
    # How much one session's figures vary from another's on this machine, assumed where
    # neither several sessions nor earlier runs of the same code tell (sessions.py).
    session_noise: float = DEFAULT_SESSION_NOISE

    def __post_init__(self) -> None:
        if self.gates and self.compare is None:  # a gate needs something to compare with
            object.__setattr__(self, "compare", "latest")

    @property
    def saving(self) -> bool:
        return bool(self.save or self.autosave)

    @property
    def active(self) -> bool:
        """Anything to keep or compare: only then is the machine read at start."""
        return bool(
            self.saving or self.json_path or self.compare or self.exports or self.report_path
        )


@dataclass(frozen=True)
class RouteOptions:
    """The routing section and the figures at the end of a session."""

    workload: Workload | None = None  # None: Alpaca, read when first needed
    by: str = INPUT
    lam: float = 1.0
    plots_dir: str | None = None


@dataclass(frozen=True)
class LLMSettings:
    grid_name: str = "default"
    models: tuple[str, ...] | None = None  # None: the grid's
    input_tokens: tuple[int, ...] | None = None
    output_tokens: tuple[int, ...] | None = None
    dtype: str = "auto"
    device: str = "auto"
    trust_remote_code: bool = False
    allow_beyond_context: bool = False  # rotary/ALiBi models may run cases past their context
    parallel: str = "none"  # under torchrun: none (a whole model per rank) or tp
    batch_sizes: tuple[int, ...] = (1,)  # prompts per generate call
    concurrency: tuple[int, ...] = (1,)  # requests at once to a server
    # A known regression added to the models' work, to measure what a gate can see.
    inject_regression: float = 0.0
    # --llm-axis NAME=VALUES: values of the axes conftests add (pytest_llmenergy_axes)
    axis_choices: tuple[tuple[str, str], ...] = ()
    # those axes with their values, set at configure once the hook has answered
    extra_axes: tuple[tuple[Axis, tuple[Any, ...]], ...] = ()
    grid: Grid = field(init=False, compare=False)

    def __post_init__(self) -> None:
        grid = make_grid(
            self.grid_name,
            self.models,
            self.input_tokens,
            self.output_tokens,
            self.batch_sizes,
            self.concurrency,
            self.extra_axes,
        )
        object.__setattr__(self, "grid", grid)


@dataclass(frozen=True)
class GpuOptions:
    """GPU settings as benchmark axes, the telemetry per trial, and the frontier."""

    power_limits: AxisSpec = field(default_factory=AxisSpec)
    clocks: AxisSpec = field(default_factory=AxisSpec)
    telemetry: bool = False  # read the GPUs during every trial even without the axes
    max_slowdowns: tuple[float, ...] = (0.0, 0.05)
    frontier_json: str | None = None

    @property
    def sweeping(self) -> bool:
        return bool(self.power_limits or self.clocks)


@dataclass(frozen=True)
class PluginOptions:
    """Everything the options say, parsed and checked once."""

    measure: MeasureSettings = field(default_factory=MeasureSettings)
    meter: MeterOptions = field(default_factory=MeterOptions)
    controller: ControllerOptions = field(default_factory=ControllerOptions)
    order: OrderSettings = field(default_factory=OrderSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    keep: KeepSettings = field(default_factory=KeepSettings)
    route: RouteOptions = field(default_factory=RouteOptions)
    llm: LLMSettings = field(default_factory=LLMSettings)
    gpu: GpuOptions = field(default_factory=GpuOptions)
    serve: ServeSettings = field(default_factory=ServeSettings)
    record: Mapping[str, Any] = field(default_factory=dict)  # for the run file, by option name


# The sections of PluginOptions, by field name: where an Option's ``to`` points.
_SECTION_OF: dict[str, type] = {
    f.name: f.default_factory  # type: ignore[misc]
    for f in dataclasses.fields(PluginOptions)
    if f.name != "record"
}


# -- one option ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """One command-line option and its ini twin, and where its value goes.

    ``to`` is ``"section.field"``: the ``PluginOptions`` section and the field of that
    settings dataclass; the field's default is the option's default.  ``help`` may use
    ``{choices}`` (filled from ``choices``) and ends with the default, unless
    ``default_text`` says what the default means in words.
    """

    flag: str
    to: str
    parse: Callable[[str], Any]
    metavar: str
    help: str
    choices: Callable[[], Sequence[str]] | None = None
    default_text: str | Callable[[], str] | None = None
    multiple: bool = False  # repeatable on the command line; comma lists in the ini
    const: str | None = None  # the value of the bare flag (``--energy-shuffle``)
    ini_name: str | None = None  # only where 0.1.0 named the ini key otherwise
    record: Callable[[Any], Any] | None = None  # how the run file keeps the value

    @property
    def section(self) -> str:
        return self.to.split(".", 1)[0]

    @property
    def field_name(self) -> str:
        return self.to.split(".", 1)[1]

    @property
    def name(self) -> str:
        """The option's name in ini files (after the prefix) and in run files."""
        return self.ini[len(INI_PREFIX) :]

    @property
    def ini(self) -> str:
        if self.ini_name:
            return self.ini_name
        bare = self.flag.lstrip("-").removeprefix("energy-").removeprefix("llm-")
        return INI_PREFIX + bare.replace("-", "_")

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def default(self) -> Any:
        cls = _SECTION_OF[self.section]
        f = {f.name: f for f in dataclasses.fields(cls)}[self.field_name]
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        raise AssertionError(f"{self.to} has no default")  # pragma: no cover

    def describe_default(self) -> str:
        if self.default_text is not None:
            return self.default_text if isinstance(self.default_text, str) else self.default_text()
        value = self.default
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value) or "none"
        return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    def full_help(self) -> str:
        text = self.help.format(choices=", ".join(self.choices()) if self.choices else "")
        return f"{text} (default: {self.describe_default()})"

    def to_record(self, value: Any) -> Any:
        if self.record is not None:
            return self.record(value)
        return _plain(value)


def _plain(value: Any) -> Any:
    """An option's value as JSON: tuples as lists, other objects by their text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return str(value)


def _background_share(text: str) -> float | None:
    if text.strip().lower() in ("off", "none", "no"):
        return None
    value = values.fraction(text, "a share of the CPUs")
    if value == 0:
        raise ConfigError(f"expected a share above 0 such as 25%, or off, got {text!r}")
    return value


def _injected(text: str) -> float:
    if text.strip().lower() in ("off", "none", "no", "0"):
        return 0.0
    parsed = values.split_number(text)
    if not parsed or parsed[1] not in ("", "%") or parsed[0] <= 0:
        raise ConfigError(f"expected a regression such as 25% or 0.25, or off, got {text!r}")
    return parsed[0] / 100 if parsed[1] == "%" else parsed[0]


def _columns(text: str) -> tuple[str, ...]:
    return parse_report_columns(text)


def _workload(text: str) -> Workload:
    """Read now, so a bad row stops the session at start, not after the measurements."""
    from ..routing.workload import load_workload

    return load_workload(text.strip())


def _backend_choices() -> list[str]:
    return [*BUILTIN_BACKENDS, "or one registered through the pytest_llmenergy_meters hook"]


def _model_choices() -> list[str]:
    return [*TINY_MODEL_NAMES, "a Hugging Face id", "a local path"]


OPTIONS: tuple[Option, ...] = (
    # -- measuring ---------------------------------------------------------------------
    Option(
        "--energy-backend",
        "measure.backend",
        values.text,
        "NAME",
        "energy meter: {choices}",
        choices=_backend_choices,
    ),
    Option(
        "--energy-gpus",
        "meter.gpus",
        values.indices,
        "LIST",
        "GPUs to measure, as indices among the CUDA-visible ones, e.g. 0,1",
        default_text="all",
    ),
    Option(
        "--energy-sample-interval",
        "meter.sample_interval_s",
        values.seconds,
        "SECONDS",
        "seconds between power samples of sampling meters, e.g. 0.1 or 100ms",
        default_text=lambda: (
            "the backend's own: "
            + ", ".join(f"{s:g} s for {b}" for b, s in sample_interval_defaults().items())
        ),
    ),
    Option(
        "--energy-idle",
        "measure.idle_s",
        values.non_negative_seconds,
        "SECONDS",
        "measure idle power for SECONDS at session start and report net energy too",
    ),
    Option(
        "--energy-cpu-tdp",
        "meter.cpu_tdp_w",
        values.watts,
        "WATTS",
        "CPU TDP in watts for the estimate meter",
        default_text="from the CPU model table",
    ),
    Option(
        "--energy-profile-ops",
        "measure.profile_ops",
        values.switch,
        "on|off",
        "after each case's trials, run it once more under torch.profiler (unmeasured, so "
        "the profiler's overhead never enters a trial) and keep its operator trace with "
        "the case, for llmenergy calibrate",
        const="on",
    ),
    # -- repeating ---------------------------------------------------------------------
    Option(
        "--energy-min-trials",
        "controller.min_trials",
        values.integer(1),
        "N",
        "measured trials of a case at least",
    ),
    Option(
        "--energy-max-trials",
        "controller.max_trials",
        values.integer(1),
        "N",
        "measured trials of a case at most",
    ),
    Option(
        "--energy-confidence",
        "controller.confidence",
        values.confidence,
        "LEVEL",
        "confidence level of the intervals, e.g. 0.95 or 95%",
    ),
    Option(
        "--energy-warmup",
        "controller.warmup",
        values.integer(0),
        "N",
        "unmeasured warm-up runs before a case's trials",
    ),
    Option(
        "--energy-rule",
        "controller.rule",
        values.choice(tuple(RULES), {"paper": "research"}),
        "NAME",
        "stopping rule: {choices}; --energy-ci-target and --energy-min-time replace its parts",
        choices=lambda: [f"{r.name} ({r.meaning})" for r in RULES.values()],
    ),
    Option(
        "--energy-min-time",
        "controller.min_time_s",
        values.non_negative_seconds,
        "SECONDS",
        "measured runtime a case needs before it may stop (within --energy-max-trials)",
        default_text="the rule's: "
        + ", ".join(f"{r.min_time_s:g} s for {r.name}" for r in RULES.values()),
    ),
    Option(
        "--energy-max-time",
        "controller.max_time_s",
        values.non_negative_seconds,
        "SECONDS",
        "stop repeating a case once this much runtime is measured (after "
        "--energy-min-trials), converged or not; 0: only the trial limit",
        default_text="the rule's: "
        + ", ".join(f"{r.max_time_s or 0:g} s for {r.name}" for r in RULES.values()),
    ),
    Option(
        "--energy-ci-target",
        "controller.targets",
        parse_ci_targets,
        "TARGET",
        "repeat a case until the CI half-width of every TARGET holds, e.g. "
        f"{CI_TARGET_EXAMPLES}; any per-trial figure (llmenergy metrics); repeatable",
        multiple=True,
        default_text=lambda: (
            "the rule's: "
            + "; ".join(
                f"{' and '.join(str(t) for t in r.targets)} for {r.name}" for r in RULES.values()
            )
        ),
    ),
    Option(
        "--energy-max-background",
        "controller.max_background",
        _background_share,
        "SHARE",
        "a trial during which other processes used more than SHARE of the machine's CPUs "
        "(e.g. 25%) is disturbed: kept, left out of the figures and repeated; off: never",
        default_text=lambda: f"{DEFAULT_MAX_BACKGROUND:.0%}",
    ),
    Option(
        "--energy-shuffle",
        "order.shuffle",
        values.choice(("on", "off", "auto"), {"true": "on", "false": "off"}),
        "on|off",
        "run energy benchmark cases in random order: {choices}",
        choices=lambda: ("on", "off", "auto"),
        default_text="on wherever energy_benchmark is used",
        const="on",
    ),
    Option(
        "--energy-interleave",
        "order.interleave",
        values.integer(1),
        "N",
        "visit every energy benchmark case N times, in a new random order each time, each "
        "visit running a share of its trials, so that a case's mean samples the whole "
        "session's machine speed, not one stretch of it; 1: each case's trials back to back",
    ),
    Option(
        "--energy-seed",
        "order.seed",
        values.integer(0),
        "N",
        "seed of the random case order",
        default_text="a new one each run, printed in the header",
    ),
    # -- showing -----------------------------------------------------------------------
    Option(
        "--energy-columns",
        "report.columns",
        _columns,
        "LIST",
        "columns of the energy tables, comma-separated, from: {choices}",
        choices=lambda: list(FIGURES),
        default_text="the default columns that have values, narrowed to the terminal",
    ),
    Option(
        "--energy-group-by",
        "report.group_by",
        parse_group_by,
        "KEYS",
        "one energy table per: {choices} (comma-separated)",
        choices=lambda: GROUP_CHOICES,
    ),
    Option(
        "--energy-sort",
        "report.sort",
        parse_sort,
        "COLUMN",
        "row order of the energy tables: tokens, name or a figure; -FIGURE sorts descending",
    ),
    # -- keeping -----------------------------------------------------------------------
    Option(
        "--energy-carbon-intensity",
        "report.carbon",
        parse_intensity,
        "G_OR_CODE",
        "grid carbon intensity for the gCO2e figures: gCO2e/kWh (e.g. 120) or a country "
        "(ISO alpha-3, e.g. FRA) or cloud region (e.g. gcp:europe-west1) from the shipped "
        "table (CodeCarbon's data)",
        record=lambda v: None if v is None else {"g_per_kwh": v.g_per_kwh, "source": v.source},
    ),
    Option(
        "--energy-price",
        "report.price",
        parse_price,
        "PRICE",
        "electricity price per kWh for the cost figures, e.g. 0.30 or 0.30EUR",
        record=lambda v: None if v is None else {"per_kwh": v.per_kwh, "currency": v.currency},
    ),
    Option(
        "--energy-save",
        "keep.save",
        check_run_name,
        "NAME",
        "save this run in the storage folder as NNNN_NAME.json",
    ),
    Option(
        "--energy-autosave",
        "keep.autosave",
        values.switch,
        "on|off",
        "save this run in the storage folder, named after the commit and the time",
        const="on",
    ),
    Option(
        "--energy-strict",
        "keep.strict",
        values.switch,
        "on|off",
        "fail the session when a gate is inconclusive because the machine was busy",
        const="on",
    ),
    Option(
        "--energy-json",
        "keep.json_path",
        values.text,
        "PATH",
        "also write this run to PATH (which must not exist yet)",
    ),
    Option(
        "--energy-storage",
        "keep.storage",
        values.text,
        "DIR",
        "storage folder of saved runs, one subfolder per hardware",
    ),
    Option(
        "--energy-compare",
        "keep.compare",
        values.text,
        "RUN",
        "compare each case with a saved run: its number, name or path; bare: the latest "
        "run saved on this hardware",
        const="latest",
    ),
    Option(
        "--energy-compare-fail",
        "keep.gates",
        parse_gates,
        "EXPR",
        "fail the session when a case regresses beyond a gate and significantly, e.g. "
        f"{GATE_EXAMPLES} (any per-trial figure; repeatable; implies --energy-compare)",
        multiple=True,
    ),
    Option(
        "--energy-session-noise",
        "keep.session_noise",
        parse_session_noise,
        "SHARE",
        "how much a case's figures vary between two sessions of unchanged code on this "
        "machine (the CV of session means), assumed by gates that have neither several "
        "sessions nor earlier runs of the same code to learn it from; "
        "'llmenergy gatecheck' measures it",
        default_text=f"{DEFAULT_SESSION_NOISE:.0%}",
    ),
    Option(
        "--energy-export",
        "keep.exports",
        parse_exports,
        "FORMAT:PATH",
        "also write this run's figures for other tools, e.g. "
        f"{EXPORT_EXAMPLES}: {{choices}} (repeatable; an export is derived from the run, "
        "so an existing PATH is replaced)",
        choices=lambda: EXPORT_FORMATS,
        multiple=True,
        record=lambda exports: [f"{fmt}:{path}" for fmt, path in exports],
    ),
    Option(
        "--energy-report",
        "keep.report_path",
        values.text,
        "PATH",
        "also write one self-contained HTML report of this run to PATH at the end (charts, "
        "every figure per case, the comparison with --energy-compare's run); an existing "
        "file is replaced (needs vl-convert-python: the report extra)",
    ),
    # -- deciding ----------------------------------------------------------------------
    Option(
        "--energy-route-workload",
        "route.workload",
        _workload,
        "SPEC",
        "workload of the routing section (shown when the session compares with a run from "
        "other hardware): alpaca, alpaca-paper, or a CSV / JSONL file of "
        "input_tokens,output_tokens",
        default_text="alpaca",
        record=lambda w: None if w is None else w.name,
    ),
    Option(
        "--energy-route-by",
        "route.by",
        values.choice(BY_CHOICES),
        "AXIS",
        "route on these tokens: {choices}",
        choices=lambda: BY_CHOICES,
    ),
    Option(
        "--energy-route-lambda",
        "route.lam",
        lambda text: values.fraction(text, "a weight of energy"),
        "L",
        "weight of energy against time when routing: 1 energy only, 0 time only",
    ),
    Option(
        "--energy-plots",
        "route.plots_dir",
        values.text,
        "DIR",
        "write figures (PNG) to DIR at the end: energy per token and runtime per model; "
        "with a run from other hardware, workload totals against the threshold and the "
        "Pareto front (needs matplotlib)",
    ),
    # -- running models ----------------------------------------------------------------
    Option(
        "--llm-model",
        "llm.models",
        values.names,
        "MODEL",
        "model to benchmark: {choices} (repeatable)",
        choices=_model_choices,
        default_text="the grid's models",
        multiple=True,
        ini_name="llmenergy_models",
    ),
    Option(
        "--llm-input-tokens",
        "llm.input_tokens",
        INPUT_AXIS.parse,
        "LIST",
        "sizes of the input sweep, e.g. 8,64,512 or 8..2048 (powers of two)",
        default_text="the grid's",
    ),
    Option(
        "--llm-output-tokens",
        "llm.output_tokens",
        OUTPUT_AXIS.parse,
        "LIST",
        "sizes of the output sweep, e.g. 8,64,512 or 8..4096 (powers of two)",
        default_text="the grid's",
    ),
    Option(
        "--llm-grid",
        "llm.grid_name",
        values.choice(tuple(GRIDS)),
        "NAME",
        "case grid: {choices}",
        choices=lambda: [f"{name} ({grid.models_text()})" for name, grid in GRIDS.items()],
    ),
    Option(
        "--llm-dtype",
        "llm.dtype",
        values.choice(DTYPES),
        "DTYPE",
        "model weights' dtype: {choices}",
        choices=lambda: DTYPES,
    ),
    Option(
        "--llm-device",
        "llm.device",
        values.text,
        "DEVICE",
        "where the model runs: auto (device_map=auto with a GPU, else cpu), cpu, cuda, cuda:N, mps",
    ),
    Option(
        "--llm-trust-remote-code",
        "llm.trust_remote_code",
        values.switch,
        "on|off",
        "allow models whose repository ships Python code to run it",
        const="on",
    ),
    Option(
        "--llm-allow-beyond-context",
        "llm.allow_beyond_context",
        values.switch,
        "on|off",
        "let models with rotary (RoPE) or ALiBi positions run cases whose input + output "
        "tokens exceed their context (the research ran Llama-2-7B at 4128 of 4096); "
        "off: such a case stops the session at start",
        const="on",
    ),
    Option(
        "--llm-inject-regression",
        "llm.inject_regression",
        _injected,
        "SHARE",
        "slow every model down on purpose: after each forward pass, extra CPU work of "
        "SHARE times the pass's own CPU time (25%: about +25 % time, and energy on CPU "
        "meters), to learn which regressions a gate finds on this runner "
        "(llmenergy gatecheck); never in a baseline",
        default_text="off",
    ),
    Option(
        "--llm-parallel",
        "llm.parallel",
        values.choice(PARALLEL),
        "LAYOUT",
        "under torchrun: tp (the model split tensor-parallel over the ranks by transformers) "
        "or none (every rank runs a whole model); choices: {choices}",
        choices=lambda: PARALLEL,
    ),
    Option(
        "--energy-dist-timeout",
        "measure.dist_timeout_s",
        values.seconds,
        "SECONDS",
        "under torchrun: how long a rank waits for the others at a trial's start or end "
        "before it gives up, saves what was measured and names the silent rank (300)",
    ),
    # -- batches and servers -------------------------------------------------------------
    Option(
        "--llm-batch-sizes",
        "llm.batch_sizes",
        BATCH_AXIS.parse,
        "LIST",
        "run every case at these batch sizes, e.g. 1,8,32 (ids get -bs8): a batch of "
        "distinct prompts of exactly the case's input tokens, each generating exactly its "
        "output tokens; per-query figures share the batch's joules, J/token sums its tokens",
    ),
    Option(
        "--llm-concurrency",
        "llm.concurrency",
        CONCURRENCY_AXIS.parse,
        "LIST",
        "send this many requests at once to the server (--llm-endpoint or --llm-serve) per "
        "trial, e.g. 1,8 (ids get -c8); the window covers the whole burst",
    ),
    Option(
        "--llm-axis",
        "llm.axis_choices",
        parse_axis_choices,
        "NAME=VALUES",
        "values of an axis a conftest or plugin adds through the pytest_llmenergy_axes "
        "hook, e.g. temperature=0,0.7 (repeatable): every case runs at each",
        default_text="the axis's own default",
        multiple=True,
    ),
    Option(
        "--llm-endpoint",
        "serve.endpoint",
        values.text,
        "URL",
        "measure a running OpenAI-compatible server (vLLM, llama.cpp, ...) at URL, e.g. "
        "http://127.0.0.1:8000, serving the one --llm-model (its tokenizer makes the prompts)",
    ),
    Option(
        "--llm-served-model",
        "serve.served_model",
        values.text,
        "NAME",
        "the model's name on the server (the request's model field)",
        default_text="the one model the server lists",
    ),
    Option(
        "--llm-serve",
        "serve.engine",
        engine_choice,
        "ENGINE",
        "start this engine for the session on a free port, serving the one --llm-model, "
        "and stop it and its children at the end: {choices}",
        choices=lambda: list(ENGINES),
    ),
    Option(
        "--llm-serve-python",
        "serve.python",
        values.text,
        "PATH",
        "the engine's Python interpreter (engines live in their own venv), e.g. "
        "/work/venvs/vllm/bin/python",
        default_text="$LLMENERGY_SERVE_PYTHON, else this Python",
    ),
    Option(
        "--llm-serve-args",
        "serve.args",
        parse_args,
        "FLAGS",
        "extra flags for the engine, e.g. '--max-num-seqs 16' (never run through a shell)",
    ),
    Option(
        "--llm-serve-timeout",
        "serve.timeout_s",
        values.seconds,
        "SECONDS",
        "how long the engine may take to answer after starting",
    ),
    Option(
        "--llm-server-pid",
        "serve.server_pid",
        values.integer(1),
        "PID",
        "the --llm-endpoint server's process: the CPU meters charge its process tree too",
        default_text="the process listening on the URL's port, when it is on this machine",
    ),
    # -- GPU settings (the time-energy frontier) ---------------------------------------
    Option(
        "--energy-gpu-power-limits",
        "gpu.power_limits",
        parse_power_limits,
        "LIST",
        "run every energy case at each GPU power limit, e.g. "
        f"{POWER_EXAMPLES} (of the default limit; all: the allowed range in steps); the "
        "GPU's default is always measured too, and restored at the end (needs root)",
        default_text="none: the GPU as it is",
        record=axis_record,
    ),
    Option(
        "--energy-gpu-clocks",
        "gpu.clocks",
        parse_clocks,
        "LIST",
        f"run every energy case at each locked SM clock, e.g. {CLOCK_EXAMPLES} (all: the "
        "supported clocks in steps); unlocked clocks are always measured too, and restored "
        "at the end (needs root)",
        default_text="none: the GPU as it is",
        record=axis_record,
    ),
    Option(
        "--energy-gpu-telemetry",
        "gpu.telemetry",
        values.switch,
        "on|off",
        "record the GPUs' temperature, SM clock and throttle reasons during every trial "
        "(always on with the GPU setting axes)",
        const="on",
    ),
    Option(
        "--energy-max-slowdown",
        "gpu.max_slowdowns",
        parse_slowdowns,
        "LIST",
        "report the energy bloat at the GPU's default: the energy the cheapest setting at "
        "most this much slower saves, e.g. 0%,5%",
        default_text="0%,5%",
        multiple=True,
    ),
    Option(
        "--energy-frontier-json",
        "gpu.frontier_json",
        values.text,
        "PATH",
        "also write the time-energy frontier and the per-token-range setting policy to "
        "PATH (must not exist yet)",
    ),
    Option(
        "--llm-gguf-converter",
        "serve.converter",
        values.text,
        "PATH",
        "llama.cpp's convert_hf_to_gguf.py (in llama-cpp-python's sdist under "
        "vendor/llama.cpp, or a llama.cpp checkout): --llm-serve=llama.cpp converts the "
        "model to GGUF with it once (cached)",
        default_text="$LLMENERGY_GGUF_CONVERTER, else one in the engine's venv",
    ),
)

BY_FLAG = {o.flag: o for o in OPTIONS}


def marker_help(marker: str) -> str:
    kwargs = ", ".join(f"{k}=" for k in MARKER_KWARGS)
    return f"{marker}({kwargs}): repetition settings of this test's energy_benchmark"


def plugin_option(flag: str) -> Option:
    """The row of ``flag``: for a front end whose flag means the same (``llmenergy``)."""
    for option in OPTIONS:
        if option.flag == flag:
            return option
    raise KeyError(f"no pytest option {flag}")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmenergy", "LLM energy measurement (pytest-llmenergy)")
    for option in OPTIONS:
        text = option.full_help()
        kwargs: dict[str, Any] = {
            "dest": option.dest,
            "default": None,
            "metavar": option.metavar,
            "help": f"{text}. ini: {option.ini}".replace("%", "%%"),
        }
        if option.multiple:
            kwargs["action"] = "append"
        if option.const is not None:
            kwargs.update(nargs="?", const=option.const)
        group.addoption(option.flag, **kwargs)
        parser.addini(option.ini, help=f"{text} (= {option.flag})", default="")


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


def _parse(option: Option, text: str, origin: str) -> Any:
    try:
        return option.parse(text)
    except (ConfigError, ValueError) as exc:
        raise pytest.UsageError(f"{origin}: {exc or 'expected ' + option.metavar}") from None


def read_options(config: pytest.Config) -> PluginOptions:
    """Parse every option once; the settings get the given values over their defaults."""
    given: dict[str, dict[str, Any]] = {name: {} for name in _SECTION_OF}
    origins: dict[str, list[str]] = {name: [] for name in _SECTION_OF}
    for option in OPTIONS:
        raw = _raw(config, option)
        if raw is None:
            continue
        given[option.section][option.field_name] = _parse(option, *raw)
        origins[option.section].append(raw[1].split("=", 1)[0].strip())
    controller = given["controller"]
    if "max_trials" in controller and "min_trials" not in controller:
        controller["min_trials"] = min(ControllerOptions().min_trials, controller["max_trials"])
    sections: dict[str, Any] = {}
    for name, cls in _SECTION_OF.items():
        try:
            sections[name] = cls(**given[name])
        except (ConfigError, ValueError) as exc:
            where = "/".join(origins[name]) or f"--{name}"
            raise pytest.UsageError(f"{where}: {exc}") from None
    return PluginOptions(**sections, record=options_record(sections))


def options_record(sections: Mapping[str, Any]) -> dict[str, Any]:
    """What the run file keeps of the options: every option by its name (the ini key
    without the prefix), with the value in effect.  Written field by field, so renaming
    a settings field never changes saved files."""
    record: dict[str, Any] = {}
    for option in OPTIONS:
        value = getattr(sections[option.section], option.field_name)
        record[option.name] = option.to_record(value)
    return record
