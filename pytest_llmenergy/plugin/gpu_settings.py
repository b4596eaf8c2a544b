"""GPU settings: power limits and locked SM clocks as axes of every energy case.

At session start: a state file left by a session killed outright is restored first
(and said so); with ``--energy-gpu-power-limits`` / ``--energy-gpu-clocks`` the axes are
resolved against what the GPUs allow, and the right to change them is checked, so a
missing permission or a value out of range is one line before anything runs.  Each case
applies its setting before its warm-up (the ``energy_gpu_setting`` fixture, which
``energy_benchmark`` asks for); the setting is read back and checked, and the GPUs'
temperature, SM clock and throttle reasons are read during every trial.  The originals
come back at session end, whatever ended it: failure, Ctrl-C, SIGTERM (and a state file
remains for SIGKILL).  At the end: the time-energy frontier table, JSON and figures.
"""

from __future__ import annotations

import atexit
import json
import platform
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .. import values
from ..conditions.control import GpuControl, GpuControlError, ReadBack, StateFile, recover
from ..conditions.isolation import MODES, describe, neighbours, own_roots
from ..conditions.settings import (
    CLOCK_EXAMPLES,
    GPU_SETTING_AXIS,
    POWER_EXAMPLES,
    AxisSpec,
    GpuSetting,
    axis_record,
    cross,
    parse_clocks,
    parse_power_limits,
    parse_slowdowns,
    resolve_clocks,
    resolve_power,
)
from ..conditions.telemetry import TrialTelemetry
from ..conditions.thermal import (
    GpuTemperatures,
    ThermalSettling,
    gpu_temperatures_reader,
    wait_summary,
)
from ..errors import ConfigError, LLMEnergyError
from ..gpu.device import VENDORS
from ..results import CaseResult, ThermalWait
from ..storage.store import NEW_FILE, AtomicFile
from ..tables import render
from .cases import BENCHMARK_FIXTURE
from .option_rows import Option, Section
from .session import header_lines

SECTION = "llmenergy: GPU settings and the time-energy frontier"
SETTING_FIXTURE = "energy_gpu_setting"
DEFAULT_THERMAL_MAX_WAIT_S = 120.0


@dataclass(frozen=True)
class GpuSettings:
    """GPU settings as benchmark axes, the telemetry per trial, and the frontier."""

    power_limits: AxisSpec = field(default_factory=AxisSpec)
    clocks: AxisSpec = field(default_factory=AxisSpec)
    telemetry: bool = False  # read the GPUs during every trial even without the axes
    max_slowdowns: tuple[float, ...] = (0.0, 0.05)
    frontier_json: str | None = None
    # each case waits until every GPU is at most this much above its reference (None: off)
    thermal_tolerance_c: float | None = None
    thermal_max_wait_s: float = DEFAULT_THERMAL_MAX_WAIT_S
    isolation: str = "warn"  # other processes on the measured GPUs: warn, error or off

    @property
    def sweeping(self) -> bool:
        return bool(self.power_limits or self.clocks)


class GpuTuning:
    """Owns the GPUs' settings for the session: the axes, applying, telemetry, restoring,
    and the frontier at the end."""

    def __init__(
        self,
        config: pytest.Config,
        options: GpuSettings,
        gpus: tuple[int, ...] | None,
        results: list[CaseResult],
        lam: float,
        plots_dir: str | None,
        state: StateFile | None = None,
        system: Callable[[], str] = lambda: "",
        backend: str = "auto",
        attributed_pids: tuple[int, ...] = (),
    ) -> None:
        self.config = config
        self.options = options
        self.gpus = gpus
        self.results = results
        self.lam = lam
        self.plots_dir = plots_dir
        self.state = state or StateFile()
        self.system = system  # the hardware key when the run is kept, for the policy
        self.backend = backend  # the energy backend: whose vendor's GPUs are changed
        self.attributed_pids = attributed_pids  # servers measured: their GPU use is ours
        self.control: GpuControl | None = None
        self.settings: list[GpuSetting] = []
        self.notes: list[str] = []
        self.restored: list[str] = []  # what was given back, read back, for the summary
        self._previous_sigterm: Any = None
        self.temperatures: GpuTemperatures | None = None
        self.thermal: ThermalSettling | None = None  # with --energy-thermal-tolerance
        self._lock = threading.RLock()  # the SIGTERM handler may restore mid-apply

    # -- session start -------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._recover()
        self._open_thermal()
        changes = self.options.sweeping or self.options.telemetry
        if not (changes or self._looks()):
            return
        if changes and getattr(self.config.option, "numprocesses", None):
            raise pytest.UsageError(
                "--energy-gpu-power-limits/--energy-gpu-clocks change the whole GPU: they "
                "cannot run under pytest-xdist; drop -n"
            )
        try:
            self.control = GpuControl(self.state, self.gpus, backend=self.backend)
            if self.options.sweeping:
                self._resolve()
        except (GpuControlError, ConfigError) as exc:
            self._close()
            if not changes:  # only looking for neighbours: no GPU library, no GPU to share
                return
            raise pytest.UsageError(str(exc)) from None
        self._check_isolation()
        if self.options.sweeping and threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        atexit.register(self._restore_quietly)

    def _open_thermal(self) -> None:
        """--energy-thermal-tolerance reads the GPUs' temperature: one line at start
        where it cannot, or where the cases do not run one at a time in this process."""
        tolerance_c = self.options.thermal_tolerance_c
        if tolerance_c is None or self.config.option.collectonly:
            return
        if getattr(self.config.option, "numprocesses", None):
            raise pytest.UsageError(
                "--energy-thermal-tolerance waits for the GPUs between cases, which "
                "pytest-xdist's workers run at once: drop -n"
            )
        try:
            self.temperatures = gpu_temperatures_reader(self.gpus, self.backend)
        except ConfigError as exc:
            raise pytest.UsageError(f"--energy-thermal-tolerance: {exc}") from None
        self.thermal = ThermalSettling(
            self.temperatures, tolerance_c, self.options.thermal_max_wait_s
        )
        now = "/".join("?" if t is None else f"{t:.0f}" for t in self.temperatures())
        self.notes.append(
            f"thermal: every case waits until each GPU is at most {tolerance_c:g} °C above "
            f"its reference (the previous case's start, never above the first's), at most "
            f"{self.options.thermal_max_wait_s:g} s; read through {self.temperatures.source}, "
            f"{now} °C now"
        )

    def settle(self, progress: Callable[[str], None] | None = None) -> ThermalWait | None:
        """Before a case's warm-up: wait for a steady thermal state (None: not asked)."""
        if self.thermal is None:
            return None
        return self.thermal.settle(progress)

    def _looks(self) -> bool:
        """Whether to look for other processes on the GPUs: on, and the energy measured
        is (or may be) a GPU's."""
        gpu_backends = {"auto", *(v.backend for v in VENDORS)}
        return self.options.isolation != "off" and self.backend in gpu_backends

    def _check_isolation(self) -> None:
        """Other processes on the measured GPUs at start: a warning in the header, or
        (``error``) the session stops here, naming them."""
        if self.control is None or not self._looks():
            return
        found = neighbours(self.control.devices, own_roots(self.attributed_pids))
        if not found:
            return
        text = describe(found)
        # the controller already decided (the session's own role: a pytester session
        # run inside an xdist worker inherits its environment, not its role)
        worker = hasattr(self.config, "workerinput")
        if self.options.isolation == "error" and not worker:
            self._close()
            raise pytest.UsageError(
                f"--energy-gpu-isolation=error: other processes use the measured GPUs: {text}; "
                "stop them, or pass --energy-gpu-isolation=warn to measure anyway (the trials "
                "they overlap are marked disturbed and repeated)"
            )
        self.notes.append(
            f"WARNING: other processes use the measured GPUs: {text}; the trials they overlap "
            "are marked disturbed and repeated (--energy-gpu-isolation=error refuses to start)"
        )

    def recover_now(self) -> list[str]:
        """What a killed session left changed, given back now, in any session, measuring
        or not (hardware state is restored whatever runs next): the lines that say so."""
        before = len(self.restored)
        self._recover()
        return self.restored[before:]

    def _recover(self) -> None:
        """A session killed outright left its GPUs changed: give them back now."""
        if not self.state.path.exists():
            return
        try:
            found = recover(self.state)
        except (GpuControlError, ConfigError) as exc:
            if self.options.sweeping:
                raise pytest.UsageError(str(exc)) from None
            self.notes.append(f"WARNING: {exc}")
            return
        if found is None:
            return
        data, back = found
        line = (
            f"restored GPU settings a session left changed (pid {data.get('pid')}, started "
            f"{data.get('started')}, killed before it could): "
            + "; ".join(b.describe() for b in back)
        )
        self.notes.append(line)  # in the header
        self.restored.append(line)  # and in the summary, which -q does not hide

    def _resolve(self) -> None:
        assert self.control is not None
        limits = self.control.limits()
        power = clocks = None
        if self.options.power_limits:
            flag = "--energy-gpu-power-limits"
            power = resolve_power(self.options.power_limits, limits, flag)
        if self.options.clocks:
            why_not = self.control.library.no_clock_lock
            if why_not is not None:
                raise ConfigError(f"--energy-gpu-clocks: {why_not}")
            clocks, snapped = resolve_clocks(self.options.clocks, limits, "--energy-gpu-clocks")
            self.notes += snapped
        self.control.check_permission()
        first = limits[0]
        self.settings = cross(power, clocks, first.default_power_w, first.max_power_w)
        default = next(s.id for s in self.settings if s.default)
        self.notes.append(
            f"GPU settings: {len(self.settings)} per case on "
            + ", ".join(f"{g.domain} {g.name}" for g in limits)
            + f": {', '.join(s.id for s in self.settings)} ({default} is the GPU's default, "
            f"the reference of the energy bloat); restored at the end (state in {self.state.path})"
        )

    def header(self) -> list[str]:
        return list(self.notes)

    # -- cases -------------------------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """After the grid's parametrization, so ids read ``tiny-llama-in8-out32-pl250W``."""
        names = metafunc.fixturenames
        if self.settings and SETTING_FIXTURE in names and BENCHMARK_FIXTURE in names:
            ids = [GPU_SETTING_AXIS.id_of(s) for s in self.settings]
            metafunc.parametrize(SETTING_FIXTURE, self.settings, ids=ids, indirect=True)

    def apply(self, setting: GpuSetting) -> list[ReadBack]:
        """Before the case's warm-up; a GPU that does not take it fails the case."""
        assert self.control is not None
        with self._lock:
            return self.control.apply(setting)

    def probe(self) -> TrialTelemetry | None:
        """What a case reads around each trial: clocks and temperature with the GPU axes or
        telemetry, and other processes on the GPUs unless isolation is off."""
        if self.control is None:
            return None
        clocks = self.options.sweeping or self.options.telemetry
        roots = own_roots(self.attributed_pids) if self._looks() else None
        if roots is None and not clocks:
            return None
        return TrialTelemetry(self.control.devices, roots=roots, clocks=clocks)

    # -- giving back ----------------------------------------------------------------------------
    def restore(self, why: str) -> list[str]:
        """The originals again; lines saying what was read back."""
        control = self.control
        if control is None or not control.changed:
            return []
        with self._lock:
            back = control.restore()
        lines = [f"GPU settings restored ({why}): " + "; ".join(b.describe() for b in back)]
        self.restored += lines
        return lines

    def _restore_quietly(self) -> None:
        try:
            for line in self.restore("at exit"):
                sys.stderr.write(f"llmenergy: {line}\n")
        except LLMEnergyError as exc:
            sys.stderr.write(f"llmenergy: {exc}\n")

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """Give the GPUs back first, then stop the session as Ctrl-C does (what was
        measured is kept)."""
        try:
            for line in self.restore("SIGTERM"):
                sys.stderr.write(f"llmenergy: {line}\n")
        except LLMEnergyError as exc:
            sys.stderr.write(f"llmenergy: {exc}\n")
        raise KeyboardInterrupt("SIGTERM: GPU settings restored, session stopped")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        try:
            self.restore("session end")
        except GpuControlError as exc:
            self.restored.append(f"ERROR: {exc}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._restore_quietly()
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        atexit.unregister(self._restore_quietly)
        self._close()

    def _close(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.temperatures is not None:
            self.temperatures.close()
            self.temperatures = None

    # -- the end --------------------------------------------------------------------------------
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        from ..frontier import frontier_json, frontier_table, frontiers

        items = frontiers(self.results, max_slowdowns=self.options.max_slowdowns, lam=self.lam)
        throttled = [r for r in self.results if r.throttled]
        waits = [r.thermal for r in self.results if r.thermal is not None]
        if not (items or self.restored or throttled or waits):
            return
        terminalreporter.section(SECTION)
        config = terminalreporter.config
        if waits:
            line = wait_summary(waits, self.options.thermal_max_wait_s)
            gave_up = any(w.gave_up for w in waits)
            for part in header_lines(config, [line]):
                terminalreporter.write_line(part, yellow=gave_up)
        if items:
            width = config.get_terminal_writer().fullwidth
            for line in render([frontier_table(items)], "table", width=width).splitlines():
                terminalreporter.write_line(line)
        if throttled:
            n = sum(len(r.throttled) for r in throttled)
            why = sorted({t.gpu.throttled for r in throttled for t in r.throttled if t.gpu})
            line = (
                f"{n} trial(s) of {len(throttled)} case(s) ran throttled ({'; '.join(why)}): "
                "kept in the run, left out of the figures and repeated"
            )
            for part in header_lines(config, [line]):
                terminalreporter.write_line(part, yellow=True)
        for line in self.restored:
            for part in header_lines(config, [line]):
                terminalreporter.write_line(part, red=line.startswith("ERROR"))
        system = self.system() or platform.node() or "this machine"
        if items and self.options.frontier_json:
            path = Path(self.options.frontier_json)
            try:  # whole or not at all, and never over a file that appeared meanwhile
                AtomicFile(path).write(json.dumps(frontier_json(items, system), indent=1))
                terminalreporter.write_line(f"llmenergy: frontier written to {path}")
            except OSError as exc:
                terminalreporter.write_line(
                    f"llmenergy: --energy-frontier-json={path}: {exc.strerror or exc}", red=True
                )
        if items and self.plots_dir:
            from ..frontier.frontier_plots import write_frontier_plots
            from ..plotting import PlotError

            try:
                written = write_frontier_plots(items, Path(self.plots_dir))
            except PlotError as exc:
                terminalreporter.write_line(f"llmenergy: --energy-plots: {exc}", red=True)
            else:
                for p in written:
                    terminalreporter.write_line(f"llmenergy: frontier figure {p}")


def setting_fixture(request: pytest.FixtureRequest) -> GpuSetting | None:
    """The body of the ``energy_gpu_setting`` fixture: apply this case's setting."""
    setting: GpuSetting | None = getattr(request, "param", None)
    feature = request.config.stash.get(GPU_TUNING, None)
    if setting is not None and feature is not None:
        try:
            feature.apply(setting)
        except GpuControlError as exc:
            pytest.fail(str(exc), pytrace=False)
    return setting


GPU_TUNING = pytest.StashKey[GpuTuning]()
ProbeFactory = Callable[[], TrialTelemetry | None]


# -- options -----------------------------------------------------------------------------
GPU_OPTIONS = Section(
    "gpu",
    "GPU settings",
    GpuSettings,
    (
        Option(
            "--energy-gpu-power-limits",
            "power_limits",
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
            "clocks",
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
            "telemetry",
            values.switch,
            "on|off",
            "record the GPUs' temperature, SM clock and throttle reasons during every trial "
            "(always on with the GPU setting axes)",
            const="on",
        ),
        Option(
            "--energy-max-slowdown",
            "max_slowdowns",
            parse_slowdowns,
            "LIST",
            "report the energy bloat at the GPU's default: the energy the cheapest setting at "
            "most this much slower saves, e.g. 0%,5%",
            default_text="0%,5%",
            multiple=True,
        ),
        Option(
            "--energy-thermal-tolerance",
            "thermal_tolerance_c",
            values.celsius_difference,
            "C",
            "before each case, wait until every GPU is at most C °C above the previous "
            "case's start temperature (never above the first case's), so every case starts "
            "from the same thermal state; the waits are kept in the run and summed at the "
            "end (reads the GPUs through NVML or amdsmi)",
            default_text="off: cases start at once",
        ),
        Option(
            "--energy-thermal-max-wait",
            "thermal_max_wait_s",
            values.seconds,
            "SECONDS",
            "the longest a case waits for the GPUs to cool (--energy-thermal-tolerance); "
            "it then starts anyway, and the run and the summary say so",
            default_text=f"{DEFAULT_THERMAL_MAX_WAIT_S:g} s",
        ),
        Option(
            "--energy-frontier-json",
            "frontier_json",
            values.text,
            "PATH",
            "also write the time-energy frontier and the per-token-range setting policy to "
            "PATH (must not exist yet)",
            writes=NEW_FILE,
        ),
        Option(
            "--energy-gpu-isolation",
            "isolation",
            values.choice(MODES),
            "warn|error|off",
            "other processes on the measured GPUs (not this session's): warn names them at "
            "start, error stops the session there, off does not look; unless off, the trials "
            "they overlap are marked disturbed and repeated, and the run keeps who was there",
            default_text="warn",
        ),
    ),
)
