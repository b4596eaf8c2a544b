"""Every reader, fed generated hostile input (issue 33): it reads it, or refuses it in one
line of the documented error type; nothing else is lost or changed.

The readers: run files (the raw text through ``loads``, and valid files with fields
replaced, removed or given twice), a storage folder with one such file among good runs
(``llmenergy list``, ``compare``), the pytest-xdist workers' case channel, the research's
CSVs (``llmenergy import``), and every option's parser (the command line's and the ini
file's values reach the same one) with the settings it builds, the routing workload's
file included.

Bounded for the default test run (about 20 s in all here, at most 60 s), and
derandomized: every run tries the same examples, so a red CI run is reproducible and
never a new draw on someone else's change.  ``LLMENERGY_HYPOTHESIS=hunt`` runs twenty
times the examples, freshly random, to look for new failures; a failure it finds prints
the example to add with ``@example``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_llmenergy import case_tables
from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.comparison_text import comparison_table
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.export import EXPORT_FORMATS, export_text
from pytest_llmenergy.figures import FIGURES
from pytest_llmenergy.meters.validity import Telemetry
from pytest_llmenergy.plugin import option_rows
from pytest_llmenergy.plugin.options import OPTIONS, SECTIONS
from pytest_llmenergy.results import CountedWork, GpuTelemetry, OpWork, RequestRecord
from pytest_llmenergy.routing.workload import WorkloadError, load_workload
from pytest_llmenergy.storage.research import _NEEDED, read_rows, system_runs
from pytest_llmenergy.storage.runfile import (
    COMPLETE,
    MAX_MAGNITUDE,
    MIN_MAGNITUDE,
    Run,
    RunFileError,
    case_dict,
    decode_case,
    dumps,
    loads,
)
from pytest_llmenergy.storage.store import Storage
from pytest_llmenergy.tables import render
from tests.casefactory import make_case, make_trials
from tests.test_storage_runfile import sample_run

HUNT = os.environ.get("LLMENERGY_HYPOTHESIS") == "hunt"
settings.register_profile(
    "llmenergy-readers",
    deadline=None,  # a shared CI machine's pauses are no failure
    derandomize=True,
    database=None,  # derandomized: nothing to replay, nothing written into the tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "llmenergy-readers-hunt",
    parent=settings.get_profile("llmenergy-readers"),
    derandomize=False,
)
PROFILE = settings.get_profile("llmenergy-readers-hunt" if HUNT else "llmenergy-readers")


def bounded(examples: int) -> settings:
    return settings(PROFILE, max_examples=examples * 20 if HUNT else examples)


def assert_one_line(exc: BaseException, *, starts: str = "") -> None:
    message = str(exc)
    assert message and "\n" not in message and "\r" not in message, repr(message)
    assert message.startswith(starts), message
    message.encode("utf-8")  # printable on any terminal: no half surrogate pair


# -- hostile JSON, written by hand so that it can hold what json.dumps never writes -------
class Raw(str):
    """Text to write as it is: ``1e400``, ``NaN``, a 5000-digit integer."""


class Pairs(list):  # type: ignore[type-arg]
    """An object as its pairs, so that a key can come twice."""


def emit(value: Any) -> str:
    """JSON text of ``value``; dicts and ``Pairs`` as objects, ``Raw`` verbatim."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        value = Pairs(value.items())
    if isinstance(value, Pairs):
        return "{" + ", ".join(f"{emit(str(k))}: {emit(v)}" for k, v in value) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(emit(v) for v in value) + "]"
    return json.dumps(value)  # a lone surrogate becomes "\udc80": JSON allows the escape


ANY_CHAR = st.characters(exclude_categories=())  # lone surrogates included
NUMBERS = st.one_of(
    st.integers(-(10**25), 10**25),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1e400", "-1e400", "1E309", "9" * 5000, "-0", "0.0e0", "1" + "0" * 19]).map(
        Raw
    ),
)
SCALARS = st.one_of(
    st.none(), st.booleans(), NUMBERS, st.text(ANY_CHAR, max_size=12), st.just("x" * 10_000)
)
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(st.tuples(st.text(ANY_CHAR, max_size=6), inner), max_size=4).map(Pairs),
    ),
    max_leaves=20,
)


def nested(document: Any, depth: int) -> Any:
    for i in range(depth):
        document = [document] if i % 2 else {"a": document}
    return document


def nested_text(document: Any, depth: int) -> str:
    """``document`` inside ``depth`` lists and objects, written without recursing."""
    opening = "".join("[" if i % 2 else '{"a": ' for i in range(depth))
    return opening + emit(document) + "".join("]" if i % 2 else "}" for i in reversed(range(depth)))


HOSTILE_TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=40),
    st.builds(nested_text, DOCUMENTS, st.integers(0, 1500)),
)


# -- a valid run with every kind of field, and ways to spoil it ---------------------------
def rich_run() -> Run:
    """A run file's every part: phases, GPU telemetry, judged power telemetry, requests, a
    rejected trial, disturbed trials, prefill passes, conversions, resources, counted work."""
    trials = make_trials([0.1, 0.2, 0.3])
    trials = (
        replace(
            trials[0],
            gpu=GpuTelemetry(61.0, 1410.0, ("sw_power_cap",), 0.1, 0.0, "", 300.0),
            requests=(RequestRecord(0.01, 0.1, 4),),
            background_cpu=0.02,
            reference_s=0.006,
            telemetry=Telemetry(
                ("gpu:0", "gpu:1"), ("gpu:0",), 3.0, True, 0.01, "gpu:1 never read"
            ),
        ),
        *trials[1:],
    )
    rejected = replace(make_trials([0.15])[0], rejected="server counted 5 tokens", joules=-1.0)
    case = replace(
        make_case([0.1]),
        trials=trials,
        disturbed=(rejected,),
        prefill_passes=tuple(replace(t, passes=4) for t in make_trials([0.05])),
        conversions={"gco2e_per_kwh": 400.0, "price_per_kwh": 0.3},
        resolution_s=0.001,
        work=CountedWork(
            prefill=(OpWork("aten::addmm", "matmul", 4, 1.5e6, 40_000),),
            decode=(
                OpWork("aten::mm", "matmul", 6, 9.0e5, 30_000),
                OpWork(
                    "aten::_scaled_dot_product_flash_attention_for_cpu",
                    "attention",
                    2,
                    512.0,
                    900,
                    True,
                ),
            ),
            marked=True,
            seconds=0.25,
        ),
    )
    other = make_case([0.4, 0.41], input_tokens=64, model="tiny-mistral")
    return replace(sample_run((case, other)), status=COMPLETE)


RICH = json.loads(dumps(rich_run()))


def places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key and index of a decoded file, as paths from its top."""
    yield path
    if isinstance(value, dict | list):
        for key, child in value.items() if isinstance(value, dict) else enumerate(value):
            yield from places(child, (*path, key))


PLACES = list(places(RICH))[1:]
SPOILERS = st.one_of(
    SCALARS,
    st.sampled_from([-1, -1e-9, -1e308, 1e308, 10**19 - 1, 0, "", [], {}, True]),
    # subnormal and tiny: a square of them underflows to 0, which statistics divide by
    st.sampled_from([5e-324, -5e-324, 2.2e-308, 1e-200, 1e-31, 1e-30, -1e-30]),
    st.builds(nested, SCALARS, st.integers(30, 40)),
)


@st.composite
def spoiled(draw: st.DrawFn, document: Any = RICH) -> str:
    """The document with one to three fields replaced, removed or given twice."""
    data = json.loads(json.dumps(document))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PLACES))
        parent = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change took this place away
        if not isinstance(parent, dict | list):  # a value given twice is text now
            continue
        how = draw(st.sampled_from(["replace", "remove", "twice"]))
        if how == "replace" or not isinstance(parent, dict):
            parent[path[-1]] = draw(SPOILERS)
        elif how == "remove":
            del parent[path[-1]]
        else:
            parent[path[-1]] = Raw(f"{emit(parent[path[-1]])}, {json.dumps(path[-1])}: 1")
    return emit(data)


def check_read(run: Run) -> None:
    """What a reader let through is safe downstream: finite, physical quantities not
    negative where they count, shown as tables, written back and read back unchanged."""
    for case in run.cases:
        assert case.input_tokens >= 0 and case.output_tokens >= 0
        for t in (*case.trials, *case.disturbed, *case.prefill_passes):
            numbers = [t.seconds, t.joules, t.net_joules, *t.joules_by_domain.values()]
            assert all(math.isfinite(n) and abs(n) <= MAX_MAGNITUDE for n in numbers)
            assert all(n == 0 or abs(n) >= MIN_MAGNITUDE for n in numbers)
            if not t.rejected:
                assert (
                    t.seconds >= 0
                    and t.joules >= 0
                    and min(t.joules_by_domain.values(), default=0) >= 0
                )
            assert t.input_tokens >= 0 and t.output_tokens >= 0 and t.passes >= 1
            if t.telemetry is not None:  # judged telemetry: finite, never negative
                gap, difference = t.telemetry.max_gap_s, t.telemetry.counter_vs_integral
                assert math.isfinite(gap) and gap >= 0
                assert difference is None or (math.isfinite(difference) and difference >= 0)
        if case.work is not None:  # counted work: counts, never negative or infinite
            assert math.isfinite(case.work.seconds) and case.work.seconds >= 0
            for o in case.work.ops():
                assert o.calls >= 0 and o.bytes >= 0 and isinstance(o.estimated, bool)
                assert math.isfinite(o.flops) and 0 <= o.flops <= MAX_MAGNITUDE
    render(case_tables.case_tables(run.cases), "table")
    counted = [k for k, f in FIGURES.items() if f.exact]  # figures of the counted work
    render(case_tables.case_tables(run.cases, columns=counted, group_by=()), "csv")
    for fmt in EXPORT_FORMATS:  # strict JSON: no figure of a read run makes an inf
        export_text(list(run.cases), fmt)
    again = loads(dumps(run), "again.json")
    assert replace(again, schema_version=run.schema_version) == run  # written as the newest


def read_or_refuse(text: str, path: str = "hostile.json") -> Run | None:
    try:
        run = loads(text, path)
    except RunFileError as exc:
        assert_one_line(exc, starts=f"{path}: ")
        return None
    check_read(run)
    return run


# -- run files ------------------------------------------------------------------------------
@bounded(150)
@given(HOSTILE_TEXT)
@example("[" * 200_000)
@example('{"format": "pytest-llmenergy-run", "schema_version": 2, "run": {}, "run": 1}')
def test_any_text_is_a_run_or_one_line(text: str) -> None:
    read_or_refuse(text)


@bounded(400)
@given(spoiled())
def test_a_spoiled_run_file_is_read_safely_or_refused_in_one_line(text: str) -> None:
    read_or_refuse(text)


def every_figure(value: float) -> str:
    """The rich run with every trial's seconds and joules set to ``value``."""
    data = json.loads(json.dumps(RICH))
    for case in data["cases"]:
        for trial in (*case["trials"], *case["prefill_passes"]):
            trial.update(seconds=value, joules=value, net_joules=value, phases={})
            trial["joules_by_domain"] = dict.fromkeys(trial["joules_by_domain"], value)
            trial["net_joules_by_domain"] = dict.fromkeys(trial["net_joules_by_domain"], value)
    return emit(data)


@bounded(60)
@given(
    st.one_of(
        st.floats(min_value=0, max_value=2e15, allow_subnormal=True),
        st.sampled_from([5e-324, 1e-320, 2.2e-308, 1e-160, 1e-31, 1e-30, 1e15]),
    )
)
def test_a_run_of_tiny_or_huge_figures_is_refused_or_safe_for_statistics(value: float) -> None:
    """Issue 54: 5e-324 joules passed the reader, then a mean's square underflowed to 0
    and the statistics divided by it (report, exports, a gated comparison)."""
    run = read_or_refuse(every_figure(value))
    if run is None:
        assert 0 < value < MIN_MAGNITUDE or value > MAX_MAGNITUDE
        return
    gates = parse_gates("j_per_token:5%,time_s:5%")
    for baseline, current in ((run, run), (loads(every_figure(0.5), "b.json"), run)):
        comparison = compare_cases(baseline.cases, current.cases, CompareOptions(gates=gates))
        render([comparison_table(comparison)], "table")


@contextlib.contextmanager
def storage_with(text: str) -> Iterator[tuple[Path, Path]]:
    """A storage folder with two good runs (base, head) and ``text`` named like a run."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        storage = Storage(root)
        for name, seconds in (("base", [0.1, 0.11, 0.12]), ("head", [0.2, 0.21, 0.22])):
            writer = storage.claim("cpu-x__no-gpu__trace", name)
            writer.write(dumps(replace(sample_run((make_case(seconds),)), name=name)))
        hostile = root / "cpu-x__no-gpu__trace" / "0003_hostile.json"
        hostile.write_text(text, encoding="utf-8", errors="surrogatepass")
        yield root, hostile


def run_cli(*argv: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


@bounded(40)
@given(st.one_of(HOSTILE_TEXT, spoiled()))
@example("[" * 200_000)
def test_a_hostile_file_in_the_storage_leaves_the_others_listed_and_usable(text: str) -> None:
    with storage_with(text) as (root, hostile):
        before = sorted((p.name, p.read_bytes()) for p in hostile.parent.iterdir())
        code, out, err = run_cli("--storage", root, "list", "--format", "json")
        assert code == 0 and err == ""
        rows = json.loads(out)["tables"][0]["rows"]
        assert [r["name"] for r in rows[:2]] == ["base", "head"]
        assert [r["status"] for r in rows[:2]] == [COMPLETE, COMPLETE]
        status = rows[2]["status"]
        assert "\n" not in status
        code, out, err = run_cli("--storage", root, "show", "0003")
        if status.startswith("unreadable: "):
            assert (code, out) == (2, "")
            assert err == f"llmenergy: error: {hostile}: {status.removeprefix('unreadable: ')}\n"
        else:
            assert code == 0
        assert run_cli("--storage", root, "compare", "base", "head")[0] == 0
        assert sorted((p.name, p.read_bytes()) for p in hostile.parent.iterdir()) == before


# -- the workers' channel ---------------------------------------------------------------------
CASE = RICH["cases"][0]


@bounded(150)
@given(st.one_of(HOSTILE_TEXT, spoiled(CASE)))
@example("[" * 200_000)
def test_a_worker_report_is_a_case_or_one_line(text: str) -> None:
    try:
        case = decode_case(text, "test_x.py::test_x: its worker's report")
    except RunFileError as exc:
        assert_one_line(exc, starts="test_x.py::test_x: its worker's report: not a case: ")
        return
    assert decode_case(json.dumps(case_dict(case))) == case


# -- the research's CSVs ----------------------------------------------------------------------
CELLS = st.one_of(
    st.sampled_from(
        [
            "inf",
            "-inf",
            "nan",
            "1e400",
            "1e300",
            "1.7e308",
            "-0",
            "0",
            "1",
            "1.5",
            "-2",
            "",
            " 7 ",
            "9" * 400,
            "1_000",
            "0x10",
            "inference",
            "startup",
            "Llama-2 (7B)",
            "Palmetto Intel+A100",
            "M1-Pro",
        ]
    ),
    st.text(ANY_CHAR.filter(lambda c: not 0xD800 <= ord(c) <= 0xDFFF), max_size=8),
)
HEADER = [*_NEEDED, "Output Token Limit"]


@st.composite
def research_csv(draw: st.DrawFn) -> bytes:
    header = draw(st.permutations(HEADER))
    if draw(st.integers(0, 4)) == 4:  # a column missing, now and then
        header = header[: draw(st.integers(0, len(header)))]
    good = {
        "Phase": "inference",
        "Runtime (s)": "2.5",
        "CPU Energy (J)": "30.1",
        "GPU Energy (J)": "250.0",
        "Output Token Limit": "32",
        "Number of Input Tokens": "8",
        "Iteration": "1",
        "Model": "Llama-2 (7B)",
        "System": "Palmetto Intel+A100",
        "Total Number of Tokens": "40",
    }
    rows = []
    for _ in range(draw(st.integers(0, 4))):
        row = dict(good)
        for column in draw(st.lists(st.sampled_from(HEADER), max_size=2)):
            row[column] = draw(CELLS)
        rows.append([row[c] for c in header])
    text = io.StringIO()
    csv.writer(text).writerows([header, *rows])
    data = text.getvalue().encode("utf-8")
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data  # a spreadsheet's "CSV UTF-8"
    if draw(st.integers(0, 3)) == 3:  # a stray byte
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\x00", b"\r", b'"', b","])) + data[at:]
    return data


@bounded(200)
@given(research_csv())
def test_a_research_csv_imports_or_is_one_line_naming_it(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stats.csv"
        path.write_bytes(data)
        try:
            rows = read_rows(path)
        except ConfigError as exc:
            assert_one_line(exc, starts=str(path))
            return
    for run in system_runs(rows, [str(path)], "2024-05-01T00:00:00+00:00"):
        check_read(loads(dumps(run), "imported.json"))


# -- options and ini values ---------------------------------------------------------------------
FRAGMENTS = st.sampled_from(
    [
        "0",
        "1",
        "-1",
        "1e400",
        "inf",
        "nan",
        "9" * 30,
        "9" * 5000,
        "1.5",
        "50%",
        "500%",
        "ms",
        "s",
        "W",
        "gpu:0",
        "energy_j",
        "j_per_token",
        "time_s",
        "5%",
        "0.5s",
        "=",
        ":",
        ",",
        " ",
        "\n",
        "\udcff",
        "all",
        "auto",
        "on",
        "off",
        "..",
        "/",
        "x=1,2",
        "150W",
        "1500MHz",
        "cpu",
        "alpaca",
    ]
)
OPTION_TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=30), st.lists(FRAGMENTS, max_size=6).map("".join)
)
# Values that are physical quantities or counts: never negative, never infinite.
PHYSICAL = {"SECONDS", "WATTS", "SHARE", "N", "PID", "LEVEL"}


def numbers_in(value: Any) -> Iterator[float]:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            yield from numbers_in(v)
    elif is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            yield from numbers_in(getattr(value, f.name))


@bounded(800)
@given(st.sampled_from(OPTIONS), OPTION_TEXT)
@example(next(o for o in OPTIONS if o.flag == "--energy-seed"), "9" * 5000)
def test_an_option_value_is_taken_or_refused_in_one_line(option: Any, text: str) -> None:
    """The command line's value and the ini file's (stripped) reach the same parser; its
    value then builds the section's settings (which check values together)."""
    origin = f"{option.flag}={text}"
    try:
        value = option_rows._parse(option, text, origin)
    except pytest.UsageError as exc:
        assert_one_line(exc)
        return
    if option.metavar in PHYSICAL:
        assert all(math.isfinite(n) and n >= 0 for n in numbers_in(value)), value
    section = next(s for s in SECTIONS if option in s.options)
    try:
        built = section.build({option.field_name: value}, [option.flag])
    except pytest.UsageError as exc:
        assert_one_line(exc)
        return
    assert getattr(built, option.field_name) is not None or value is None


WORKLOAD_CELLS = st.one_of(
    st.integers(-5, 10**12).map(str), st.sampled_from(["9" * 5000, "1.5", "²", "", "inf"])
)


@bounded(100)
@given(
    st.sampled_from(["w.csv", "w.jsonl"]),
    st.lists(st.tuples(WORKLOAD_CELLS, WORKLOAD_CELLS), max_size=4),
    st.one_of(st.none(), HOSTILE_TEXT),
)
def test_a_workload_file_is_read_or_one_line(
    name: str, rows: list[tuple[str, str]], extra: str | None
) -> None:
    """--energy-route-workload's value names a file: a reader like the others."""
    if name.endswith(".csv"):
        lines = ["input_tokens,output_tokens", *(f"{a},{b}" for a, b in rows)]
    else:
        lines = [f'{{"input_tokens": {a or 0}, "output_tokens": {b or 0}}}' for a, b in rows]
    if extra is not None:
        lines.append(extra.replace("\n", " "))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
        try:
            workload = load_workload(str(path))
        except WorkloadError as exc:
            assert_one_line(exc, starts=str(path))
            return
    assert (workload.input_tokens >= 0).all() and (workload.output_tokens >= 0).all()
