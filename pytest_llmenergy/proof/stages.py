"""The proof's stages, each adding its checks and its table to the ``Proof``.

The meter stage reads NVML in this process; the others run the tool the way a user
does, as fresh processes (``python -m pytest`` on the built-in suite, ``llmenergy ab``),
and read what those saved.  Each subprocess gets a time limit from the stage's cap and
the proof's remaining budget; a stage that does not fit is ``not run``, never half-read.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from ..conditions.isolation import OWN_ROOTS_ENV
from ..conditions.settings import DEFAULT_LABEL, parse_power_limits
from ..controller.rule import ControllerSettings
from ..controller.window import window_target_s
from ..errors import MeterUnavailable
from ..figures import value_or_none
from ..llm.compiled import EAGER
from ..meters.readings import duration_text
from ..stats import summarize
from ..storage.runfile import RunFileError, load
from ..suite import FILES
from . import meter_probe
from .checks import FAIL, NOT_RUN, PASS, Check, Proof
from .plans import STAGES as STAGES  # the order they run in, beside their caps
from .plans import Plan

Log = Callable[[str], None]
# ML.ENERGY leaderboard (v3, H100, vLLM): Llama-3.1-8B-Instruct, energy per output token
# of the steady state, at two batch sizes (issue 45 quotes them; ml.energy/leaderboard).
MLENERGY_H100_8B = {8: 0.455, 512: 0.070}
MLENERGY_METHOD = (
    "ML.ENERGY: vLLM (continuous batching, CUDA graphs, paged attention), the steady "
    "state's GPU energy per generated token, long outputs of real prompts, trained weights; "
    "here: transformers' generate (the plugin's default execution: on CUDA the decode step "
    "compiled with CUDA graphs, the prefill eager; static batch), whole-query energy per "
    "token (prefill included) and decode J per output token, fixed lengths, random weights"
)
MIN_STAGE_S = 20.0  # a stage with less budget left than this is not started
LAST_LINES = 6
# A subprocess stopped at its limit gets this long to exit (a settings session restores
# the GPU's limit, llmenergy ab stops both sides) before it is killed: a stage's limit
# leaves it inside the budget, so that a part never outlasts its device call.
STOP_GRACE_S = 30.0


@dataclass
class Budget:
    """The proof's wall-time budget, shared by the stages."""

    total_s: float
    started: float

    def left_s(self) -> float:
        return self.total_s - (time.monotonic() - self.started)

    def for_stage(self, cap_s: float) -> float:
        """A subprocess's time limit: its cap, or what is left of the budget once a stop's
        grace and the proof's own writing are set aside."""
        return min(cap_s, self.left_s() - STOP_GRACE_S - 5.0)


def python_env() -> dict[str, str]:
    """The environment of the proof's subprocesses: this package importable from where
    it was imported (a checkout run with PYTHONPATH=. becomes an absolute path)."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    absolute = [str(Path(p).resolve()) for p in parts]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*absolute, here]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    # this process holds a CUDA context while its sessions measure: not a neighbour
    roots = [p for p in env.get(OWN_ROOTS_ENV, "").split(",") if p]
    env[OWN_ROOTS_ENV] = ",".join([*roots, str(os.getpid())])
    return env


def plugin_args() -> list[str]:
    """``-p pytest_llmenergy.plugin`` where the package is not installed (a checkout on
    PYTHONPATH has no entry point), nothing where it is (pytest loads it already)."""
    installed = any(ep.name == "llmenergy" for ep in metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_llmenergy.plugin"]


def write_suite(folder: Path) -> Path:
    """The built-in suite's files, as ``llmenergy init-suite`` writes them."""
    bench = folder / "benchmarks"
    bench.mkdir(parents=True, exist_ok=True)
    for f in FILES:
        (bench / f.name).write_text(f.text(), encoding="utf-8")
    return folder


@dataclass(frozen=True)
class Ran:
    code: int | None  # None: stopped at its time limit
    seconds: float
    out: str

    def tail(self, n: int = LAST_LINES) -> str:
        lines = [ln for ln in self.out.strip().splitlines() if ln.strip()]
        return " | ".join(lines[-n:])


def run(cmd: Sequence[str], cwd: Path, limit_s: float, log: Log) -> Ran:
    """One subprocess, its output kept, stopped (with its children) at ``limit_s``."""
    log("$ " + " ".join(cmd))
    start = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=max(1.0, limit_s))
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            out, _ = proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
        code = None
    return Ran(code, time.monotonic() - start, out or "")


def pytest_cmd(
    plan: Plan, files: Sequence[str], *extra: str, execution: str | None = EAGER
) -> list[str]:
    """A pytest session of the built-in suite as a user runs it.  ``execution``: the
    ``--llm-execution`` it is given (None: the plugin's default, compiled decode on CUDA);
    eager where the stage must be (the settings stage's eager reference, counted work,
    the injected regressions)."""
    return [
        sys.executable,
        "-m",
        "pytest",
        *files,
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        *plugin_args(),
        "--energy-backend=nvml",
        f"--llm-device={plan.device}",
        f"--llm-dtype={plan.dtype}",
        *([f"--llm-execution={execution}"] if execution else []),
        *plan.extra_args,
        *extra,
    ]


# -- the machine --------------------------------------------------------------------------
def open_nvml() -> tuple[Any, Any]:
    """pynvml, initialised, and the first visible GPU's handle; MeterUnavailable: none."""
    from ..gpu.device import GpuDeviceError
    from ..gpu.nvidia import init_library, visible_gpu_indices

    try:
        nvml = init_library()
    except GpuDeviceError as exc:
        raise MeterUnavailable("nvml", str(exc)) from exc
    indices = visible_gpu_indices(nvml)
    if not indices:
        raise MeterUnavailable("nvml", "NVML found no NVIDIA GPU")
    return nvml, nvml.nvmlDeviceGetHandleByIndex(indices[0])


def machine(nvml: Any, handle: Any, plan: Plan) -> dict[str, str]:
    facts = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "plan": plan.name}
    for key, read in (
        ("gpu", lambda: nvml.nvmlDeviceGetName(handle)),
        ("driver", nvml.nvmlSystemGetDriverVersion),
        ("power limit (W)", lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000),
        ("power limits allowed (W)", lambda: _limit_range(nvml, handle)),
    ):
        try:
            got = read()
            facts[key] = got.decode() if isinstance(got, bytes) else str(got)
        except Exception as exc:  # a fact NVML cannot give is only missing
            facts[key] = f"unknown ({type(exc).__name__})"
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["cuda"] = str(torch.version.cuda) if torch.cuda.is_available() else "not available"
    except ImportError:
        facts["torch"] = "not installed"
    facts["models ran on"] = plan.device
    facts["python"] = sys.version.split()[0]
    return facts


def _limit_range(nvml: Any, handle: Any) -> str:
    low_mw, high_mw = nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    return f"{low_mw / 1000:g}-{high_mw / 1000:g}"


# -- stage 1: the meter ---------------------------------------------------------------------
def meter_stage(proof: Proof, plan: Plan, nvml: Any, handle: Any, log: Log) -> None:
    from ..meters import open_meter

    log(f"meter: recording {plan.idle_s:g} s idle, {plan.load_s:g} s loaded, idle again")
    recorder = meter_probe.Recorder(nvml, handle)
    windows: list[tuple[float, float, float]] = []
    with open_meter("nvml", gpus=(0,)) as meter:
        resolution_s = meter.resolution_s
        with recorder:
            time.sleep(plan.idle_s)
            load_from = recorder.clock()
            with meter_probe.Load(plan.device):
                time.sleep(min(1.5, plan.load_s / 3))  # past the average's window
                lengths = _meter_lengths(plan, resolution_s)
                windows = meter_probe.meter_windows(meter, "gpu:0", recorder, lengths)
                left = plan.load_s - (recorder.clock() - load_from)
                time.sleep(max(0.0, left))
                load_to = recorder.clock()
            time.sleep(min(3.0, plan.idle_s / 2))
    samples = recorder.samples
    idle = (samples[0].t_s, load_from)
    result = meter_probe.analyse(samples, idle, (load_from, load_to), plan.windows_s)
    _meter_checks(proof, result, resolution_s, samples, idle[1] - idle[0])
    _trial_window_check(proof, result, resolution_s)
    _meter_window_checks(proof, samples, windows)
    proof.tables["meter"] = [
        {
            "phase": s.phase,
            "window s": s.length_s,
            "windows": s.windows,
            "counter/instant-1 median": s.vs_instant_median,
            "p95 |.|": s.vs_instant_p95,
            "counter/average-1 median": s.vs_average_median,
            "p95 |.| (average)": s.vs_average_p95,
        }
        for s in result.spreads
    ]


def resolution_agrees(
    resolution_s: float | None, period_s: float | None, step_s: float | None
) -> bool:
    """Whether the meter's resolution is the counter's period as the recording saw it.

    The recording reads every few milliseconds: a counter that changed at (nearly) every
    sample updates at most that slowly, and the meter, which times it in a tight loop,
    may well see it finer; then any resolution up to twice the seen period agrees."""
    if resolution_s is None or period_s is None or period_s <= 0:
        return False
    if step_s is not None and period_s <= 1.5 * step_s:
        return resolution_s <= 2.0 * period_s
    return 0.5 <= resolution_s / period_s <= 2.0


def _sample_step_s(samples: Sequence[meter_probe.Sample]) -> float | None:
    """The recording's median time between samples."""
    steps = [b.t_s - a.t_s for a, b in itertools.pairwise(samples)]
    return statistics.median(steps) if steps else None


def _meter_lengths(plan: Plan, resolution_s: float | None) -> list[float]:
    """The package meter's windows inside the load: the short ones, then one as long as
    the suite's trials where the load leaves room for it (the check reads the longest)."""
    lengths = [w for w in plan.windows_s if w <= plan.load_s / 4]
    trial_s = window_target_s(resolution_s, ControllerSettings())
    room_s = plan.load_s - min(1.5, plan.load_s / 3) - sum(lengths)
    if trial_s and trial_s <= room_s:
        lengths.append(trial_s)
    return lengths


def _meter_checks(
    proof: Proof,
    a: meter_probe.Analysis,
    resolution_s: float | None,
    samples: Sequence[meter_probe.Sample],
    idle_s: float,
) -> None:
    """What the recording says of the counter, the power fields and the windows."""
    _period_checks(proof, a, resolution_s, samples)
    _power_field_checks(proof, a)
    _integral_checks(proof, a)
    _trusted_note(proof, a)
    proof.notes.setdefault("meter", []).append(
        f"idle stretch {idle_s:.1f} s; windows of 1-1.5 lengths cut from one recording, "
        "one every 0.618 lengths; "
        "counter/instant-1: the counter's joules against the trapezoid integral of the "
        "instantaneous field on the same window"
    )


def _period_checks(
    proof: Proof,
    a: meter_probe.Analysis,
    resolution_s: float | None,
    samples: Sequence[meter_probe.Sample],
) -> None:
    """The counter's update period as recorded, and the meter's resolution beside it."""
    period = a.counter_period_s
    n = len(samples)
    proof.add(
        Check(
            "meter",
            "energy counter's update period",
            PASS if period is not None else FAIL,
            "unmeasured" if period is None else f"{period * 1e3:.1f} ms",
            f"{a.counter_updates} updates in {n} samples; idle {a.idle_w:.0f} W, "
            f"loaded {a.load_w:.0f} W",
        )
    )
    step_s = _sample_step_s(samples)
    proof.add(
        Check(
            "meter",
            "the meter's resolution is the counter's period",
            PASS if resolution_agrees(resolution_s, period, step_s) else FAIL,
            "unknown" if resolution_s is None else f"{resolution_s * 1e3:.1f} ms",
            "timed when the meter opens; windows shorter than twice it are marked"
            + (
                f"; the recording samples every {step_s * 1e3:.1f} ms, so a counter that "
                "changes at every sample may update faster"
                if step_s is not None and period is not None and period <= 1.5 * step_s
                else ""
            ),
        )
    )


def _power_field_checks(proof: Proof, a: meter_probe.Analysis) -> None:
    """The averaged power reading's window, and whether the instant field is there."""
    window = a.average_window_s
    proof.add(
        Check(
            "meter",
            "power reading's averaging window",
            PASS if window is not None else NOT_RUN,
            "unmeasured" if window is None else f"{window:.2f} s",
            f"NVML documents {meter_probe.DOCUMENTED_AVERAGE_S:g} s on Ampere and newer; "
            "from the 10-90 % rise of a load step / 0.8",
        )
    )
    proof.add(
        Check(
            "meter",
            "instantaneous power field",
            PASS if a.instant else NOT_RUN,
            "read" if a.instant else "not supported",
        )
    )


def _integral_checks(proof: Proof, a: meter_probe.Analysis) -> None:
    """The counter against the instantaneous integral on the longest windows."""
    longest = max((s.length_s for s in a.spreads), default=0.0)
    for phase in ("idle", "load"):
        rows = [s for s in a.spreads if s.phase == phase and s.length_s == longest]
        row = rows[0] if rows else None
        ok = row is not None and row.vs_instant_median is not None
        good = ok and abs(row.vs_instant_median) <= meter_probe.TRUST  # type: ignore[union-attr, arg-type]
        proof.add(
            Check(
                "meter",
                f"counter vs instantaneous integral, {longest:g} s windows, {phase}",
                (PASS if good else FAIL) if ok else NOT_RUN,
                "—"
                if not ok
                else f"{row.vs_instant_median:+.1%} median, "  # type: ignore[union-attr]
                f"{row.vs_instant_p95:.1%} p95 over {row.windows} windows",  # type: ignore[union-attr]
                f"within {meter_probe.TRUST:.0%} passes",
            )
        )


def _trusted_note(proof: Proof, a: meter_probe.Analysis) -> None:
    """From which window length the counter is within the trust, as a note: the suite's
    trials are windows at least as long as its resolution asks (the trials' window check),
    so a lone 1 s window is no longer what a figure rests on."""
    trusted = a.smallest_trusted_s()
    proof.notes.setdefault("meter", []).append(
        f"the counter is within {meter_probe.TRUST:.0%} of the integral (p95) from "
        + ("none of the lengths tried" if trusted is None else f"{trusted:g} s windows")
    )


def _trial_window_check(proof: Proof, a: meter_probe.Analysis, resolution_s: float | None) -> None:
    """The counter against the integral on windows as long as the suite's trials
    (controller/window.py), within the proof's trust like the other windows; the share
    one refresh may take of such a window is said beside it."""
    window_s = window_target_s(resolution_s, ControllerSettings())
    if not window_s:
        proof.add(
            Check(
                "meter",
                "counter vs integral on the trials' windows",
                NOT_RUN,
                "one call a trial",
                f"the meter resolves {duration_text(resolution_s or 0.0)}: no window of "
                "several calls is needed",
            )
        )
        return
    # the recording's windows nearest the trials' length (the meter times its
    # resolution, a little over the counter's period on a busy machine)
    near = [
        s
        for s in a.spreads
        if 0.75 * window_s <= s.length_s <= 1.5 * window_s and s.vs_instant_p95 is not None
    ]
    nearest = min(near, key=lambda s: abs(s.length_s - window_s), default=None)
    worst = max(
        (s.vs_instant_p95 for s in near if nearest and s.length_s == nearest.length_s),
        default=None,
    )
    one_refresh = (resolution_s or 0.0) / window_s
    proof.add(
        Check(
            "meter",
            f"counter vs integral on the trials' windows ({duration_text(window_s)})",
            NOT_RUN if worst is None else PASS if worst <= meter_probe.TRUST else FAIL,
            "—"
            if worst is None or nearest is None
            else f"{worst:.1%} p95 at {nearest.length_s:g} s windows",
            f"within {meter_probe.TRUST:.0%} passes; a trial's window holds calls until it "
            f"lasts {duration_text(window_s)}, of which one counter refresh is {one_refresh:.1%}",
        )
    )


def _meter_window_checks(
    proof: Proof,
    samples: Sequence[meter_probe.Sample],
    windows: Sequence[tuple[float, float, float]],
) -> None:
    rows = []
    for start, end, meter_j in windows:
        instant = meter_probe.integral_between(samples, start, end, instant=True)
        average = meter_probe.integral_between(samples, start, end, instant=False)
        rows.append((end - start, meter_j, instant, average))
    longest = max(rows, key=lambda r: r[0], default=None)
    if longest is None or longest[2] is None:
        proof.add(Check("meter", "the package's meter vs the integral", NOT_RUN, "no window"))
        return
    seconds, meter_j, instant, _ = longest
    diff = meter_j / instant - 1.0 if instant else math.nan
    proof.add(
        Check(
            "meter",
            f"the package's meter (NvmlMeter) on a {seconds:.2f} s loaded window",
            PASS if abs(diff) <= meter_probe.TRUST else FAIL,
            f"{meter_j:.1f} J vs {instant:.1f} J integrated ({diff:+.1%})",
        )
    )
    proof.tables["meter windows"] = [
        {"window s": s, "meter J": m, "instant integral J": i, "average integral J": a}
        for s, m, i, a in rows
    ]


# -- stage 2: the suite ---------------------------------------------------------------------
def suite_stage(proof: Proof, plan: Plan, work: Path, out: Path, budget: Budget, log: Log) -> None:
    """The suite as a user runs it: the plugin's default execution (compiled decode on
    CUDA, eager on a CPU), every batch size of the plan in one session."""
    path = out / "suite.json"
    cmd = pytest_cmd(
        plan,
        plan.suite_files,
        f"--llm-model={plan.model}",
        f"--llm-input-tokens={plan.input_tokens}",
        f"--llm-output-tokens={plan.output_tokens}",
        f"--llm-batch-sizes={','.join(map(str, plan.batch_sizes))}",
        f"--energy-max-time={plan.case_max_time_s:g}",
        f"--energy-json={path}",
        execution=None,
    )
    ran = run(cmd, work, budget.for_stage(plan.caps_s["suite"]), log)
    cases = _cases(path)
    if not cases:
        proof.add(Check("suite", "the suite ran", FAIL, _ended(ran), ran.tail()))
        return
    measured = [c for c in cases if c.measured]
    converged = [c for c in measured if c.converged]
    runs = ", ".join(f"{n} {e}" for e, n in _executions(cases).items())
    proof.add(
        Check(
            "suite",
            f"{plan.model} ({plan.dtype}) at batch {','.join(map(str, plan.batch_sizes))}",
            PASS if len(measured) == len(cases) else FAIL,
            f"{len(measured)} of {len(cases)} cases measured in {ran.seconds:.0f} s",
            "; ".join([f"execution: {runs}", *([] if ran.code == 0 else [_ended(ran)])]),
        )
    )
    proof.add(
        Check(
            "suite",
            "CI targets held",
            PASS if len(converged) == len(measured) else FAIL,
            f"{len(converged)} of {len(measured)} cases converged",
            "; ".join(
                [
                    "default rule: runtime CI within 0.5 s and 10 %, energy CI within 10 %",
                    *(_why_not_converged(c) for c in measured if not c.converged),
                ]
            ),
        )
    )
    split = [c for c in measured if value_or_none(c, "decode_j_per_out_token") is not None]
    proof.add(
        Check(
            "suite",
            "prefill/decode split at the first token",
            PASS if len(split) == len(measured) else FAIL,
            f"{len(split)} of {len(measured)} cases split",
        )
    )
    rows = []
    for c in cases:
        energy = value_or_none(c, "gpu_j") or value_or_none(c, "energy_j")
        rows.append(
            {
                "case": c.name,
                "execution": execution_of(c),
                "batch": c.queries,
                "in": c.input_tokens,
                "out": c.output_tokens,
                "trials": len(c.trials),
                "converged": "yes" if c.converged else "no",
                "J/token": value_or_none(c, "j_per_token"),
                "J/out token": energy / c.output_tokens if energy else None,
                "prefill J/in": value_or_none(c, "prefill_j_per_in_token"),
                "decode J/out": value_or_none(c, "decode_j_per_out_token"),
                "tok/s": value_or_none(c, "tokens_per_s"),
            }
        )
    proof.tables["suite"] = rows
    _mlenergy(proof, plan, cases)


def execution_of(case: Any) -> str:
    """How a case ran: the ``execution`` label a compiled case carries, else eager."""
    return str(case.labels.get("execution", EAGER))


def _executions(cases: Sequence[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in cases:
        counts[execution_of(c)] = counts.get(execution_of(c), 0) + 1
    return counts


# A case's energy interval this much wider than its runtime's (relative, plus 2 points)
# is the meter's noise; narrower, the energy only followed the runtime.
METER_NOISE_RATIO = 1.25


def _why_not_converged(case: Any) -> str:
    """Whether the meter or the runtime kept a case from converging: a meter that reads
    the device's energy adds little noise to the runtime's, so an energy interval at most
    a quarter (and 2 points) wider than the runtime's says the work's own speed varied
    (another tenant of the machine, clocks), and one wider still says the meter did.
    A case of one trial has no interval to compare: its budget ended first."""
    if len(case.trials) < 2:
        trials = "1 trial" if case.trials else "no trial"
        return f"{case.name}: {trials}, no interval (its time budget ran out)"
    time_ci = summarize([t.seconds for t in case.trials]).relative_half_width
    energy_ci = summarize([t.joules for t in case.trials]).relative_half_width
    cause = (
        "the energy noisier than the runtime: the meter's"
        if energy_ci > METER_NOISE_RATIO * time_ci + 0.02
        else "the energy followed the runtime: the work's speed varied, not the meter"
    )
    return f"{case.name}: runtime ±{time_ci:.1%}, energy ±{energy_ci:.1%} ({cause})"


def _mlenergy(proof: Proof, plan: Plan, cases: Sequence[Any]) -> None:
    """Ours beside ML.ENERGY's published H100 figures for Llama-3.1-8B, where the batch
    matches; the check is of scale (the same order of magnitude), the method differs."""
    if plan.model != "random-llama-3.1-8b":
        proof.notes.setdefault("suite", []).append(
            f"not beside ML.ENERGY's figures: the model is {plan.model}, not Llama-3.1-8B"
        )
        return
    notes = proof.notes.setdefault("suite", [])
    notes.append(MLENERGY_METHOD)
    for batch, theirs in MLENERGY_H100_8B.items():
        ours = [value_or_none(c, "decode_j_per_out_token") for c in cases if c.queries == batch]
        ours = [o for o in ours if o is not None]
        if not ours:
            notes.append(f"ML.ENERGY at batch {batch}: {theirs} J/token (no case of ours)")
            continue
        ratio = max(ours) / theirs
        proof.add(
            Check(
                "suite",
                f"decode J/output token at batch {batch} beside ML.ENERGY's {theirs}",
                PASS if 1 / 10 <= ratio <= 10 else FAIL,
                f"{max(ours):.3g} J ({ratio:.2f}x theirs)",
                "the same order of magnitude passes; the methods differ (see notes)",
            )
        )


# -- stage 3b: compiled execution beside eager -----------------------------------------------
def compiled_stage(proof: Proof, plan: Plan, out: Path) -> None:
    """The suite's case at ``plan.compiled_batch`` (the plugin's default execution:
    compiled decode on CUDA) beside the same case run eager by the settings stage at the
    board's default power limit: decode J/output token of both, and ML.ENERGY's.  No
    session of its own: both ran already, so the comparison costs no device time."""
    batch = plan.compiled_batch
    name = f"compiled decode J/output token at batch {batch}"
    if batch is None:
        proof.add(
            Check("compiled", "compiled execution beside eager", NOT_RUN, "not in this plan",
                  "a CPU runs eager by default (inductor compiles for minutes there): a GPU "
                  "plan compares them")
        )  # fmt: skip
        return
    compiled = [c for c in _cases(out / "suite.json") if c.measured and c.queries == batch]
    eager = [
        c
        for c in _cases(out / SETTINGS_RUN)
        if c.measured
        and c.queries == batch
        and execution_of(c) == EAGER
        and c.labels.get(DEFAULT_LABEL, "yes") == "yes"
    ]
    if not compiled:
        proof.add(Check("compiled", name, NOT_RUN, "the suite measured no such case",
                        "run the suite stage first, in the same part"))  # fmt: skip
        return
    ran_as = sorted({execution_of(c) for c in compiled})
    figure = _most(compiled, "decode_j_per_out_token")
    before = _most(eager, "decode_j_per_out_token")
    mlenergy = MLENERGY_H100_8B.get(batch) if plan.model == "random-llama-3.1-8b" else None
    converged = all(c.converged for c in compiled)
    all_compiled = all(e.startswith("compiled") for e in ran_as)
    proof.add(
        Check(
            "compiled",
            name,
            PASS if figure is not None and converged and all_compiled else FAIL,
            "—" if figure is None else f"{figure:.3g} J",
            "; ".join(
                [
                    f"ran {', '.join(ran_as)}"
                    + ("" if all_compiled else " (the default on CUDA is compiled)"),
                    "eager at the default limit: "
                    + ("not measured" if before is None else f"{before:.3g} J")
                    + (f" ({figure / before:.2f}x)" if figure is not None and before else ""),
                    *([f"ML.ENERGY {mlenergy} J"] if mlenergy is not None else []),
                    "converged" if converged else "not converged",
                ]
            ),
        )
    )


def _most(cases: Sequence[Any], figure: str) -> float | None:
    """The largest of a figure over cases (None: no case has it)."""
    found = [value_or_none(c, figure) for c in cases]
    return max((f for f in found if f is not None), default=None)


def _cases(path: Path) -> list[Any]:
    try:
        return list(load(path).cases)
    except (RunFileError, OSError):
        return []


def _ended(ran: Ran) -> str:
    return "stopped at its time limit" if ran.code is None else f"exit code {ran.code}"


# -- stage 3: GPU settings ------------------------------------------------------------------
SETTINGS_RUN = "settings.json"
# What a settings session prints when it refuses the power limits before measuring
# anything (pytest's usage error, exit code 4): a limit outside the board's range, no
# permission, a board whose limit cannot be read or set.
USAGE_ERROR_CODE = 4
REFUSAL = re.compile(r"--energy-gpu-power-limits|power limit|CAP_SYS_ADMIN|cannot be swept", re.I)


def settings_stage(
    proof: Proof,
    plan: Plan,
    nvml: Any,
    handle: Any,
    work: Path,
    out: Path,
    budget: Budget,
    log: Log,
) -> None:
    """The plan's power limits set, measured and given back, on the suite's case at
    ``plan.frontier_batch`` run eager (the compiled stage's reference, at the default
    limit).  A limit the board or this process refuses is ``n/a`` with its reason."""
    before = _limit_w(nvml, handle)
    limits, left_out = power_limit_plan(nvml, handle, plan.power_limits)
    for why in left_out:
        log(f"settings: {why}")
    if not limits and plan.compiled_batch is None:
        _refused(proof, plan, "; ".join(left_out), before, before)
        return
    path = out / "frontier.json"
    sweep = [f"--energy-gpu-power-limits={limits}", f"--energy-frontier-json={path}"]
    cmd = pytest_cmd(
        plan,
        ["benchmarks/test_output_tokens.py"],
        f"--llm-model={plan.model}",
        f"--llm-output-tokens={plan.output_tokens}",
        f"--llm-batch-sizes={plan.frontier_batch}",
        *(sweep if limits else []),
        f"--energy-max-time={plan.case_max_time_s:g}",
        f"--energy-json={out / SETTINGS_RUN}",
        *plan.settings_args,
    )
    ran = run(cmd, work, budget.for_stage(plan.caps_s["settings"]), log)
    after = _limit_w(nvml, handle)
    refusal = "; ".join(left_out) if not limits else session_refusal(ran)
    if refusal:
        _refused(proof, plan, refusal, before, after)
        return
    proof.add(
        Check(
            "settings",
            "power limit restored",
            PASS if before is not None and after == before else FAIL,
            f"{before} W before, {after} W after (read back through NVML)",
        )
    )
    name = f"power-limit frontier ({limits} of the default)"
    if not path.exists():
        proof.add(Check("settings", name, FAIL, _ended(ran), ran.tail()))
        return
    points = _frontier_points(path)
    proof.add(
        Check(
            "settings",
            name,
            PASS if len(points) >= 2 else FAIL,
            f"{len(points)} settings measured in {ran.seconds:.0f} s",
            "; ".join(f"left out: {why}" for why in left_out),
        )
    )
    proof.tables["settings"] = points


def _refused(proof: Proof, plan: Plan, why: str, before: float | None, after: float | None) -> None:
    """Both settings checks ``n/a``: no limit was set, so none was given back (unless
    the limit moved all the same, which fails)."""
    moved = f"{before} W before, {after} W after, though no limit was to be set"
    restored = (NOT_RUN, "no limit was set") if after == before else (FAIL, moved)
    proof.add(Check("settings", "power limit restored", *restored))
    proof.add(
        Check(
            "settings",
            f"power-limit frontier ({plan.power_limits} of the default)",
            NOT_RUN,
            "refused",
            why[:300],
        )
    )


def power_limit_plan(nvml: Any, handle: Any, wanted: str) -> tuple[str, tuple[str, ...]]:
    """The plan's power limits this board takes (as ``--energy-gpu-power-limits`` text),
    and why each other one is left out: outside the board's range (NVML's constraints;
    a percentage of its default limit, rounded as the session rounds it), or every one
    where this process may not set a limit (it writes the limit as it is, as the
    session's own check does).  Where NVML cannot say, the session is left to."""
    try:
        low_mw, high_mw = nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
        default_w = nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000
        current_mw = nvml.nvmlDeviceGetPowerManagementLimit(handle)
    except nvml.NVMLError:
        return wanted, ()
    try:
        nvml.nvmlDeviceSetPowerManagementLimit(handle, current_mw)
    except nvml.NVMLError as exc:
        denied = getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4)
        why = (
            "this process may not set the power limit: it needs root or CAP_SYS_ADMIN"
            if denied
            else "the board's power limit cannot be set"
        )
        return "", (f"{why} (NVML: {exc})",)
    low_w, high_w = low_mw / 1000, high_mw / 1000
    kept: list[str] = []
    left_out: list[str] = []
    for word in (w.strip() for w in wanted.split(",") if w.strip()):
        spec = parse_power_limits(word)
        watts = [*spec.values, *(round(default_w * p / 100) for p in spec.percents)]
        outside = [w for w in watts if not low_w <= w <= high_w]
        if outside:
            side = "floor" if outside[0] < low_w else "ceiling"
            left_out.append(
                f"{word} ({outside[0]:g} W) is beyond the board's {side}: it allows "
                f"{low_w:g}-{high_w:g} W"
            )
        else:
            kept.append(word)
    return ",".join(kept), tuple(left_out)


def session_refusal(ran: Ran) -> str:
    """Why a settings session refused its power limits before measuring anything ("":
    it did not, and a session that failed otherwise is a failure, not a refusal)."""
    if ran.code != USAGE_ERROR_CODE:
        return ""
    for line in ran.out.splitlines():
        text = line.strip()
        if text.startswith("ERROR:") and REFUSAL.search(text):
            return text.removeprefix("ERROR:").strip()
    return ""


def _limit_w(nvml: Any, handle: Any) -> float | None:
    try:
        return nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0
    except nvml.NVMLError:
        return None


def _frontier_points(path: Path) -> list[dict[str, Any]]:
    """Every measured setting of the frontier file, flattened for a table."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    cases = data.get("cases") if isinstance(data, dict) else None
    rows: list[dict[str, Any]] = []
    for case in cases if isinstance(cases, list) else []:
        if not isinstance(case, dict):
            continue
        front = set(case.get("pareto") or ())
        for point in case.get("points") or ():
            if isinstance(point, dict):
                rows.append(
                    {
                        "setting": point.get("setting"),
                        "time_s": point.get("time_s"),
                        "energy_j": point.get("energy_j"),
                        "on_front": "yes" if point.get("setting") in front else "no",
                    }
                )
    return rows


# -- stage 4: the gate ----------------------------------------------------------------------
def gate_stage(proof: Proof, plan: Plan, work: Path, out: Path, budget: Budget, log: Log) -> None:
    """A campaign in one paired run: every case of one model unchanged (A/A), every case
    of the other with a regression injected; how many unchanged cases failed, and the
    share of changed ones found."""
    same, changed = plan.gate_models
    share = f"{plan.gate_share:.0%}"
    cmd = [
        sys.executable,
        "-m",
        "pytest_llmenergy",
        "ab",
        ".",
        ".",
        f"--head-arg=--llm-inject-regression={changed}={share}",
        "--format",
        "json",
        *plan.ab_args,
        "--",
        "benchmarks/test_input_tokens.py",
        "-p",
        "no:randomly",
        *plugin_args(),
        "--energy-backend=nvml",
        f"--llm-device={plan.device}",
        f"--llm-dtype={plan.dtype}",
        "--llm-execution=eager",  # injected regressions run eager (llm/compiled.py)
        f"--llm-model={same}",
        f"--llm-model={changed}",
        f"--llm-input-tokens={','.join(map(str, plan.gate_input_tokens))}",
        f"--llm-batch-sizes={','.join(map(str, plan.gate_batch_sizes))}",
        *plan.gate_args,
    ]
    ran = run(cmd, work, budget.for_stage(plan.caps_s["gate"]), log)
    rows = _ab_rows(ran.out)
    (out / "ab.txt").write_text(ran.out[-20000:], encoding="utf-8")
    if not rows:
        proof.add(
            Check(
                "gate", "paired A/A and +regression (llmenergy ab)", FAIL, _ended(ran), ran.tail()
            )
        )
        return
    detects = re.search(r"detects >= ([\d.]+ ?%)", ran.out)
    reach = detects.group(1) if detects else "unknown"
    expected = len(plan.gate_input_tokens) * len(plan.gate_batch_sizes)
    unchanged = [r for r in rows if _model_of(r["case"], (same, changed)) == same]
    hits = [r for r in rows if _model_of(r["case"], (same, changed)) == changed]
    false_alarms = [r for r in unchanged if r["verdict"] == "FAIL"]
    found = [r for r in hits if r["verdict"] == "FAIL"]
    proof.add(
        Check(
            "gate",
            f"A/A: unchanged cases ({same}) that failed",
            PASS if unchanged and not false_alarms and len(unchanged) == expected else FAIL,
            f"{len(false_alarms)} of {len(unchanged)} (of {expected} planned)",
            f"detects >= {reach}; {ran.seconds:.0f} s for both sides; changes "
            + _changes_text(unchanged),
        )
    )
    found_share = len(found) / len(hits) if hits else 0.0
    proof.add(
        Check(
            "gate",
            f"+{share} injected into {changed}: changed cases found",
            PASS if hits and found_share >= CAMPAIGN_FOUND and len(hits) == expected else FAIL,
            f"{len(found)} of {len(hits)} ({found_share:.0%}; {CAMPAIGN_FOUND:.0%} passes)",
            "on a GPU: the GPU kept multiplying for that share of each forward pass's "
            "time; on a CPU: CPU work after each forward pass; changes " + _changes_text(hits),
        )
    )
    proof.tables["gate"] = [
        {k: r.get(k) for k in ("case", "baseline", "current", "change", "p_value", "verdict")}
        for r in rows
    ]


# The share of changed cases the campaign must find.
CAMPAIGN_FOUND = 0.8


def _changes_text(rows: Sequence[dict[str, Any]]) -> str:
    """The spread of the cases' changes, for the check's detail."""
    changes = sorted(float(r["change"]) for r in rows if isinstance(r.get("change"), int | float))
    if not changes:
        return "none measured"
    return f"{changes[0]:+.1%} to {changes[-1]:+.1%} (median {statistics.median(changes):+.1%})"


def _ab_rows(text: str) -> list[dict[str, Any]]:
    """The comparison rows of ``llmenergy ab --format json`` (its stdout, mixed here with
    its stderr lines, which never start with ``{``)."""
    start = text.find('{\n  "tables"')
    if start < 0:
        return []
    depth = 0
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            break
    try:
        data = json.loads(text[start : end + 1])
    except ValueError:
        return []
    return [row for table in data.get("tables", []) for row in table.get("rows", [])]


def _model_of(case: str, models: Sequence[str]) -> str:
    for m in sorted(models, key=len, reverse=True):
        if f"[{m}-" in case:
            return m
    return case


# -- stage 5: counted work ------------------------------------------------------------------
def work_stage(proof: Proof, plan: Plan, work: Path, out: Path, budget: Budget, log: Log) -> None:
    import torch

    devices = ("cuda", "cpu") if torch.cuda.is_available() else ("cpu",)
    counts = []
    for n, device in enumerate(devices):
        path = out / f"work-{n + 1}-{device}.json"
        cmd = pytest_cmd(
            plan,
            ["benchmarks/test_input_tokens.py"],
            f"--llm-model={plan.work_model}",
            "--llm-input-tokens=64",
            "--energy-count-work",
            "--energy-max-trials=2",
            "--energy-min-trials=1",
            f"--energy-json={path}",
        )
        swaps = {
            "--llm-device=": f"--llm-device={device}",
            "--llm-dtype=": "--llm-dtype=float32",
            # the CPU's session measures the CPU (what counts is the same either way)
            "--energy-backend=": f"--energy-backend={'nvml' if device == 'cuda' else 'auto'}",
        }
        cmd = [next((v for k, v in swaps.items() if a.startswith(k)), a) for a in cmd]
        ran = run(cmd, work, budget.for_stage(plan.caps_s["work"] / 2), log)
        cases = _cases(path)
        if not cases or cases[0].work is None:
            (out / f"work-{n + 1}-{device}.log").write_text(ran.out[-20000:], encoding="utf-8")
            proof.add(Check("work", f"counted work on {device}", FAIL, _ended(ran), ran.tail()))
            return
        counts.append(_work_totals(cases[0].work))
    flops = ", ".join(f"{k} {v:.4g}" for k, v in counts[0].items() if k.endswith("flops"))
    proof.tables["work"] = [
        {"figure": k, **{d: c[k] for d, c in zip(devices, counts)}} for k in counts[0]
    ]
    if len(counts) == 1:
        proof.add(
            Check("work", f"counted work of {plan.work_model} on the GPU", NOT_RUN, flops,
                  "no CUDA here: the CPU's count alone, nothing to hold it against")
        )  # fmt: skip
        return
    verdict, detail = work_verdict(devices, counts[0], counts[1])
    proof.add(
        Check(
            "work",
            f"counted work of {plan.work_model} equal on {' and '.join(devices)} (FLOPs, bytes)",
            verdict,
            flops,
            detail,
        )
    )


def _work_totals(work: Any) -> dict[str, float]:
    return {
        f"{phase} {attr}": float(work.total(attr, phase))
        for phase in ("prefill", "decode")
        for attr in ("flops", "bytes", "calls")
    }


def work_verdict(
    devices: Sequence[str], a: dict[str, float], b: dict[str, float]
) -> tuple[str, str]:
    """FLOPs and bytes must be equal on both devices; operator calls may differ (each
    device runs its own kernels for one attention call): the detail says by how many."""
    work = {k: v for k, v in a.items() if not k.endswith("calls")}
    calls = [k for k in a if k.endswith("calls")]
    moved = ", ".join(f"{k.split()[0]} {a[k] - b[k]:+.0f}" for k in calls if a[k] != b.get(k))
    said = (
        f"operator calls on {devices[0]} against {devices[1]}: {moved}"
        if moved
        else "operator calls equal"
    )
    if all(v == b.get(k) for k, v in work.items()):
        return PASS, said
    return FAIL, f"differs: {_differences(work, b)}; {said}"


def _differences(a: dict[str, float], b: dict[str, float]) -> str:
    return ", ".join(f"{k} {a[k]:.4g} vs {b[k]:.4g}" for k in a if a[k] != b.get(k))


def run_stage(proof: Proof, name: str, budget: Budget, body: Callable[[], None], log: Log) -> None:
    """One stage, timed; one that does not fit the budget, or breaks, is a line saying so
    (a stage started with less would be stopped before it measured anything)."""
    if budget.for_stage(math.inf) < MIN_STAGE_S:
        proof.add(Check(name, "stage", NOT_RUN, f"{budget.left_s():.0f} s of the budget left"))
        return
    log(f"stage {name} ({budget.left_s():.0f} s of the budget left)")
    start = time.monotonic()
    try:
        body()
    except Exception as exc:  # one stage's surprise must not lose the others
        proof.add(
            Check(name, "stage", FAIL, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        )
    proof.stage_s[name] = time.monotonic() - start
