"""Policies: first-match routing (one query or a whole array), the JSON round trip, safe
writing, and load errors that name the file and the field."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_llmenergy.routing.policy import (
    FORMAT,
    VERSION,
    Policy,
    PolicyError,
    Rule,
    load_policies,
    load_policy,
    policy_from_json,
    write_policies,
)

THREE = Policy(
    model="Llama-2 (7B)",
    by="input",
    rules=(
        Rule("M1-Pro", max_input_tokens=32),
        Rule("Swing AMD+A100", max_input_tokens=512, max_output_tokens=64),
        Rule("M1-Pro", max_output_tokens=8),
        Rule("Palmetto"),
    ),
    lam=0.3,
    p_ref_w=412.5,
    workload="alpaca",
    expected={"queries": 3, "energy_j": 12.5, "queries_by_system": {"M1-Pro": 3}},
)


def first_match(rules: tuple[Rule, ...], n_in: int, n_out: int) -> str:
    """The reference: bounds are inclusive, the first rule that holds wins."""
    for r in rules:
        in_ok = r.max_input_tokens is None or n_in <= r.max_input_tokens
        out_ok = r.max_output_tokens is None or n_out <= r.max_output_tokens
        if in_ok and out_ok:
            return r.system
    raise AssertionError("no rule took the query")


def test_route_takes_the_first_rule_that_holds() -> None:
    assert THREE.route(32, 10_000) == "M1-Pro"  # bounds are inclusive
    assert THREE.route(33, 64) == "Swing AMD+A100"
    assert THREE.route(33, 65) == "Palmetto"
    assert THREE.route(600, 8) == "M1-Pro"  # the third rule
    assert THREE.route(600) == "M1-Pro"  # output defaults to 0
    assert THREE.route(600, 9) == "Palmetto"
    assert THREE.systems == ("M1-Pro", "Swing AMD+A100", "Palmetto")
    assert THREE.describe() == (
        "input <= 32 -> M1-Pro; input <= 512 and output <= 64 -> Swing AMD+A100; "
        "output <= 8 -> M1-Pro; the rest -> Palmetto"
    )


def test_assign_agrees_with_route_on_random_queries() -> None:
    rng = np.random.default_rng(0)
    n_in = rng.integers(0, 1024, size=2000)
    n_out = rng.integers(0, 128, size=2000)
    index = THREE.assign(n_in, n_out)
    assert index.dtype == np.int64 and index.shape == (2000,)
    got = [THREE.systems[i] for i in index]
    assert got == [first_match(THREE.rules, int(a), int(b)) for a, b in zip(n_in, n_out)]
    assert got == [THREE.route(int(a), int(b)) for a, b in zip(n_in, n_out)]
    assert len(set(got)) == 3  # every rule was reached


def test_last_rule_must_take_every_query() -> None:
    with pytest.raises(PolicyError, match="last rule must take every query"):
        Policy("m", "input", (Rule("A"), Rule("B", max_input_tokens=3)))
    with pytest.raises(PolicyError, match="last rule"):
        Policy("m", "input", (Rule("B", max_output_tokens=3),))
    with pytest.raises(PolicyError, match="last rule"):
        Policy("m", "input", ())


def test_json_round_trip_keeps_everything() -> None:
    text = json.dumps(THREE.to_json())
    data = json.loads(text)
    assert data["format"] == FORMAT and data["version"] == VERSION
    assert data["rules"][0] == {"system": "M1-Pro", "max_input_tokens": 32}
    assert data["rules"][3] == {"system": "Palmetto"}  # no null bounds written
    assert policy_from_json(data) == THREE


def test_a_policy_without_reference_power_writes_and_loads(tmp_path: Path) -> None:
    """p_ref_w defaults to NaN, which strict JSON cannot hold; it is written as null."""
    bare = Policy("m", "output", (Rule("A", max_output_tokens=4), Rule("B")))
    path = write_policies(tmp_path / "bare.json", [bare])
    back = load_policy(path)
    assert math.isnan(back.p_ref_w) and back.rules == bare.rules and back.lam == 1.0


def test_write_policies_one_object_or_a_list(tmp_path: Path) -> None:
    one = write_policies(tmp_path / "one.json", [THREE])
    assert one == tmp_path / "one.json"
    assert load_policy(one) == THREE
    other = Policy("phi", "output", (Rule("A", max_output_tokens=16), Rule("B")), p_ref_w=1.0)
    several = write_policies(tmp_path / "several.json", [THREE, other])
    data = json.loads(several.read_text(encoding="utf-8"))
    assert isinstance(data, list) and len(data) == 2
    assert [policy_from_json(d) for d in data] == [THREE, other]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.json", "several.json"]


def test_write_policies_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text("precious", encoding="utf-8")
    with pytest.raises(PolicyError, match=re.escape(f"{path} exists")):
        write_policies(path, [THREE])
    assert path.read_text(encoding="utf-8") == "precious"
    assert [p.name for p in tmp_path.iterdir()] == ["policy.json"]  # no temp file left


def test_write_into_a_missing_folder_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot write the policy"):
        write_policies(tmp_path / "no" / "policy.json", [THREE])
    assert list(tmp_path.iterdir()) == []


def good() -> dict[str, Any]:
    return THREE.to_json()


def with_rules(rules: Any) -> dict[str, Any]:
    return {**good(), "rules": rules}


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ([good(), good()], "pick one with model="),
        ([], "an empty list holds no policy"),
        ({**good(), "format": "other"}, f"not a {FORMAT} file"),
        ({**good(), "version": 2}, "policy version 2"),
        ({k: v for k, v in good().items() if k != "version"}, "policy version None"),
        (with_rules({"system": "A"}), "rules should be a non-empty list"),
        (with_rules([]), "rules should be a non-empty list"),
        (with_rules([{"system": "A"}, {"max_input_tokens": 3}]), "rules[1] should be an object"),
        (with_rules([{"system": 7}]), "rules[0] should be an object with a system name"),
        (with_rules(["A"]), "rules[0] should be an object"),
        (
            with_rules([{"system": "A", "max_input_tokens": -1}, {"system": "B"}]),
            "rules[0].max_input_tokens should be a whole number >= 0, got -1",
        ),
        (
            with_rules([{"system": "A", "max_output_tokens": True}, {"system": "B"}]),
            "rules[0].max_output_tokens should be a whole number >= 0, got True",
        ),
        (
            with_rules([{"system": "A", "max_input_tokens": 2.5}, {"system": "B"}]),
            "rules[0].max_input_tokens should be a whole number",
        ),
        (
            with_rules([{"system": "A"}, {"system": "B", "max_input_tokens": 9}]),
            "last rule must take every query",
        ),
        ({**good(), "lambda": "high"}, "could not convert"),
    ],
)
def test_load_errors_name_the_file_and_the_field(tmp_path: Path, data: Any, words: str) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(PolicyError, match=re.escape(f"{path}: ")) as info:
        load_policy(path)
    assert words in str(info.value)


def test_load_errors_for_unreadable_files(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ', encoding="utf-8")
    with pytest.raises(PolicyError, match=re.escape(f"{broken}: not JSON")):
        load_policy(broken)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(PolicyError, match=re.escape(f"{binary}: not JSON")):
        load_policy(binary)
    with pytest.raises(PolicyError, match="cannot read the policy"):
        load_policy(tmp_path / "missing.json")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000, encoding="utf-8")  # issue 33: a RecursionError traceback
    with pytest.raises(PolicyError, match=re.escape(f"{deep}: not JSON (maximum recursion")):
        load_policy(deep)


def test_a_file_of_several_models_loads_by_model(tmp_path: Path) -> None:
    """``write_policies`` writes a list for several models; a router picks its model."""
    a = policy_from_json({**good(), "model": "a"})
    b = policy_from_json({**good(), "model": "b", "rules": [{"system": "Z"}]})
    path = write_policies(tmp_path / "p.json", [a, b])
    assert [p.model for p in load_policies(path)] == ["a", "b"]
    assert load_policy(path, model="b").route(1) == "Z"
    with pytest.raises(PolicyError, match="no policy for model 'c'; it has 'a', 'b'"):
        load_policy(path, model="c")
    (tmp_path / "bad.json").write_text(json.dumps([good(), {"format": "x"}]))
    with pytest.raises(PolicyError, match=re.escape(f"{tmp_path / 'bad.json'}[1]: not a")):
        load_policies(tmp_path / "bad.json")
    with pytest.raises(PolicyError, match="no policy to write"):
        write_policies(tmp_path / "none.json", [])
