"""Axes are one kind: the built-in ones make the ids and labels they always made, and a
conftest adds one through ``pytest_llmenergy_axes``, touching no file of the package,
whose cases run, are saved and compare like any other."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch  # noqa: F401  # before any in-process run: see tests/test_plugin_suite.py

from pytest_llmenergy import Axis
from pytest_llmenergy.axes import check_axes, parse_axis_choices
from pytest_llmenergy.cli import main
from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.llm.grid import INPUT_SWEEP, OUTPUT_SWEEP, make_grid
from pytest_llmenergy.plugin.cases import BUILTIN_AXES
from tests.test_plugin import assert_one_line_usage_error
from tests.test_plugin_suite import TRACE_METER, model_cache  # noqa: F401  # the fixture

REPO = Path(__file__).resolve().parent.parent


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(","))


THREADS = Axis("threads", "threads", _ints, (1,), id_part="th{}", quiet=1)


def test_an_axis_makes_its_id_part_and_label_and_its_quiet_value_neither() -> None:
    assert THREADS.id_of(4) == "th4" and THREADS.labels_of(4) == {"threads": "4"}
    assert THREADS.id_of(1) == "" and THREADS.labels_of(1) == {}
    assert THREADS.values_from(None) == (1,) and THREADS.values_from("2,4") == (2, 4)
    with pytest.raises(ConfigError, match=r"axis threads: cannot read 'x'"):
        THREADS.values_from("x")


def test_the_grid_is_the_product_of_its_axes_and_ids_keep_their_old_form() -> None:
    grid = make_grid(
        "quick",
        ["tiny-llama", "x=some/where"],
        [8, 64],
        [4],
        batch_sizes=(1, 8),
        extra=((THREADS, (1, 2)),),
    )
    cases = grid.cases(INPUT_SWEEP)
    assert len(cases) == 2 * 2 * 2 * 2 and grid.n_cases() == 2 * (2 + 1) * 2 * 2
    assert [c.id for c in cases[:4]] == [
        "tiny-llama-in8-out32",
        "tiny-llama-in8-out32-th2",
        "tiny-llama-in8-out32-bs8",
        "tiny-llama-in8-out32-bs8-th2",
    ]
    last = cases[-1]
    assert last.id == "x-in64-out32-bs8-th2" and last.value("threads") == 2
    assert last.value("model") == "some/where" and last.value("batch_size") == 8
    assert last.labels() == {
        "sweep": "input",
        "model": "x",
        "model_source": "some/where",
        "batch_size": "8",
        "threads": "2",
    }
    outputs = [c.id for c in grid.cases(OUTPUT_SWEEP)]
    assert outputs[:2] == ["tiny-llama-in32-out4", "tiny-llama-in32-out4-th2"]
    assert "threads 1,2" in grid.describe()
    with pytest.raises(KeyError, match="no axis 'speed'"):
        last.value("speed")


def test_every_builtin_axis_is_a_row_and_names_are_unique() -> None:
    names = [a.name for a in BUILTIN_AXES]
    assert names == [
        "model",
        "input_tokens",
        "output_tokens",
        "batch_size",
        "concurrency",
        "gpu_setting",
        "parallel",
    ]
    assert all(a.flag.startswith("--") and a.applies for a in BUILTIN_AXES)
    with pytest.raises(ConfigError, match="'batch_size' is declared twice"):
        check_axes([*BUILTIN_AXES, Axis("batch_size", "b", _ints, (1,))])


@pytest.mark.parametrize(
    "text,chosen",
    [
        ("t=0,0.7", (("t", "0,0.7"),)),
        ("t=0,0.7,seed=1,2", (("t", "0,0.7"), ("seed", "1,2"))),
    ],
)
def test_axis_choices(text: str, chosen: tuple[tuple[str, str], ...]) -> None:
    assert parse_axis_choices(text) == chosen


@pytest.mark.parametrize("text", ["0,0.7", "t=", "=1", "a b=1"])
def test_bad_axis_choices_say_what_is_expected(text: str) -> None:
    with pytest.raises(ConfigError, match="NAME=VALUES"):
        parse_axis_choices(text)


# -- an axis from a conftest, as a user adds one -------------------------------------------
CONFTEST = (
    TRACE_METER
    + """
from pytest_llmenergy import Axis


def threads(text):
    return tuple(int(t) for t in text.split(","))


def pytest_llmenergy_axes(config):
    return [Axis("threads", "threads", threads, (1,), id_part="th{}", quiet=1)]
"""
)

CASES = """
import time


def test_input(llm_input_case, energy_benchmark):
    threads = llm_input_case.value("threads")
    energy_benchmark.pedantic(
        lambda: time.sleep(0.005 * threads),
        rounds=3,
        warmup_rounds=0,
        input_tokens=llm_input_case.input_tokens,
        output_tokens=llm_input_case.output_tokens,
    )
"""


@pytest.fixture
def project(
    pytester: pytest.Pytester,
    model_cache: Path,  # noqa: F811  # the imported fixture
    monkeypatch: pytest.MonkeyPatch,
) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO), prepend=os.pathsep)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=CASES)
    return pytester


def run(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    """In a fresh process, as users run it: the model check imports transformers, which
    an in-process run would unload and could not import again."""
    return p.runpytest_subprocess(
        "--energy-backend=trace",
        "--energy-shuffle=off",
        "--energy-max-background=off",
        "--llm-model=tiny-llama",
        "--llm-input-tokens=8,16",
        "-v",
        *args,
    )


def test_an_axis_added_by_a_conftest_runs_saves_and_compares(
    project: pytest.Pytester, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("base", "head"):
        result = run(project, "--llm-axis", "threads=1,3", f"--energy-save={name}")
        result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "llmenergy: grid *; threads 1,3",
            "*test_input?tiny-llama-in8-out32? PASSED*",
            "*test_input?tiny-llama-in8-out32-th3? PASSED*",
        ]
    )
    runs = sorted((project.path / ".llmenergy").glob("*/*.json"))
    assert [p.name for p in runs] == ["0001_base.json", "0002_head.json"]
    cases = json.loads(runs[0].read_text())["cases"]
    labels = {c["nodeid"].split("[")[1][:-1]: c["labels"] for c in cases}
    assert labels["tiny-llama-in16-out32-th3"]["threads"] == "3"
    assert "threads" not in labels["tiny-llama-in16-out32"]
    options = json.loads(runs[0].read_text())["options"]
    assert options["axis"] == [["threads", "1,3"]]

    monkeypatch.chdir(project.path)
    capsys.readouterr()
    code = main(["compare", "base", "head", "--format=json"])
    out = capsys.readouterr().out
    assert code == 0
    compared = json.loads(out)
    rows = json.dumps(compared)
    for case_id in ("tiny-llama-in8-out32-th3", "tiny-llama-in16-out32-th3", "in16-out32]"):
        assert case_id in rows


def test_the_axis_default_and_bad_choices(project: pytest.Pytester) -> None:
    result = run(project, "--collect-only", "-q")
    assert sum("tiny-llama-in" in line for line in result.stdout.lines) == 2  # threads 1 only
    assert_one_line_usage_error(
        run(project, "--llm-axis", "threads=x"), "--llm-axis: axis threads: cannot read 'x'"
    )
    assert_one_line_usage_error(
        run(project, "--llm-axis", "speed=1"),
        "--llm-axis=speed=...: no added axis 'speed'; axes added here: threads",
    )
    assert_one_line_usage_error(
        run(project, "--llm-axis", "batch_size=8"),
        "--llm-axis=batch_size=...: no added axis 'batch_size'; choose its values with "
        "--llm-batch-sizes",
    )
