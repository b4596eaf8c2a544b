"""Every pytest option, collected from the features that declare them.

Each feature module declares its options beside its code, as one ``Section`` (the
settings dataclass it reads and a row per option; ``option_rows.py`` says what a row
is).  Here they are gathered, in the order ``--help`` and the reference page show them,
into ``PluginSettings``: one frozen object with a field per section, read once at
configure.  A new option is a row in its feature's section; a new feature's options are
one section and one line in ``SECTIONS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from ..controller.rule import ControllerSettings
from ..errors import ConfigError
from ..meters import MeterSettings
from ..serving.serve_settings import ServeSettings
from ..storage.store import FOLDER, check_output
from .benchmark_energy import BENCHMARK_OPTIONS, BenchmarkSettings
from .cases import CONTROLLER_OPTIONS, ORDER_OPTIONS, OrderSettings, marker_help
from .frontier import SLO_OPTIONS, SloSettings
from .gpu_settings import GPU_OPTIONS, GpuSettings
from .keeping import KEEP_OPTIONS, KeepSettings
from .meter import MEASURE_OPTIONS, METER_OPTIONS, MeasureSettings
from .models import LLM_OPTIONS, LLMSettings
from .option_rows import (
    INI_PREFIX,
    Option,
    Section,
    check_targets,
    read_sections,
    sections_record,
)
from .option_rows import add_options as add_section_options
from .routing import ROUTE_OPTIONS, RouteSectionSettings
from .server_target import SERVE_OPTIONS
from .session_tables import REPORT_OPTIONS, ReportSettings

__all__ = ["INI_PREFIX", "OPTIONS", "SECTIONS", "Option", "PluginSettings", "marker_help"]

SECTIONS: tuple[Section, ...] = (
    MEASURE_OPTIONS,
    METER_OPTIONS,
    CONTROLLER_OPTIONS,
    ORDER_OPTIONS,
    REPORT_OPTIONS,
    KEEP_OPTIONS,
    ROUTE_OPTIONS,
    LLM_OPTIONS,
    GPU_OPTIONS,
    SERVE_OPTIONS,
    SLO_OPTIONS,
    BENCHMARK_OPTIONS,
)
OPTIONS: tuple[Option, ...] = tuple(o for s in SECTIONS for o in s.options)
BY_FLAG: dict[str, Option] = {o.flag: o for o in OPTIONS}


@dataclass(frozen=True)
class PluginSettings:
    """Everything the options say, parsed and checked once; a field per section."""

    measure: MeasureSettings = field(default_factory=MeasureSettings)
    meter: MeterSettings = field(default_factory=MeterSettings)
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    order: OrderSettings = field(default_factory=OrderSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    keep: KeepSettings = field(default_factory=KeepSettings)
    route: RouteSectionSettings = field(default_factory=RouteSectionSettings)
    llm: LLMSettings = field(default_factory=LLMSettings)
    gpu: GpuSettings = field(default_factory=GpuSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    slo: SloSettings = field(default_factory=SloSettings)
    benchmark: BenchmarkSettings = field(default_factory=BenchmarkSettings)
    record: Mapping[str, Any] = field(default_factory=dict)  # for the run file, by option name


def plugin_option(flag: str) -> Option:
    """The row of ``flag``: for a front end whose flag means the same (``llmenergy``)."""
    if flag not in BY_FLAG:
        raise KeyError(f"no pytest option {flag}")
    return BY_FLAG[flag]


def add_options(parser: pytest.Parser) -> None:
    add_section_options(parser, SECTIONS)


def read_options(config: pytest.Config) -> PluginSettings:
    """Parse every option once; the settings get the given values over their defaults."""
    sections = read_sections(config, SECTIONS)
    return PluginSettings(**sections, record=sections_record(SECTIONS, sections))


def check_outputs(options: PluginSettings) -> None:
    """Every file and folder the session will write, checked before it starts (so a bad
    path is found before anything is measured, and no run number is used up): the
    output options' targets, and the storage folder when the run is saved."""
    storage = options.keep.storage
    check_targets(SECTIONS, {s.name: getattr(options, s.name) for s in SECTIONS}, storage)
    if options.keep.saving:
        try:
            check_output(storage, FOLDER, storage=None, label=f"--energy-storage={storage}")
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
