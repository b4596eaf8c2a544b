"""Run files: a round trip keeps every trial; bad files are one error naming the file."""

from __future__ import annotations

import json
import pickle
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.controller.targets import CITarget
from pytest_llmenergy.figures import value
from pytest_llmenergy.plugin.options import OPTIONS
from pytest_llmenergy.results import OOM, CaseResult
from pytest_llmenergy.storage.recorder import jsonable, new_run
from pytest_llmenergy.storage.runfile import (
    COMPLETE,
    SCHEMA_VERSION,
    Run,
    RunFileError,
    dumps,
    load,
    loads,
)
from tests.casefactory import make_case

# What the plugin writes as a run's options (schema 2) when every option is at its default:
# one entry per option by its name, e.g. "confidence": 0.95, "ci_target": ["time_s:0.5s"].
DEFAULT_OPTIONS = {o.name: o.to_record(o.default) for o in OPTIONS}


def sample_run(cases: tuple[CaseResult, ...]) -> Run:
    run = new_run(
        name="baseline",
        hardware="cpu-x__no-gpu__trace",
        machine={"cpu": {"model": "CPU X", "logical_cores": 2}, "gpus": []},
        commit={"id": "abc", "dirty": False},
        options=DEFAULT_OPTIONS,
        meter={"backend": "trace", "domains": {"gpu:0": {"method": "counter"}}},
        command=["benchmarks/", "--energy-save=baseline"],
    )
    return Run(**{**run.__dict__, "cases": cases, "status": COMPLETE})


def test_round_trip_keeps_every_trial_and_derived_figure(tmp_path: Path) -> None:
    odd = ControllerSettings(
        min_trials=2,
        max_trials=7,
        confidence=0.9,
        targets=(CITarget("energy", 0.0123456789, True),),
    )
    cases = (
        make_case([0.1, 0.12, 0.11]),
        make_case([0.3, 0.31], input_tokens=512, resources=False, prefill_share=None),
        CaseResult(**{**make_case([0.2]).__dict__, "options": odd}),
        CaseResult(
            nodeid="t.py::t[big]",
            name="t[big]",
            labels={},
            input_tokens=9000,
            output_tokens=1,
            status=OOM,
            options=ControllerSettings(),
            reason="OOM at 9000 input tokens (1 output tokens)",
        ),
    )
    path = tmp_path / "run.json"
    path.write_text(dumps(sample_run(cases)))
    back = load(path)
    assert back.cases == cases  # every field, every trial, phases and resources
    assert value(back.cases[0], "j_per_token") == value(cases[0], "j_per_token")
    assert back.cases[2].options.targets[0].value == 0.0123456789
    # built as "energy" (0.1.0's name): written and read back as the figure key
    assert back.cases[2].options.targets[0].metric == "energy_j"
    text = path.read_text()
    assert '"metric": "energy_j"' in text and '"metric": "energy"' not in text
    assert back.name == "baseline" and back.status == COMPLETE and back.path == path
    assert back.options == DEFAULT_OPTIONS  # the explicit record, as written
    assert back.options["confidence"] == 0.95 and back.confidence == 0.95
    assert back.schema_version == SCHEMA_VERSION == 2
    assert back.label == "run"


@pytest.mark.parametrize(
    ("schema_version", "options", "confidence"),
    [
        (2, {"confidence": 0.99}, 0.99),
        (2, {"confidence": 95}, None),  # not a level in (0, 1)
        (2, {"confidence": True}, None),
        (2, {"confidence": "high"}, None),
        (2, {"controller": {"confidence": 0.99}}, None),  # version 1's place, in a version 2 file
        (2, {}, None),
        (1, {"controller": {"confidence": 0.9}}, 0.9),  # 0.1.0 kept it in its controller dump
        (1, {"controller": "odd"}, None),
        (1, {"confidence": 0.99}, None),
    ],
)
def test_confidence_is_read_where_each_schema_keeps_it(
    schema_version: int, options: dict[str, object], confidence: float | None
) -> None:
    run = replace(sample_run(()), options=options, schema_version=schema_version)
    assert run.confidence == confidence


def test_a_version_1_file_loads_with_its_old_target_names_silently(tmp_path: Path) -> None:
    data = json.loads(dumps(sample_run((make_case([0.1, 0.12]),))))
    data["schema_version"] = 1
    data["options"] = {"controller": {"confidence": 0.9}}  # 0.1.0's dump of its settings
    data["cases"][0]["controller"]["targets"] = [
        {"metric": "time", "value": 0.5, "relative": False},
        {"metric": "energy", "value": 0.02, "relative": True},
    ]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a saved file is not the user's typing: no warning
        run = load(path)
    assert run.schema_version == 1 and run.confidence == 0.9
    assert [str(t) for t in run.cases[0].options.targets] == ["time_s:0.5s", "energy_j:2%"]


def test_files_are_strict_json_even_with_nan_figures(tmp_path: Path) -> None:
    case = make_case([0.1, 0.1])
    nan_resources = CaseResult(
        **{**case.__dict__, "resources": case.resources.__class__(1, None, 0.1, float("nan"), 1.0)}
    )
    text = dumps(sample_run((nan_resources,)))

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in a run file")

    data = json.loads(text, parse_constant=refuse)
    assert data["schema_version"] == SCHEMA_VERSION == 2
    assert data["cases"][0]["resources"]["iowait_share"] is None
    assert len(data["cases"][0]["trials"]) == 2


def test_jsonable_turns_options_into_plain_values() -> None:
    plain = jsonable({"o": ControllerSettings(rule="research"), "n": float("inf"), "s": {3}})
    assert plain["o"]["targets"] == [{"metric": "time_s", "value": 0.5, "relative": False}]
    assert plain["n"] is None and plain["s"] == [3]
    json.dumps(plain, allow_nan=False)


def test_the_options_record_is_written_as_given(tmp_path: Path) -> None:
    options = {**DEFAULT_OPTIONS, "ci_target": ["j_per_token:2%"], "compare_fail": ["time_s:5%"]}
    path = tmp_path / "run.json"
    path.write_text(dumps(replace(sample_run(()), options=options)))
    data = json.loads(path.read_text())
    assert data["options"] == options and set(data["options"]) == {o.name for o in OPTIONS}
    assert load(path).options == options


def _edit(change: Callable[[Any], object]) -> Callable[[str], str]:
    """A mangle that changes the decoded file, then writes it back as JSON."""

    def mangle(text: str) -> str:
        data = json.loads(text)
        change(data)
        return json.dumps(data, indent=1)

    return mangle


@pytest.fixture
def good_text() -> str:
    return dumps(sample_run((make_case([0.1, 0.2, 0.3]),)))


@pytest.mark.parametrize(
    ("mangle", "needle"),
    [
        (lambda t: "", "empty"),
        (lambda t: t[: len(t) // 2], "truncated"),
        (lambda t: t.replace('"seconds": 0.1', '"seconds": 0.1 oops', 1), "corrupt"),
        (lambda t: json.dumps({"machine_info": {}, "benchmarks": []}), "not a pytest-llmenergy"),
        (lambda t: "[1, 2, 3]", "not a pytest-llmenergy"),
        (
            lambda t: t.replace(f'"schema_version": {SCHEMA_VERSION}', '"schema_version": 99'),
            "newer pytest-llmenergy (schema 99",
        ),
        (
            lambda t: t.replace('"seconds": 0.2,', '"seconds": "fast",', 1),
            "cases[0].trials[1].seconds should be a number",
        ),
        (lambda t: t.replace('"seconds": 0.2,', '"seconds": NaN,', 1), "NaN"),
        (lambda t: t.replace('"index": 3,', "", 1), "cases[0].trials[2].index is missing"),
        (lambda t: t.replace('"min_trials": 3', '"min_trials": 0'), "min_trials"),
        (
            lambda t: t.replace('"metric": "time_s"', '"metric": "j_per_in_token"', 1),
            "'j_per_in_token' is gone",
        ),
        (
            lambda t: t.replace('"joules_by_domain": {', '"joules_by_domain": {"x": true, ', 1),
            "should be a number",
        ),
        # issue 33: what a hostile file holds is one line naming the field, never a traceback
        (lambda t: "[" * 200_000, "nested more than 32 levels deep"),
        (
            lambda t: t.replace('"machine": {', '"machine": {"x": ' + "[" * 40 + "]" * 40 + ",", 1),
            "machine.x[0][0]",
        ),
        (
            lambda t: t.replace('"seconds": 0.1,', '"seconds": 0.1, "seconds": 0.1,', 1),
            "cases[0].trials[0] has the key seconds twice",
        ),
        (
            lambda t: t.replace('"seconds": 0.2,', '"seconds": 1e400,', 1),
            "cases[0].trials[1].seconds: 1e400 is beyond a double's range",
        ),
        (
            lambda t: t.replace('"seconds": 0.2,', '"seconds": -Infinity,', 1),
            "cases[0].trials[1].seconds: -Infinity is not a number JSON allows",
        ),
        (
            lambda t: t.replace('"index": 3,', f'"index": 1{"0" * 5000},', 1),
            "cases[0].trials[2].index: 1000",
        ),
        (
            lambda t: t.replace('"model": "tiny-llama"', '"model": "\\udc00"', 1),
            "cases[0].labels.model holds half of a UTF-16 surrogate pair",
        ),
        (
            _edit(lambda d: d["cases"][0]["trials"][0].update(seconds=-3.0)),
            "cases[0].trials[0].seconds is -3.0; it cannot be below 0",
        ),
        (
            _edit(lambda d: d["cases"][0]["trials"][1].update(joules=-500)),
            "cases[0].trials[1].joules is -500.0; it cannot be below 0",
        ),
        (
            _edit(lambda d: d["cases"][0]["trials"][0]["joules_by_domain"].update({"gpu:0": -1})),
            "cases[0].trials[0].joules_by_domain.gpu:0 is -1; it cannot be below 0",
        ),
        (
            _edit(lambda d: d["cases"][0]["trials"][0]["phases"]["decode"].update(seconds=-1)),
            "cases[0].trials[0].phases.decode.seconds is -1.0",
        ),
        (
            _edit(lambda d: d["cases"][0]["trials"][2].update(joules=1e300)),
            "cases[0].trials[2].joules is 1e+300; no measurement is that large",
        ),
        (
            _edit(lambda d: d["cases"][0]["trials"][2].update(net_joules=-2e15)),
            "cases[0].trials[2].net_joules is -2e+15; no measurement is that large",
        ),
        (
            _edit(lambda d: d["cases"][0]["trials"][0]["joules_by_domain"].update({"x": 1e16})),
            "cases[0].trials[0].joules_by_domain.x is 1e+16; no measurement is that large",
        ),
        (
            _edit(lambda d: d["cases"][0].update(output_tokens=-4)),
            "cases[0].output_tokens is -4; it cannot be below 0",
        ),
        (
            _edit(lambda d: d["cases"][0]["trials"][0].update(passes=0)),
            "cases[0].trials[0].passes is 0; it cannot be below 1",
        ),
        (
            _edit(lambda d: d["cases"][0]["trials"][0].update(gpu={"reasons": 5})),
            "cases[0].trials[0].gpu.reasons should be a list",
        ),
        (
            _edit(lambda d: d["cases"][0]["trials"][0]["phases"].update({"a\nb": {}})),
            "cases[0].trials[0].phases.'a\\nb'.seconds is missing",
        ),
    ],
)
def test_bad_files_give_one_error_naming_the_file(
    tmp_path: Path, good_text: str, mangle, needle: str
) -> None:
    path = tmp_path / "0001_bad.json"
    text = mangle(good_text)
    assert text != good_text
    path.write_text(text)
    with pytest.raises(RunFileError) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and needle in message
    assert "\n" not in message


class _Boom:
    """Unpickling this would run code: a run file must never be unpickled."""

    ran: list[str] = []

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_Boom.ran.append, ("executed",))


def test_nothing_is_executed_from_a_run_file(tmp_path: Path) -> None:
    path = tmp_path / "evil.json"
    path.write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(RunFileError, match=r"evil\.json"):
        load(path)
    assert _Boom.ran == []
    evil = json.dumps(
        {"format": "pytest-llmenergy-run", "schema_version": 1, "run": "__import__('os')"}
    )
    with pytest.raises(RunFileError, match="run should be an object"):
        loads(evil, "evil.json")


def test_figures_that_may_be_negative_are_read(good_text: str) -> None:
    """Net joules are not clipped at 0 (noise stays unbiased), and a rejected trial keeps
    what its meter said (the research's published data has negative CPU joules)."""
    data = json.loads(good_text)
    first, second = data["cases"][0]["trials"][:2]
    first["net_joules"] = -0.5
    first["net_joules_by_domain"]["gpu:0"] = -0.4
    second.update(rejected="negative energy in the published data", joules=-3.0)
    second["joules_by_domain"]["cpu:package-0"] = -3.5
    second["phases"]["prefill"]["joules"] = -1.0
    data["cases"][0]["trials"][2]["gpu"] = {"temperature_c_max": -5.0}  # a cold GPU
    run = loads(json.dumps(data), "edited.json")
    trials = run.cases[0].trials
    assert trials[0].net_joules == -0.5 and trials[1].joules == -3.0
    assert trials[2].gpu is not None and trials[2].gpu.temperature_c_max == -5.0


def test_a_file_name_or_field_name_never_breaks_the_line(tmp_path: Path) -> None:
    """A file in the storage folder may be named anything: the message stays one line."""
    path = tmp_path / "0002_x\n.json"
    path.write_text("[" * 100)
    with pytest.raises(RunFileError) as info:
        load(path)
    assert "\n" not in str(info.value) and "0002_x\\n.json" in str(info.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(RunFileError, match="no such run file"):
        load(tmp_path / "nope.json")
    with pytest.raises(RunFileError, match="is a directory"):
        load(tmp_path)


def test_the_assembled_text_is_the_run_as_json() -> None:
    from pytest_llmenergy.storage.runfile import encode_case, run_dict

    run = sample_run((make_case([0.1, 0.2]), make_case([0.3], input_tokens=64)))
    assert json.loads(dumps(run)) == json.loads(json.dumps(run_dict(run)))
    assert dumps(run, [encode_case(c) for c in run.cases]) == dumps(run)
    empty = sample_run(())
    assert json.loads(dumps(empty))["cases"] == []
