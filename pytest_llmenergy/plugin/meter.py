"""The session's meter, opened at session start, and the header's meter lines.

An unknown or unavailable backend stops the session here, before collection, with one
line; never with one failure per case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from .. import values
from ..errors import ConfigError, LLMEnergyError, MeterUnavailable
from ..meters import (
    BUILTIN_BACKENDS,
    Meter,
    MeterFactory,
    MeterSettings,
    backend_names,
    open_meter,
    sample_interval_defaults,
)
from ..meters.gpu_meter import GpuMeter
from ..probes.background import BackgroundCpu
from ..probes.process_tree import ProcessTrees
from .option_rows import Option, Section
from .session import header_lines

# --energy-count-work's values: count in the warm-up only (the default), also in one
# more run where a case has no warm-up, or not at all
COUNT_WORK = ("warmup", "on", "off")
# --energy-gpus's words: every visible GPU, or the ones in use (the default)
EVERY_GPU, GPUS_IN_USE = "all", "used"


@dataclass(frozen=True)
class MeasureSettings:
    backend: str = "auto"
    idle_s: float = 0.0
    dist_timeout_s: float = 300.0  # under torchrun: how long a rank waits for the others
    profile_ops: bool = False  # an unmeasured torch.profiler run after each case's trials
    # each case's work counted in its warm-up run, unmeasured (predict.work_count): by
    # default ("warmup") and "on", which also counts a case without a warm-up in one more
    # run after its trials; what it costs, as measured, is in the option's help
    count_work: str = "warmup"


class Metering:
    """Owns the meter: which backend, its domains and methods, idle power."""

    def __init__(self, config: pytest.Config, settings: MeasureSettings, options: MeterSettings):
        self.config = config
        self.settings = settings
        self.options = options
        self.meter: Meter | None = None
        self.extra_backends: dict[str, MeterFactory] = {}
        self._background: BackgroundCpu | None = None

    @property
    def background(self) -> BackgroundCpu:
        """What the rest of the machine does: read around every trial (made on first use,
        so a session without energy cases does not pay for it)."""
        if self._background is None:
            # a server this session talks to is not "the rest of the machine"
            pids = self.options.attributed_pids
            self._background = BackgroundCpu(ProcessTrees(pids) if pids else None)
        return self._background

    # -- hooks ---------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.open()

    def header(self, detailed: bool = True) -> list[str]:
        """The session header's lines about the meter (the plugin orders the features'):
        what measures; ``detailed`` (-v) adds the meter's notes (each backend's status)
        and the idle power."""
        if self.meter is None:
            return []
        lines = [f"backend {self.settings.backend} -> {self.meter.describe()}"]
        if not detailed:
            return lines
        lines += [f"  {note}" for note in self.meter.notes]
        if self.meter.idle_power_w:
            idle = ", ".join(f"{d} {w:.2f} W" for d, w in self.meter.idle_power_w.items())
            lines.append(f"idle power over {self.settings.idle_s:g} s: {idle}")
        return lines

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """Name the GPUs the GPU meter reads once a test has run, when they changed: the
        header, written before any model loads, can only say how they are chosen."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        for meter in gpu_meters(self.meter):
            line = meter.news()
            if line is not None and reporter is not None:
                reporter.ensure_newline()
                for part in header_lines(self.config, [line]):  # fitted to the terminal
                    reporter.write_line(part, yellow="WARNING" in line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.meter is not None:
            self.meter.close()
            self.meter = None

    # -- the meter -----------------------------------------------------------------
    def _collect_backends(self) -> None:
        for mapping in self.config.hook.pytest_llmenergy_meters(config=self.config):
            for name, factory in (mapping or {}).items():
                if name in BUILTIN_BACKENDS:
                    raise pytest.UsageError(
                        f"a plugin tried to register energy backend {name!r}, which is built "
                        "in; choose another name"
                    )
                self.extra_backends[name] = factory

    def open(self) -> None:
        """Open the meter (and measure idle power); any problem is a usage error."""
        self._collect_backends()
        name = self.settings.backend
        if name not in backend_names(self.extra_backends):
            choices = ", ".join(backend_names(self.extra_backends))
            raise pytest.UsageError(
                f"--energy-backend={name}: unknown backend; choose one of: {choices}"
            )
        try:
            self.meter = open_meter(name, self.options, extra=self.extra_backends)
        except MeterUnavailable as exc:
            raise pytest.UsageError(f"--energy-backend={name}: {exc.reason}") from None
        except ConfigError as exc:
            raise pytest.UsageError(f"--energy-backend={name}: {exc}") from None
        if self.settings.idle_s > 0:
            try:
                self.meter.measure_idle(self.settings.idle_s)
            except LLMEnergyError as exc:
                raise pytest.UsageError(
                    f"--energy-idle: measuring idle power failed: {exc}"
                ) from None

    def record(self) -> dict[str, Any]:
        """What a run file says about the meter: each domain's method, and idle power."""
        assert self.meter is not None
        return {
            "backend": self.meter.backend,
            "requested": self.settings.backend,
            "identity": self.meter.identity(),
            "description": self.meter.describe(),
            "notes": list(self.meter.notes),
            "domains": {
                name: {"method": str(d.method), "counted": d.counted}
                for name, d in self.meter.domains.items()
            },
            "idle_power_w": dict(self.meter.idle_power_w),
            "idle_seconds": self.settings.idle_s,
        }


METERING = pytest.StashKey[Metering]()


def gpu_meters(meter: Meter | None) -> list[GpuMeter]:
    """The GPU meters in a session's meter: itself, the parts of ``auto``'s, the rank's
    own under torchrun."""
    if meter is None:
        return []
    if isinstance(meter, GpuMeter):
        return [meter]
    parts = [*getattr(meter, "meters", ()), *([meter.local] if hasattr(meter, "local") else [])]
    return [found for part in parts for found in gpu_meters(part)]


def gpu_list(text: str) -> tuple[int, ...] | str:
    """``--energy-gpus``: ``all``, ``used``, or comma-separated indices."""
    word = text.strip().lower()
    return word if word in (EVERY_GPU, GPUS_IN_USE) else values.indices(text)


def _every_gpu(given: dict[str, Any]) -> None:
    """``--energy-gpus=all`` or ``used`` is no list: the meter chooses by ``every_gpu``."""
    word = given.get("gpus")
    if isinstance(word, str):
        given["gpus"] = None
        given["every_gpu"] = word == EVERY_GPU


# -- options -----------------------------------------------------------------------------
def _backend_choices() -> list[str]:
    return [*BUILTIN_BACKENDS, "or one registered through the pytest_llmenergy_meters hook"]


MEASURE_OPTIONS = Section(
    "measure",
    "Measuring",
    MeasureSettings,
    (
        Option(
            "--energy-backend",
            "backend",
            values.text,
            "NAME",
            "energy meter: {choices}",
            choices=_backend_choices,
        ),
        Option(
            "--energy-idle",
            "idle_s",
            values.non_negative_seconds,
            "SECONDS",
            "measure idle power for SECONDS at session start and report net energy too",
        ),
        Option(
            "--energy-profile-ops",
            "profile_ops",
            values.switch,
            "on|off",
            "after each case's trials, run it once more under torch.profiler (unmeasured, so "
            "the profiler's overhead never enters a trial) and keep its operator trace with "
            "the case, for llmenergy calibrate",
            const="on",
        ),
        Option(
            "--energy-count-work",
            "count_work",
            values.choice(
                COUNT_WORK, {**dict.fromkeys(values.ON, "on"), **dict.fromkeys(values.OFF, "off")}
            ),
            "warmup|on|off",
            "count each case's work in its warm-up run, unmeasured: FLOPs, bytes and "
            "operator calls per token, by phase (figures flops_per_token, bytes_per_token, "
            "ops_per_token and their prefill and decode twins), exact and the same on every "
            "machine; not for servers.  warmup (the default): a case without a warm-up is not "
            "counted; counting slows the warm-up runs, outside the measured trials: up to "
            "10-20 % of a session's time (on 2 CPU cores the quick grid took 60-63 s against "
            "53-59 s with off, its counted warm-ups 9-12 s; a busy full grid's 573 s of 41 "
            "min: docs/evidence.md), the session's last lines say how long; on: such a case "
            "runs once more after its trials to be counted; off: nothing counted",
            const="on",
        ),
        Option(
            "--energy-dist-timeout",
            "dist_timeout_s",
            values.seconds,
            "SECONDS",
            "under torchrun: how long a rank waits for the others at a trial's start or end "
            "before it gives up, saves what was measured and names the silent rank",
        ),
    ),
)

METER_OPTIONS = Section(
    "meter",
    "The meter",
    MeterSettings,
    (
        Option(
            "--energy-gpus",
            "gpus",
            gpu_list,
            "LIST|all|used",
            "GPUs to measure, as indices among the CUDA-visible ones, e.g. 0,1; all: every "
            "visible GPU, whether it runs the session's work or idles; used: the GPUs in use, "
            "chosen as each window opens (those a model is placed on, else those where this "
            "session's processes hold a GPU context, else every visible one); the header, "
            "then a line as they change, names them",
            default_text="used",
        ),
        Option(
            "--energy-sample-interval",
            "sample_interval_s",
            values.seconds,
            "SECONDS",
            "seconds between power samples of sampling meters, e.g. 0.1 or 100ms",
            default_text=lambda: (
                "the backend's own: "
                + ", ".join(f"{s:g} s for {b}" for b, s in sample_interval_defaults().items())
            ),
        ),
        Option(
            "--energy-cpu-tdp",
            "cpu_tdp_w",
            values.watts,
            "WATTS",
            "CPU TDP in watts for the estimate meter",
            default_text="from the CPU model table",
        ),
    ),
    complete=_every_gpu,
)
