"""Repeating: which cases run, in which order, and with which repetition settings.

The grid's cases parametrize the tests that ask for ``llm_input_case`` or
``llm_output_case``; every ``@pytest.mark.llmenergy`` is checked at collection (not
mid-run); models that cannot load, and cases longer than their model's context, stop
the session before the first case; energy benchmark cases run in a random order whose
seed the header prints.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from .. import values
from ..axes import Axis, check_axes
from ..conditions.settings import GPU_SETTING_AXIS
from ..controller.busy import BUSY_STREAK
from ..controller.order import shuffle_in_place, split_shards, token_cost
from ..controller.rule import (
    BUSY_POLICIES,
    DEFAULT_MAX_BACKGROUND,
    MARKER_KWARGS,
    RULES,
    ControllerSettings,
    with_overrides,
)
from ..controller.targets import EXAMPLES as CI_TARGET_EXAMPLES
from ..controller.targets import check_conversions, parse_ci_targets
from ..errors import ConfigError
from ..llm.compiled import COMPILED, describe_execution, execution_label
from ..llm.grid import CASE_AXES, INPUT_SWEEP, OUTPUT_SWEEP, PARALLEL_AXIS, LLMCase
from .models import LLMSettings
from .option_rows import Option, Section
from .session import header_lines
from .torchrun import DISTRIBUTED
from .workers import SHARD_KEY, is_worker

if TYPE_CHECKING:
    from ..llm.loader import ModelInfo

MARKER = "llmenergy"
BENCHMARK_FIXTURE = "energy_benchmark"
# Fixture name -> sweep: a test that asks for one is parametrized over the grid's cases.
CASE_FIXTURES = {"llm_input_case": INPUT_SWEEP, "llm_output_case": OUTPUT_SWEEP}
# The most visits of a case (--energy-interleave): each runs one trial at least, and no
# session runs a case's trials by the thousand; the schedule is built before the first.
MAX_VISITS = 1000


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


# Every axis the package has, in id order: the one table help texts and the docs read.
BUILTIN_AXES: tuple[Axis, ...] = (*CASE_AXES, GPU_SETTING_AXIS, PARALLEL_AXIS)


def added_axes(config: pytest.Config) -> list[Axis]:
    """The axes conftests and plugins add through ``pytest_llmenergy_axes``."""
    added = [a for rows in config.hook.pytest_llmenergy_axes(config=config) for a in rows or ()]
    for axis in added:
        if not isinstance(axis, Axis):
            raise pytest.UsageError(
                f"pytest_llmenergy_axes returned {axis!r}; return pytest_llmenergy.Axis rows"
            )
    try:
        check_axes([*BUILTIN_AXES, *added])
    except ConfigError as exc:
        raise pytest.UsageError(f"pytest_llmenergy_axes: {exc}") from None
    return added


def with_added_axes(config: pytest.Config, llm: LLMSettings) -> LLMSettings:
    """The settings with the hook's axes in the grid, at the values ``--llm-axis`` chose
    (or their defaults); a choice no added axis has is one line naming those there are."""
    added = {axis.name: axis for axis in added_axes(config)}
    chosen = dict(llm.axis_choices)
    for name in chosen:
        if name in added:
            continue
        builtin = next((a for a in BUILTIN_AXES if a.name == name), None)
        fix = (
            f"choose its values with {builtin.flag}"
            if builtin
            else f"axes added here: {', '.join(added) or 'none'} (pytest_llmenergy_axes)"
        )
        raise pytest.UsageError(f"--llm-axis={name}=...: no added axis {name!r}; {fix}")
    if not added:
        return llm
    try:
        extra = tuple((axis, axis.values_from(chosen.get(name))) for name, axis in added.items())
    except ConfigError as exc:
        raise pytest.UsageError(f"--llm-axis: {exc}") from None
    return dataclasses.replace(llm, extra_axes=extra)


def uses_energy_benchmark(item: pytest.Item) -> bool:
    return BENCHMARK_FIXTURE in getattr(item, "fixturenames", ())


def is_llm_case(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(isinstance(v, LLMCase) for v in callspec.params.values())


def case_labels(item: pytest.Item) -> dict[str, str]:
    """Labels for reports from the test's parameters; an ``LLMCase`` gives model and sweep."""
    labels: dict[str, str] = {}
    callspec = getattr(item, "callspec", None)
    for name, value in callspec.params.items() if callspec else ():
        as_labels = getattr(value, "labels", None)
        if callable(as_labels):
            labels.update(as_labels())
        else:
            labels[name] = str(value)
    return labels


def _check_conversions(
    controller: ControllerSettings, conversions: Mapping[str, float], where: str
) -> None:
    try:
        check_conversions(controller.targets, conversions)
    except ConfigError as exc:
        raise pytest.UsageError(f"{where}: {exc}") from None


class CasePlan:
    """Owns the case plan: parametrization, per-test repetition settings, the order."""

    def __init__(
        self,
        config: pytest.Config,
        controller: ControllerSettings,
        order: OrderSettings,
        llm: LLMSettings,
        conversions: Mapping[str, float] | None = None,
        *,
        served: bool = False,
    ) -> None:
        self.config = config
        self.controller = controller
        self.served = served  # a server generates (--llm-endpoint, --llm-serve), not llm_pool
        self._execution: str | None = None
        # the session's factors per kWh: a CI target on co2_g or cost needs its own
        self.conversions = dict(conversions or {})
        _check_conversions(controller, self.conversions, "--energy-ci-target")
        self.order = order
        self.llm = llm
        self.shuffled = False
        self.shard_note = ""  # --llm-shard: which part of the cases this session runs
        self.n_llm_cases = 0
        self._controllers: dict[str, ControllerSettings] = {}
        self.model_configs: dict[str, str] = {}  # model source -> config_hash, once checked
        self._collected: dict[str, int] = {}  # node id -> position in collection (file) order

    def labels_for(self, item: pytest.Item) -> dict[str, str]:
        """The case's labels, with its model's config hash where the start check read it:
        runs of the same model name with another config are not compared."""
        labels = case_labels(item)
        case = llm_case(item)
        config = self.model_configs.get(case.model) if case is not None else None
        if config:
            labels["model_config"] = config
        if case is not None and not self.llm.kv_cache:
            labels["kv_cache"] = "off"  # as the research's cases (predict.calibrate reads it)
        uses_models = case is not None or "llm_pool" in getattr(item, "fixturenames", ())
        if uses_models and not self.served and self.execution() == COMPILED:
            # compare.py does not gate a compiled case against an eager one (no label)
            labels["execution"] = execution_label(COMPILED)
        return labels

    def execution(self) -> str:
        """How this session's models generate, ``auto`` resolved: ``eager`` or
        ``compiled`` (what ``llm_pool`` loads them with)."""
        if self._execution is None:
            from ..llm.compiled import resolve_execution

            llm = self.llm
            self._execution = resolve_execution(
                llm.execution,
                llm.device,
                kv_cache=llm.kv_cache,
                parallel=llm.parallel if DISTRIBUTED in self.config.stash else "none",
                injected=bool(llm.inject_regression) or bool(llm.inject_work),
            )
        return self._execution

    def controller_for(self, item: pytest.Item) -> ControllerSettings:
        return self._controllers.get(item.nodeid, self.controller)

    def header(self) -> list[str]:
        return [f"repetition: {self.controller.describe()}"]

    # -- hooks ---------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        for name, sweep in CASE_FIXTURES.items():
            if name in metafunc.fixturenames:
                cases = self.llm.grid.cases(sweep)
                metafunc.parametrize(name, cases, ids=[case.id for case in cases])

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        self._collected.setdefault(item.nodeid, len(self._collected))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Check every test's marker now (not mid-run), then put the cases in order: last,
        after any plugin that reorders tests (pytest-randomly), so that the energy cases run
        in the order the header states, the seed's or the file's."""
        for item in items:
            marker = item.get_closest_marker(MARKER)
            if marker is None:
                continue
            if marker.args:
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.{MARKER} takes keyword arguments only"
                )
            where = f"{item.nodeid}: @pytest.mark.{MARKER}"
            try:
                self._controllers[item.nodeid] = with_overrides(self.controller, marker.kwargs)
            except ConfigError as exc:
                raise pytest.UsageError(f"{where}: {exc}") from None
            _check_conversions(self._controllers[item.nodeid], self.conversions, where)
        if self.llm.shard is not None:
            self._keep_shard(config, items, *self.llm.shard)
        if not self.config.option.collectonly:
            self._check_models(items)
        self.n_llm_cases = sum(1 for item in items if is_llm_case(item))
        mode = self.order.shuffle
        if mode == "on" or (mode == "auto" and any(uses_energy_benchmark(i) for i in items)):
            self.shuffled = True
        shuffle_in_place(
            items,
            self.order.seed if self.shuffled else None,
            selected=uses_energy_benchmark,
            group=lambda item: case_labels(item).get("model"),
            file_order=lambda item: self._collected.get(item.nodeid, len(self._collected)),
        )

    def pytest_report_collectionfinish(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> list[str]:
        """After collection, when it is known what will run and in which order."""
        lines = []
        if self.n_llm_cases:
            lines.append(self.llm.grid.describe())
            if not self.served:
                lines.append(describe_execution(self.execution(), self.llm.execution))
        if self.shard_note:
            lines.append(self.shard_note)
        if self.shuffled:
            seed = self.order.seed
            lines.append(
                f"cases in random order, seed {seed} (repeat with --energy-seed={seed}; "
                "--energy-shuffle=off keeps the file order)"
            )
        if config.pluginmanager.hasplugin("randomly") and config.option.verbose > 0:
            lines.append(
                "pytest-randomly is installed: it orders the other tests; the energy "
                "benchmark cases run in this plugin's order, "
                + ("seeded as above" if self.shuffled else "the file's")
            )
        return header_lines(config, lines)

    def _keep_shard(self, config: pytest.Config, items: list[pytest.Item], i: int, n: int) -> None:
        """``--llm-shard=I/N``: keep the I-th part of the energy cases (split by
        ``order.split_shards`` on node ids and tokens, so every machine agrees), and the
        other tests in part 1 only; the rest are deselected."""
        energy = [item for item in items if uses_energy_benchmark(item)]
        parts = split_shards(energy, n, cost=_item_cost, key=lambda item: item.nodeid)
        mine = {item.nodeid for item, part in zip(energy, parts) if part == i - 1}
        keep = [
            item
            for item in items
            if item.nodeid in mine or (not uses_energy_benchmark(item) and i == 1)
        ]
        dropped = [item for item in items if item not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
        self.shard_note = (
            f"shard {i}/{n}: {len(mine)} of {len(energy)} energy cases "
            "(split by tokens, the same on every machine; llmenergy merge joins the parts)"
        )
        if is_worker(config):  # the controller collects nothing: it says so at the end
            config.workeroutput[SHARD_KEY] = self.shard_note  # type: ignore[attr-defined]

    def _check_models(self, items: list[pytest.Item]) -> None:
        """A model that cannot load, or a case longer than its model's context, stops the
        session now: before any weights load, not once per case or after hours of others."""
        by_model: dict[str, list[LLMCase]] = {}
        for item in items:
            case = llm_case(item)
            if case is not None:
                by_model.setdefault(case.model, []).append(case)
        if not by_model:
            return
        from ..llm.loader import check_model

        problems: list[tuple[str, str]] = []  # (model, what is wrong and how to fix it)
        for model in sorted(by_model):
            try:
                info = check_model(
                    model,
                    dtype=self.llm.dtype,
                    device=self.llm.device,
                    trust_remote_code=self.llm.trust_remote_code,
                )
            except ConfigError as exc:
                raise pytest.UsageError(f"--llm-model={model}: {exc}") from None
            self.model_configs[model] = info.config_sha256
            problem = beyond_context(info, by_model[model], self.llm.allow_beyond_context)
            if problem:
                problems.append((model, problem))
        if problems:
            (model, problem), others = problems[0], [m for m, _ in problems[1:]]
            also = f" (and the same for {', '.join(others)})" if others else ""
            raise pytest.UsageError(f"--llm-model={model}: {problem}{also}")


def _item_cost(item: pytest.Item) -> float:
    """An energy case's expected time for the split: its tokens where it is an LLM case,
    else one short case's."""
    case = llm_case(item)
    if case is None:
        return token_cost(8, 8)
    return token_cost(case.input_tokens, case.output_tokens, case.queries)


def llm_case(item: pytest.Item) -> LLMCase | None:
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return next((v for v in params if isinstance(v, LLMCase)), None)


_SHOWN_CASES = 2  # the first few offending cases in the message; the count says the rest
_TOKEN_FIX = "lower --llm-input-tokens/--llm-output-tokens"


def beyond_context(info: ModelInfo, cases: list[LLMCase], allow: bool) -> str | None:
    """What is wrong with the cases longer than the model's context, and the fixes; None
    when they all fit (or may run past it: computed positions and ``allow``)."""
    if allow and info.can_exceed_context:
        return None
    over = sorted(
        {c for c in cases if c.positions > info.max_positions}, key=lambda c: (c.positions, c.id)
    )
    if not over:
        return None
    total = len(set(cases))
    shown = ", ".join(f"{c.id} ({c.positions})" for c in over[:_SHOWN_CASES])
    more = ", ..." if len(over) > _SHOWN_CASES else ""
    verb = "needs" if len(over) == 1 else "need"
    what = (
        f"{len(over)} of {total} cases {verb} more than the model's context of "
        f"{info.max_positions} positions (input + output tokens): {shown}{more}"
    )
    if not info.can_exceed_context:
        flag = " (--llm-allow-beyond-context cannot help)" if allow else ""
        return f"{what}; {_TOKEN_FIX}: {info.positions_text}{flag}"
    return (
        f"{what}; {_TOKEN_FIX}, or add --llm-allow-beyond-context to run past the context: "
        f"{info.positions_text} (the research measured Llama-2-7B, context 4096, at 4128 "
        "positions this way)"
    )


CASE_PLAN = pytest.StashKey[CasePlan]()


# -- options -----------------------------------------------------------------------------
def visits(text: str) -> int:
    """``--energy-interleave``: a whole number from 1 to ``MAX_VISITS``."""
    count = values.integer(1)(text)
    if count > MAX_VISITS:
        raise ConfigError(
            f"at most {MAX_VISITS} visits (each runs a trial at least; the schedule of every "
            f"visit is made before the first), got {text.strip()}"
        )
    return count


def marker_help(marker: str) -> str:
    kwargs = ", ".join(f"{k}=" for k in MARKER_KWARGS)
    return f"{marker}({kwargs}): repetition settings of this test's energy_benchmark"


def _lower_min_trials(given: dict[str, Any]) -> None:
    """A given maximum below the default minimum lowers the minimum with it."""
    if "max_trials" in given and "min_trials" not in given:
        given["min_trials"] = min(ControllerSettings().min_trials, given["max_trials"])


CONTROLLER_OPTIONS = Section(
    "controller",
    "Repeating a case",
    ControllerSettings,
    (
        Option(
            "--energy-min-trials",
            "min_trials",
            values.integer(1),
            "N",
            "measured trials of a case at least",
        ),
        Option(
            "--energy-max-trials",
            "max_trials",
            values.integer(1),
            "N",
            "measured trials of a case at most",
        ),
        Option(
            "--energy-confidence",
            "confidence",
            values.confidence,
            "LEVEL",
            "confidence level of the intervals, e.g. 0.95 or 95%",
        ),
        Option(
            "--energy-warmup",
            "warmup",
            values.integer(0),
            "N",
            "unmeasured warm-up runs before a case's trials",
        ),
        Option(
            "--energy-rule",
            "rule",
            values.choice(tuple(RULES), {"paper": "research"}),
            "NAME",
            "stopping rule: {choices}; --energy-ci-target and --energy-min-time replace its parts",
            choices=lambda: [f"{r.name} ({r.meaning})" for r in RULES.values()],
        ),
        Option(
            "--energy-min-time",
            "min_time_s",
            values.non_negative_seconds,
            "SECONDS",
            "measured runtime a case needs before it may stop, within its trial limit",
            default_text="the rule's: "
            + ", ".join(f"{r.min_time_s:g} s for {r.name}" for r in RULES.values()),
        ),
        Option(
            "--energy-max-time",
            "max_time_s",
            values.non_negative_seconds,
            "SECONDS",
            "stop repeating a case once this much runtime is measured (after "
            "--energy-min-trials), converged or not; 0: only the trial limit",
            default_text="the rule's: "
            + ", ".join(f"{r.max_time_s or 0:g} s for {r.name}" for r in RULES.values()),
        ),
        Option(
            "--energy-ci-target",
            "targets",
            parse_ci_targets,
            "TARGET",
            "repeat a case until the CI half-width of every TARGET holds, e.g. "
            f"{CI_TARGET_EXAMPLES}; any per-trial figure (llmenergy metrics); repeatable",
            multiple=True,
            default_text=lambda: (
                "the rule's: "
                + "; ".join(
                    f"{' and '.join(str(t) for t in r.targets)} for {r.name}"
                    for r in RULES.values()
                )
            ),
        ),
        Option(
            "--energy-prefill-passes",
            "prefill_passes",
            values.choice(("on", "off"), {"true": "on", "false": "off"}),
            "on|off",
            "on: where a case's prefill is too short for the meter to split it at its "
            "first-token mark without bias (under 34 counter periods), each trial is "
            "followed by a window of its prefill alone, whose joules are the trial's "
            "prefill's; off: the split stays at the mark, marked and never gated (a "
            "session that gates whole-trial figures saves the windows' time)",
        ),
        Option(
            "--energy-max-sample-gap",
            "max_sample_gap_s",
            values.seconds,
            "SECONDS",
            "a sampling meter's trial whose devices were not all read, or that went longer "
            "than this without a sample (or from an edge of its window), has invalid "
            "telemetry: its case is marked and never gated",
        ),
        Option(
            "--energy-max-background",
            "max_background",
            values.background_share,
            "SHARE",
            "a trial during which other processes used more than SHARE of the machine's CPUs "
            "(e.g. 25%) is disturbed: kept, left out of the figures and repeated, until the "
            "machine is busy (--energy-busy); off: never",
            default_text=lambda: f"{DEFAULT_MAX_BACKGROUND:.0%}",
        ),
        Option(
            "--energy-busy",
            "busy",
            values.choice(BUSY_POLICIES),
            "|".join(BUSY_POLICIES),
            f"once {BUSY_STREAK} trials in a row were disturbed the machine is busy, and "
            "the session says so; measure: its disturbed trials then count, marked busy, "
            "never gated, with how far they may be off; repeat: they are still repeated, "
            "within each case's trial limit and time budget, and a case that measured "
            "nothing is skipped (failed under --energy-strict)",
        ),
    ),
    complete=_lower_min_trials,
)

ORDER_OPTIONS = Section(
    "order",
    "Case order",
    OrderSettings,
    (
        Option(
            "--energy-shuffle",
            "shuffle",
            values.choice(("on", "off", "auto"), {"true": "on", "false": "off"}),
            "on|off|auto",
            "run energy benchmark cases in random order: {choices}",
            choices=lambda: ("on", "off", "auto"),
            default_text="on wherever energy_benchmark is used",
            const="on",
        ),
        Option(
            "--energy-interleave",
            "interleave",
            visits,
            "N",
            "visit every energy benchmark case N times, in a new random order each time, each "
            "visit running a share of its trials, so that a case's mean samples the whole "
            "session's machine speed, not one stretch of it; 1: each case's trials back to "
            f"back; at most {MAX_VISITS} (a visit runs one trial at least)",
        ),
        Option(
            "--energy-seed",
            "seed",
            values.integer(0),
            "N",
            "seed of the random case order",
            default_text="a new one each run, printed in the header",
        ),
    ),
)
