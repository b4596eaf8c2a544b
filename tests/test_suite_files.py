"""One suite, two ways to run it: the clone's ``benchmarks/`` and the folder
``llmenergy init-suite`` writes into a project are the same thin files, generated from
``pytest_llmenergy.suite.FILES``, and collect the same cases under the same ids."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmenergy.suite import FILES
from tests.test_cli import cli

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def test_the_clones_benchmarks_are_the_generated_files_and_nothing_else() -> None:
    """A copy that drifted (an edit to benchmarks/ instead of the package) fails here."""
    assert sorted(p.name for p in BENCHMARKS.glob("*.py")) == sorted(f.name for f in FILES)
    for suite_file in FILES:
        assert (BENCHMARKS / suite_file.name).read_text() == suite_file.text(), suite_file.name


def test_init_suite_writes_the_files_and_a_rerun_keeps_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "project" / "benchmarks"
    code, out, err = cli(capsys, "init-suite", target)
    assert code == 0
    assert f"python -m pytest {target}/ --llm-grid=quick" in out
    assert err.count("llmenergy: wrote ") == len(FILES)
    for suite_file in FILES:
        assert (target / suite_file.name).read_text() == suite_file.text()
    code, out, err = cli(capsys, "init-suite", target)
    assert code == 0 and "wrote" not in err
    assert "already there: conftest.py, test_input_tokens.py, test_output_tokens.py" in err


def test_init_suite_refuses_a_file_of_the_projects_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "conftest.py").write_text("import pytest\n")
    code, out, err = cli(capsys, "init-suite", tmp_path)
    assert code == 2 and out == ""
    [line] = err.splitlines()
    assert line == (
        f"llmenergy: error: {tmp_path / 'conftest.py'} exists and is not the suite's "
        "conftest.py: move it away, give another folder (llmenergy init-suite DIR), or add "
        "the suite's line to it yourself: from pytest_llmenergy.suite.fixtures import run_case"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conftest.py"]
    # done as it says: the project's conftest with the suite's line is kept as it is
    (tmp_path / "conftest.py").write_text(
        "import pytest\nfrom pytest_llmenergy.suite.fixtures import run_case\n"
    )
    code, out, err = cli(capsys, "init-suite", tmp_path)
    assert code == 0 and "already there: conftest.py" in err
    assert (tmp_path / "conftest.py").read_text().startswith("import pytest\n")
    assert (tmp_path / "test_input_tokens.py").is_file()


def test_init_suite_refuses_a_file_for_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "benchmarks").write_text("")
    code, out, err = cli(capsys, "init-suite", tmp_path / "benchmarks")
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"llmenergy: error: {tmp_path / 'benchmarks'}: is a file; give a folder"
    ]


def _collected(cwd: Path, *args: str) -> list[str]:
    """The case ids ``python -m pytest`` collects in ``cwd``, in order (a fresh process,
    as a user runs it; the package from this checkout)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_a_project_runs_the_same_cases_under_the_same_ids_as_the_clone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Saved runs are compared by case id: a project's must match a clone's."""
    assert cli(capsys, "init-suite", tmp_path / "benchmarks")[0] == 0
    args = ("benchmarks/", "--llm-grid=quick", "--energy-seed=3")
    project = _collected(tmp_path, *args)
    assert len(project) == 18 and project[0].startswith("benchmarks/test_")
    assert project == _collected(ROOT, *args)
