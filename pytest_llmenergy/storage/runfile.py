"""The run file: one session's machine, code, options, meter and every trial, as JSON.

A run file is data only.  Reading one never executes anything from it (plain
``json``; no pickle, no imports named in the file), and every field is checked on the
way in, so a corrupt, truncated, foreign or newer file is one clear error naming it.

What a reader refuses, whoever wrote the file (one line naming the file and the field;
``llmenergy list`` shows the file as unreadable, every other run stays usable):

- a file larger than 64 MiB (some 75,000 trials at about 850 bytes each), before any
  of it is read: reading takes about 0.16 s a MiB and several times the file's size in
  memory (a 387 MB file took over two minutes and 3 GB); ``LLMENERGY_MAX_RUN_FILE_MB``
  raises the limit for a larger file that is real;
- JSON nested more than 32 levels deep (a run file needs 8), an object with a key
  twice, a string with half of a UTF-16 surrogate pair, NaN or Infinity, a number
  beyond a double's range (``1e400``) and an integer of more than 19 digits;
- a figure beyond 10^15 either way (``1e300`` seconds: no trial measures that much, and
  the statistics of such numbers would leave a double's range), and one other than 0
  nearer zero than 10^-30 (``5e-324`` joules: no meter resolves that, and a square or a
  product of such numbers underflows to 0, which the statistics then divide by);
- a physical quantity below zero: seconds, joules, watts, bytes, token counts,
  GPU clocks and times, a trial's busy-machine share, a case's meter resolution and
  speed reference.  Two figures may be negative: net joules (gross minus idle power x
  duration, not clipped at 0 so that noise stays unbiased) and anything in a trial
  marked ``rejected`` (kept as evidence, counted nowhere; the research's published
  data has negative CPU joules).  ``passes`` and ``queries`` are at least 1.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..controller.rule import ControllerSettings
from ..controller.targets import CITarget
from ..errors import ConfigError, LLMEnergyError, one_line
from ..meters.validity import DEFAULT_MAX_GAP_S, Telemetry
from ..probes.resources import ResourceUsage
from ..results import (
    SPLIT_MARKS,
    SPLITS,
    CaseResult,
    CountedWork,
    GpuNeighbour,
    GpuTelemetry,
    OpWork,
    PhaseRecord,
    PowerSlice,
    RequestRecord,
    ThermalWait,
    Trial,
    busy_guard,
)

FORMAT = "pytest-llmenergy-run"
# 1: pytest-llmenergy 0.1.0; "options" was a dump of the settings dataclasses.
# 2: "options" is an explicit record, one entry per option by its name (the ini key without
#    "llmenergy_"), e.g. {"backend": "auto", "confidence": 0.95, "compare_fail": [...]};
#    CI targets name figures ("time_s", not "time").  Version 1 files are read as they are.
#    Added since, optional when read: a trial's "background_cpu", a case's
#    "disturbed_trials" and its controller's "max_background" (absent: never checked),
#    "rule", "min_time_s" and "max_time_s" (absent: none); a case's "resolution_s" (the meter's)
#    and "prefill_passes" (trials of repeated prefill-only passes, each with "passes");
#    a case's "conversions" (gCO2e and price per kWh of its session); a trial's "gpu"
#    (temperature, SM clock, throttle reasons: see results.GpuTelemetry); a trial's
#    "rejected" (why the target's result did not count, e.g. a server's token counts);
#    a trial's "session" (which run of a pooled run measured it; absent: the run's own);
#    a trial's "visit" (which visit of its case, under --energy-interleave; absent: none)
#    and "reference_s" (the machine-speed reference around its case in its session);
#    the machine's "speed_reference" (readings of the reference workload through the
#    session) and "threads" (torch's and the OpenMP/MKL settings); a trial's "pair" (its
#    pair in a paired run, llmenergy ab) and the run's "pairing" ({"id": shared by the
#    two runs of one paired run, "side": "base" or "head"}); a case's "work" (counted work,
#    results.CountedWork: "prefill" and "decode" lists of operators with "name", "class",
#    "calls", "flops", "bytes" and "estimated", and "marked", "seconds"; absent: not counted;
#    optional: "derived_steps", the decode steps derived from the sampled ones, and
#    "full_because", why every step was counted after all);
#    a case's "thermal" (how it waited for the GPUs to cool first, results.ThermalWait:
#    "start_c" and "reference_c" lists of °C or null per GPU, "tolerance_c", "waited_s",
#    "gave_up"; absent: it did not wait); a trial's "steady_tokens" (a server burst's
#    output tokens streamed in its steady window, the phase "steady") and "unstable" (why
#    the burst had no steady window worth measuring; absent: it had, or was no burst) and
#    "steady_batch" (the window's mean batch, requests generating; absent: no window) and
#    "steady_batch_note" (why the server's running-requests gauge was set aside for the
#    client's count: it disagreed with it; absent: the batch is the gauge's, or no gauge).
#    a trial's gpu "neighbours" (other processes on the measured GPUs: "gpu", "pid", "name").
#    a trial's "telemetry" (a sampling meter's window judged, meters/validity.Telemetry:
#    "devices" and "read" lists of domains, "max_gap_s", "covered", "counter_vs_integral"
#    (null: no counter beside samples, or unbounded), "reason" ("": valid); absent: the
#    meter does not sample, or the run predates it) and the controller's "max_sample_gap_s".
#    the run's "writer" (the process writing it: "host", "pid", and "started", its start
#    in seconds since the epoch; absent: not recorded, and "running" is taken as said).
#    a trial's "split" (how its prefill | decode phases were split, results.SPLITS:
#    "prefill passes", the prefill's joules from a window of prefill-only passes right
#    after it; absent: at the marks), and the controller's "prefill_passes" ("on" or
#    "off": whether such windows were measured; absent: "on").
#    a trial's request's "input_tokens", "sent_s" (seconds after the window opened),
#    "status" (why it did not complete as asked), "prefill_j" and "decode_j" (its joules as
#    attributed, net of idle: may be below 0), "plain_j" (ML.ENERGY's steady J/token x its
#    output tokens) and "coarse" (why its share is not its own): a served workload's
#    requests (serving/attribution.py); absent: a burst's.
#    a trial's "busy" (true: counted though the machine was busy throughout, the session
#    measuring anyway, controller/busy.py; absent: false) and the controller's "busy"
#    ("measure" or "repeat": what a busy machine's trials became; absent: "repeat", as
#    every session did before).  a trial's "power" (a served workload's window slice by
#    slice: "start_s", "end_s" from the window's start and "joules"; absent: none).
SCHEMA_VERSION = 2

# How a run ended: still running (or killed without a word), finished, or interrupted.
RUNNING, COMPLETE, INTERRUPTED = "running", "complete", "interrupted"
# What a reader on the writer's host makes of ``running`` once the writer's process is
# gone: it was killed outright (SIGKILL, out of memory, a power cut) and never finishes.
ABANDONED = "abandoned"


class RunFileError(LLMEnergyError):
    """A run file cannot be read; the message names the file and says what is wrong."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        problem = one_line(problem)
        super().__init__(f"{one_line(os.fspath(path))}: {problem}")
        self.path = Path(path)
        self.problem = problem


@dataclass(frozen=True)
class Run:
    """A saved session.  ``cases`` are full results, so every report works on them."""

    run_id: str  # "0003" in the storage folder; "" for a file saved elsewhere
    name: str
    created: str  # ISO 8601, UTC
    status: str  # RUNNING, COMPLETE or INTERRUPTED (ABANDONED: read so, never written)
    hardware: str  # the storage folder's name: CPU, GPUs, meter
    machine: Mapping[str, Any]
    commit: Mapping[str, Any]
    options: Mapping[str, Any]
    meter: Mapping[str, Any]  # backend, description, notes, domains, idle_power_w
    cases: tuple[CaseResult, ...] = ()
    finished: str | None = None
    exit_status: int | None = None
    command: tuple[str, ...] = ()
    # The two runs of one ``llmenergy ab`` share an id; "side" says which this is.  A
    # comparison of the two pairs their trials (``Trial.pair``); empty: not paired.
    pairing: Mapping[str, str] = field(default_factory=dict)
    path: Path | None = field(default=None, compare=False)
    schema_version: int = SCHEMA_VERSION
    # The process writing the run ({"host", "pid", "started"}): a reader on that host
    # tells a run still being written from one whose writer was killed (ABANDONED).
    writer: Mapping[str, Any] = field(default_factory=dict)

    @property
    def confidence(self) -> float | None:
        """The confidence level the run was measured at, where its file says so sensibly
        (version 2 keeps it as the option; version 1 inside its controller settings)."""
        value = self.options.get("confidence")
        if self.schema_version < 2:
            controller = self.options.get("controller")
            value = controller.get("confidence") if isinstance(controller, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if 0 < value < 1 else None

    def paired_with(self, other: Run) -> bool:
        """Are the two the sides of one paired run (``llmenergy ab``)?  Then their trials
        pair up (``Trial.pair``) and a comparison tests each case pair by pair."""
        mine, theirs = self.pairing.get("id"), other.pairing.get("id")
        return (
            bool(mine) and mine == theirs and self.pairing.get("side") != other.pairing.get("side")
        )

    @property
    def label(self) -> str:
        """How reports name this run: ``0003_baseline`` or the file name."""
        if self.path is not None:
            return self.path.stem
        return "_".join(p for p in (self.run_id, self.name) if p) or "run"

    @property
    def backend(self) -> str:
        return str(self.meter.get("backend", ""))

    @property
    def meter_identity(self) -> dict[str, str]:
        """What another run must share for energies to be comparable: its meter's (see
        ``Meter.identity``; runs saved before it was recorded get it from their record)
        and its busy-machine check (``results.busy_guard``)."""
        return {**self._meter_identity(), **busy_guard(self.cases)}

    def _meter_identity(self) -> dict[str, str]:
        saved = self.meter.get("identity")
        if isinstance(saved, Mapping) and all(isinstance(v, str) for v in saved.values()):
            return {str(k): v for k, v in saved.items()}
        backend = self.backend
        if backend.startswith("auto(") and backend.endswith(")"):
            backend = backend[len("auto(") : -1]
        identity = {"meter": backend}
        domains = self.meter.get("domains")
        if isinstance(domains, Mapping):
            identity["domains"] = ", ".join(
                str(name)
                for name, d in domains.items()
                if not isinstance(d, Mapping) or d.get("counted", True)
            )
        tdp = re.search(r"TDP (\d+(?:\.\d+)?) W", str(self.meter.get("description", "")))
        if tdp:
            identity["TDP"] = f"{float(tdp.group(1)):g} W"
        return identity


# -- writing ---------------------------------------------------------------------------
def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _trial_dict(t: Trial) -> dict[str, Any]:
    return {
        "index": t.index,
        "seconds": t.seconds,
        "joules": t.joules,
        "net_joules": t.net_joules,
        "joules_by_domain": dict(t.joules_by_domain),
        "net_joules_by_domain": dict(t.net_joules_by_domain),
        "input_tokens": t.input_tokens,
        "output_tokens": t.output_tokens,
        "phases": {
            name: {
                "seconds": p.seconds,
                "joules": p.joules,
                "joules_by_domain": dict(p.joules_by_domain),
            }
            for name, p in t.phases.items()
        },
        "background_cpu": t.background_cpu,
        "passes": t.passes,
        "queries": t.queries,
        "requests": [_request_dict(q) for q in t.requests],
        **({"gpu": _gpu_dict(t.gpu)} if t.gpu is not None else {}),
        **({"rejected": t.rejected} if t.rejected else {}),
        **({"session": t.session} if t.session else {}),
        **({"visit": t.visit} if t.visit else {}),
        **({"reference_s": t.reference_s} if t.reference_s is not None else {}),
        **({"pair": t.pair} if t.pair else {}),
        **({"steady_tokens": t.steady_tokens} if t.steady_tokens else {}),
        **({"unstable": t.unstable} if t.unstable else {}),
        **({"steady_batch": t.steady_batch} if t.steady_batch else {}),
        **({"steady_batch_note": t.steady_batch_note} if t.steady_batch_note else {}),
        **({"telemetry": _telemetry_dict(t.telemetry)} if t.telemetry is not None else {}),
        **({"split": t.split} if t.split else {}),
        **({"busy": True} if t.busy else {}),
        **(
            {
                "power": [
                    {"start_s": p.start_s, "end_s": p.end_s, "joules": p.joules} for p in t.power
                ]
            }
            if t.power
            else {}
        ),
    }


def _request_dict(q: RequestRecord) -> dict[str, Any]:
    """A request's timings, and a served workload's lengths, status and joules."""
    out: dict[str, Any] = {
        "ttft_s": q.ttft_s,
        "latency_s": q.latency_s,
        "output_tokens": q.output_tokens,
    }
    if q.input_tokens is not None:
        out["input_tokens"] = q.input_tokens
    if q.sent_s is not None:
        out["sent_s"] = q.sent_s
    if q.status:
        out["status"] = q.status
    if q.prefill_j is not None and q.decode_j is not None:
        out["prefill_j"], out["decode_j"] = q.prefill_j, q.decode_j
    if q.plain_j is not None:
        out["plain_j"] = q.plain_j
    if q.coarse:
        out["coarse"] = q.coarse
    return out


def _telemetry_dict(v: Telemetry) -> dict[str, Any]:
    difference = v.counter_vs_integral  # unbounded (a counter of 0 J beside power): null
    return {**asdict(v), "counter_vs_integral": None if difference is None else _finite(difference)}


def _gpu_dict(g: GpuTelemetry) -> dict[str, Any]:
    return {
        "temperature_c_max": g.temperature_c_max,
        "sm_clock_mhz_mean": g.sm_clock_mhz_mean,
        "reasons": list(g.reasons),
        "power_capped_s": g.power_capped_s,
        "thermal_s": g.thermal_s,
        "throttled": g.throttled,
        "power_limit_w": g.power_limit_w,
        **(
            {"neighbours": [{"gpu": n.gpu, "pid": n.pid, "name": n.name} for n in g.neighbours]}
            if g.neighbours
            else {}
        ),
    }


def _controller_dict(o: ControllerSettings) -> dict[str, Any]:
    return {
        "min_trials": o.min_trials,
        "max_trials": o.max_trials,
        "confidence": o.confidence,
        "warmup": o.warmup,
        "max_background": o.max_background,
        "rule": o.rule,
        "min_time_s": o.min_time,
        "max_time_s": o.max_time,
        "max_sample_gap_s": o.max_sample_gap_s,
        "prefill_passes": o.prefill_passes,
        "busy": o.busy,
        "targets": [
            {"metric": t.metric, "value": t.value, "relative": t.relative} for t in o.targets
        ],
    }


def case_dict(r: CaseResult) -> dict[str, Any]:
    u = r.resources
    return {
        "nodeid": r.nodeid,
        "name": r.name,
        "labels": dict(r.labels),
        "input_tokens": r.input_tokens,
        "output_tokens": r.output_tokens,
        "status": r.status,
        "reason": r.reason,
        "backend": r.backend,
        "controller": _controller_dict(r.options),
        "methods": dict(r.methods),
        "counted": dict(r.counted),
        "resources": None
        if u is None
        else {
            "peak_rss_bytes": u.peak_rss_bytes,
            "peak_gpu_bytes": u.peak_gpu_bytes,
            "cpu_seconds": u.cpu_seconds,
            "iowait_share": None if u.iowait_share is None else _finite(u.iowait_share),
            "wall_seconds": u.wall_seconds,
        },
        "trials": [_trial_dict(t) for t in r.trials],
        "disturbed_trials": [_trial_dict(t) for t in r.disturbed],
        "resolution_s": r.resolution_s,
        "prefill_passes": [_trial_dict(t) for t in r.prefill_passes],
        "conversions": dict(r.conversions),
        "queries": r.queries,
        "op_profile": None if r.op_profile is None else dict(r.op_profile),
        **({"reference_s": r.reference_s} if r.reference_s is not None else {}),
        **({"work": _work_dict(r.work)} if r.work is not None else {}),
        **({"thermal": _thermal_dict(r.thermal)} if r.thermal is not None else {}),
    }


def _thermal_dict(w: ThermalWait) -> dict[str, Any]:
    return {
        "start_c": list(w.start_c),
        "reference_c": list(w.reference_c),
        "tolerance_c": w.tolerance_c,
        "waited_s": w.waited_s,
        "gave_up": w.gave_up,
    }


def _work_dict(w: CountedWork) -> dict[str, Any]:
    def ops(rows: tuple[OpWork, ...]) -> list[dict[str, Any]]:
        return [
            {
                "name": o.name,
                "class": o.op_class,
                "calls": o.calls,
                "flops": o.flops,
                "bytes": o.bytes,
                **({"estimated": True} if o.estimated else {}),
            }
            for o in rows
        ]

    return {
        "prefill": ops(w.prefill),
        "decode": ops(w.decode),
        "marked": w.marked,
        "seconds": w.seconds,
        **({"derived_steps": w.derived_steps} if w.derived_steps else {}),
        **({"full_because": w.full_because} if w.full_because else {}),
        **({"ranks": [_work_dict(rank) for rank in w.ranks]} if w.ranks else {}),
    }


def run_dict(run: Run) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "run": {
            "id": run.run_id,
            "name": run.name,
            "created": run.created,
            "finished": run.finished,
            "status": run.status,
            "exit_status": run.exit_status,
            "hardware": run.hardware,
            "command": list(run.command),
            **({"pairing": dict(run.pairing)} if run.pairing else {}),
            **({"writer": dict(run.writer)} if run.writer else {}),
        },
        "machine": dict(run.machine),
        "commit": dict(run.commit),
        "options": dict(run.options),
        "meter": dict(run.meter),
        "cases": [case_dict(c) for c in run.cases],  # last: dumps() relies on it
    }


def encode_case(case: CaseResult) -> str:
    """One case's JSON, indented to sit inside the file's ``cases`` list."""
    text = json.dumps(case_dict(case), indent=1, allow_nan=False)
    return "\n".join("  " + line for line in text.splitlines())


_EMPTY_CASES = '"cases": []\n}'


def dumps(run: Run, encoded_cases: Sequence[str] | None = None) -> str:
    """Strict JSON (no NaN or Infinity), so any JSON reader can take the file.

    ``encoded_cases`` (from ``encode_case``) spares a session that rewrites its file
    after every case from encoding the earlier cases again.
    """
    head = json.dumps(run_dict(replace(run, cases=())), indent=1, allow_nan=False)
    cases = (
        list(encoded_cases) if encoded_cases is not None else [encode_case(c) for c in run.cases]
    )
    if not cases:
        return head + "\n"
    assert head.endswith(_EMPTY_CASES)
    return head[: -len("[]\n}")] + "[\n" + ",\n".join(cases) + "\n ]\n}\n"


# -- reading ---------------------------------------------------------------------------
# Deeper than any run file (its trials' phases' domains are 8 levels down), shallow
# enough that nothing walking a file's free-form records recurses near Python's limit.
MAX_DEPTH = 32
# |n| < 10**19: more than any count, byte size or clock; a float would lose digits beyond.
_MAX_INT_DIGITS = 19
# No figure of a trial comes near it (10**15 s is 30 million years, 10**15 J 280 GWh), and
# below it the statistics' squares and sums never leave a double's range.
MAX_MAGNITUDE = 1e15
# Nothing measured is nearer zero than this but 0 itself (a meter's resolution is 1e-9 at
# best), and above it no product of a few figures underflows (a subnormal's square is 0).
MIN_MAGNITUDE = 1e-30


class _Hostile(ValueError):
    """JSON that parses but is no run file's: a key twice, a number out of range, ..."""


class _Refused:
    """What the parser leaves where a value is refused, for the walk to name its field."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


class _Twice(dict):  # type: ignore[type-arg]
    """An object that had a key twice (which value a reader sees is anyone's guess)."""

    key = ""


def _float(text: str) -> float | _Refused:
    value = float(text)
    return value if math.isfinite(value) else _Refused(f"{text[:30]} is beyond a double's range")


def _int(text: str) -> int | _Refused:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        return _Refused(f"{text[:20]}… has more than {_MAX_INT_DIGITS} digits")
    return int(text)


def _constant(name: str) -> _Refused:
    return _Refused(f"{name} is not a number JSON allows")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    twice = _Twice(obj)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            twice.key = key
            break
        seen.add(key)
    return twice


def _decode(text: str) -> Any:
    """The JSON document, refused (ValueError naming the field) where no writer of run
    files would have written it: see the module's docstring.  The check walks the
    document with a stack of its own, so no depth makes it recurse."""
    try:
        data = json.loads(
            text,
            parse_constant=_constant,
            parse_float=_float,
            parse_int=_int,
            object_pairs_hook=_object,
        )
    except RecursionError:
        raise _Hostile(f"nested more than {MAX_DEPTH} levels deep") from None
    Where = tuple[Any, str | int] | None  # (the parent's, this key or index): built on error
    stack: list[tuple[Any, int, Where]] = [([data], 0, None)]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            raise _Hostile(f"{_path(where)} is nested more than {MAX_DEPTH} levels deep")
        if type(value) is _Twice:
            raise _Hostile(f"{_path(where)} has the key {_shown(value.key)} twice")
        pairs = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in pairs:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, (where, key)))
            elif isinstance(child, str):
                _check_text(child, (where, key))
            elif isinstance(child, _Refused):
                raise _Hostile(f"{_path((where, key))}: {child.problem}")
            if isinstance(key, str):
                _check_text(key, (where, key))
    return data


def _path(where: tuple[Any, str | int] | None) -> str:
    """``cases[0].trials[2].seconds`` from the walk's (parent, key) links."""
    parts: list[str] = []
    while where is not None:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{_shown(key)}")
    text = "".join(reversed(parts[:-1])).lstrip(".")  # the last is the walk's own wrapper
    return text or "the document"


def _check_text(text: str, where: tuple[Any, str | int]) -> None:
    """Half a surrogate pair (``"\\ud800"`` in JSON) decodes, then fails every print
    and every write."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _Hostile(
                f"{_path(where)} holds half of a UTF-16 surrogate pair (\\ud800-\\udfff)"
            ) from None


def _shown(key: object) -> str:
    """A key from the file inside a field's path: itself when plain, else quoted."""
    text = str(key)
    if re.fullmatch(r"[\w:.+-]{1,40}", text):
        return text
    return repr(text[:40]) + ("…" if len(text) > 40 else "")


_TOO_LARGE = f"no measurement is that large (at most {MAX_MAGNITUDE:g} either way)"
_TOO_SMALL = f"no measurement is that near zero (0, or at least {MIN_MAGNITUDE:g} either way)"


def _magnitude_problem(value: float) -> str:
    """Why a figure is out of the range a measurement can take; "" when it is not."""
    if abs(value) > MAX_MAGNITUDE:
        return f"{value:g}; {_TOO_LARGE}"
    if value and abs(value) < MIN_MAGNITUDE:
        return f"{value:g}; {_TOO_SMALL}"
    return ""


class _Bad(Exception):
    """A field that is missing or of the wrong type; carries where it is."""


class _Reader:
    """Typed access to a decoded JSON object, with the path of every field for errors."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise _Bad(f"{where or 'the file'} should be a JSON object")
        self.data = data
        self.where = where

    def _at(self, key: str) -> str:
        return f"{self.where}.{_shown(key)}" if self.where else _shown(key)

    def get(
        self,
        key: str,
        kinds: type | tuple[type, ...],
        *,
        optional: bool = False,
        least: float | None = None,
    ) -> Any:
        """The field, of one of ``kinds``; a number below ``least`` is refused."""
        if key not in self.data:
            if optional:
                return None
            raise _Bad(f"{self._at(key)} is missing")
        value = self.data[key]
        if value is None and optional:
            return None
        # JSON has one number type: accept ints where floats are wanted, never bools.
        wanted = kinds if isinstance(kinds, tuple) else (kinds,)
        if float in wanted and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in wanted:
            raise _Bad(f"{self._at(key)} should be {_kind_name(wanted)}, not a boolean")
        if not isinstance(value, wanted):
            raise _Bad(f"{self._at(key)} should be {_kind_name(wanted)}")
        if least is not None and isinstance(value, int | float) and value < least:
            raise _Bad(f"{self._at(key)} is {value!r}; it cannot be below {least:g}")
        if isinstance(value, float) and (problem := _magnitude_problem(value)):
            raise _Bad(f"{self._at(key)} is {problem}")
        return value

    def amount(self, key: str, *, optional: bool = False, signed: bool = False) -> Any:
        """A physical quantity (seconds, joules, watts, bytes): not below zero, unless
        ``signed`` (net joules, a rejected trial's figures)."""
        return self.get(key, float, optional=optional, least=None if signed else 0.0)

    def count(self, key: str, *, optional: bool = False, least: int = 0) -> Any:
        return self.get(key, int, optional=optional, least=least)

    def obj(self, key: str, *, optional: bool = False) -> _Reader | None:
        value = self.get(key, dict, optional=optional)
        return None if value is None else _Reader(value, self._at(key))

    def objs(self, key: str, *, optional: bool = False) -> list[_Reader]:
        items = self.get(key, list, optional=optional) or []
        return [_Reader(item, f"{self._at(key)}[{i}]") for i, item in enumerate(items)]

    def numbers(self, key: str, *, signed: bool = True) -> dict[str, float]:
        """An object of numbers by name (joules by domain): none below zero, unless
        ``signed``."""
        mapping = self.get(key, dict)
        out: dict[str, float] = {}
        for name, value in mapping.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise _Bad(f"{self._at(key)}.{_shown(name)} should be a number")
            if not signed and value < 0:
                raise _Bad(f"{self._at(key)}.{_shown(name)} is {value!r}; it cannot be below 0")
            if problem := _magnitude_problem(float(value)):
                raise _Bad(f"{self._at(key)}.{_shown(name)} is {problem}")
            out[str(name)] = float(value)
        return out

    def names(self, key: str) -> tuple[str, ...]:
        """A list of strings (domains)."""
        items = self.get(key, list)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise _Bad(f"{self._at(key)}[{i}] should be a string")
        return tuple(items)

    def strings(self, key: str, kind: type = str) -> dict[str, Any]:
        mapping = self.get(key, dict)
        for name, value in mapping.items():
            if not isinstance(value, kind):
                raise _Bad(f"{self._at(key)}.{_shown(name)} should be {_kind_name((kind,))}")
        return dict(mapping)


def _kind_name(kinds: Sequence[type]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        dict: "an object",
        list: "a list",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _trial(r: _Reader) -> Trial:
    rejected = r.get("rejected", str, optional=True) or ""
    signed = bool(rejected)  # kept as evidence, counted nowhere: whatever the meter said
    phases = {}
    phase_map = _must(r.obj("phases"))
    for name in phase_map.data:
        p = _must(phase_map.obj(name))
        phases[str(name)] = PhaseRecord(
            p.amount("seconds", signed=signed),
            p.amount("joules", signed=signed),
            p.numbers("joules_by_domain", signed=signed),
        )
    return Trial(
        index=r.get("index", int),
        seconds=r.amount("seconds", signed=signed),
        joules=r.amount("joules", signed=signed),
        net_joules=r.amount("net_joules", signed=True),
        joules_by_domain=r.numbers("joules_by_domain", signed=signed),
        net_joules_by_domain=r.numbers("net_joules_by_domain"),
        input_tokens=r.count("input_tokens"),
        output_tokens=r.count("output_tokens"),
        phases=phases,
        background_cpu=r.amount("background_cpu", optional=True),
        passes=r.count("passes", optional=True, least=1) or 1,
        queries=r.count("queries", optional=True, least=1) or 1,
        requests=_requests(r, signed),
        gpu=_gpu(r.obj("gpu", optional=True)),
        rejected=rejected,
        session=r.count("session", optional=True) or 0,
        visit=r.count("visit", optional=True) or 0,
        reference_s=r.amount("reference_s", optional=True),
        pair=r.count("pair", optional=True) or 0,
        steady_tokens=r.count("steady_tokens", optional=True) or 0,
        unstable=r.get("unstable", str, optional=True) or "",
        steady_batch=r.amount("steady_batch", optional=True) or 0.0,
        steady_batch_note=r.get("steady_batch_note", str, optional=True) or "",
        telemetry=_telemetry(r.obj("telemetry", optional=True)),
        split=_split(r),
        busy=r.get("busy", bool, optional=True) or False,
        power=_power(r, signed),
    )


# A trial's requests at most (a served workload's: its spec allows 100,000), and the
# longest status or note kept with one (what the replay writes is cut at 300 characters).
MAX_REQUESTS = 100_000
MAX_REQUEST_TEXT = 1000


def _requests(r: _Reader, signed: bool) -> tuple[RequestRecord, ...]:
    items = r.objs("requests", optional=True)
    if len(items) > MAX_REQUESTS:
        raise _Bad(f"{r._at('requests')} holds {len(items):,} requests, more than {MAX_REQUESTS:,}")
    return tuple(_request(q, signed) for q in items)


# A served workload's slices at most (serving/replay.py keeps a window under 4,000).
MAX_POWER_SLICES = 100_000


def _power(r: _Reader, signed: bool) -> tuple[PowerSlice, ...]:
    """A served workload's window slice by slice: each in order, none ending before it
    starts."""
    items = r.objs("power", optional=True)
    if len(items) > MAX_POWER_SLICES:
        raise _Bad(f"{r._at('power')} holds {len(items):,} slices, more than {MAX_POWER_SLICES:,}")
    slices = []
    for item in items:
        start_s, end_s = item.amount("start_s"), item.amount("end_s")
        if end_s < start_s:
            raise _Bad(f"{item.where} ends at {end_s!r} s, before it starts ({start_s!r} s)")
        slices.append(PowerSlice(start_s, end_s, item.amount("joules", signed=signed)))
    return tuple(slices)


def _request(q: _Reader, signed: bool) -> RequestRecord:
    """One request; a workload's joules are net of idle power, so they may be below 0."""
    prefill_j = q.amount("prefill_j", optional=True, signed=True)
    decode_j = q.amount("decode_j", optional=True, signed=True)
    if (prefill_j is None) != (decode_j is None):
        raise _Bad(f"{q.where} has one of prefill_j and decode_j without the other")
    return RequestRecord(
        q.amount("ttft_s", optional=True, signed=signed),
        q.amount("latency_s", signed=signed),
        q.count("output_tokens"),
        input_tokens=q.count("input_tokens", optional=True),
        sent_s=q.amount("sent_s", optional=True),
        status=_short_text(q, "status"),
        prefill_j=prefill_j,
        decode_j=decode_j,
        plain_j=q.amount("plain_j", optional=True),
        coarse=_short_text(q, "coarse"),
    )


def _short_text(r: _Reader, key: str) -> str:
    text = r.get(key, str, optional=True) or ""
    if len(text) > MAX_REQUEST_TEXT:
        raise _Bad(f"{r._at(key)} runs past {MAX_REQUEST_TEXT} characters")
    return text


def _prefill_passes(r: _Reader) -> str:
    """The controller's ``prefill_passes``: on (absent: a run from before it) or off."""
    value = r.get("prefill_passes", str, optional=True) or "on"
    if value not in ("on", "off"):
        raise _Bad(f"{r._at('prefill_passes')} is {value!r}; known: 'on', 'off'")
    return value


def _split(r: _Reader) -> str:
    """How the trial's phases were split: one of SPLITS, refused otherwise."""
    split = r.get("split", str, optional=True) or SPLIT_MARKS
    if split not in SPLITS:
        raise _Bad(f"{r._at('split')} is {split!r}; known: {', '.join(map(repr, SPLITS))}")
    return split


def _telemetry(r: _Reader | None) -> Telemetry | None:
    if r is None:
        return None
    return Telemetry(
        devices=r.names("devices"),
        read=r.names("read"),
        max_gap_s=r.amount("max_gap_s"),
        covered=r.get("covered", bool),
        counter_vs_integral=r.amount("counter_vs_integral", optional=True),
        reason=r.get("reason", str),
    )


def decode_trial(data: Any, where: str = "a trial") -> Trial:
    """One trial's JSON (as ``case_dict`` writes it), checked like a run file's."""
    try:
        return _trial(_Reader(data, "trial"))
    except _Bad as exc:
        raise RunFileError(where, f"not a trial: {exc}") from None


def trial_dict(t: Trial) -> dict[str, Any]:
    """One trial as the run file writes it."""
    return _trial_dict(t)


def _gpu(r: _Reader | None) -> GpuTelemetry | None:
    if r is None:
        return None
    return GpuTelemetry(
        # a GPU may run below 0 °C: the temperature alone is any number
        temperature_c_max=r.get("temperature_c_max", float, optional=True),
        sm_clock_mhz_mean=r.amount("sm_clock_mhz_mean", optional=True),
        reasons=tuple(str(x) for x in (r.get("reasons", list, optional=True) or [])),
        power_capped_s=r.amount("power_capped_s", optional=True),
        thermal_s=r.amount("thermal_s", optional=True),
        throttled=r.get("throttled", str, optional=True) or "",
        power_limit_w=r.amount("power_limit_w", optional=True),
        neighbours=tuple(
            GpuNeighbour(n.get("gpu", str), n.count("pid"), n.get("name", str, optional=True) or "")
            for n in r.objs("neighbours", optional=True)
        ),
    )


def _controller(r: _Reader) -> ControllerSettings:
    try:
        targets = tuple(
            CITarget(t.get("metric", str), t.get("value", float), t.get("relative", bool))
            for t in r.objs("targets")
        )
        return ControllerSettings(
            min_trials=r.get("min_trials", int),
            max_trials=r.get("max_trials", int),
            confidence=r.get("confidence", float),
            warmup=r.get("warmup", int),
            targets=targets,
            # runs of 0.1.0 and 0.2.0.dev0 before the busy-machine check: never judged
            max_background=r.amount("max_background", optional=True),
            rule=r.get("rule", str, optional=True) or "default",
            min_time_s=r.amount("min_time_s", optional=True) or 0.0,
            max_time_s=r.amount("max_time_s", optional=True) or 0.0,
            max_sample_gap_s=r.amount("max_sample_gap_s", optional=True) or DEFAULT_MAX_GAP_S,
            prefill_passes=_prefill_passes(r),
            busy=r.get("busy", str, optional=True) or "repeat",
        )
    except ConfigError as exc:
        raise _Bad(f"{r.where}: {exc}") from None


def _resources(r: _Reader | None) -> ResourceUsage | None:
    if r is None:
        return None
    return ResourceUsage(
        peak_rss_bytes=r.count("peak_rss_bytes"),
        peak_gpu_bytes=r.count("peak_gpu_bytes", optional=True),
        cpu_seconds=r.amount("cpu_seconds"),
        iowait_share=r.amount("iowait_share", optional=True),
        wall_seconds=r.amount("wall_seconds"),
    )


def _case(r: _Reader) -> CaseResult:
    return CaseResult(
        nodeid=r.get("nodeid", str),
        name=r.get("name", str),
        labels=r.strings("labels"),
        input_tokens=r.count("input_tokens"),
        output_tokens=r.count("output_tokens"),
        status=r.get("status", str),
        options=_controller(_must(r.obj("controller"))),
        trials=tuple(_trial(t) for t in r.objs("trials")),
        methods=r.strings("methods"),
        counted=r.strings("counted", bool),
        backend=r.get("backend", str),
        reason=r.get("reason", str),
        resources=_resources(r.obj("resources", optional=True)),
        disturbed=tuple(_trial(t) for t in r.objs("disturbed_trials", optional=True)),
        resolution_s=r.amount("resolution_s", optional=True),
        prefill_passes=tuple(_trial(t) for t in r.objs("prefill_passes", optional=True)),
        conversions=r.numbers("conversions") if "conversions" in r.data else {},
        queries=r.count("queries", optional=True, least=1) or 1,
        op_profile=r.get("op_profile", dict, optional=True),
        reference_s=r.amount("reference_s", optional=True),
        work=_work(r.obj("work", optional=True)),  # runs before counted work: none
        thermal=_thermal(r.obj("thermal", optional=True)),
    )


def _thermal(r: _Reader | None) -> ThermalWait | None:
    if r is None:
        return None

    def temps(key: str) -> tuple[float | None, ...]:
        # a GPU may run below 0 °C: a temperature is any number, or null (not read)
        out: list[float | None] = []
        for v in r.get(key, list):
            number = isinstance(v, int | float) and not isinstance(v, bool)
            if v is not None and not (number and not _magnitude_problem(float(v))):
                raise _Bad(f"{r.where}.{key} should hold numbers (°C) or null")
            out.append(None if v is None else float(v))
        return tuple(out)

    return ThermalWait(
        start_c=temps("start_c"),
        reference_c=temps("reference_c"),
        tolerance_c=r.amount("tolerance_c"),
        waited_s=r.amount("waited_s"),
        gave_up=r.get("gave_up", bool),
    )


def _work(r: _Reader | None, rank: bool = False) -> CountedWork | None:
    """A case's counted work; under torchrun with each rank's (whose own have none)."""
    if r is None:
        return None

    def ops(key: str) -> tuple[OpWork, ...]:
        return tuple(
            OpWork(
                name=o.get("name", str),
                op_class=o.get("class", str),
                calls=o.count("calls"),
                flops=o.amount("flops"),
                bytes=o.count("bytes"),
                estimated=o.get("estimated", bool, optional=True) or False,
            )
            for o in r.objs(key)
        )

    ranks = () if rank else tuple(_work(w, rank=True) for w in r.objs("ranks", optional=True))
    return CountedWork(
        prefill=ops("prefill"),
        decode=ops("decode"),
        marked=r.get("marked", bool),
        seconds=r.amount("seconds"),
        ranks=tuple(w for w in ranks if w is not None),
        derived_steps=r.count("derived_steps", optional=True) or 0,
        full_because=r.get("full_because", str, optional=True) or "",
    )


def decode_case(text: str, where: str = "a worker's report") -> CaseResult:
    """One case's JSON (``case_dict``), as pytest-xdist workers send it; checked like a
    run file's cases."""
    try:
        return _case(_Reader(_decode(text), "case"))
    except (_Bad, ValueError) as exc:
        raise RunFileError(where, f"not a case: {exc}") from None


def _must(r: _Reader | None) -> _Reader:
    assert r is not None  # obj() without optional=True never returns None
    return r


def loads(text: str, path: str | os.PathLike[str]) -> Run:
    """Parse and check a run file's text; any problem is a RunFileError naming ``path``."""
    if not text.strip():
        raise RunFileError(path, "the file is empty (a run that never got its first write?)")
    try:
        data = _decode(text)
    except json.JSONDecodeError as exc:
        # An error on the last line means the file stops short (a write cut off).
        problem = "corrupt" if "\n" in text.rstrip()[exc.pos :] else "truncated"
        raise RunFileError(
            path,
            f"not a readable run file: the JSON is {problem} (line {exc.lineno}, "
            f"column {exc.colno}: {exc.msg}); re-run the benchmarks or delete the file",
        ) from None
    except ValueError as exc:  # _Hostile
        raise RunFileError(
            path,
            f"not a readable run file: {exc}; pytest-llmenergy never writes that, so the "
            "file was edited or damaged: delete it or move it elsewhere",
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RunFileError(
            path,
            f'not a pytest-llmenergy run file (no "format": "{FORMAT}" field); '
            "pass a file written by --energy-save, --energy-autosave or --energy-json",
        )
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise RunFileError(path, "corrupt run file: schema_version should be an integer")
    if version > SCHEMA_VERSION:
        raise RunFileError(
            path,
            f"written by a newer pytest-llmenergy (schema {version}; this version reads "
            f"up to {SCHEMA_VERSION}); upgrade pytest-llmenergy to read it",
        )
    if version < 1:
        raise RunFileError(path, f"corrupt run file: unknown schema_version {version}")
    try:
        top = _Reader(data, "")
        run = _must(top.obj("run"))
        found = Run(
            run_id=run.get("id", str),
            name=run.get("name", str),
            created=run.get("created", str),
            finished=run.get("finished", str, optional=True),
            status=run.get("status", str),
            exit_status=run.get("exit_status", int, optional=True),
            hardware=run.get("hardware", str),
            command=tuple(str(a) for a in run.get("command", list)),
            pairing=run.strings("pairing") if "pairing" in run.data else {},
            writer=_writer(run.obj("writer", optional=True)),
            machine=top.get("machine", dict),
            commit=top.get("commit", dict),
            options=top.get("options", dict),
            meter=top.get("meter", dict),
            cases=tuple(_case(c) for c in top.objs("cases")),
            path=Path(path),
            schema_version=version,
        )
    except _Bad as exc:
        raise RunFileError(
            path, f"corrupt run file: {exc}; re-run the benchmarks or delete the file"
        ) from None
    if found.status == RUNNING and writer_gone(found.writer):
        return replace(found, status=ABANDONED)
    return found


def _writer(r: _Reader | None) -> dict[str, Any]:
    if r is None:
        return {}
    return {
        "host": r.get("host", str),
        "pid": r.count("pid", least=1),
        "started": r.amount("started"),
    }


def this_writer() -> dict[str, Any]:
    """This process, as a run file's ``writer``."""
    import socket

    import psutil

    try:
        started = psutil.Process().create_time()
    except psutil.Error:
        return {}
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": started}


def writer_gone(writer: Mapping[str, Any]) -> bool:
    """Is the process that writes a run known to have ended?  Only a reader on its host
    can tell: its pid is free, or taken by a process started at another time (a recycled
    pid).  What it cannot tell (another host, no record, no permission): not gone."""
    import socket

    import psutil

    if not writer or writer.get("host") != socket.gethostname():
        return False
    try:
        started = psutil.Process(int(writer["pid"])).create_time()
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, OverflowError, ValueError):
        return False
    return abs(started - float(writer["started"])) > 1.0


# The largest run file read (see the module's docstring); the variable raises it.
MAX_BYTES = 64 * 2**20
MAX_BYTES_VARIABLE = "LLMENERGY_MAX_RUN_FILE_MB"


def max_bytes() -> int:
    """The largest run file read: ``MAX_BYTES``, or ``$LLMENERGY_MAX_RUN_FILE_MB`` MiB."""
    text = os.environ.get(MAX_BYTES_VARIABLE, "").strip()
    if not text:
        return MAX_BYTES
    if not re.fullmatch(r"[0-9]{1,7}", text) or int(text) == 0:
        raise ConfigError(
            f"{MAX_BYTES_VARIABLE}={one_line(text, 40)}: give the largest run file to read "
            "in MiB, a whole number such as 512"
        )
    return int(text) * 2**20


def _read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The file's bytes; a RunFileError past ``limit``, found from its size before any of
    it is read (and, for a file whose size says nothing, after ``limit`` bytes)."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        raw = file.read(limit + 1) if size <= limit else b""
    if size > limit or len(raw) > limit:
        shown = f"{size / 2**20:.0f} MiB" if size > limit else f"more than {limit // 2**20} MiB"
        raise RunFileError(
            path,
            f"is {shown}, larger than the {limit // 2**20} MiB a run file may be (some "
            "75,000 trials; reading it would take minutes and gigabytes); if it is real, set "
            f"{MAX_BYTES_VARIABLE} to a larger number of MiB",
        )
    return raw


def load(path: str | os.PathLike[str]) -> Run:
    try:
        raw = _read_bounded(path, max_bytes())
    except FileNotFoundError:
        raise RunFileError(path, "no such run file") from None
    except IsADirectoryError:
        raise RunFileError(path, "is a directory, not a run file") from None
    except OSError as exc:
        raise RunFileError(path, f"cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RunFileError(path, "not a run file: the content is not UTF-8 text") from None
    return loads(text, path)
