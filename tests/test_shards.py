"""--llm-shard=I/N: one grid split across machines, and the parts joined again."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_llmenergy.cli import main
from pytest_llmenergy.controller.order import split_shards, token_cost

PROJECT = """
import time
import pytest


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 7])
def test_case(energy_benchmark, size):
    energy_benchmark(time.sleep, 0.002 * size, input_tokens=size, output_tokens=size)


def test_plain():
    assert True
"""


@given(
    st.lists(st.integers(1, 5000), min_size=0, max_size=60),
    st.integers(1, 8),
    st.randoms(use_true_random=False),
)
def test_every_case_is_in_one_part_whatever_the_order(
    costs: list[int], shards: int, rng: random.Random
) -> None:
    items = [(f"case{i}", float(c)) for i, c in enumerate(costs)]
    parts = split_shards(items, shards, cost=lambda x: x[1], key=lambda x: x[0])
    assert len(parts) == len(items) and all(0 <= p < shards for p in parts)
    # the same split from any order: it depends on the ids and costs only
    shuffled = items[:]
    rng.shuffle(shuffled)
    again = split_shards(shuffled, shards, cost=lambda x: x[1], key=lambda x: x[0])
    assert dict(zip(shuffled, again)) == dict(zip(items, parts))
    # balanced: no part exceeds another by more than the costliest case
    loads = [sum(c for (_, c), p in zip(items, parts) if p == k) for k in range(shards)]
    if items:
        assert max(loads) - min(loads) <= max(c for _, c in items)


def test_the_default_grid_splits_in_three_by_tokens() -> None:
    from pytest_llmenergy.llm.grid import make_grid

    grid = make_grid("default")
    cases = [c for sweep in ("input", "output") for c in grid.cases(sweep)]
    assert len(cases) == 57
    costs = [token_cost(c.input_tokens, c.output_tokens) for c in cases]
    parts = split_shards(
        list(range(57)), 3, cost=lambda i: costs[i], key=lambda i: f"{cases[i].id}"
    )
    loads = [sum(costs[i] for i in range(57) if parts[i] == k) for k in range(3)]
    assert max(loads) / min(loads) < 1.05  # within 5 %: out4096 cases are a third each


def _session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--energy-backend=estimate",
        "--energy-min-trials=2",
        "--energy-max-trials=2",
        "--energy-warmup=0",
        "--energy-min-time=0",
        *args,
    )


def _ids(path: Path) -> list[str]:
    return [c["nodeid"] for c in json.loads(path.read_text())["cases"]]


def test_three_shards_run_every_case_once_and_join_into_one_run(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    pytester.makepyfile(test_grid=PROJECT)
    whole = _session(pytester, "--energy-json=whole.json")
    assert whole.ret == 0
    results = []
    for i in (1, 2, 3):
        r = _session(pytester, f"--llm-shard={i}/3", f"--energy-json=s{i}.json")
        assert r.ret == 0, r.stdout.str()
        results.append(r)
        r.stdout.fnmatch_lines([f"*shard {i}/3: * of 7 energy cases*"])
    ids = [_ids(pytester.path / f"s{i}.json") for i in (1, 2, 3)]
    every = sorted(i for part in ids for i in part)
    assert every == sorted(_ids(pytester.path / "whole.json"))
    assert all(ids)  # seven cases over three parts: none empty
    # the plain test runs in part 1 only
    passed = [r.parseoutcomes().get("passed", 0) for r in results]
    assert sum(passed) == 8 and passed[0] == len(ids[0]) + 1
    # joined: every case once
    paths = [str(pytester.path / f"s{i}.json") for i in (1, 2, 3)]
    out = pytester.path / "joined.json"
    assert main(["merge", *paths, "--out", str(out)]) == 0
    joined = json.loads(out.read_text())
    assert sorted(c["nodeid"] for c in joined["cases"]) == every
    assert joined["run"]["status"] == "complete"
    assert joined["options"]["shards"]["joined"] == [1, 2, 3]
    capsys.readouterr()
    # a missing part is named, and --partial joins what there is
    assert main(["merge", paths[0], paths[2], "--out", str(pytester.path / "p.json")]) == 2
    assert "shard 2/3 missing" in capsys.readouterr().err
    assert (
        main(["merge", paths[0], paths[2], "--partial", "--out", str(pytester.path / "p.json")])
        == 0
    )
    assert "shard 2/3 missing" in capsys.readouterr().err
    assert json.loads((pytester.path / "p.json").read_text())["run"]["status"] == "interrupted"
    # a part twice, or a whole run among the parts: refused in one line
    assert main(["merge", paths[0], paths[0], "--out", str(pytester.path / "x.json")]) == 2
    assert "given twice" in capsys.readouterr().err
    whole_path = str(pytester.path / "whole.json")
    assert main(["merge", paths[0], whole_path, "--out", str(pytester.path / "y.json")]) == 2
    assert "is no shard" in capsys.readouterr().err


def test_parts_measured_otherwise_are_not_joined(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    pytester.makepyfile(test_grid=PROJECT)
    assert _session(pytester, "--llm-shard=1/2", "--energy-json=a.json").ret == 0
    other = _session(pytester, "--llm-shard=2/2", "--energy-json=b.json", "--energy-max-trials=3")
    assert other.ret == 0
    a, b = (str(pytester.path / n) for n in ("a.json", "b.json"))
    assert main(["merge", a, b, "--out", str(pytester.path / "j.json")]) == 2
    err = capsys.readouterr().err
    assert "max_trials 3 against 2" in err and err.count("\n") == 1


def test_a_part_that_is_no_part_is_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_grid=PROJECT)
    result = _session(pytester, "--llm-shard=4/3")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--llm-shard*expected a part such as 2/3*"])
    assert "Traceback" not in result.stderr.str()


def test_shards_under_xdist_hold_the_cases_they_hold_without_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-n 2`` runs a shard's cases on two workers: each worker splits the same
    collection the same way, so the shard holds what it holds in one process, and the
    controller's run file of each shard joins with the others into the whole grid."""
    pytest.importorskip("xdist")
    from tests.test_plugin_keep import REPO

    monkeypatch.setenv("PYTHONPATH", str(REPO), prepend=os.pathsep)
    pytester.makepyfile(test_grid=PROJECT)
    quiet = "--energy-max-background=off"  # a shared machine: no case left unmeasured
    whole = _session(pytester, quiet, "--energy-json=whole.json")
    assert whole.ret == 0, whole.stdout.str()
    for i in (1, 2):
        alone = _session(pytester, quiet, f"--llm-shard={i}/2", f"--energy-json=a{i}.json")
        assert alone.ret == 0, alone.stdout.str()
        both = _session(
            pytester, quiet, "-n", "2", f"--llm-shard={i}/2", f"--energy-json=x{i}.json"
        )
        assert both.ret == 0, both.stdout.str()
        # the workers split the cases; the controller says which part, once
        both.stdout.fnmatch_lines([f"llmenergy: shard {i}/2: * of 7 energy cases*"])
        assert both.stdout.str().count(f"shard {i}/2:") == 1
        assert sorted(_ids(pytester.path / f"x{i}.json")) == sorted(
            _ids(pytester.path / f"a{i}.json")
        )
        # the plain test in part 1 only, as without xdist
        assert both.parseoutcomes()["passed"] == alone.parseoutcomes()["passed"]
        saved = json.loads((pytester.path / f"x{i}.json").read_text())
        assert saved["options"]["shard"] == [i, 2]
        assert all(c["trials"] for c in saved["cases"])
    out = pytester.path / "joined.json"
    parts = [str(pytester.path / f"x{i}.json") for i in (1, 2)]
    assert main(["merge", *parts, "--out", str(out)]) == 0
    joined = json.loads(out.read_text())
    assert sorted(c["nodeid"] for c in joined["cases"]) == sorted(
        _ids(pytester.path / "whole.json")
    )
    assert joined["run"]["status"] == "complete"


def test_a_part_killed_before_its_end_is_named_and_one_part_joins_alone(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task cancelled mid-run (scancel) leaves its run file as its last write left it:
    the cases it finished, status running; the join names it.  And a split of which one
    part is left joins it alone with --partial, naming the others."""
    pytester.makepyfile(test_grid=PROJECT)
    for i in (1, 2):
        assert _session(pytester, f"--llm-shard={i}/2", f"--energy-json=s{i}.json").ret == 0
    killed = pytester.path / "s2.json"
    data = json.loads(killed.read_text())
    data["run"]["status"] = "running"  # as the recorder writes it after each case
    data["cases"] = data["cases"][:1]
    killed.write_text(json.dumps(data))
    first = str(pytester.path / "s1.json")
    assert main(["merge", first, str(killed), "--out", str(pytester.path / "j.json")]) == 2
    err = capsys.readouterr().err
    assert (
        "shard 2/2 ended early (s2 still says running: killed or cancelled; 1 case(s) saved)" in err
    )
    assert err.count("\n") == 1 and not (pytester.path / "j.json").exists()
    out = pytester.path / "p.json"
    assert main(["merge", first, str(killed), "--partial", "--out", str(out)]) == 0
    assert "its finished cases are joined" in capsys.readouterr().err
    joined = json.loads(out.read_text())
    assert len(joined["cases"]) == len(_ids(pytester.path / "s1.json")) + 1
    assert joined["run"]["status"] == "interrupted"
    # one part alone: refused without --partial, the other part named either way
    assert main(["merge", first, "--out", str(pytester.path / "one.json")]) == 2
    assert "shard 2/2 missing (have 1/2)" in capsys.readouterr().err
    assert main(["merge", first, "--partial", "--out", str(pytester.path / "one.json")]) == 0
    assert "shard 2/2 missing" in capsys.readouterr().err
