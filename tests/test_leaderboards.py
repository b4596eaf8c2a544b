"""The leaderboards' shapes (issue 48, item 4): AI Energy Score's GPU Wh per 1,000 queries at
batch 1 and ML.ENERGY-style records, computed from cases whose energy is known, valid
against their documented schema, read back, and every malformed file one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmenergy.cli import main
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.export import AI_ENERGY_SCORE, EXPORT_FORMATS, MLENERGY, export_text
from pytest_llmenergy.leaderboards import (
    AI_ENERGY_SCORE_FORMAT,
    MLENERGY_FORMAT,
    json_schema,
    read_ai_energy_score,
    read_mlenergy,
)
from pytest_llmenergy.results import CONVERGED, LIMIT
from pytest_llmenergy.storage.runfile import Run, dumps
from tests.casefactory import make_case

WATTS = 100.0  # casefactory: constant power, 80 % of it the GPU's, 20 % the CPU's


def batch_of(case: object, queries: int, **changes: object) -> object:
    """The case as a batch of ``queries``: each trial's joules shared by them."""
    trials = tuple(dataclasses.replace(t, queries=queries) for t in case.trials)  # type: ignore[attr-defined]
    return dataclasses.replace(case, queries=queries, trials=trials, **changes)  # type: ignore[call-overload]


def cases() -> list:
    one = make_case([1.0, 1.2, 0.8], model="tiny-llama", input_tokens=8, output_tokens=32)
    two = make_case([2.0, 2.0, 2.0], model="tiny-llama", input_tokens=64, output_tokens=32)
    batched = batch_of(
        make_case([4.0, 4.0, 4.0], model="tiny-llama", input_tokens=8, output_tokens=32),
        8,
        nodeid="benchmarks/test_input_tokens.py::test_input_tokens[tiny-llama-in8-out32-bs8]",
    )
    only_batched = batch_of(make_case([1.0, 1.0, 1.0], model="tiny-mistral", status=LIMIT), 4)
    return [one, two, batched, only_batched]


def test_ai_energy_score_is_the_batch_1_cases_gpu_wh_per_1000_queries() -> None:
    data = json.loads(export_text(cases(), AI_ENERGY_SCORE))
    by = {row["model"]: row for row in data["models"]}
    llama = by["tiny-llama"]
    # batch-1 cases only: 1.0 s and 2.0 s mean queries at 100 W, 80 % of it the GPU's
    gpu_j = 0.8 * WATTS * (1.0 + 2.0) / 2
    assert llama["cases"] == 2 and llama["batch_size"] == 1
    assert llama["gpu_wh_per_1k_queries"] == pytest.approx(gpu_j * 1000 / 3600)
    assert llama["cpu_wh_per_1k_queries"] == pytest.approx(0.2 * WATTS * 1.5 * 1000 / 3600)
    assert llama["total_wh_per_1k_queries"] == pytest.approx(WATTS * 1.5 * 1000 / 3600)
    assert llama["dram_wh_per_1k_queries"] is None  # no DRAM meter: not made up
    assert by["tiny-mistral"]["cases"] == 0 and "no batch-1 case" in by["tiny-mistral"]["note"]
    assert "AI Energy Score" in data["method"] and "no stars" in data["method"]


def test_mlenergy_records_carry_the_leaderboards_figures_and_say_what_is_invalid() -> None:
    data = json.loads(export_text(cases(), MLENERGY))
    by = {row["case"]: row for row in data["records"]}
    assert len(by) == 4
    batched = by["benchmarks/test_input_tokens.py::test_input_tokens[tiny-llama-in8-out32-bs8]"]
    assert batched["batch_size"] == 8
    assert batched["energy_per_response_j"] == pytest.approx(WATTS * 4.0 / 8)  # per query
    assert batched["output_throughput_tokens_per_s"] == pytest.approx(32 * 8 / 4.0)
    assert batched["avg_power_w"] == pytest.approx(WATTS)
    assert batched["output_tokens_per_j"] == pytest.approx(64 / WATTS)
    assert batched["energy_per_token_source"] == "decode"
    assert batched["valid"] and batched["reasons"] == []
    limited = next(r for r in by.values() if r["model"] == "tiny-mistral")
    assert not limited["valid"]
    assert limited["reasons"] == ["its confidence intervals did not reach their targets"]


@pytest.mark.parametrize(
    ("fmt", "schema_of", "read"),
    [(MLENERGY, MLENERGY_FORMAT, read_mlenergy),
     (AI_ENERGY_SCORE, AI_ENERGY_SCORE_FORMAT, read_ai_energy_score)],
)  # fmt: skip
def test_each_export_validates_against_its_schema_and_reads_back(
    fmt: str, schema_of: str, read: object
) -> None:
    text = export_text(cases(), fmt)
    jsonschema.validate(json.loads(text), json_schema(schema_of))
    rows = read(text)  # type: ignore[operator]
    key = "records" if fmt == MLENERGY else "models"
    assert rows == json.loads(text)[key]


def test_the_exports_are_in_the_one_registry_and_reach_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert {MLENERGY, AI_ENERGY_SCORE} <= set(EXPORT_FORMATS)
    run = Run("", "x", "", "complete", "hw", {}, {}, {}, {}, cases=tuple(cases()))
    path = tmp_path / "run.json"
    path.write_text(dumps(run))
    out = tmp_path / "records.json"
    assert main(["export", str(path), "--format", MLENERGY, "--out", str(out)]) == 0
    assert len(read_mlenergy(out.read_text(), str(out))) == 4


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("not json", "not JSON"),
        ('{"format": "other", "version": 1}', "not a llmenergy-mlenergy-records export"),
        (f'{{"format": "{MLENERGY_FORMAT}", "version": 9, "records": []}}', "version 9"),
        (f'{{"format": "{MLENERGY_FORMAT}", "version": 1, "records": {{}}}}', "not a list"),
        (f'{{"format": "{MLENERGY_FORMAT}", "version": 1, "records": [3]}}', "not an object"),
        (f'{{"format": "{MLENERGY_FORMAT}", "version": 1, "records": [{{}}]}}', "'model' missing"),
        ('{"format": NaN}', "not JSON"),
    ],
)
def test_a_malformed_file_is_one_line(text: str, said: str) -> None:
    with pytest.raises(ConfigError) as err:
        read_mlenergy(text, "x.json")
    message = str(err.value)
    assert said in message and "\n" not in message and message.startswith("x.json: ")


def test_a_number_beyond_floats_is_refused() -> None:
    record = json.loads(export_text(cases()[:1], MLENERGY))
    text = json.dumps(record).replace('"avg_power_w": 100.0', '"avg_power_w": 1e400')
    with pytest.raises(ConfigError, match="'avg_power_w' is not a finite number"):
        read_mlenergy(text)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(
    body=st.fixed_dictionaries(
        {"format": st.sampled_from([MLENERGY_FORMAT, AI_ENERGY_SCORE_FORMAT, "x"]),
         "version": st.sampled_from([1, 2, "1"]),
         "records": st.lists(st.dictionaries(st.text(max_size=12), _json, max_size=6), max_size=3),
         "models": st.lists(st.dictionaries(st.text(max_size=12), _json, max_size=6), max_size=3)}
    )
)  # fmt: skip
def test_the_readers_take_any_json_and_either_read_it_or_say_why(body: dict) -> None:
    text = json.dumps(body)
    for read in (read_mlenergy, read_ai_energy_score):
        try:
            rows = read(text)
        except ConfigError as exc:
            assert "\n" not in str(exc)
        else:
            assert isinstance(rows, list)


def test_a_valid_export_stays_valid_with_every_status() -> None:
    for status in (CONVERGED, LIMIT):
        case = make_case([1.0, 1.0], status=status)
        assert read_mlenergy(export_text([case], MLENERGY))
