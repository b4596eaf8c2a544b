"""The docs: reference pages generated from the registries list everything registered, and
the README stays a short front door whose commands and links are true."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from pytest_llmenergy.figures import FIGURES
from pytest_llmenergy.meters import BUILTIN_BACKENDS
from pytest_llmenergy.plugin.options import OPTIONS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CI = ROOT / ".ci" / "run"
# A day written as YYYY-MM-DD: in these docs and the package, the mark of a dated measurement.
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# The pages that keep dated measurements: the evidence page and the GPU's proof.
EVIDENCE_PAGES = {"evidence.md", "hardware-proof.md"}
# Package files whose dates are a data source's provenance (the upstream files' own
# dates, part of what the data is), not a measurement of this package.
PROVENANCE_NOTES = {"data/carbon_intensity.md", "data/alpaca_token_lengths.md"}


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    """docs/hooks/reference.py, the MkDocs hook, loaded as a module (it is no package)."""
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "docs" / "hooks" / "reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_options_page_lists_every_option_with_its_ini_twin_and_default(
    reference: ModuleType,
) -> None:
    page = reference.options_page()
    rows = re.findall(r"^\| `(--[a-z-]+)[^`]*` \| `(llmenergy_\w+)` \| ([^|]*) \|", page, re.M)
    assert {flag: ini for flag, ini, _ in rows} == {o.flag: o.ini for o in OPTIONS}
    defaults = {flag: default.strip() for flag, _, default in rows}
    assert defaults["--energy-max-trials"] == "25"
    assert defaults["--energy-storage"] == ".llmenergy"


def test_figures_page_lists_every_figure(reference: ModuleType) -> None:
    page = reference.figures_page()
    keys = re.findall(r"^\| `(\w+)` \|", page, re.M)
    assert keys == list(FIGURES)


def _leaf_commands(parser: argparse.ArgumentParser, prefix: str) -> dict[str, list[str]]:
    """Every command that runs something, with its option strings."""
    found: dict[str, list[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _leaf_commands(sub, f"{prefix} {name}")
                found.update(nested or {f"{prefix} {name}": _flags(sub)})
    return found


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")]


def test_commands_page_lists_every_command_and_its_options(reference: ModuleType) -> None:
    parser = reference.cli_parser()
    page = reference.commands_page()
    commands = _leaf_commands(parser, "llmenergy")
    assert "llmenergy gpu restore" in commands  # nested commands are found too
    sections = dict(
        re.findall(r"^## `(llmenergy [^`]+)`[^\n]*\n(.*?)(?=^## |\Z)", page, re.M | re.S)
    )
    assert set(sections) == set(commands)
    for name, flags in commands.items():
        for flag in flags:
            assert f"`{flag}" in sections[name], (name, flag)


def test_meters_page_has_every_backend_with_its_docstring(reference: ModuleType) -> None:
    page = reference.meters_page()
    for name in BUILTIN_BACKENDS:
        assert f"## `{name}`" in page
    assert "millijoules" in page  # nvml's module docstring, not a hand-written line


def test_run_file_page_covers_every_field_a_real_session_writes(reference: ModuleType) -> None:
    sample = reference.sample_run_file()
    page = reference.runfile_page(sample)
    fields = set(re.findall(r"^\| `([^`]+)` \|", page, re.M))
    for path, _, _ in reference._walk({k: v for k, v in sample.items() if k != "options"}, ""):
        generic = re.sub(r"\.(disturbed_trials|prefill_passes)\[\]", ".trials[]", path)
        assert not path or path in fields or generic in fields, path
    row = next(line for line in page.splitlines() if line.startswith("| `cases[].trials[].joules`"))
    assert "gross, every counted domain once" in row  # the field's comment in results.py
    assert sample["cases"][0]["trials"], "the sample session measured no trial"
    assert json.dumps(sample["schema_version"]) in page


def test_readme_is_a_short_front_door_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = [line.strip() for block in blocks for line in block.splitlines()]
    assert "python -m pytest benchmarks/" in commands
    assert "python -m pytest" in commands


def test_readme_links_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    for link in local:
        assert (ROOT / link).exists(), link


def _bash_lines(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_readme_install_and_test_commands_are_what_ci_runs() -> None:
    """.ci/run installs and tests "exactly as README.md says": the README's clone install
    (torch pinned first, then the package with its extras) and its test command are lines
    of .ci/run, in that order, and the first-run guide installs the same."""
    readme = _bash_lines(README.read_text())
    install = [line for line in readme if line.startswith("pip install") and "-e" in line]
    torch = [line for line in readme if line.startswith("pip install torch==")]
    assert install == ['pip install -e ".[llm,dev]"'], install
    assert torch, "the README pins torch before the package"
    ci = [line.strip() for line in CI.read_text().splitlines()]
    steps = [torch[0], install[0], "python -m pytest"]
    assert all(step in ci for step in steps), steps
    assert [ci.index(step) for step in steps] == sorted(ci.index(step) for step in steps)
    first_run = _bash_lines((DOCS / "guides" / "first-run.md").read_text())
    assert torch[0] in first_run and install[0] in first_run


def test_dated_measurements_live_on_the_evidence_pages_only() -> None:
    """The README, the guides and the package state current behaviour: a dated figure
    belongs on the evidence page (or the GPU's proof), which the README links to."""
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    for page in pages:
        if page.parent == DOCS and page.name in EVIDENCE_PAGES:
            continue
        if DOCS / "hardware-proof" in page.parents:  # the proof's own files, as written
            continue
        found = DATE.findall(page.read_text())
        assert not found, f"{page.relative_to(ROOT)}: dated {found}: move it to docs/evidence.md"
    package = ROOT / "pytest_llmenergy"
    for path in sorted(package.rglob("*")):
        if path.suffix not in (".py", ".md") or "__pycache__" in path.parts:
            continue
        if path.relative_to(package).as_posix() in PROVENANCE_NOTES:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not DATE.search(line), f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
    assert "docs/evidence.md" in README.read_text()
    assert "evidence.md" in (ROOT / "mkdocs.yml").read_text()


def test_the_date_check_sees_a_dated_line() -> None:
    assert DATE.search("on 2026-11-27 13-15 % of the pairs")
    assert not DATE.search("schema 3, 2.13.0, 05:29-05:59 UTC, 8-18 %")
