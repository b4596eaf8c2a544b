"""The run's state: options, meter, case order, per-test repetition settings, results.

Created in ``pytest_configure`` and kept in ``config.stash``; the plugin's hooks and
fixtures only talk to this object.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .compare import Comparison, compare_cases
from .controller.order import shuffle_in_place
from .controller.results import CaseResult
from .controller.rule import ControllerOptions, with_overrides
from .errors import ConfigError, LLMEnergyError, MeterUnavailable
from .llm.grid import LLMCase
from .meters import BUILTIN_BACKENDS, Meter, MeterFactory, backend_names, open_meter
from .options import PluginOptions
from .storage.recorder import RunRecorder, autosave_name, check_json_target, new_run
from .storage.runfile import Run, RunFileError, load
from .storage.store import Storage

if TYPE_CHECKING:
    from .routing.decide import Routed

MARKER = "llmenergy"
BENCHMARK_FIXTURE = "energy_benchmark"


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


class EnergySession:
    """Owns the run's measuring state: the options, the meter, the idle baseline, results."""

    def __init__(self, config: pytest.Config, options: PluginOptions) -> None:
        self.config = config
        self.options = options
        self.meter: Meter | None = None
        self.extra_backends: dict[str, MeterFactory] = {}
        self.results: list[CaseResult] = []
        self.shuffled = False
        self._controllers: dict[str, ControllerOptions] = {}
        # keeping: where this run goes, and what it is compared with
        self.hardware = ""
        self.recorder: RunRecorder | None = None
        self.baseline: Run | None = None
        self.baseline_note = ""
        self.comparison: Comparison | None = None
        # deciding and showing: the routing section and the figures, made in finish()
        self.routed: list[Routed] = []
        self.routing_note = ""
        self.plots: list[Path] = []
        self.plots_note = ""

    # -- the meter -----------------------------------------------------------------
    def collect_backends(self) -> None:
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
        self.collect_backends()
        name = self.options.backend
        if name not in backend_names(self.extra_backends):
            choices = ", ".join(backend_names(self.extra_backends))
            raise pytest.UsageError(
                f"--energy-backend={name}: unknown backend; choose one of: {choices}"
            )
        try:
            self.meter = open_meter(name, self.options.meter, extra=self.extra_backends)
        except MeterUnavailable as exc:
            raise pytest.UsageError(f"--energy-backend={name}: {exc.reason}") from None
        except ConfigError as exc:
            raise pytest.UsageError(f"--energy-backend={name}: {exc}") from None
        if self.options.idle_s > 0:
            try:
                self.meter.measure_idle(self.options.idle_s)
            except LLMEnergyError as exc:
                raise pytest.UsageError(
                    f"--energy-idle: measuring idle power failed: {exc}"
                ) from None
        self._open_keeping()
        if self.options.route.plots_dir:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise pytest.UsageError(
                    "--energy-plots: matplotlib is not installed: "
                    "pip install 'pytest-llmenergy[plots]'"
                ) from None

    # -- saving and comparing ------------------------------------------------------
    def _open_keeping(self) -> None:
        """Find the baseline and claim the run file now, so a bad path fails at start."""
        keep = self.options.keep
        if not (keep.saving or keep.json_path or keep.compare):
            return
        from .storage.machine import commit_info, hardware_key, machine_info

        assert self.meter is not None
        machine = machine_info()
        self.hardware = hardware_key(machine, self.meter.backend)
        storage = Storage(keep.storage)
        if keep.compare:
            self._load_baseline(storage, keep.compare)
        if self.config.option.collectonly or not (keep.saving or keep.json_path):
            return
        commit = commit_info(self.config.rootpath)
        header = new_run(
            name=keep.save or autosave_name(commit),
            hardware=self.hardware,
            machine=machine,
            commit=commit,
            options=self.options,
            meter=self.meter_record(),
            command=[str(a) for a in self.config.invocation_params.args],
        )
        try:
            json_path = check_json_target(keep.json_path) if keep.json_path else None
        except ConfigError as exc:
            raise pytest.UsageError(f"--energy-json: {exc}") from None
        try:
            self.recorder = RunRecorder(
                header, storage=storage if keep.saving else None, json_path=json_path
            )
        except OSError as exc:
            raise pytest.UsageError(
                f"--energy-storage={keep.storage}: cannot save runs there: {exc.strerror or exc}"
            ) from None

    def _load_baseline(self, storage: Storage, spec: str) -> None:
        if spec == "latest":
            latest = storage.latest(self.hardware)
            if latest is None:
                self.baseline_note = (
                    f"nothing to compare with: no run saved in {storage.root / self.hardware} "
                    "yet (save one with --energy-autosave or --energy-save=NAME)"
                )
                return
            path = latest.path
        else:
            try:
                path = storage.resolve(spec, hardware=self.hardware)
            except ConfigError as exc:
                raise pytest.UsageError(f"--energy-compare={spec}: {exc}") from None
        try:
            self.baseline = load(path)
        except RunFileError as exc:
            raise pytest.UsageError(f"--energy-compare: {exc}") from None

    def meter_record(self) -> dict[str, Any]:
        """What a run file says about the meter: each domain's method, and idle power."""
        assert self.meter is not None
        return {
            "backend": self.meter.backend,
            "requested": self.options.backend,
            "description": self.meter.describe(),
            "notes": list(self.meter.notes),
            "domains": {
                name: {"method": str(d.method), "counted": d.counted}
                for name, d in self.meter.domains.items()
            },
            "idle_power_w": dict(self.meter.idle_power_w),
            "idle_seconds": self.options.idle_s,
        }

    def finish(self, exitstatus: int) -> bool:
        """Compare, then write the run's last state; True when an energy gate failed."""
        keep = self.options.keep
        failed = False
        if self.baseline is not None and self.results:
            self.comparison = compare_cases(
                self.baseline.cases,
                self.results,
                gates=keep.gates,
                confidence=self.options.controller.confidence,
                baseline_label=self.baseline.label,
                current_label="this run",
            )
            failed = self.comparison.failed
            if self.baseline.hardware != self.hardware:
                self._route(self.baseline)
        if self.options.route.plots_dir and self.results:
            self._plot()
        if self.recorder is not None:
            final = int(exitstatus) or (int(pytest.ExitCode.TESTS_FAILED) if failed else 0)
            self.recorder.finish(
                self.results,
                interrupted=exitstatus == pytest.ExitCode.INTERRUPTED,
                exit_status=final,
            )
        return failed

    def _route(self, baseline: Run) -> None:
        """Two systems measured: which queries should go to which, and what that saves.
        A question without an answer (no model in common, one size only) is a note."""
        from .routing.decide import RouteSettings, route
        from .routing.profile import profiles_from_cases, profiles_from_run
        from .routing.workload import alpaca

        settings = self.options.route
        try:
            profiles = profiles_from_run(baseline) + profiles_from_cases(
                self.results, self.hardware, "this run"
            )
            workload = settings.workload or alpaca()
            self.routed = route(
                profiles,
                workload,
                RouteSettings(
                    by=settings.by, lam=settings.lam, systems=(self.hardware, baseline.hardware)
                ),
            )
        except LLMEnergyError as exc:
            self.routing_note = f"routing skipped: {exc}"

    def _plot(self) -> None:
        from .routing.fit import build_model
        from .routing.plots import write_profile_plots, write_routing_plots
        from .routing.profile import profiles_from_cases

        out = Path(self.options.route.plots_dir or ".")
        try:
            if self.routed:
                for r in self.routed:
                    self.plots += write_profile_plots(r.router.models, out)
                    self.plots += write_routing_plots(
                        r.router, out, lams=[d.policy.lam for d in r.sweep]
                    )
            else:
                profiles = profiles_from_cases(self.results, self.hardware or "this run", "")
                self.plots += write_profile_plots([build_model(p) for p in profiles], out)
        except LLMEnergyError as exc:
            self.plots_note = f"figures not (all) written: {exc}"

    @property
    def saved_paths(self) -> list[Path]:
        return self.recorder.written_paths if self.recorder is not None else []

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()
            self.meter = None

    # -- the cases -----------------------------------------------------------------
    def prepare(self, items: list[pytest.Item]) -> None:
        """Check every test's marker now (not mid-run), then put the cases in order."""
        for item in items:
            marker = item.get_closest_marker(MARKER)
            if marker is None:
                continue
            if marker.args:
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.{MARKER} takes keyword arguments only"
                )
            try:
                self._controllers[item.nodeid] = with_overrides(
                    self.options.controller, marker.kwargs
                )
            except ConfigError as exc:
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER}: {exc}") from None
        if not self.config.option.collectonly:
            self._check_models(items)
        mode = self.options.shuffle
        cases = [item for item in items if uses_energy_benchmark(item)]
        if mode == "on" or (mode == "auto" and cases):
            self.shuffled = True
            shuffle_in_place(
                items,
                self.options.seed,
                selected=uses_energy_benchmark,
                group=lambda item: case_labels(item).get("model"),
            )

    def _check_models(self, items: list[pytest.Item]) -> None:
        """A model that cannot load stops the session now, not once per case."""
        models = sorted({case_labels(i).get("model", "") for i in items if is_llm_case(i)})
        if not models:
            return
        from .llm.loader import check_model

        llm = self.options.llm
        for model in models:
            try:
                check_model(
                    model,
                    dtype=llm.dtype,
                    device=llm.device,
                    trust_remote_code=llm.trust_remote_code,
                )
            except ConfigError as exc:
                raise pytest.UsageError(f"--llm-model={model}: {exc}") from None

    def controller_for(self, item: pytest.Item) -> ControllerOptions:
        return self._controllers.get(item.nodeid, self.options.controller)

    def record(self, result: CaseResult) -> None:
        self.results.append(result)
        if self.recorder is not None:
            self.recorder.add(self.results)

    # -- what the header says ------------------------------------------------------
    def header_lines(self) -> list[str]:
        if self.meter is None:
            return []
        lines = [f"llmenergy: backend {self.options.backend} -> {self.meter.describe()}"]
        lines += [f"llmenergy:   {note}" for note in self.meter.notes]
        if self.meter.idle_power_w:
            idle = ", ".join(f"{d} {w:.2f} W" for d, w in self.meter.idle_power_w.items())
            lines.append(f"llmenergy: idle power over {self.options.idle_s:g} s: {idle}")
        lines.append(f"llmenergy: repetition: {self.options.controller.describe()}")
        if self.recorder is not None:
            where = ", ".join(str(p) for p in self.recorder.paths)
            lines.append(f"llmenergy: saving this run to {where}")
        if self.baseline is not None:
            lines.append(f"llmenergy: comparing with {self.baseline.path}")
        return lines

    def collection_lines(self, n_llm_cases: int) -> list[str]:
        """After collection, when it is known what will run and in which order."""
        lines = []
        if n_llm_cases:
            lines.append(f"llmenergy: {self.options.llm.grid.describe()}")
        if self.shuffled:
            seed = self.options.seed
            lines.append(
                f"llmenergy: cases in random order, seed {seed} (repeat with "
                f"--energy-seed={seed}; --energy-shuffle=off keeps the file order)"
            )
        return lines
