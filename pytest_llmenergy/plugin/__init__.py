"""The pytest front end: options, fixtures, and one plugin object per feature.

Registered through the ``pytest11`` entry point as ``llmenergy``; disable it with
``-p no:llmenergy``.  ``pytest_configure`` reads the options once and registers the
features, each owning its state, its hooks, its terminal-summary section, and its
options (a ``Section`` of rows beside its code, collected by ``options.py``):

- ``meter.Metering``: the meter (opened at session start) and its header lines;
- ``cases.CasePlan``: parametrization over the grid, markers, models, case order;
- ``session_tables.CaseResults``: the measured cases and the energy-per-token tables;
- ``keeping.Keeper``: the run file, the baseline, the comparison and gates;
- ``routing.RoutingSection``: routing between two systems, and figures;
- ``frontier.BestConfiguration``: the time-energy front over a sweep's configurations,
  and the best one under ``--llm-slo``;
- ``html_report.HtmlReporting`` (``--energy-report``): the HTML report, written last;
- ``benchmark_energy.BenchmarkEnergy`` (with pytest-benchmark): the joules of its tests;
- ``workers.Workers`` / ``workers.WorkerSide`` (with pytest-xdist): the controller hands
  out the seed and the meter's lock and keeps what the workers measured;
- ``gpu_settings.GpuTuning``: GPU power limits and clocks as axes, telemetry per
  trial, restoring the GPUs, and the time-energy frontier.
- ``torchrun.Distributed`` (under torchrun): joins the process group, takes rank 0's
  seed, meters every rank's share in lockstep windows; rank 0 alone keeps and shows;
- ``server_target.Serving``: a server or an engine started for the session as the target;
- ``ab_side.PairedSide`` (under ``llmenergy ab``): one side of a paired run.

``session.py`` holds what every feature shares: header lines fitted to the terminal and a
session failed with its reason counted on pytest's last line.  ``activity.py`` says when a
session measures at all: one that measures nothing (no option of the plugin's given, no
test using its fixtures) costs nothing and says nothing, and its features never start.
What only a measuring session uses is imported where it is used, so that pytest's start
imports no more than the options need.

pluggy calls the last registered plugin first, so they are registered in reverse: the
meter opens before the keeper claims the run file, and the energy tables print before
the comparison, which prints before routing.  The session header is one hook here, which
puts the features' ``header()`` lines in that order too.  Each feature is reachable
through its typed stash key (``config.stash[KEEPER]``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ..errors import ConfigError, LLMEnergyError, one_line
from ..figures import DeprecatedName
from .activity import ACTIVITY, Activity, given_on_command_line, measures
from .benchmark_energy import BENCHMARK_FIXTURE
from .busy_machine import BUSY_MACHINE, BusyMachine, terminal_say
from .cases import CASE_FIXTURES, CASE_PLAN, MARKER, CasePlan, case_labels, with_added_axes
from .frontier import BEST_CONFIGURATION, BestConfiguration
from .gpu_settings import GPU_TUNING, GpuTuning, setting_fixture
from .keeping import KEEPER, Keeper
from .meter import METERING, Metering
from .options import (
    OPTIONS,
    PluginSettings,
    add_options,
    check_outputs,
    marker_help,
    read_options,
)
from .routing import ROUTING, RoutingSection
from .server_target import SERVING, Serving, attribute_server, check_settings
from .session import fitted, fitted_usage_error, header_lines
from .session_tables import CASE_RESULTS, CaseResults
from .torchrun import DISTRIBUTED, Distributed
from .workers import WORKER_SIDE, Workers, WorkerSide, is_worker, worker_seed, xdist_header

if TYPE_CHECKING:
    from ..conditions.settings import GpuSetting
    from ..controller.benchmark import EnergyBenchmark
    from ..llm.grid import Grid
    from ..llm.loader import ModelPool
    from ..meters import Meter
    from ..serving.target import ServerTarget
    from .ab_side import PairedSide

__all__ = ["CASE_PLAN", "CASE_RESULTS", "KEEPER", "METERING", "ROUTING"]


def __getattr__(name: str) -> Any:
    """``LiveStatus`` (the live status line), imported where it is asked for."""
    if name == "LiveStatus":
        from .progress import LiveStatus

        return LiveStatus
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from .. import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


# In which role each feature runs, in the order they are registered (pluggy calls the
# last registered first: the meter opens before the keeper claims the run file, the energy
# tables print before the comparison, and a server starts before anything else).
CONTROLLER, XDIST_WORKER, TORCHRUN_RANK = "controller", "xdist worker", "torchrun rank"
ROLES: dict[str, tuple[str, ...]] = {
    XDIST_WORKER: ("profile-ops", "count-work", "xdist-worker", "metering", "cases"),
    TORCHRUN_RANK: ("profile-ops", "torchrun", "metering", "cases"),
    CONTROLLER: (
        # first: its hooks run last, so it puts SIGTERM back after those installed over it
        "sigterm",
        "profile-ops",
        "count-work",
        "xdist",
        "pytest-benchmark",
        "torchrun",
        "html-report",
        "gpu-settings",
        "routing",
        "keeper",
        "best-configuration",
        "results",
        "interleaving",
        "cases",
        # after the case plan: pluggy calls trylast hooks in the order they were
        # registered, so its collection hook orders the cases after the plan's
        "pairing",
        "metering",
        "serving",
    ),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", marker_help(MARKER))
    options, ranks = resolved_options(config)
    role = (
        XDIST_WORKER
        if is_worker(config)
        else TORCHRUN_RANK
        if ranks is not None and not ranks.is_main
        else CONTROLLER
    )
    if role == CONTROLLER and not (config.option.collectonly or getattr(config.option, "help", 0)):
        check_outputs(options)  # only where files are written, and before anything runs
    features = _features(config, options, ranks, role)
    named = {f"llmenergy-{n}": features[n] for n in ROLES[role] if features.get(n) is not None}
    reason = measures_from_start(config, options, ranks)
    # registered now in any session, and kept: the SIGTERM handler's owner (installed
    # now) and xdist's controller side (its lock's folder, made now), whose unconfigure
    # puts back what they took
    always = [n for n in named if n in ("llmenergy-sigterm", "llmenergy-xdist")]
    # from the start, the header's place is pytest's header (none under -q)
    activity = Activity(
        named,
        _measuring_fixtures(options),
        reason,
        always,
        started=bool(reason),
        header_shown=bool(reason),
    )
    config.stash[ACTIVITY] = activity
    activity.register(config.pluginmanager, named if activity.measuring else always)
    if role == CONTROLLER:  # under xdist the controller hears of measuring from a case
        config.stash[CASE_RESULTS].listeners.append(lambda _: _wake(config, "a case was measured"))
    from .stopping import SIGTERM_STOP

    if SIGTERM_STOP in config.stash:  # once registered, so that unconfigure takes it back
        config.stash[SIGTERM_STOP].install()


def measures_from_start(
    config: pytest.Config, options: PluginSettings, ranks: Distributed | None
) -> str:
    """Why the session measures from its start, or "" (``activity.py`` has the rule): an
    option on the command line, an ini setting that acts on its own, a side of
    ``llmenergy ab``, a rank under torchrun."""
    if given_on_command_line(config, [o.dest for o in OPTIONS]):
        return "an option on the command line"
    if ranks is not None:
        return "a rank under torchrun"
    from ..pairing.channel import ENV as PAIRED

    if os.environ.get(PAIRED):
        return "a side of llmenergy ab"
    return "the ini file's settings" if _acts_alone(options) else ""


def _acts_alone(options: PluginSettings) -> bool:
    """Whether the settings ask for something a session does whether or not a test
    measures: a run kept or compared, an export, the report, figures, a server, GPU
    settings or telemetry, interleaved visits."""
    gpu = options.gpu
    return bool(
        options.keep.active
        or options.serve.active
        or options.route.plots_dir
        or gpu.sweeping
        or gpu.telemetry
        or gpu.thermal_tolerance_c is not None
        or options.order.interleave > 1
    )


def _measuring_fixtures(options: PluginSettings) -> frozenset[str]:
    """The fixtures whose use makes a session measure: the plugin's, the grid's cases,
    and pytest-benchmark's where --energy-benchmark-extra-info=on."""
    benchmark = [BENCHMARK_FIXTURE] if options.benchmark.extra_info == "on" else []
    return frozenset({*PLUGIN_FIXTURES, *CASE_FIXTURES, *benchmark})


def _wake(config: pytest.Config, reason: str) -> None:
    """The session measures from now on (``Activity.wake``); a no-op where it does."""
    config.stash[ACTIVITY].wake(config.pluginmanager, reason)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """A session not yet measuring registers its features now, after their session start
    was called for: it waits until a test needs them (``activity.py``)."""
    activity = session.config.stash.get(ACTIVITY, None)
    if activity is None:
        return
    activity.session = session
    if not activity.measuring:
        _restore_left_gpus(session.config)
    activity.register(session.config.pluginmanager, activity.features)


def _restore_left_gpus(config: pytest.Config) -> None:
    """GPU settings a killed session left changed go back in any session, one that
    measures nothing too, and it says so (a measuring session's GPU feature does it)."""
    gpu = config.stash.get(GPU_TUNING, None)
    lines = gpu.recover_now() if gpu is not None else []
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if lines and reporter is not None:
        for part in header_lines(config, lines):
            reporter.write_line(part)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """After collection: a test that needs the plugin makes the session measure (its
    features start now, before any test runs; a bad setting stops it here); where none
    does, the features are dropped and the session goes on without them."""
    config = session.config
    activity = config.stash.get(ACTIVITY, None)
    if activity is None or activity.measuring:
        return
    found = next((i for i in session.items if measures(i, activity.fixtures, MARKER)), None)
    if found is not None:
        _wake(config, f"{found.nodeid} uses it")
    else:
        activity.drop(config.pluginmanager)


def resolved_options(config: pytest.Config) -> tuple[PluginSettings, Distributed | None]:
    """The options, read once and rewritten in one place, in order: the hook's axes,
    combinations that cannot work, a server's processes charged by the CPU meters, an
    xdist worker's seed (the controller's), and under torchrun each rank's share and rank
    0's seed.  What comes back is final: no feature rewrites it."""
    options, renamed = _read_noting_old_names(config)
    options = dataclasses.replace(options, llm=with_added_axes(config, options.llm))
    check_settings(options.serve, options.llm, options.measure)
    if options.serve.active and config.getoption("numprocesses", None):
        raise pytest.UsageError(
            "--llm-endpoint/--llm-serve: a server is measured one burst at a time; run "
            "without pytest-xdist's -n (--llm-concurrency sends requests at once)"
        )
    if options.order.interleave > 1 and config.getoption("numprocesses", None):
        raise pytest.UsageError(
            "--energy-interleave: the visits of every case run in one process; run without "
            "pytest-xdist's -n (or with --energy-interleave=1)"
        )
    # before the meter opens: it charges the server
    options = dataclasses.replace(options, meter=attribute_server(options.serve, options.meter))
    seed = worker_seed(config)
    if seed is not None:  # an xdist worker collects in the controller's order
        options = _with_seed(options, seed)
    ranks = _join_torchrun(config, options)
    if ranks is not None and options.order.interleave > 1:
        raise pytest.UsageError(
            "--energy-interleave does not run under torchrun yet: leave it out (or =1)"
        )
    if ranks is not None:  # every rank collects in rank 0's order, meters its own share
        options = _with_seed(ranks.options, ranks.seed(ranks.options.order.seed))
        config.stash[DISTRIBUTED] = ranks
    if not is_worker(config) and (ranks is None or ranks.is_main):  # said once per session
        for message in renamed:
            sys.stderr.writelines(f"{part}\n" for part in fitted(f"warning: {message}"))
    return options, ranks


def _read_noting_old_names(config: pytest.Config) -> tuple[PluginSettings, list[str]]:
    """The options, and the message of each old figure name among them (``DeprecatedName``).
    The session prints those itself, one line each as the ``llmenergy`` command does, so
    that an old name warns and works wherever the session runs: a warning issued at
    configure time is an INTERNALERROR traceback where the ini's ``filterwarnings`` makes
    it an error (this repository's own ``error::DeprecationWarning:pytest_llmenergy.*``
    did)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecatedName)
        options = read_options(config)
    renamed = [str(w.message) for w in caught if issubclass(w.category, DeprecatedName)]
    return options, list(dict.fromkeys(renamed))


def _with_seed(options: PluginSettings, seed: int | None) -> PluginSettings:
    return dataclasses.replace(options, order=dataclasses.replace(options.order, seed=seed))


def _features(
    config: pytest.Config, options: PluginSettings, ranks: Distributed | None, role: str
) -> dict[str, object]:
    """Every feature this role runs, built from the resolved options and stashed under
    its key; ``ROLES`` says which of them are registered."""
    stash = config.stash
    metering = Metering(config, options.measure, options.meter)
    plan = CasePlan(
        config,
        options.controller,
        options.order,
        options.llm,
        options.report.conversions,
        served=options.serve.active,
    )
    results = CaseResults(options.report, gated=[g.metric for g in options.keep.gates])
    keeper = Keeper(
        config,
        options.keep,
        metering,
        results.results,
        options.record,
        options.controller.confidence,
    )
    routing = RoutingSection(options.route, keeper, results.results)
    serving = Serving(
        config, options.serve, options.llm, options.record, options.meter.attributed_pids
    )
    stash[SERVING], stash[METERING], stash[CASE_PLAN] = serving, metering, plan
    stash[CASE_RESULTS], stash[KEEPER], stash[ROUTING] = results, keeper, routing
    stash[GPU_TUNING] = gpu = _gpu_tuning(config, options, ranks, keeper, results)
    features: dict[str, object] = {
        "metering": metering,
        "cases": plan,
        "results": results,
        "keeper": keeper,
        "routing": routing,
        "gpu-settings": gpu,
        "serving": serving if options.serve.active else None,
        "torchrun": ranks,
    }
    features.update(_work_features(stash, options, ranks, results))
    say = terminal_say(config) if role == CONTROLLER else None
    stash[BUSY_MACHINE] = busy = BusyMachine(options.controller.busy, options.keep.strict, say)
    if role == CONTROLLER:
        results.listeners.append(busy.on_case)
    if role == XDIST_WORKER:  # measure and send; the controller keeps, shows and decides
        side = WorkerSide(config, lambda: metering.meter)
        features["xdist-worker"] = stash[WORKER_SIDE] = side
        results.listeners.append(lambda cases: side.on_case(cases[-1]))
    if role == CONTROLLER:
        features.update(_controller_features(config, options, metering, results, keeper, routing))
    return features


def _gpu_tuning(
    config: pytest.Config,
    options: PluginSettings,
    ranks: Distributed | None,
    keeper: Keeper,
    results: CaseResults,
) -> GpuTuning:
    """The GPU settings the session sweeps or holds; refused under torchrun where they
    do not run there yet (every rank stops alike, before NVML is asked)."""
    if options.gpu.sweeping and ranks is not None:
        raise pytest.UsageError(
            "--energy-gpu-power-limits/--energy-gpu-clocks do not run under torchrun yet: "
            "sweep one process, without torchrun"
        )
    if options.gpu.thermal_tolerance_c is not None and ranks is not None:
        raise pytest.UsageError(
            "--energy-thermal-tolerance does not run under torchrun yet: leave it out"
        )
    return GpuTuning(
        config,
        options.gpu,
        options.meter.gpus,
        results.results,
        options.route.lam,
        options.route.plots_dir,
        system=lambda: keeper.hardware,
        backend=options.measure.backend,
        attributed_pids=options.meter.attributed_pids,
    )


def _work_features(
    stash: pytest.Stash, options: PluginSettings, ranks: Distributed | None, results: CaseResults
) -> dict[str, object]:
    """Profiling the ops and counting the work, where asked: on workers too (what they
    find travels with the case)."""
    features: dict[str, object] = {}
    if options.measure.profile_ops:
        from ..predict.plugin import OP_PROFILING, OpProfiling

        features["profile-ops"] = stash[OP_PROFILING] = OpProfiling()
    # not a server's work (it runs elsewhere); under torchrun every rank counts its own
    # share and rank 0 keeps the job's
    if options.measure.count_work != "off" and not options.serve.active:
        from ..predict.plugin import WORK_COUNTING, WorkCounting

        gather = ranks.group.all_gather if ranks is not None else None
        after = options.measure.count_work == "on"
        counting = WorkCounting(gather, lambda: results.results, after_trials=after)
        features["count-work"] = stash[WORK_COUNTING] = counting
    return features


def _controller_features(
    config: pytest.Config,
    options: PluginSettings,
    metering: Metering,
    results: CaseResults,
    keeper: Keeper,
    routing: RoutingSection,
) -> dict[str, object]:
    """What only the controller runs: it keeps, shows and decides."""
    from .stopping import SIGTERM_STOP, SigtermStop

    stash, manager = config.stash, config.pluginmanager
    results.listeners.append(keeper.on_case)
    features: dict[str, object] = {}
    features["sigterm"] = stash[SIGTERM_STOP] = SigtermStop()
    best = BestConfiguration(options.slo, results.results)
    features["best-configuration"] = stash[BEST_CONFIGURATION] = best
    if manager.hasplugin("xdist"):
        features["xdist"] = Workers(options.order.seed or 0, results.add)
    if manager.hasplugin("benchmark"):  # pytest-benchmark: its tests get energy too
        from .benchmark_energy import BenchmarkEnergy

        features["pytest-benchmark"] = BenchmarkEnergy(metering, options.benchmark)
    if options.keep.report_path:
        from .html_report import HTML_REPORTING, HtmlReporting

        reporting = HtmlReporting(config, options.keep.report_path, keeper, routing)
        features["html-report"] = stash[HTML_REPORTING] = reporting
    paired = _paired_side(config, options, keeper)
    if paired is not None:
        from .ab_side import PAIRED_SIDE

        features["pairing"] = stash[PAIRED_SIDE] = paired
        results.listeners.append(lambda cases: paired.on_case(cases[-1]))
    if options.order.interleave > 1:
        from .interleaving import INTERLEAVING, Interleaving

        features["interleaving"] = stash[INTERLEAVING] = Interleaving(
            options.order.interleave,
            options.order.seed or 0,
            group=lambda item: case_labels(item).get("model"),
        )
    return features


def _paired_side(
    config: pytest.Config, options: PluginSettings, keeper: Keeper
) -> PairedSide | None:
    """This session as a side of ``llmenergy ab`` (which sets LLMENERGY_AB), after the
    checks of what cannot take turns with another session."""
    from ..pairing.channel import side_from_env

    try:
        found = side_from_env()
    except LLMEnergyError as exc:
        raise pytest.UsageError(str(exc)) from None
    if found is None:
        return None
    refused = [
        ("pytest-xdist's -n", bool(config.getoption("numprocesses", None))),
        ("--energy-interleave", options.order.interleave > 1),
        ("--llm-endpoint/--llm-serve (one server for both sides)", options.serve.active),
        ("torchrun", DISTRIBUTED in config.stash),
    ]
    for what, given in refused:
        if given:
            raise pytest.UsageError(
                f"llmenergy ab: {what} cannot take turns with the other side; leave it out"
            )
    from .ab_side import PairedSide

    return PairedSide(*found, keeper=keeper)


def _join_torchrun(config: pytest.Config, options: PluginSettings) -> Distributed | None:
    """Under torchrun: check the layout, give each rank its meter, join the group."""
    from ..distributed import detect
    from .torchrun import check_layout, rank_options

    try:
        env = detect()
    except ConfigError as exc:
        raise pytest.UsageError(f"torchrun: {exc}") from None
    if env is None or is_worker(config):
        if options.llm.parallel == "tp":
            raise pytest.UsageError(
                "--llm-parallel=tp: needs several ranks; start pytest with torchrun, e.g. "
                "torchrun --nproc-per-node=2 -m pytest benchmarks/ --llm-parallel=tp"
            )
        return None
    options, notes = check_layout(options, env)
    import torch

    return Distributed(config, env, rank_options(options, env, torch.cuda.device_count()), notes)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A test failed by a bad setting of the package's (a model name it cannot load, an
    option's value) says so in one line, not under hundreds of lines of a library's
    traceback: what was wrong and how to fix it is all the error's message."""
    report: pytest.TestReport = yield
    excinfo = call.excinfo
    if report.failed and excinfo is not None and excinfo.errisinstance(ConfigError):
        report.longrepr = f"{item.nodeid}: {one_line(str(excinfo.value), 1000)}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config) -> Any:
    """A session stopped by a bad setting of the package's (an option, its meter, a
    marker) says so in lines that fit the terminal, as its other lines do."""
    try:
        return (yield)
    except pytest.UsageError as exc:
        raise fitted_usage_error(exc) from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    """A few lines by default (what measures, what the session was asked to do beyond
    measuring, where the run goes); -v adds the details a newcomer need not read first:
    each backend's status and the meter's notes, the idle power, the repetition rule,
    the machine's speed, the counted work.  Only in a session that measures from its
    start; one that measures from the end of collection shows them there."""
    activity = config.stash.get(ACTIVITY, None)
    return _header(config) if activity is not None and activity.measuring else []


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """The header of a session that measures from the end of collection (a test uses
    the plugin's fixtures), below pytest's collection line."""
    activity = config.stash.get(ACTIVITY, None)
    return _header(config) if activity is not None and activity.shows_header(config) else []


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The header of a session that began to measure after collection (a test asked for
    the meter by name; under xdist, the controller's first measured case), above the
    plugin's sections."""
    config = terminalreporter.config
    activity = config.stash.get(ACTIVITY, None)
    if activity is not None and activity.shows_header(config):
        for line in _header(config):
            terminalreporter.write_line(line)


def _header(config: pytest.Config) -> list[str]:
    """The header's lines, fitted to the terminal."""
    from .ab_side import PAIRED_SIDE
    from .interleaving import INTERLEAVING

    stash = config.stash
    detailed = config.option.verbose > 0
    lines = [
        *stash[METERING].header(detailed),
        *xdist_header(config, stash[METERING].meter),
        *stash[CASE_RESULTS].header(),
        *(stash[CASE_PLAN].header() if detailed else []),
        *(stash[INTERLEAVING].header() if INTERLEAVING in stash else []),
        *(stash[PAIRED_SIDE].header() if PAIRED_SIDE in stash else []),
        *stash[KEEPER].header(detailed),
        *(stash[GPU_TUNING].header() if GPU_TUNING in stash else []),
        *(stash[DISTRIBUTED].header() if DISTRIBUTED in stash else []),
        *(stash[SERVING].header() if SERVING in stash else []),
        *_profiling_header(config),
        *(_counting_header(config) if detailed else []),
    ]
    if not detailed and lines:
        lines.append(DETAILS_HINT)
    return header_lines(config, lines)


# the default header's last line: where the rest went
DETAILS_HINT = "-v adds each backend's status, the meter's notes and the repetition rule"


def _profiling_header(config: pytest.Config) -> list[str]:
    from ..predict.plugin import OP_PROFILING

    return config.stash[OP_PROFILING].header() if OP_PROFILING in config.stash else []


def _counting_header(config: pytest.Config) -> list[str]:
    from ..predict.plugin import WORK_COUNTING

    counting = config.stash.get(WORK_COUNTING, None)
    return counting.header() if counting is not None else []


def _work_counter(config: pytest.Config) -> Any:
    """The case's work counter.  In a paired run (llmenergy ab) too, where asked for: it
    counts in the warm-up, or in an extra run after the case's last turn and before the
    side reports the case, while the other side waits (the coordinator lets one side run
    at a time), as the operator profile's does."""
    from ..predict.plugin import WORK_COUNTING

    counting = config.stash.get(WORK_COUNTING, None)
    return counting.counter() if counting is not None else None


def _counts_after_trials(config: pytest.Config) -> bool:
    """Whether a case without a warm-up runs once more to be counted (``on``)."""
    from ..predict.plugin import WORK_COUNTING

    counting = config.stash.get(WORK_COUNTING, None)
    return counting is not None and counting.after_trials


def _op_profiler(config: pytest.Config, labels: dict[str, str]) -> Any:
    from ..predict.plugin import OP_PROFILING

    profiling = config.stash.get(OP_PROFILING, None)
    return profiling.profiler_for(labels) if profiling is not None else None


# -- fixtures ----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def energy_meter(pytestconfig: pytest.Config) -> Iterator[Meter]:
    """The session's configured meter: ``with energy_meter.measure() as m: ...``."""
    meter = pytestconfig.stash[METERING].meter
    if meter is None:  # asked for by name: collection did not see it coming
        _wake(pytestconfig, "a test asked for energy_meter")
        meter = pytestconfig.stash[METERING].meter
    if meter is None:  # only if sessionstart did not run, e.g. under an unusual runner
        raise LLMEnergyError("the energy meter was not opened at session start")
    yield meter


@pytest.fixture
def energy_gpu_setting(request: pytest.FixtureRequest) -> GpuSetting | None:
    """The case's GPU setting (``--energy-gpu-power-limits``, ``--energy-gpu-clocks``),
    applied and read back before the case's warm-up; None without those options."""
    _wake(request.config, "a test asked for energy_gpu_setting")
    return setting_fixture(request)


@pytest.fixture
def energy_benchmark(
    request: pytest.FixtureRequest, energy_meter: Meter, energy_gpu_setting: GpuSetting | None
) -> EnergyBenchmark:
    """Repeat a target under the stopping rule and keep every trial:
    ``energy_benchmark(fn, *args, input_tokens=N, output_tokens=M)``."""
    from ..controller.benchmark import CaseFeatures, CaseIdentity, EnergyBenchmark
    from .ab_side import PAIRED_SIDE
    from .interleaving import INTERLEAVING
    from .progress import progress_writer

    config = request.config
    node = request.node
    controller = config.stash[CASE_PLAN].controller_for(node)
    gpu = config.stash.get(GPU_TUNING, None)
    interleaving = config.stash.get(INTERLEAVING, None)
    labels = config.stash[CASE_PLAN].labels_for(node)
    return EnergyBenchmark(
        energy_meter,
        controller,
        CaseIdentity(node.nodeid, node.name, labels),
        config.stash[CASE_RESULTS].add,
        CaseFeatures(
            progress=progress_writer(request, controller),
            background=(
                config.stash[METERING].background if controller.max_background is not None else None
            ),
            exclusive=config.stash[WORKER_SIDE].exclusive if WORKER_SIDE in config.stash else None,
            trial_probe=gpu.probe() if gpu is not None else None,
            op_profiler=_op_profiler(config, labels),
            work_counter=_work_counter(config),
            count_after_trials=_counts_after_trials(config),
            visits=interleaving.visits_for(node) if interleaving is not None else None,
            pacer=config.stash[PAIRED_SIDE].pacer_for(node.nodeid, energy_meter.resolution_s)
            if PAIRED_SIDE in config.stash
            else None,
            settle=gpu.settle if gpu is not None and gpu.thermal is not None else None,
            conversions=config.stash[CASE_RESULTS].settings.conversions,
            windows=DISTRIBUTED not in config.stash,
            busy=config.stash[BUSY_MACHINE].watch,
            not_measured=config.stash[BUSY_MACHINE].not_measured,
        ),
    )


@pytest.fixture(scope="session")
def llm_grid(pytestconfig: pytest.Config) -> Grid:
    """The cases ``--llm-grid``, ``--llm-model`` and the token options select."""
    return pytestconfig.stash[CASE_PLAN].llm.grid


def _check_metered(config: pytest.Config, loaded: Any) -> None:
    """A model spread over GPUs (``device_map="auto"``) must be metered on every one."""
    from ..llm.loader import occupied_gpus, unmetered_gpus

    meter = config.stash[METERING].meter
    if meter is None or not meter.domains:
        return
    missing = unmetered_gpus(occupied_gpus(loaded.model), meter.domains)
    if missing and any(name.startswith("gpu:") for name in meter.domains):
        on = ", ".join(f"cuda:{i}" for i in missing)
        raise LLMEnergyError(
            f"model {loaded.name!r} also runs on {on}, which the meter does not read; "
            "meter every GPU it occupies (--energy-gpus, or leave it unset for all)"
        )


@pytest.fixture(scope="session")
def llm_pool(pytestconfig: pytest.Config) -> Iterator[ModelPool]:
    """Loads models on first use and keeps one at a time: ``llm_pool.get("tiny-llama")``."""
    from ..llm.loader import ModelPool

    settings = pytestconfig.stash[CASE_PLAN].llm
    pool = ModelPool(
        dtype=settings.dtype,
        device=settings.device,
        trust_remote_code=settings.trust_remote_code,
        allow_beyond_context=settings.allow_beyond_context,
        parallel=settings.parallel if DISTRIBUTED in pytestconfig.stash else "none",
        on_load=lambda loaded: _check_metered(pytestconfig, loaded),
        inject_regression=settings.inject_regression,
        inject_work=settings.inject_work,
        kv_cache=settings.kv_cache,
        execution=pytestconfig.stash[CASE_PLAN].execution(),
    )
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def llm_server(pytestconfig: pytest.Config) -> ServerTarget | None:
    """The server the cases target (``--llm-endpoint`` or ``--llm-serve``), None without:
    ``llm_server.run(input_tokens, output_tokens, concurrency)`` is one measured burst."""
    serving = pytestconfig.stash.get(SERVING, None)
    return serving.target if serving is not None else None


# The plugin's fixtures: a test that uses one, directly or through another fixture, makes
# the session measure (activity.py); the grid's case fixtures do too.
PLUGIN_FIXTURES = frozenset(
    {"energy_meter", "energy_gpu_setting", "energy_benchmark", "llm_grid", "llm_pool", "llm_server"}
)
