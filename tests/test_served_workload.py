"""A served workload's spec, lengths and draw, and each request's joules kept: the run
file (written, read back, hostile values refused) and the exports and table per request."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_llmenergy.export import export_text, request_rows, request_tables
from pytest_llmenergy.results import CaseResult, RequestRecord, Trial
from pytest_llmenergy.serving.workload_plan import (
    WorkloadError,
    WorkloadSpec,
    draw,
    load_lengths,
    parse_workload,
    read_lengths,
)
from pytest_llmenergy.storage.runfile import RunFileError, decode_trial, trial_dict
from tests.casefactory import make_case


# -- the spec --------------------------------------------------------------------------
def test_a_spec_names_its_source_rate_and_length() -> None:
    spec = parse_workload("alpaca:rate=4,requests=200")
    assert spec == WorkloadSpec("alpaca", 4.0, 200)
    timed = parse_workload("lengths.csv:rate=2.5,seconds=60,seed=7,scale=0.5,max_output=64")
    assert (timed.requests, timed.seconds, timed.seed, timed.scale) == (None, 60.0, 7, 0.5)
    assert parse_workload(timed.text()) == timed
    assert parse_workload("alpaca") == WorkloadSpec()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("alpaca:rate=0", "rate="),
        ("alpaca:rate=nan", "rate="),
        ("alpaca:requests=0", "requests="),
        ("alpaca:requests=1e9", "requests="),
        ("alpaca:requests=5,seconds=3", "not both"),
        ("alpaca:rate=1,rate=2", "twice"),
        ("alpaca:speed=3", "expected one of"),
        ("alpaca:scale=2", "scale="),
        (":rate=1", "no source"),
    ],
)
def test_a_bad_spec_is_one_line(text: str, says: str) -> None:
    with pytest.raises(WorkloadError, match=says) as caught:
        parse_workload(text)
    assert "\n" not in str(caught.value)


# -- the lengths and the draw ----------------------------------------------------------
def test_the_draw_is_seeded_poisson_over_alpacas_lengths() -> None:
    spec = parse_workload("alpaca:rate=4,requests=2000,seed=3")
    plan = draw(spec)
    assert plan == draw(spec)  # the seed draws the same requests
    gaps = np.diff([r.arrival_s for r in plan.requests])
    assert plan.requests[0].arrival_s == 0.0
    assert np.mean(gaps) == pytest.approx(1 / 4, rel=0.1)
    assert np.std(gaps) == pytest.approx(1 / 4, rel=0.15)  # exponential: sd = mean
    inputs = [r.input_tokens for r in plan.requests]
    assert min(inputs) >= 39 and np.median(inputs) == pytest.approx(53, abs=3)
    assert min(r.output_tokens for r in plan.requests) >= 1  # empty outputs ask for one
    timed = draw(parse_workload("alpaca:rate=10,seconds=5"))
    assert timed.span_s <= 5 and 25 < len(timed.requests) < 80


def test_lengths_scale_and_cap() -> None:
    table = np.array([[100, 300], [10, 0]])
    plan = draw(parse_workload("x.csv:rate=1,requests=50,scale=0.5,max_output=100"), table)
    assert {(r.input_tokens, r.output_tokens) for r in plan.requests} <= {(50, 100), (5, 1)}


def test_a_users_lengths_file(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("id,input_tokens,output_tokens\na,12,30\nb,40,2\n\n")
    assert load_lengths(str(path)).tolist() == [[12, 30], [40, 2]]
    with pytest.raises(WorkloadError, match="cannot read the lengths"):
        load_lengths(str(tmp_path / "missing.csv"))
    path.write_text("input_tokens,output_tokens\n12,-3\n")
    with pytest.raises(WorkloadError, match=r"lengths.csv:2: output_tokens should be"):
        load_lengths(str(path))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_any_lengths_text_is_read_or_refused_in_one_line(text: str) -> None:
    for candidate in (text, "input_tokens,output_tokens\n" + text):
        try:
            rows = read_lengths(candidate, "hostile.csv")
        except WorkloadError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("hostile.csv")
            continue
        assert rows.ndim == 2 and rows.shape[1] == 2 and len(rows) >= 1
        assert rows.min() >= 0 and rows.max() <= 1_000_000


# -- the run file --------------------------------------------------------------------------
def served_trial() -> Trial:
    requests = (
        RequestRecord(0.05, 0.8, 30, 50, 0.0, "", 1.5, 4.25, 6.1, ""),
        RequestRecord(None, 0.01, 0, 70, 0.3, "failed before its first token: HTTP 500", 0.0, 0.0),
        RequestRecord(0.02, 0.03, 2, 12, 0.5, "", -0.01, 0.2, 0.4, "it lasted 0.03 s, under 2"),
    )
    return Trial(
        index=1,
        seconds=2.0,
        joules=100.0,
        net_joules=60.0,
        joules_by_domain={"gpu:0": 100.0},
        net_joules_by_domain={"gpu:0": 60.0},
        input_tokens=132,
        output_tokens=32,
        requests=requests,
    )


def test_each_requests_joules_are_kept_and_read_back() -> None:
    trial = served_trial()
    back = decode_trial(json.loads(json.dumps(trial_dict(trial))))
    assert back.requests == trial.requests
    assert back.requests[0].energy_j == pytest.approx(5.75)
    assert back.requests[2].prefill_j == -0.01  # net of idle: may be below 0
    # a burst's request keeps its old three fields only
    plain = trial_dict(Trial(**{**trial.__dict__, "requests": (RequestRecord(0.1, 1.0, 8),)}))
    assert set(plain["requests"][0]) == {"ttft_s", "latency_s", "output_tokens"}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"prefill_j": 1.0, "decode_j": None}, "without the other"),
        ({"input_tokens": -1}, "input_tokens"),
        ({"status": "x" * 2000}, "runs past"),
        ({"sent_s": -2.0}, "sent_s"),
        ({"decode_j": "many"}, "decode_j"),
    ],
)
def test_a_spoiled_request_is_refused(change: dict[str, object], says: str) -> None:
    data = trial_dict(served_trial())
    data["requests"][0].update(change)
    data["requests"][0] = {k: v for k, v in data["requests"][0].items() if v is not None}
    with pytest.raises(RunFileError, match=says):
        decode_trial(json.loads(json.dumps(data)))


# -- what users see ------------------------------------------------------------------------
def served_case() -> CaseResult:
    return dataclasses.replace(make_case([2.0]), trials=(served_trial(),))


def test_each_request_exports_as_csv_and_json() -> None:
    case = served_case()
    rows = list(csv.DictReader(io.StringIO(export_text([case], "requests-csv"))))
    assert len(rows) == 3
    assert rows[0]["energy_j"] == "5.75" and rows[0]["input_tokens"] == "50"
    assert rows[1]["status"].startswith("failed before its first token")
    listed = json.loads(export_text([case], "requests-json"))
    assert listed == json.loads(json.dumps(request_rows([case])))
    assert math.isclose(listed[0]["j_per_token"], 5.75 / 80)


def test_the_table_gives_joules_by_input_length() -> None:
    (table,) = request_tables([served_case()])
    by_bucket = {row[0]: row for row in table.rows}
    assert set(by_bucket) == {"33-64", "9-16"}  # the failed request is left out
    assert by_bucket["33-64"][2] == pytest.approx(5.75)
    assert any("1 requests failed" in note for note in table.notes)
    assert by_bucket["9-16"][-1] == 1  # marked: too short for the meter
