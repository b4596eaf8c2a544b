"""``llmenergy gatecheck``: what can this runner's energy gate see?

Runs the suite in fresh sessions, some of unchanged code (A/A), some with a regression of
known size injected (``--llm-inject-regression``), in rounds (A, B at each size in
turn, A again), then judges every pair the way each documented procedure would:

- ``single``: one baseline session against one session (``--energy-compare``);
- ``single+history``: the same, with the noise learned from the other A sessions (as
  after saving the baseline three times);
- ``rounds``: base and head measured alternately, each side's sessions merged
  (``llmenergy merge``) and compared round by round;
- ``paired`` (``--paired``): one ``llmenergy ab`` run per round and size, both sides in
  one stretch of time, trials alternating, compared pair by pair.

It reports, per procedure, the share of A/A comparisons with any FAIL, the per-case false
alarm rate, the detection rate per injected size and the smallest regression the gate
could have detected (median case).  Nothing here is specific to this project's own CI:
users run it on their runner to learn what their gate can see.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .compare import CompareOptions, Comparison, Gate, compare_cases, detectable
from .errors import ConfigError, one_line
from .history import run_sessions
from .sessions import DEFAULT_SESSION_NOISE, NoiseEstimate, noise_from_runs
from .storage.pool import pool_runs
from .storage.runfile import Run, RunFileError, load
from .tables import Table

BASE = "A"


@dataclass(frozen=True)
class Session:
    label: str  # "A" or the injected share as text ("25%")
    injected: float
    round: int
    run: Run
    seconds: float


@dataclass(frozen=True)
class Outcome:
    comparisons: int
    any_fail: int
    cases: int
    case_fails: int
    detectable: tuple[float, ...]

    @property
    def any_fail_share(self) -> float:
        return self.any_fail / self.comparisons if self.comparisons else math.nan

    @property
    def case_share(self) -> float:
        return self.case_fails / self.cases if self.cases else math.nan


@dataclass(frozen=True)
class PairedRun:
    """One ``llmenergy ab`` run of unchanged code (``injected`` 0) or with a regression
    injected into its head side."""

    label: str
    injected: float
    round: int
    base: Run
    head: Run
    seconds: float


PAIRED = "paired (llmenergy ab)"
_PAIRED_INDEX = "paired.json"


def outcome(comparisons: Sequence[Comparison]) -> Outcome:
    return Outcome(
        comparisons=len(comparisons),
        any_fail=sum(1 for c in comparisons if c.failed),
        cases=sum(sum(1 for d in c.deltas if d.gate is not None) for c in comparisons),
        case_fails=sum(len(c.failures) for c in comparisons),
        detectable=tuple(detectable(c) for c in comparisons),
    )


def schedule(rounds: int, shares: Sequence[float]) -> list[tuple[int, float]]:
    """(round, injected share) in the order sessions run: per round A, every size, A."""
    order: list[tuple[int, float]] = []
    for r in range(1, rounds + 1):
        order.append((r, 0.0))
        order += [(r, s) for s in shares]
        order.append((r, 0.0))
    return order


def share_text(share: float) -> str:
    return BASE if share == 0 else f"+{share:.0%}"


def run_sessions_now(
    pytest_args: Sequence[str],
    rounds: int,
    shares: Sequence[float],
    out: Path,
    *,
    log: Callable[[str], None] = lambda _: None,
) -> list[Session]:
    """Each session a fresh ``python -m pytest`` (a new process, as CI starts one)."""
    out.mkdir(parents=True, exist_ok=True)
    sessions = []
    order = schedule(rounds, shares)
    for i, (r, share) in enumerate(order, start=1):
        path = out / f"{i:03d}_{share_text(share).lstrip('+').replace('%', 'pct')}.json"
        if path.exists():
            raise ConfigError(f"{path} exists; give gatecheck a new --out folder")
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            # injected regressions run eager (llm/compiled.py): the unchanged sessions too
            "--llm-execution=eager",
            *pytest_args,
            "-q",
            "-p",
            "no:cacheprovider",
            f"--energy-json={path}",
            f"--llm-inject-regression={share:g}" if share else "--llm-inject-regression=off",
        ]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        if done.returncode not in (0, 1) or not path.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise ConfigError(
                f"session {i} ({' '.join(cmd[3:])}) ended with exit code {done.returncode}: "
                + " | ".join(tail)
            )
        try:
            run = load(path)
        except RunFileError as exc:
            raise ConfigError(str(exc)) from None
        log(f"session {i}/{len(order)}: round {r}, {share_text(share)}, {seconds:.0f} s")
        sessions.append(Session(share_text(share), share, r, run, seconds))
    (out / "sessions.json").write_text(
        json.dumps(
            [
                {
                    "file": s.run.path.name if s.run.path else "",
                    "label": s.label,
                    "injected": s.injected,
                    "round": s.round,
                    "seconds": s.seconds,
                }
                for s in sessions
            ],
            indent=1,
        )
    )
    return sessions


def run_paired_now(
    pytest_args: Sequence[str],
    rounds: int,
    shares: Sequence[float],
    out: Path,
    *,
    log: Callable[[str], None] = lambda _: None,
) -> list[PairedRun]:
    """Per round, one paired run of unchanged code and one per injected size, each a
    fresh ``llmenergy ab . .`` (the regression injected into its head side only)."""
    storage = out / "paired"
    found: list[PairedRun] = []
    index = []
    order = [(r, share) for r in range(1, rounds + 1) for share in (0.0, *shares)]
    for i, (r, share) in enumerate(order, start=1):
        name = f"p{i:03d}"
        inject = [f"--head-arg=--llm-inject-regression={share:g}"] if share else []
        cmd = [
            sys.executable,
            "-m",
            "pytest_llmenergy",
            "--storage",
            str(storage),
            "ab",
            ".",
            ".",
            "--save",
            name,
            "--seed",
            str(i),
            # one process pair, judged on its pairs of trials as it is saved: the
            # procedure this check has measured since it was written
            "--processes=1",
            "--confirm=off",
            *inject,
            "--",
            "--llm-execution=eager",  # as the injected side runs (llm/compiled.py)
            *pytest_args,
            "-q",
            "-p",
            "no:cacheprovider",
        ]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        files = {side: sorted(storage.glob(f"*/*_{name}-{side}.json")) for side in ("base", "head")}
        if done.returncode not in (0, 1) or not all(files.values()):
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise ConfigError(
                f"paired run {i} ({share_text(share)}) ended with exit code {done.returncode}: "
                + " | ".join(tail)
            )
        base, head = load(files["base"][-1]), load(files["head"][-1])
        log(f"paired run {i}/{len(order)}: round {r}, {share_text(share)}, {seconds:.0f} s")
        found.append(PairedRun(share_text(share), share, r, base, head, seconds))
        index.append(
            {
                "base": str(files["base"][-1].relative_to(out)),
                "head": str(files["head"][-1].relative_to(out)),
                "label": share_text(share),
                "injected": share,
                "round": r,
                "seconds": seconds,
            }
        )
    (out / _PAIRED_INDEX).write_text(json.dumps(index, indent=1))
    return found


def read_paired(folder: Path) -> list[PairedRun]:
    """The paired runs an earlier gatecheck --paired ran (none: an empty list)."""
    index = folder / _PAIRED_INDEX
    if not index.exists():
        return []
    rows = _index_rows(index, "paired runs")
    try:
        return [
            PairedRun(
                _field(index, i, r, "label", str),
                _field(index, i, r, "injected", float),
                _field(index, i, r, "round", int),
                load(folder / _field(index, i, r, "base", Path)),
                load(folder / _field(index, i, r, "head", Path)),
                _field(index, i, r, "seconds", float),
            )
            for i, r in enumerate(rows)
        ]
    except RunFileError as exc:
        raise ConfigError(f"{index}: not a gatecheck folder's paired runs ({exc})") from None


def read_sessions(folder: Path) -> list[Session]:
    """Sessions an earlier gatecheck ran (its --out folder), to judge them again."""
    index = folder / "sessions.json"
    rows = _index_rows(index, "sessions")
    sessions = [
        Session(
            _field(index, i, r, "label", str),
            _field(index, i, r, "injected", float),
            _field(index, i, r, "round", int),
            load(folder / _field(index, i, r, "file", Path)),
            _field(index, i, r, "seconds", float),
        )
        for i, r in enumerate(rows)
    ]
    for r in sorted({s.round for s in sessions}):
        if not any(s.round == r and s.injected == 0 for s in sessions):
            raise ConfigError(
                f"{index}: round {r} has no session of unchanged code (injected 0) to judge "
                f"the others against; {_RUN_AGAIN}"
            )
    return sessions


_RUN_AGAIN = "run gatecheck again into a new --out folder, which writes it"


def _index_rows(index: Path, what: str) -> list[dict[str, Any]]:
    """The rows of an index gatecheck wrote: a list of objects, one per session."""
    try:
        rows = json.loads(index.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"{index}: not a gatecheck folder ({one_line(str(why))})") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"{index}: not a list of {what}, one object each; {_RUN_AGAIN}")
    return rows


def _field(index: Path, i: int, row: dict[str, Any], key: str, kind: type) -> Any:
    """One field of an index's row, of its kind: a name, a share or time (a number, not
    below 0), a round (1 or more), or a file inside the folder."""
    value = row.get(key)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is float and number and math.isfinite(value) and value >= 0:
        return float(value)
    if kind is int and number and value == int(value) and value >= 1:
        return int(value)
    if kind is str and isinstance(value, str):
        return value
    inside = isinstance(value, str) and value and not Path(value).is_absolute()
    if kind is Path and inside and ".." not in Path(value).parts:
        return Path(value)
    wanted = {
        float: "a number, not below 0",
        int: "a whole number, 1 or more",
        str: "a string",
        Path: "a file's path inside the folder",
    }[kind]
    what = "is missing" if key not in row else f"should be {wanted}, not {json.dumps(value)}"
    raise ConfigError(one_line(f"{index}: [{i}].{key} {what}; {_RUN_AGAIN}"))


def judge(
    sessions: Sequence[Session],
    gates: Sequence[Gate],
    *,
    confidence: float,
    session_noise: float = DEFAULT_SESSION_NOISE,
    normalize: bool = True,
    paired: Sequence[PairedRun] = (),
) -> tuple[dict[str, dict[str, Outcome]], dict[str, float]]:
    """Per procedure, per label (A/A, +25%, ...): the outcome; and each procedure's time
    in sessions' seconds."""
    rounds = sorted({s.round for s in sessions})
    firsts = {r: next(s for s in sessions if s.round == r and s.injected == 0) for r in rounds}
    seconds = statistics.fmean(s.seconds for s in sessions)

    def cmp(base: Run, head: Run, history: dict[str, NoiseEstimate] | None = None) -> Comparison:
        return compare_cases(
            base.cases,
            head.cases,
            CompareOptions(
                gates=gates,
                confidence=confidence,
                session_noise=session_noise,
                history=history,
                normalize=normalize,
            ),
        )

    metrics = [g.metric for g in gates]
    a_runs = [s for s in sessions if s.injected == 0]
    labels = [BASE, *sorted({s.label for s in sessions if s.injected}, key=_share_of)]
    results: dict[str, dict[str, list[Comparison]]] = {
        "single": {k: [] for k in labels},
        "single+history": {k: [] for k in labels},
    }

    sides = {id(a): run_sessions(a.run, metrics, normalize) for a in a_runs}  # each run read once

    def single(base: Session, head: Session, label: str) -> None:
        results["single"][label].append(cmp(base.run, head.run))
        # the noise the other A sessions teach, as if saved before (the head left out)
        history = noise_from_runs([[sides[id(a)] for a in a_runs if a is not head]])
        results["single+history"][label].append(cmp(base.run, head.run, history))

    for i, base in enumerate(a_runs):  # every earlier A session against every later one
        for head in a_runs[i + 1 :]:
            single(base, head, BASE)
    for head in (s for s in sessions if s.injected):  # each B against its round's A's
        for base in (a for a in a_runs if a.round == head.round):
            single(base, head, head.label)
    if len(rounds) >= 2:
        key = f"{len(rounds)} rounds"
        results[key] = {k: [] for k in labels}
        base = pool_runs([firsts[r].run for r in rounds], name="base")
        seconds_a2 = [
            next(s for s in reversed(sessions) if s.round == r and s.injected == 0) for r in rounds
        ]
        results[key][BASE].append(cmp(base, pool_runs([s.run for s in seconds_a2], name="head")))
        for label in labels[1:]:
            heads = [next(s for s in sessions if s.round == r and s.label == label) for r in rounds]
            results[key][label].append(cmp(base, pool_runs([s.run for s in heads], name="head")))
    if paired:
        results[PAIRED] = _paired_results(paired, gates, confidence, labels)
    outcomes = {p: {k: outcome(v) for k, v in by.items()} for p, by in results.items()}
    times = {"single": 2 * seconds, "single+history": 5 * seconds}
    if paired:
        times[PAIRED] = statistics.fmean(run.seconds for run in paired)
    times.update({p: 2 * len(rounds) * seconds for p in outcomes if p.endswith("rounds")})
    return outcomes, times


def _paired_results(
    paired: Sequence[PairedRun], gates: Sequence[Gate], confidence: float, labels: list[str]
) -> dict[str, list[Comparison]]:
    """Each paired run's comparison of its two sides, by label: pairs measured side by
    side need no speed normalization."""
    results: dict[str, list[Comparison]] = {k: [] for k in labels}
    for run in paired:
        options = CompareOptions(
            gates=gates,
            confidence=confidence,
            normalize=False,
            paired=run.base.paired_with(run.head),
        )
        results.setdefault(run.label, []).append(
            compare_cases(run.base.cases, run.head.cases, options)
        )
    return results


def _share_of(label: str) -> float:
    return float(label.strip("+%")) / 100


def realized(sessions: Sequence[Session], metric: str) -> dict[str, float]:
    """The regression each injected size really caused: median over cases of the ratio of
    the injected sessions' mean to the A sessions' mean, minus one."""
    from .figures import figure

    f = figure(metric, per_trial=True, warn=False)

    def means(runs: Sequence[Session]) -> dict[str, float]:
        found: dict[str, list[float]] = {}
        for s in runs:
            for c in s.run.cases:
                values = f.trial_values(c) if c.measured else None
                if values:
                    found.setdefault(c.nodeid, []).append(statistics.fmean(values))
        return {k: statistics.fmean(v) for k, v in found.items()}

    a = means([s for s in sessions if s.injected == 0])
    out = {}
    for label in sorted({s.label for s in sessions if s.injected}, key=_share_of):
        b = means([s for s in sessions if s.label == label])
        ratios = [b[k] / a[k] - 1 for k in b if k in a and a[k] > 0]
        out[label] = statistics.median(ratios) if ratios else math.nan
    return out


def quality_table(
    outcomes: dict[str, dict[str, Outcome]], times: dict[str, float], real: dict[str, float]
) -> Table:
    labels = [k for k in next(iter(outcomes.values())) if k != BASE]
    keys = [
        "procedure",
        "aa_any_fail",
        "aa_case_fail",
        *[f"detect_{k}" for k in labels],
        "detectable",
        "seconds",
    ]
    headers = [
        "procedure",
        "A/A with any FAIL",
        "A/A cases FAIL",
        *[f"found {k} (real {real.get(k, math.nan):+.0%})" for k in labels],
        "detects >= (median)",
        "time",
    ]
    rows, cells = [], []
    for proc, by in outcomes.items():
        aa = by[BASE]
        det = [x for o in by.values() for x in o.detectable if math.isfinite(x)]
        mdr = statistics.median(det) if det else math.nan
        row = [
            proc,
            aa.any_fail_share,
            aa.case_share,
            *[by[k].case_share for k in labels],
            mdr,
            times[proc],
        ]
        rows.append(tuple(row))
        cells.append(
            (
                proc,
                f"{aa.any_fail}/{aa.comparisons}",
                f"{aa.case_fails}/{aa.cases} ({aa.case_share:.1%})",
                *[f"{by[k].case_fails}/{by[k].cases} ({by[k].case_share:.0%})" for k in labels],
                "—" if not math.isfinite(mdr) else f"{mdr:.0%}",
                f"{times[proc] / 60:.1f} min",
            )
        )
    return Table(
        title="what this runner's energy gate can see",
        keys=tuple(keys),
        headers=tuple(headers),
        rows=tuple(rows),
        cells=tuple(cells),
        notes=(
            "A/A: sessions of unchanged code compared; found: share of the cases whose "
            "injected regression failed the gate; real: the regression the injection caused "
            "(median case); detects: the smallest regression the gate could have found with "
            "80 % power (median case and comparison); time: sessions per verdict x the mean "
            "session",
        ),
    )
