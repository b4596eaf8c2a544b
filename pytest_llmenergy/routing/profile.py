"""What each system measured: per model, the trials at every (input, output) token size.

Profiles come from the project's saved runs or from a plain CSV with one row per trial,
so that measurements taken with other tools can be routed too::

    system,model,input_tokens,output_tokens,seconds,joules
    M1-Pro,Llama-2 (7B),8,32,9.61,100.2

An optional ``sweep`` column (``input`` or ``output``) says which sweep a trial belongs
to, as the benchmark suite's cases do; without it the sweeps are inferred from the sizes.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..conditions.settings import GPU_LABELS, SETTING_LABEL
from ..errors import ConfigError
from ..results import CaseResult
from ..storage.runfile import MAX_MAGNITUDE, MIN_MAGNITUDE, Run

CSV_COLUMNS = ("system", "model", "input_tokens", "output_tokens", "seconds", "joules")
ALL_MODELS = "all"


class ProfileError(ConfigError):
    """Measurements that cannot be routed on; the message names the file and line."""


@dataclass(frozen=True)
class Point:
    """The trials at one token size."""

    input_tokens: int
    output_tokens: int
    seconds: tuple[float, ...]
    joules: tuple[float, ...]
    sweep: str = ""  # "input" / "output" when known

    @property
    def mean_seconds(self) -> float:
        return math.fsum(self.seconds) / len(self.seconds)

    @property
    def mean_joules(self) -> float:
        return math.fsum(self.joules) / len(self.joules)

    @property
    def trials(self) -> int:
        return len(self.seconds)


@dataclass(frozen=True)
class Profile:
    """One model on one system: every measured size, sorted by (input, output) tokens."""

    system: str
    model: str
    points: tuple[Point, ...]
    source: str = ""
    confidence: float = 0.95  # the level its measurements' intervals are drawn at
    estimated: bool = False  # energy from the estimate meter, not measured: figures say so
    predicted: bool = False  # from a calibration (llmenergy predict), never measured
    served: bool = False  # each request of a served workload, attributed in its batch
    note: str = ""  # what the figures left out, for the tables

    @property
    def average_power_w(self) -> float:
        """Joules over seconds of every trial: what one busy second costs on this system."""
        seconds = math.fsum(s for p in self.points for s in p.seconds)
        joules = math.fsum(j for p in self.points for j in p.joules)
        return joules / seconds if seconds > 0 else math.nan


Row = tuple[str, str, int, int, float, float, str]  # system, model, in, out, s, J, sweep
SWEEPS = ("input", "output")


def _group(rows: Iterable[Row], source: str) -> list[Profile]:
    trials: dict[tuple[str, str], dict[tuple[int, int, str], list[tuple[float, float]]]] = (
        defaultdict(lambda: defaultdict(list))
    )
    for system, model, n_in, n_out, seconds, joules, sweep in rows:
        trials[(system, model)][(n_in, n_out, sweep)].append((seconds, joules))
    profiles = []
    for (system, model), sizes in trials.items():
        points = tuple(
            Point(n_in, n_out, tuple(s for s, _ in ts), tuple(j for _, j in ts), sweep)
            for (n_in, n_out, sweep), ts in sorted(sizes.items())
        )
        profiles.append(Profile(system, model, points, source))
    return profiles


def _whole(text: str, column: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ProfileError(f"{where}: {column} should be a whole number >= 0, got {text!r}")
    return value


def _positive(text: str, column: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ProfileError(f"{where}: {column} should be a number > 0, got {text!r}")
    if not MIN_MAGNITUDE <= value <= MAX_MAGNITUDE:  # as a run file's figures
        raise ProfileError(
            f"{where}: {column} is {value:g}; no measurement is that "
            f"{'large' if value > 1 else 'near zero'} (between {MIN_MAGNITUDE:g} and "
            f"{MAX_MAGNITUDE:g})"
        )
    return value


def csv_rows(
    path: Path, columns: Sequence[str], what: str, error: type[ProfileError] = ProfileError
) -> Iterator[tuple[str, dict[str, str]]]:
    """``(file:line, {column: text})`` for each non-blank row: the shared reading of a
    profile or workload CSV, whose header must name ``columns`` (in any order, with more)."""
    with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: Excel's BOM
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in columns if c not in header]
        if missing:
            raise error(
                f"{path}:1: the header lacks {', '.join(missing)}; a {what} CSV has the "
                f"columns {','.join(columns)}"
            )
        for values in reader:
            where = f"{path}:{reader.line_num}"
            if not any(v.strip() for v in values):
                continue
            if len(values) < len(header):
                raise error(f"{where}: {len(values)} values for {len(header)} columns")
            yield where, {h: v.strip() for h, v in zip(header, values)}


def read_profile_csv(path: str | Path) -> list[Profile]:
    """One row per trial; extra columns are ignored, so richer exports load as they are."""
    path = Path(path)
    rows: list[Row] = []
    try:
        for where, row in csv_rows(path, CSV_COLUMNS, "profile"):
            if not row["system"] or not row["model"]:
                raise ProfileError(f"{where}: system and model must not be empty")
            sweep = row.get("sweep", "")
            if sweep not in ("", *SWEEPS):
                raise ProfileError(
                    f"{where}: sweep should be input, output or empty, got {sweep!r}"
                )
            rows.append(
                (
                    row["system"],
                    row["model"],
                    _whole(row["input_tokens"], "input_tokens", where),
                    _whole(row["output_tokens"], "output_tokens", where),
                    _positive(row["seconds"], "seconds", where),
                    _positive(row["joules"], "joules", where),
                    sweep,
                )
            )
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the profile: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ProfileError(f"{path}: not a CSV text file ({exc})") from None
    if not rows:
        raise ProfileError(f"{path}: no trials in the file")
    return _group(rows, str(path))


# Which of a run's cases to route: cases measured at several GPU settings count at one
# setting each (``frontier.at_best_settings(lam)``: the frontier's choice, a layer above).
CasePicker = Callable[[Sequence[CaseResult]], Sequence[CaseResult]]


def profiles_from_run(
    run: Run, system: str | None = None, pick: CasePicker | None = None
) -> list[Profile]:
    """A saved run's cases, one profile per model; the system is the run's hardware."""
    source = str(run.path or run.label)
    return profiles_from_cases(run.cases, system or run.hardware or run.label, source, pick)


def profiles_from_cases(
    cases: Sequence[CaseResult], system: str, source: str, pick: CasePicker | None = None
) -> list[Profile]:
    """Benchmark results, one profile per model: the case's ``model`` label, else its test
    function (by node id), whose parametrized cases are then the sizes of one model.
    ``pick`` chooses the cases to route (each at its best GPU setting), so a system is
    routed to as it would run; without it, cases measured at several GPU settings are
    refused rather than pooled."""
    if pick is not None:
        cases = pick(cases)
    settings: dict[tuple[object, ...], set[str]] = defaultdict(set)
    for c in cases:
        if SETTING_LABEL in c.labels:
            rest = tuple(sorted((k, v) for k, v in c.labels.items() if k not in GPU_LABELS))
            key = (c.nodeid.split("[", 1)[0], c.input_tokens, c.output_tokens, c.queries, rest)
            settings[key].add(c.labels[SETTING_LABEL])
    most = max((len(s) for s in settings.values()), default=0)
    if most > 1:
        raise ProfileError(
            f"{source or system}: a case measured at {most} GPU settings; route each at "
            "its best setting (llmenergy frontier --workload)"
        )
    rows: list[Row] = [
        (
            system,
            model_of(case),
            t.input_tokens,
            t.output_tokens,
            t.seconds,
            t.joules,
            case.labels.get("sweep", "") if case.labels.get("sweep") in SWEEPS else "",
        )
        for case in cases
        if alone_case(case)  # a batch's, a burst's or a served workload's trials are
        # another operating point (a served workload's: routing/served.py)
        for t in case.trials
        if t.seconds > 0 and t.joules > 0
    ]
    if not rows:
        raise ProfileError(f"{source}: no measured trials")
    by_model: dict[str, list[CaseResult]] = defaultdict(list)
    for case in cases:
        by_model[model_of(case)].append(case)
    return [
        replace(
            p,
            confidence=min(c.options.confidence for c in by_model[p.model]),
            estimated=any(c.estimated for c in by_model[p.model]),
        )
        for p in _group(rows, source)
    ]


def alone_case(case: CaseResult) -> bool:
    """A case that measured one query at a time: what a one-at-a-time profile routes."""
    return case.queries == 1 and not served_case(case)


def served_case(case: CaseResult) -> bool:
    """A case that replayed a workload: its requests carry their attributed joules."""
    return any(q.energy_j is not None for t in case.trials for q in t.requests)


def model_of(case: CaseResult) -> str:
    """The ``model`` label, else the test (its node id without parameters): two files'
    same-named tests are two models."""
    return case.labels.get("model") or case.nodeid.split("[", 1)[0]


def pool_models(profiles: Sequence[Profile]) -> list[Profile]:
    """Every model of a system as one (model ``all``): how the research averaged them."""
    rows = [
        (p.system, ALL_MODELS, pt.input_tokens, pt.output_tokens, s, j, pt.sweep)
        for p in profiles
        for pt in p.points
        for s, j in zip(pt.seconds, pt.joules)
    ]
    pooled = _group(rows, ", ".join(sorted({p.source for p in profiles})))
    of_system = {s: [p for p in profiles if p.system == s] for s in {p.system for p in profiles}}
    return [
        replace(
            p,
            confidence=min(q.confidence for q in of_system[p.system]),
            estimated=any(q.estimated for q in of_system[p.system]),
        )
        for p in pooled
    ]


def select(
    profiles: Sequence[Profile], systems: Sequence[str] = (), models: Sequence[str] = ()
) -> dict[str, list[Profile]]:
    """Profiles to route on, per model: each model measured on every chosen system.

    ``systems`` picks and orders systems (default: all, in the order first seen);
    ``models`` picks models (default: every model that all systems measured), and
    ``all`` pools each system's models.
    """
    seen: dict[tuple[str, str], Profile] = {}
    for p in profiles:
        if (p.system, p.model) in seen:
            raise ProfileError(
                f"two profiles give system {p.system!r}, model {p.model!r} "
                f"({seen[(p.system, p.model)].source} and {p.source}); pass each system once"
            )
        seen[(p.system, p.model)] = p
    known = list(dict.fromkeys(p.system for p in profiles))
    unknown = [s for s in systems if s not in known]
    if unknown:
        raise ProfileError(
            f"no measurements of system {unknown[0]!r}; the profiles have: {', '.join(known)}"
        )
    chosen = list(dict.fromkeys(systems)) or known
    if len(chosen) < 2:
        raise ProfileError(
            f"routing needs two or more systems, the profiles have {', '.join(chosen) or 'none'}"
        )
    kept = [p for p in profiles if p.system in chosen]
    if ALL_MODELS in models and len(set(models)) > 1:
        raise ProfileError(f"model {ALL_MODELS!r} pools every model; give it alone")
    if ALL_MODELS in models:
        pooled = pool_models(kept)
        return {ALL_MODELS: sorted(pooled, key=lambda p: chosen.index(p.system))}
    by_system = {s: {p.model for p in kept if p.system == s} for s in chosen}
    common = [
        m for m in dict.fromkeys(p.model for p in kept) if all(m in by_system[s] for s in chosen)
    ]
    wanted = list(dict.fromkeys(models)) or common
    for m in wanted:
        lacking = [s for s in chosen if m not in by_system[s]]
        if lacking:
            raise ProfileError(
                f"model {m!r} was not measured on {', '.join(lacking)}; models measured on "
                f"every system: {', '.join(common) or 'none'} (or --model all to pool them)"
            )
    if not wanted:
        raise ProfileError(
            "no model was measured on every system; pick one with --model, "
            "or pool each system's models with --model all"
        )
    return {m: [seen[(s, m)] for s in chosen] for m in wanted}
