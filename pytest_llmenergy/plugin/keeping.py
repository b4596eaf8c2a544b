"""Keeping: the run file written after every case, the baseline, the comparison and gates.

At session start the baseline is loaded and the run file claimed, so a bad path or run
stops the session before anything is measured.  After every case the file is rewritten
atomically; at the end the comparison is made, gates decide, and the file gets its
final status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .. import values
from ..compare import (
    GATE_EXAMPLES,
    CompareOptions,
    Comparison,
    Gate,
    compare_cases,
    other_hardware,
    parse_gates,
    unlike_meters,
)
from ..comparison_text import comparison_table, evidence_line, verdict_line, why_lines
from ..errors import ConfigError
from ..export import EXPORT_EXAMPLES, EXPORT_FORMATS, export_text, parse_exports
from ..probes.reference import reference_s, speed_drift
from ..results import CaseResult, busy_guard
from ..sessions import DEFAULT_SESSION_NOISE, NoiseEstimate, parse_session_noise
from ..storage.recorder import RunRecorder, autosave_name, new_run
from ..storage.runfile import COMPLETE, Run, RunFileError, load
from ..storage.store import (
    DEFAULT_STORAGE,
    DERIVED_FILE,
    NEW_FILE,
    AtomicFile,
    Storage,
    check_run_name,
)
from ..tables import render
from .meter import Metering
from .option_rows import Option, Section
from .session import fail_session, fail_writes, header_lines

# What pytest's last line counts a failed gate as: ``2 passed, 1 energy gate failed``.
GATE_FAILED_OUTCOME = "energy gate failed"


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


class Keeper:
    """Owns the run's record on disk and the comparison with a baseline."""

    def __init__(
        self,
        config: pytest.Config,
        settings: KeepSettings,
        metering: Metering,
        results: list[CaseResult],
        options_record: Mapping[str, Any],
        confidence: float,
    ) -> None:
        self.config = config
        self.settings = settings
        self.options_record = options_record  # every option's value, for the run file
        self.confidence = confidence  # of the cases' intervals, for the comparison
        self.metering = metering
        self.results = results  # the session's list, shared with CaseResults
        self.hardware = ""
        self.recorder: RunRecorder | None = None
        self.baseline: Run | None = None
        self.baseline_note = ""
        self.comparison: Comparison | None = None
        self.exported: list[tuple[str, Path]] = []
        self.header_run: Run | None = None  # the run's record without cases, for the report
        self.export_errors: list[str] = []
        self.reference_start_s: float | None = None  # the machine's speed at start

    @property
    def active(self) -> bool:
        return self.settings.active

    @property
    def saved_paths(self) -> list[Path]:
        return self.recorder.written_paths if self.recorder is not None else []

    # -- hooks ---------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """After the meter is open (Metering is registered later, so it runs first)."""
        if self.active:
            self._open()

    def header(self, detailed: bool = True) -> list[str]:
        """Where the run goes and what it is compared with; ``detailed`` (-v) adds the
        machine's speed."""
        lines = []
        if self.recorder is not None:
            lines.append(f"saving this run to {', '.join(str(p) for p in self.recorder.paths)}")
        if self.baseline is not None:
            lines.append(f"comparing with {self.baseline.path}")
        if self.reference_start_s is not None and detailed:
            lines.append(
                f"machine speed: a reference workload takes {self.reference_start_s * 1e3:.1f}"
                " ms of CPU (a difference from the baseline's beyond the reference's own noise "
                "widens the gates)"
            )
        return lines

    def on_case(self, results: list[CaseResult]) -> None:
        if self.recorder is not None:
            self.recorder.add(results)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        failed = self.finish(exitstatus)
        unwritten = len(self.export_errors) + (
            len(self.recorder.errors) if self.recorder is not None else 0
        )
        if failed:
            fail_session(session, self._gate_failure(), GATE_FAILED_OUTCOME)
        fail_writes(session, unwritten)

    def _gate_failure(self) -> str:
        """The failed gate in a few words (the comparison above names every case)."""
        c = self.comparison
        assert c is not None
        gates = ", ".join(str(g) for g in c.gates)
        if c.compared_nothing:
            return f"energy gate FAILED ({gates}): nothing compared"
        if c.failed:
            cases = len({d.name for d in c.failures})
            return f"energy gate FAILED ({gates}): {cases} case(s) significantly worse"
        if c.only_in_baseline or c.only_in_current:
            return f"energy gate FAILED ({gates}): a case on one side only (--energy-strict)"
        return f"energy gate inconclusive ({gates}), and --energy-strict fails on that"

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        def write(line: str, **markup: bool) -> None:  # one logical line, fitted
            for part in header_lines(self.config, [line]):
                terminalreporter.write_line(part, **markup)

        if self.recorder is not None:  # what each file holds, or what it does not
            for line, failed in self.recorder.summary():
                write(line, red=failed)
        for fmt, path in self.exported:
            write(f"exported {len(self.results)} case(s) as {fmt} to {path}")
        for error in self.export_errors:
            write(error, red=True)
        if self.recorder is not None and not self.results:
            write("no energy benchmark case ran; no run saved")
        if self.baseline_note:
            write(self.baseline_note, yellow=True)
        comparison = self.comparison
        if comparison is None:
            return
        width = terminalreporter.config.get_terminal_writer().fullwidth
        title = f"llmenergy: compared with {comparison.baseline_label}"
        terminalreporter.section(title if len(title) < width - 10 else "llmenergy: compared")
        baseline = self.baseline
        if baseline is not None and baseline.hardware != self.hardware:
            write(f"the baseline ran on other hardware: {baseline.hardware}")
        for line in render([comparison_table(comparison)], "table", width=width).splitlines():
            terminalreporter.write_line(line)
        failed = comparison.fails(self.settings.strict)
        unsure = comparison.unsure
        write(
            verdict_line(comparison, self.settings.strict),
            red=failed,
            yellow=unsure and not failed,
            green=not (failed or unsure),
            bold=True,
        )
        if comparison.gates and comparison.deltas:
            write(evidence_line(comparison))
        for line in why_lines(comparison):
            write(line, red=True)

    # -- saving and comparing ------------------------------------------------------
    def _open(self) -> None:
        """Find the baseline and claim the run file now, so a bad path fails at start."""
        from ..storage.machine import commit_info, hardware_key, machine_info

        meter = self.metering.meter
        assert meter is not None
        keep = self.settings
        machine = machine_info()
        self.reference_start_s = reference_s()
        machine[SPEED_KEY] = self.reference_start_s
        machine["threads"] = thread_settings()
        self.hardware = hardware_key(machine, meter.kind)
        storage = Storage(keep.storage)
        if keep.compare:
            self._load_baseline(storage, keep.compare)
        if self.config.option.collectonly or not (
            keep.saving or keep.json_path or keep.report_path
        ):
            return
        commit = commit_info(self.config.rootpath, own=[keep.storage])
        header = new_run(
            name=keep.save or autosave_name(commit),
            hardware=self.hardware,
            machine=machine,
            commit=commit,
            options=dict(self.options_record),
            meter=self.metering.record(),
            command=[str(a) for a in self.config.invocation_params.args],
        )
        self.header_run = header
        if not (keep.saving or keep.json_path):
            return
        json_path = Path(keep.json_path) if keep.json_path else None  # checked at configure
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
            self._load_latest(storage)
            return
        try:
            path = storage.resolve(spec, hardware=self.hardware)
        except ConfigError as exc:
            raise pytest.UsageError(f"{values.shown(f'--energy-compare={spec}')}: {exc}") from None
        try:
            self.baseline = load(path)
        except RunFileError as exc:
            raise pytest.UsageError(f"--energy-compare: {exc}") from None

    def _load_latest(self, storage: Storage) -> None:
        """The latest *complete* run on this hardware: an interrupted, still running (or
        killed) or unreadable run is skipped, and the note says which."""
        skipped: list[str] = []
        try:
            stored_runs = storage.runs(self.hardware)
        except ConfigError as exc:
            raise pytest.UsageError(f"--energy-compare: {exc}") from None
        for stored in reversed(stored_runs):
            try:
                run = load(stored.path)
            except RunFileError as exc:
                skipped.append(f"{stored.path.name} (unreadable: {exc.problem})")
                continue
            if run.status != COMPLETE:
                skipped.append(f"{stored.path.name} ({run.status})")
                continue
            self.baseline = run
            break
        folder = storage.root / self.hardware
        if self.baseline is None:
            self.baseline_note = (
                f"nothing to compare with: no complete run saved in {folder} yet (save one "
                "with --energy-autosave or --energy-save=NAME)"
            )
        if skipped:
            also = f"; {self.baseline_note}" if self.baseline is None else ""
            self.baseline_note = f"baseline: skipped {', '.join(skipped)}{also}"

    def finish(self, exitstatus: int) -> bool:
        """Compare, then write the run's last state; True when an energy gate failed.
        The exports and the run's last state are written even where the comparison
        raised (a bug, a baseline it could not take): measured cases are never lost,
        nor is the run left ``running``."""
        failed = compared = False
        try:
            failed = self._compare()
            compared = True
        finally:
            self._export()
            if self.recorder is not None:
                final = int(exitstatus) or (int(pytest.ExitCode.TESTS_FAILED) if failed else 0)
                if not compared:  # what pytest ends with: an internal error
                    final = int(pytest.ExitCode.INTERNAL_ERROR)
                self.recorder.finish(
                    self.results,
                    interrupted=exitstatus == pytest.ExitCode.INTERRUPTED,
                    exit_status=final,
                )
        return failed

    def _compare(self) -> bool:
        """The comparison with the baseline; True when an energy gate failed."""
        failed = False
        # A gate is judged even when no case ran: a gate that compared nothing fails.
        if self.baseline is not None and (self.results or self.settings.gates):
            meter = self.metering.meter
            identity = meter.identity() if meter is not None else {}
            identity.update(busy_guard(self.results))
            drift, drift_note = self._speed_drift()
            history = self._history()
            self.comparison = compare_cases(
                self.baseline.cases,
                self.results,
                CompareOptions(
                    gates=self.settings.gates,
                    confidence=self.confidence,
                    baseline_label=self.baseline.label,
                    current_label="this run",
                    not_comparable=unlike_meters(self.baseline.meter_identity, identity),
                    drift=drift,
                    drift_note=drift_note,
                    session_noise=self.settings.session_noise,
                    history=history,
                    normalize=self.baseline.hardware == self.hardware,
                    hardware_note=other_hardware(self.baseline.hardware, self.hardware),
                ),
            )
            failed = self.comparison.fails(self.settings.strict)
        return failed

    def _history(self) -> dict[str, NoiseEstimate]:
        """The between-session noise saved runs of the same code on this hardware teach
        (this session's own file left out: it is the one being judged)."""
        from ..history import stored_noise

        if not self.settings.gates:
            return {}
        metrics = [g.metric for g in self.settings.gates]
        try:
            noise, _ = stored_noise(
                Storage(self.settings.storage), self.hardware, metrics, exclude=self.saved_paths
            )
        except ConfigError:  # no storage folder to learn from (a file there)
            return {}
        return noise

    def _speed_drift(self) -> tuple[float, str]:
        """How much the machine's speed differed from the baseline's and within this
        session, and the reference times that say so."""
        assert self.baseline is not None
        base = self.baseline.machine.get(SPEED_KEY)
        base_s = float(base) if isinstance(base, int | float) and base > 0 else None
        start_s = self.reference_start_s
        end_s = reference_s() if start_s is not None else None
        drift = speed_drift(base_s, start_s, end_s)
        if start_s is None or end_s is None:
            return drift, ""
        then = f", {base_s * 1e3:.1f} ms at the baseline" if base_s else ""
        note = (
            f": a reference workload took {start_s * 1e3:.1f} ms at this session's start, "
            f"{end_s * 1e3:.1f} ms at its end{then}"
        )
        return drift, note

    def _export(self) -> None:
        """Each export once, atomically; an export is derived from the run, so it
        replaces an earlier one (a CI re-run in an uncleaned workspace).  A session
        that ran no case exports none: ``[]``, a CSV header."""
        if self.config.option.collectonly:
            return
        for fmt, path in self.settings.exports:
            try:
                AtomicFile(path, derived=True).write(export_text(self.results, fmt))
                self.exported.append((fmt, path))
            except OSError as exc:
                self.export_errors.append(
                    f"could not export {fmt} to {path}: {exc.strerror or exc}"
                )


def thread_settings() -> dict[str, object]:
    """What decides how many threads the math runs on: sessions with other settings are
    not the same measurement (kept in the run's machine record)."""
    import os
    import sys

    found: dict[str, object] = {
        name: os.environ.get(name)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    }
    affinity = getattr(os, "sched_getaffinity", None)
    found["cpus_allowed"] = len(affinity(0)) if affinity is not None else os.cpu_count()
    torch = sys.modules.get("torch")
    if torch is not None:
        found["torch_threads"] = torch.get_num_threads()
        found["torch_interop_threads"] = torch.get_num_interop_threads()
    return found


KEEPER = pytest.StashKey[Keeper]()
# Where a run file keeps the machine's speed at the session's start (probes/reference.py).
SPEED_KEY = "speed_reference_s"


# -- options -----------------------------------------------------------------------------
KEEP_OPTIONS = Section(
    "keep",
    "Saving, comparing and gating",
    KeepSettings,
    (
        Option(
            "--energy-save",
            "save",
            check_run_name,
            "NAME",
            "save this run in the storage folder as NNNN_NAME.json",
        ),
        Option(
            "--energy-autosave",
            "autosave",
            values.switch,
            "on|off",
            "save this run in the storage folder, named after the commit and the time",
            const="on",
        ),
        Option(
            "--energy-strict",
            "strict",
            values.switch,
            "on|off",
            "fail the session when a gate could not judge everything: a case inconclusive "
            "(busy machine, speed drift), the meters unlike, or a case on one side only",
            const="on",
        ),
        Option(
            "--energy-json",
            "json_path",
            values.text,
            "PATH",
            "also write this run to PATH (which must not exist yet; if another session "
            "takes it meanwhile, this run goes beside it as PATH-2, ...)",
            writes=NEW_FILE,
        ),
        Option(
            "--energy-storage",
            "storage",
            values.text,
            "DIR",
            "storage folder of saved runs, one subfolder per hardware",
        ),
        Option(
            "--energy-compare",
            "compare",
            values.text,
            "RUN",
            "compare each case with a saved run: its number, name or path; bare: the latest "
            "run saved on this hardware",
            const="latest",
        ),
        Option(
            "--energy-compare-fail",
            "gates",
            parse_gates,
            "EXPR",
            "fail the session when a case regresses beyond a gate and significantly, e.g. "
            f"{GATE_EXAMPLES} (any per-trial figure; repeatable; compares against the "
            "baseline as --energy-compare does)",
            multiple=True,
        ),
        Option(
            "--energy-session-noise",
            "session_noise",
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
            "exports",
            parse_exports,
            "FORMAT:PATH",
            "also write this run's figures for other tools, e.g. "
            f"{EXPORT_EXAMPLES}: {{choices}} (repeatable; an export is derived from the run, "
            "so an existing PATH is replaced; a saved run never is)",
            choices=lambda: EXPORT_FORMATS,
            multiple=True,
            record=lambda exports: [f"{fmt}:{path}" for fmt, path in exports],
            writes=DERIVED_FILE,
            paths=lambda exports: [(f"{fmt}:{path}", path) for fmt, path in exports],
        ),
        Option(
            "--energy-report",
            "report_path",
            values.text,
            "PATH",
            "also write one self-contained HTML report of this run to PATH at the end (charts, "
            "every figure per case, the comparison with --energy-compare's run); an existing "
            "file is replaced, a saved run never (needs vl-convert-python: the report extra)",
            writes=DERIVED_FILE,
        ),
    ),
)
