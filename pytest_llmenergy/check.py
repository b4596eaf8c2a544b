"""``llmenergy check``: what a user should know about a machine before trusting a number.

In about a minute, on a machine never measured before:

- **the meters**: which backends open here and, for the others, why not (each
  backend's own one-line reason); for those that open, what they read, their
  resolution (as measured where the meter measures it: NVML's counter update period,
  RAPL's), and the idle power over a short quiet window;
- **the noise between sessions**: two short sessions of one small case (the built-in
  tiny Llama, 32 input and 32 output tokens), each a fresh ``python -m pytest`` as CI
  starts one, with the meter ``auto`` picks; how far their energy per token differs,
  and how tight each one's own interval was;
- **what a gate can see here**: the smallest regression a one-session gate against one
  baseline session would find (80 % power), from that noise or the assumed session
  noise (``--energy-session-noise``), whichever is larger: two sessions are one
  estimate of a noise, and the trials of one session agree far better than sessions do.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .controller.rule import DEFAULT_MAX_BACKGROUND
from .errors import ConfigError, LLMEnergyError, MeterUnavailable
from .figures import value
from .meters import BUILTIN_BACKENDS, Method, open_meter
from .sessions import DEFAULT_SESSION_NOISE, POWER, Test
from .storage.runfile import RunFileError, load

IDLE_S = 1.0  # the quiet window each meter's idle power is read over
SESSION_MAX_S = 4.0  # measured time per session (--energy-max-time)
CASE = (32, 32)  # input, output tokens of the small case
ALPHA = 0.05  # the gate's one-sided level, as a single gated case's

SESSION_TEST = """
import pytest

def test_check(energy_benchmark, llm_pool):
    model = llm_pool.get("tiny-llama")
    ids = model.prompt_ids({n_in})
    energy_benchmark(model.generate, ids, {n_out}, input_tokens={n_in}, output_tokens={n_out})
"""


@dataclass(frozen=True)
class MeterCheck:
    """One backend on this machine: does it open, and what does it read."""

    backend: str
    available: bool
    why: str = ""  # why not, or what it reads
    resolution_s: float | None = None
    idle_w: float | None = None
    estimated: bool = False


@dataclass(frozen=True)
class NoiseCheck:
    """Two short sessions of one small case."""

    backend: str
    j_per_token: tuple[float, ...]
    within: tuple[float, ...]  # each session's relative CI half-width of J/token
    seconds: tuple[float, ...]  # each session's wall time

    @property
    def between(self) -> float:
        """How far the two sessions' J/token differ (a fraction of the first)."""
        a, b = self.j_per_token[:2]
        return abs(b / a - 1.0) if a else math.nan

    def detectable(self, assumed: float = DEFAULT_SESSION_NOISE) -> float:
        """The smallest regression a one-session gate against one baseline finds here at
        80 % power: from the measured difference (one estimate of the noise between
        two sessions) or the assumed noise, whichever is larger."""
        measured = abs(math.log1p(self.between)) / math.sqrt(2.0)
        noise = max(measured, math.log1p(assumed))
        return Test(0.0, noise * math.sqrt(2.0), math.inf, "check").detectable(ALPHA, POWER)


class MachineBusy(ConfigError):
    """A session of the small case measured nothing: other work disturbed every trial.
    Not bad input: ``check`` still shows the meters it read, then says this in ``lines``
    (what happened, what to do), and exits as a run that could not finish (3)."""

    def __init__(self, session: int, max_background: float | None) -> None:
        self.lines: tuple[str, ...] = _all_disturbed(session, max_background)
        super().__init__("; ".join(self.lines))


@dataclass(frozen=True)
class Report:
    meters: tuple[MeterCheck, ...]
    auto: str  # what ``auto`` opens here
    noise: NoiseCheck | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    busy: tuple[str, ...] = ()  # the machine was too busy to read the noise: why, what to do

    def record(self) -> dict[str, Any]:
        """Plain JSON."""
        noise = self.noise
        return {
            "meters": [m.__dict__ for m in self.meters],
            "auto": self.auto,
            "sessions": None
            if noise is None
            else {
                "backend": noise.backend,
                "j_per_token": list(noise.j_per_token),
                "within_ci": list(noise.within),
                "seconds": list(noise.seconds),
                "between": noise.between,
                "one_session_gate_detects": noise.detectable(),
            },
            "notes": list(self.notes),
            "busy": list(self.busy),
        }


def check_meters(
    backends: Sequence[str] | None = None,
    opener: Callable[[str], Any] = open_meter,
    idle_s: float = IDLE_S,
) -> list[MeterCheck]:
    """Open each backend in turn: why not, or its resolution and idle power."""
    out = []
    for name in backends or [b for b in BUILTIN_BACKENDS if b != "auto"]:
        try:
            meter = opener(name)
        except MeterUnavailable as exc:  # the backend's own reason, without the preamble
            out.append(MeterCheck(name, False, _first_line(exc.reason)))
            continue
        except LLMEnergyError as exc:
            out.append(MeterCheck(name, False, _first_line(str(exc))))
            continue
        except Exception as exc:  # a vendor library's own failure: its line, not a trace
            out.append(MeterCheck(name, False, f"{type(exc).__name__}: {_first_line(str(exc))}"))
            continue
        try:
            with meter:
                idle = meter.measure_idle(idle_s)
            idle_w = math.fsum(idle.values()) / idle_s if idle else None
            estimated = any(d.method == Method.ESTIMATED for d in meter.domains.values())
            out.append(
                MeterCheck(name, True, meter.describe(), meter.resolution_s, idle_w, estimated)
            )
        except LLMEnergyError as exc:
            out.append(MeterCheck(name, False, f"opened, then: {_first_line(str(exc))}"))
        finally:
            meter.close()
    return out


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or ["(no message)"])[0]


def run_sessions(
    backend: str,
    count: int = 2,
    max_s: float = SESSION_MAX_S,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    max_background: float | None = DEFAULT_MAX_BACKGROUND,
) -> NoiseCheck:
    """``count`` fresh pytest sessions of the small case, each saved to a run file;
    ``max_background`` is their ``--energy-max-background`` (None: off)."""
    background = "off" if max_background is None else f"{max_background:.6g}"
    n_in, n_out = CASE
    values_, within, walls = [], [], []
    with tempfile.TemporaryDirectory(prefix="llmenergy-check-") as folder:
        root = Path(folder)
        (root / "test_check.py").write_text(SESSION_TEST.format(n_in=n_in, n_out=n_out))
        for i in range(count):
            path = root / f"session{i}.json"
            cmd = [
                python,
                "-m",
                "pytest",
                "test_check.py",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:randomly",
                f"--energy-backend={backend}",
                f"--energy-max-time={max_s:g}",
                f"--energy-max-background={background}",
                f"--energy-json={path}",
            ]
            start = time.perf_counter()
            done = subprocess.run(
                cmd, cwd=root, capture_output=True, text=True, check=False, env=env
            )
            walls.append(time.perf_counter() - start)
            if done.returncode != 0 or not path.exists():
                tail = (done.stdout + done.stderr).strip().splitlines()[-2:]
                raise ConfigError(
                    f"check: session {i + 1} of the small case ended with exit code "
                    f"{done.returncode}: {' | '.join(tail)}"
                )
            try:
                case = load(path).cases[0]
            except (RunFileError, IndexError) as exc:
                raise ConfigError(f"check: session {i + 1} saved no case: {exc}") from None
            j = value(case, "j_per_token")
            if j is None and case.disturbed and not case.trials:
                raise MachineBusy(i + 1, max_background)
            if j is None:
                raise ConfigError(f"check: session {i + 1} measured no energy per token")
            values_.append(float(j))
            within.append(_relative_ci(case))
    return NoiseCheck(backend, tuple(values_), tuple(within), tuple(walls))


def _all_disturbed(session: int, max_background: float | None) -> tuple[str, str]:
    """Why a session measured nothing (every trial disturbed), and what to do."""
    if max_background is None:  # only other processes on its GPUs disturb it then
        return (
            f"check: session {session}: every trial was disturbed by other processes on "
            "the GPUs it measures, so the noise between sessions was not read",
            "a noise read now would be theirs: stop them and run check again",
        )
    return (
        f"check: session {session}: every trial was disturbed by other work on this "
        f"machine (more than {max_background:.0%} of the CPUs busy), so the noise between "
        "sessions was not read",
        "a noise read now would be that work's: stop it and run check again, or read the "
        "noise with it running (--max-background=off)",
    )


def _relative_ci(case: Any) -> float:
    from .figures import FIGURES
    from .stats import summarize

    found = FIGURES["j_per_token"].trial_values(case)
    if not found or len(found) < 2:
        return math.nan
    s = summarize(found, 0.95)
    return s.half_width / s.mean if s.mean else math.nan


def run_check(
    *,
    sessions: int = 2,
    backends: Sequence[str] | None = None,
    idle_s: float = IDLE_S,
    max_s: float = SESSION_MAX_S,
    log: Callable[[str], None] = lambda _: None,
    max_background: float | None = DEFAULT_MAX_BACKGROUND,
) -> Report:
    """The meters, then (``sessions`` >= 2) the noise between sessions with ``auto``'s
    (``max_background``: the sessions' ``--energy-max-background``, None: off)."""
    log("opening each meter")
    meters = check_meters(backends, idle_s=idle_s)
    try:
        with open_meter("auto") as chosen:
            auto = chosen.kind  # what measures: "estimate", "nvml+rapl"
    except LLMEnergyError as exc:
        auto = f"none: {_first_line(str(exc))}"
    notes = []
    noise = None
    busy: tuple[str, ...] = ()
    if sessions >= 2 and not auto.startswith("none"):
        log(f"{sessions} short sessions of the small case with auto ({auto})")
        try:
            noise = replace(
                run_sessions("auto", sessions, max_s, max_background=max_background),
                backend=auto,
            )
        except MachineBusy as exc:  # the meters were read all the same: keep them
            busy = exc.lines
    elif sessions >= 2:
        notes.append("no meter opens here, so no session could be measured")
    if any(m.estimated for m in meters if m.backend in auto.split("+")):
        notes.append(f"{auto} estimates energy from CPU time and a TDP: it follows time, not power")
    return Report(tuple(meters), auto, noise, tuple(notes), busy)


__all__ = [
    "MachineBusy",
    "MeterCheck",
    "NoiseCheck",
    "Report",
    "check_meters",
    "run_check",
    "run_sessions",
]
