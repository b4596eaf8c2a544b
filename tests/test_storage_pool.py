"""Pooling runs of the same cases (base, head, base, head) into one run per side."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_llmenergy.compare import CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.figures import value
from pytest_llmenergy.results import CONVERGED, LIMIT
from pytest_llmenergy.storage.pool import pool_runs
from pytest_llmenergy.storage.runfile import COMPLETE, INTERRUPTED, load
from tests.casefactory import make_case
from tests.test_cli import HW_A, HW_B, cli, save
from tests.test_storage_runfile import sample_run


def test_pooling_keeps_every_trial_of_every_case() -> None:
    one = sample_run((make_case([0.10, 0.11, 0.12]), make_case([0.2, 0.2], input_tokens=64)))
    two = sample_run((make_case([0.13, 0.14], status=LIMIT), make_case([0.3], output_tokens=9)))
    pooled = pool_runs([one, two], name="base")
    assert pooled.name == "base" and pooled.status == COMPLETE
    assert [c.nodeid for c in pooled.cases] == [
        one.cases[0].nodeid,
        one.cases[1].nodeid,
        two.cases[1].nodeid,  # only in the second run: kept as it is
    ]
    first = pooled.cases[0]
    assert [t.seconds for t in first.trials] == [0.10, 0.11, 0.12, 0.13, 0.14]
    assert [t.index for t in first.trials] == [1, 2, 3, 4, 5]
    assert first.status == LIMIT  # the least settled part: one run hit its trial limit
    # 100 W throughout: the pooled mean is the mean of all five trials
    assert value(first, "energy_j") == pytest.approx(100 * sum([0.10, 0.11, 0.12, 0.13, 0.14]) / 5)
    assert pooled.cases[1].status == CONVERGED and len(pooled.cases[1].trials) == 2


def test_an_unfinished_run_leaves_the_pool_unfinished() -> None:
    one, two = sample_run((make_case([0.1, 0.1]),)), sample_run((make_case([0.2, 0.2]),))
    assert pool_runs([one, replace(two, status=INTERRUPTED)]).status == INTERRUPTED


def test_runs_of_other_hardware_or_confidence_are_not_pooled() -> None:
    one = sample_run((make_case([0.1, 0.1]),))
    with pytest.raises(ConfigError, match="different hardware cannot be pooled"):
        pool_runs([one, replace(one, hardware="elsewhere")])
    other = make_case([0.1, 0.1])
    other = replace(other, options=ControllerSettings(confidence=0.99))
    with pytest.raises(ConfigError, match=r"different confidence levels \(0.95, 0.99\)"):
        pool_runs([one, replace(one, cases=(other,))])
    with pytest.raises(ConfigError, match="at least two runs"):
        pool_runs([one])


def test_pooled_sides_give_the_gate_more_trials_than_either_round() -> None:
    """Two rounds of three trials each side: too noisy alone, significant pooled."""
    base = [sample_run((make_case(s),)) for s in ([0.10, 0.12, 0.08], [0.11, 0.09, 0.10])]
    head = [sample_run((make_case(s),)) for s in ([0.12, 0.14, 0.10], [0.13, 0.11, 0.12])]
    gates = parse_gates("j_per_token:5%")
    alone = compare_cases(base[0].cases, head[0].cases, CompareOptions(gates=gates))
    pooled = compare_cases(
        pool_runs(base).cases, pool_runs(head).cases, CompareOptions(gates=gates)
    )
    assert not alone.failed and alone.deltas[0].p_value > 0.05
    assert pooled.failed and pooled.deltas[0].p_value < 0.05


def test_llmenergy_merge_writes_a_new_run_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save(tmp_path, [make_case([0.1, 0.11, 0.12])], name="base")
    save(tmp_path, [make_case([0.13, 0.12, 0.11])], name="base")
    out = tmp_path / "pooled.json"
    code, stdout, stderr = cli(capsys, "--storage", tmp_path, "merge", "1", "2", "--out", out)
    assert (code, stderr) == (0, "")
    # one line that says what was written: the same case in both runs is one case
    assert stdout == f"wrote {out} (2 runs, 1 case, 6 trials, pooled into one run)\n"
    run = load(out)
    assert len(run.cases[0].trials) == 6 and run.command[:2] == ("llmenergy", "merge")
    assert json.loads(out.read_text())["schema_version"] == 2
    before = out.read_text()
    code, _, stderr = cli(capsys, "--storage", tmp_path, "merge", "1", "2", "--out", out)
    assert code == 2 and "already exists" in stderr and out.read_text() == before
    save(tmp_path, [make_case([0.1, 0.1])], name="gpu", hardware=HW_B)
    code, _, stderr = cli(
        capsys,
        "--storage",
        tmp_path,
        "merge",
        f"{HW_A}/1",
        f"{HW_B}/1",
        "--out",
        tmp_path / "x.json",
    )
    assert code == 2 and "different hardware" in stderr and not (tmp_path / "x.json").exists()
    code, _, stderr = cli(
        capsys, "--storage", tmp_path, "merge", f"{HW_A}/1", "--out", tmp_path / "y.json"
    )
    assert code == 2 and "merge needs at least two runs to pool" in stderr


def test_a_run_is_never_pooled_with_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33: ``llmenergy merge base base`` doubled the trials (and the gate's
    confidence); so did one run by two names, a copy, or a run already pooled."""
    first = save(tmp_path, [make_case([0.1, 0.11, 0.12])], name="base")
    save(tmp_path, [make_case([0.13, 0.12, 0.11])], name="head")
    copy = tmp_path / "copy.json"
    copy.write_text(first.read_text())
    pooled = tmp_path / "pooled.json"
    assert cli(capsys, "--storage", tmp_path, "merge", "base", "head", "--out", pooled)[0] == 0
    given_twice = f"0001_base is given twice ({first}); pool runs of distinct sessions\n"
    for runs, problem in (
        (["base", "base"], given_twice),
        (["1", "base"], given_twice),
        ([f"{HW_A}/0001", str(first)], given_twice),
        (
            ["base", copy],
            "every trial of copy is already in 0001_base (a copy of it, or a pool that holds "
            "it): pooled, they would count twice; pool runs of distinct sessions\n",
        ),
        (
            [pooled, "head"],
            "every trial of 0002_head is already in pooled (a copy of it, or a pool that "
            "holds it): pooled, they would count twice; pool runs of distinct sessions\n",
        ),
    ):
        out = tmp_path / "again.json"
        code, stdout, stderr = cli(capsys, "--storage", tmp_path, "merge", *runs, "--out", out)
        assert (code, stdout, stderr) == (2, "", f"llmenergy: error: {problem}")
        assert not out.exists()
    # runs that merely share a duration here and there are distinct sessions
    one = sample_run((make_case([0.10, 0.12, 0.08]),))
    assert len(pool_runs([one, sample_run((make_case([0.11, 0.09, 0.10]),))]).cases) == 1
    with pytest.raises(ConfigError, match="every trial of baseline is already in"):
        pool_runs([one, pool_runs([one, sample_run((make_case([0.3]),))])])
