"""A branch's history in the HTML report: a figure per commit with its interval, the
commits where the gate's test saw it change marked with the size (issue 38, item 5)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import parse_gate
from pytest_llmenergy.history import BETTER, WORSE, branch_history, commit_points
from pytest_llmenergy.html import render_report
from pytest_llmenergy.results import CaseResult, distinct_names
from pytest_llmenergy.storage.pool import sessions_of
from pytest_llmenergy.storage.runfile import Run, dumps
from pytest_llmenergy.tables import DASH
from tests.casefactory import make_case, synthetic_run
from tests.hostile import HOSTILE, hostile_run, script_texts
from tests.test_work_figures import work

pytest.importorskip("vl_convert")

GATE = parse_gate("j_per_token:5%")


def _scaled(case: CaseResult, factor: float) -> CaseResult:
    """The case with every trial ``factor`` times as long (and so as costly)."""
    trials = tuple(
        dataclasses.replace(
            t,
            seconds=t.seconds * factor,
            joules=t.joules * factor,
            net_joules=t.net_joules * factor,
        )
        for t in case.trials
    )
    return dataclasses.replace(case, trials=trials)


def sha(k: int) -> str:
    return f"{k:02d}" + "c0ffee" * 6 + "00"


def at_commit(
    run: Run, k: int, *, rep: int = 0, branch: str | None = "main", dirty: bool = False
) -> Run:
    """The run as if saved at the k-th commit (a day apart), its rep-th session."""
    return dataclasses.replace(
        run,
        name=f"c{k}r{rep}" + ("dirty" if dirty else ""),
        created=f"2026-01-{k + 1:02d}T{rep + 1:02d}:00:00Z",
        commit={
            "id": sha(k),
            "short_id": sha(k)[:12],
            "branch": branch,
            "dirty": dirty,
            "time": f"2026-01-{k + 1:02d}T00:00:00+00:00",
        },
    )


def stepped_runs(steps: Mapping[str, tuple[int, float]], commits: int = 5) -> list[Run]:
    """Two sessions per commit of a 12-case suite; a model in ``steps`` is ``factor``
    times as costly from commit ``k`` on, every other case never changes."""
    runs = []
    for k in range(commits):
        for rep in range(2):
            run = synthetic_run(12, seed=10 * k + rep)
            cases = []
            for case in run.cases:
                at, factor = steps.get(case.labels.get("model", ""), (commits, 1.0))
                cases.append(_scaled(case, factor) if k >= at else case)
            runs.append(at_commit(dataclasses.replace(run, cases=tuple(cases)), k, rep=rep))
    return runs


def _saved(folder: Path, runs: Sequence[Run]) -> list[str]:
    paths = []
    for run in runs:
        path = folder / f"{run.name}.json"
        path.write_text(dumps(run))
        paths.append(str(path))
    return paths


def _ids(runs: Sequence[Run], model: str) -> set[str]:
    return {c.nodeid for c in runs[0].cases if c.labels.get("model") == model}


# -- what the history holds ------------------------------------------------------------------
def test_a_step_is_marked_at_its_commit_and_nowhere_else() -> None:
    runs = stepped_runs({"tiny-falcon": (3, 1.3), "tiny-mistral": (2, 0.7)})
    [h] = branch_history(runs, GATE)
    assert [p.label for p in h.points] == [sha(k)[:8] for k in range(5)]
    # a commit's two sessions pooled: every trial, each run a session of its own
    for k, point in enumerate(h.points):
        assert point.runs == (f"c{k}r0", f"c{k}r1") and not point.dirty
        assert all(len(c.trials) == 10 and sessions_of(c) == [1, 2] for c in point.run.cases)
    found = {(c.nodeid, c.after, c.direction) for c in h.changes}
    expected = {(i, 3, WORSE) for i in _ids(runs, "tiny-falcon")}
    expected |= {(i, 2, BETTER) for i in _ids(runs, "tiny-mistral")}
    assert found == expected
    for c in h.changes:  # the size: +30 % and -30 %, each within the trials' noise
        assert c.delta.relative_change == pytest.approx(
            0.3 if c.direction == WORSE else -0.3, abs=0.05
        )
        assert c.p is not None and c.p < 0.05


def test_without_a_step_nothing_is_marked() -> None:
    [h] = branch_history(stepped_runs({}), GATE)
    assert len(h.points) == 5 and h.changes == ()


def test_only_the_branchs_runs_count_and_uncommitted_ones_stand_alone() -> None:
    base = synthetic_run(6, seed=1)
    runs = [
        at_commit(base, 0),
        at_commit(synthetic_run(6, seed=2), 1),
        at_commit(synthetic_run(6, seed=3), 1, rep=1, dirty=True),
        at_commit(synthetic_run(6, seed=4), 2, branch="feature"),
        at_commit(synthetic_run(6, seed=5), 3, branch=None),  # a detached HEAD
        dataclasses.replace(base, name="nocommit", commit={"branch": "main"}),
    ]
    points, notes = commit_points(runs, "main")
    assert [(p.label, p.dirty, p.runs) for p in points] == [
        (sha(0)[:8], False, ("c0r0",)),
        (sha(1)[:8], False, ("c1r0",)),
        (sha(1)[:8] + "+", True, ("c1r1dirty",)),
    ]
    assert any("2 run(s) not on branch main" in n and "c2r0" in n for n in notes)
    assert any("no commit recorded" in n and "nocommit" in n for n in notes)
    # another branch's history: one point, nothing to draw
    assert branch_history(runs, GATE, branch="feature") == []


def test_a_counted_figure_has_no_interval_and_its_change_is_exact(tmp_path: Path) -> None:
    runs = []
    for k in range(4):
        flops = 400.0 if k < 2 else 800.0  # the decode's matmuls doubled at commit 2
        cases = tuple(
            dataclasses.replace(
                make_case([0.1, 0.101, 0.099], input_tokens=n, output_tokens=4), work=work(flops)
            )
            for n in (8, 16)
        )
        runs.append(at_commit(dataclasses.replace(synthetic_run(2), cases=cases), k))
    gate = parse_gate("flops_per_token:1%")
    [h] = branch_history(runs, gate)
    assert {(c.after, c.direction) for c in h.changes} == {(2, WORSE)}
    assert len(h.changes) == 2
    page = render_report(runs[-1:], histories=[h])
    spec = json.loads(script_texts(page)["llmenergy-specs"])["history-0"]
    assert all(r["lo"] is None and r["hi"] is None for r in spec["data"]["values"])
    marks = [layer["mark"]["type"] for layer in spec["spec"]["layer"]]
    assert "rule" not in marks  # no bars: counted figures are exact
    assert "counted, not measured" in spec["title"]["subtitle"][1]


# -- llmenergy report ------------------------------------------------------------------------
def test_the_report_draws_the_history_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = stepped_runs({"tiny-falcon": (3, 1.3)})
    paths = _saved(tmp_path, runs)
    out = tmp_path / "r.html"
    assert main(["report", *paths, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "history of main (cpu-x__no-gpu__estimate): j_per_token over 5 commits, " in err
    assert "4 change(s) worse and 0 better by the gate j_per_token:5%" in err
    scripts = script_texts(out.read_text())
    spec = json.loads(scripts["llmenergy-specs"])["history-0"]
    data = spec["data"]["values"]
    assert len(data) == 5 * 12  # a point per commit and case
    marked = {(r["panel"], r["commit"]) for r in data if r["change"]}
    falcon = {r["panel"] for r in data if "tiny-falcon" in r["panel"]}
    assert marked == {(p, sha(3)[:8]) for p in falcon} and len(falcon) == 4
    assert all(r["size"].startswith("+") for r in data if r["change"])
    # the changed cases' panels first
    assert sorted({(r["rank"], r["panel"]) for r in data})[:4] == list(enumerate(sorted(falcon)))
    changes = json.loads(scripts["history-0-data"])["rows"]
    assert sorted(row[0] for row in changes) == sorted(falcon)
    assert {(row[1], row[2]) for row in changes} == {(sha(2)[:8], sha(3)[:8])}
    commits = json.loads(scripts["history-1-data"])["rows"]
    assert [row[3] for row in commits] == [f"c{k}r0, c{k}r1" for k in range(5)]
    # what each step could have seen: a share, the gate's threshold at least
    assert commits[0][5] == DASH  # the first commit has none before it
    assert all(row[5].startswith(">= ") and int(row[5][3:-1]) >= 5 for row in commits[1:])


def test_history_options_choose_the_figure_and_the_branch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _saved(tmp_path, stepped_runs({"tiny-falcon": (3, 1.3)}, commits=3))
    out = tmp_path / "r.html"
    args = ["report", *paths, "--out", str(out), "--history", "time_s:10%"]
    assert main(args) == 0
    assert "time_s over 3 commits" in capsys.readouterr().err
    assert "history-0" in json.loads(script_texts(out.read_text())["llmenergy-specs"])
    assert main([*args, "--history-branch", "release"]) == 0
    err = capsys.readouterr().err
    assert "no history: the runs given span fewer than two commits on branch release" in err
    assert "history-0" not in json.loads(script_texts(out.read_text())["llmenergy-specs"])


def test_hostile_names_in_a_history_change_nothing_in_how_the_page_parses() -> None:
    """Case names, commit ids and a branch that are markup: each data element ends at its
    own ``</script>``, holds no ``<``, and gives the names back as they were."""
    runs = [
        dataclasses.replace(
            hostile_run(13, seed=k, slower=1.0 if k < 2 else 1.4),
            name=f"h{k}",
            commit={
                "id": f"{HOSTILE[k]}{k}",
                "branch": HOSTILE[0],
                "dirty": False,
                "time": f"2026-02-0{k + 1}T00:00:00Z",
            },
        )
        for k in range(3)
    ]
    histories = branch_history(runs, GATE, branch=HOSTILE[0], session_noise=0.02)
    [h] = histories
    assert {c.after for c in h.changes} == {2} and h.changes
    page = render_report(runs, histories=histories)
    scripts = script_texts(page)
    for text in scripts.values():
        assert "<" not in text and ">" not in text and "&" not in text
    spec = json.loads(scripts["llmenergy-specs"])["history-0"]
    names = distinct_names([c.nodeid for c in runs[0].cases])
    assert {r["panel"] for r in spec["data"]["values"]} == set(names.values())
    # in commit order, by number: a list of names would be compiled into an expression
    assert {(r["commit"], r["order"]) for r in spec["data"]["values"]} == {
        (p.label, i) for i, p in enumerate(h.points)
    }
    labels = [f"{HOSTILE[k]}{k}"[:8] for k in range(3)]
    assert {r["commit"] for r in spec["data"]["values"]} == set(labels)
    commits = json.loads(scripts["history-1-data"])["rows"]
    assert [row[1] for row in commits] == [f"{HOSTILE[k]}{k}" for k in range(3)]
    assert f"commits on {HOSTILE[0]}" not in page  # the title is escaped in the markup
    assert "commits on &lt;!--&lt;script&gt;" in page


def test_runs_of_a_commit_that_cannot_be_pooled_leave_the_latest_and_say_why() -> None:
    other = synthetic_run(6, seed=3)
    looser = tuple(
        dataclasses.replace(c, options=dataclasses.replace(c.options, confidence=0.9))
        for c in other.cases
    )
    runs = [
        at_commit(synthetic_run(6, seed=1), 0),
        at_commit(synthetic_run(6, seed=2), 1),
        at_commit(dataclasses.replace(other, cases=looser), 1, rep=1),
    ]
    points, notes = commit_points(runs, "main")
    assert [p.runs for p in points] == [("c0r0",), ("c1r0", "c1r1")]
    assert points[1].run.name == "c1r1"  # the latest session of the commit, alone
    assert "different confidence levels" in points[1].note and points[1].note in notes
