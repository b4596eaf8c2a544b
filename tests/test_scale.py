"""``llmenergy scale``: the same cases at 1, 2 and 4 ranks, with known times and joules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.scale import ALL_CASES, scale_rows
from pytest_llmenergy.storage.runfile import load
from tests.casefactory import make_case
from tests.test_cli import cli, one_error_line, save


def _layout(world_size: int, nodes: int = 1) -> dict[str, Any]:
    return {
        "distributed": {
            "world_size": world_size,
            "nodes": nodes,
            "ranks_per_node": world_size // nodes,
            "parallel": "tp",
        }
    }


@pytest.fixture
def three_scales(tmp_path: Path) -> list[Path]:
    """Case A (8 + 4 tokens): 1.0 s at 100 W on one process; 0.6 s at 200 W on 2 ranks
    (speed-up 1.67, efficiency 83 %, 120 J against 100 J); 0.5 s at 400 W on 4 ranks on 2
    nodes (speed-up 2, efficiency 50 %, 200 J).  Case B only at 1 and 2 ranks."""
    root = tmp_path / ".llmenergy"

    def cases(seconds_a: float, watts: float, with_b: bool = True) -> list[Any]:
        found = [make_case([seconds_a] * 3, watts=watts)]
        if with_b:
            found.append(make_case([2 * seconds_a] * 3, watts=watts, sweep="output"))
        return found

    return [
        save(root, cases(1.0, 100.0), name="one"),
        save(root, cases(0.6, 200.0), name="two", machine=_layout(2)),
        save(root, cases(0.5, 400.0, with_b=False), name="four", machine=_layout(4, 2)),
    ]


def test_each_case_against_the_smallest_scale_that_ran_it(three_scales: list[Path]) -> None:
    runs = [load(p) for p in reversed(three_scales)]  # any order: sorted by ranks
    rows = scale_rows(runs, ["four", "two", "one"])
    a = [r for r in rows if r.case == "test_input_tokens[tiny-llama-in8-out4]"]
    assert [r.scale.world_size for r in a] == [1, 2, 4]
    one, two, four = a
    assert one.speedup == pytest.approx(1.0) and one.extra_j_per_token == pytest.approx(0.0)
    assert two.speedup == pytest.approx(1.0 / 0.6)
    assert two.efficiency == pytest.approx(1.0 / 0.6 / 2)
    assert two.j_per_token == pytest.approx(120.0 / 12)
    assert two.extra_j_per_token == pytest.approx((120.0 - 100.0) / 12)
    assert two.extra_percent == pytest.approx(20.0)
    assert four.efficiency == pytest.approx(0.5) and four.extra_percent == pytest.approx(100.0)
    assert four.scale.text == "4 ranks on 2 nodes (tp)" and one.scale.text == "1 process"
    b = [r for r in rows if r.case.startswith("test_output_tokens")]
    assert [r.scale.world_size for r in b] == [1, 2]
    # only case A ran at every scale: no pooled row from a single case
    assert not [r for r in rows if r.case == ALL_CASES]


def test_the_pooled_row_sums_joules_and_time_of_the_shared_cases(three_scales: list[Path]) -> None:
    rows = scale_rows([load(p) for p in three_scales[:2]], ["one", "two"])
    pooled = [r for r in rows if r.case == ALL_CASES]
    assert len(pooled) == 2
    # 1 process: 100 + 200 J over 3 s; 2 ranks: 120 + 240 J over 1.8 s; 24 tokens
    assert pooled[1].speedup == pytest.approx(3.0 / 1.8)
    assert pooled[1].extra_j_per_token == pytest.approx((360.0 - 300.0) / 24)


def test_the_command_prints_the_table_and_draws_the_figure(
    three_scales: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    code, out, err = cli(capsys, "scale", *three_scales, "--plot", tmp_path / "fig")
    assert code == 0
    assert "speed-up" in out and "4 ranks on 2 nodes (tp)" in out and "83%" in out
    assert "+20%" in out and "+100%" in out
    assert (tmp_path / "fig" / "scale.png").stat().st_size > 1000
    assert "wrote" in err
    code, out, _ = cli(capsys, "scale", *three_scales[:2], "--format", "json")
    data = json.loads(out)
    assert ALL_CASES in {row["case"] for row in data["tables"][0]["rows"]}


def test_runs_without_a_shared_case_are_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / ".llmenergy"
    a = save(root, [make_case([1.0] * 3)], name="a")
    b = save(root, [make_case([1.0] * 3, input_tokens=16)], name="b", machine=_layout(2))
    code, _, err = cli(capsys, "scale", a, b)
    assert code == 2
    assert "no case has figures in two of the runs" in one_error_line(err)
