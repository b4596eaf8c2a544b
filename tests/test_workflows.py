"""The CI files users copy must use options and commands that exist."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from pytest_llmenergy.cli import _parser
from pytest_llmenergy.plugin.options import BY_FLAG

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def workflow(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def commands(flow: dict[str, Any]) -> list[list[str]]:
    """Every shell command of every step, split into words (line continuations joined)."""
    found = []
    for job in flow["jobs"].values():
        for step in job["steps"]:
            script = step.get("run", "").replace("\\\n", " ")
            for line in script.splitlines():
                line = line.split(" >>")[0].strip()
                if line and not line.startswith(("#", "if ", "fi", "else", "then")):
                    found.append(shlex.split(line))
    return found


def test_energy_gate_runs_on_main_and_pull_requests_only_when_enabled() -> None:
    flow = workflow("energy-gate.yml")
    triggers = flow[True]  # YAML reads the key `on` as true
    assert triggers["push"]["branches"] == ["main"] and "pull_request" in triggers
    job = flow["jobs"]["energy"]
    assert job["if"] == "vars.LLMENERGY_ENERGY_GATE == 'on'"
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload")]
    assert uploads[0]["with"]["name"] == "energy-baseline"


def test_every_pytest_option_in_the_workflows_exists() -> None:
    used = set()
    for name in ("energy-gate.yml", "ci.yml"):
        for words in commands(workflow(name)):
            used |= {w.split("=")[0] for w in words if w.startswith(("--energy-", "--llm-"))}
    assert "--energy-compare-fail" in used and "--energy-json" in used
    assert used <= set(BY_FLAG), used - set(BY_FLAG)


def test_every_gate_and_cli_call_in_the_workflows_parses() -> None:
    from pytest_llmenergy.compare import parse_gate

    calls = 0
    for words in commands(workflow("energy-gate.yml")):
        for w in words:
            if w.startswith("--energy-compare-fail="):
                parse_gate(w.split("=", 1)[1])
        if words[0] == "llmenergy":
            args = _parser().parse_args(words[1:])
            assert args.command == "compare" and args.format == "markdown"
            calls += 1
    assert calls == 1


def test_own_ci_installs_torch_pinned_before_the_package() -> None:
    steps = [" ".join(w) for w in commands(workflow("ci.yml"))]
    torch = steps.index("pip install torch==2.13.0")
    assert steps.index("pip install -e .[llm,test]") > torch
    assert "python -m pytest" in steps
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip install torch==2\.13\.0\n.*pip install -e \"\.\[llm,test\]\"", ci_run)


def test_tox_has_tests_benchmarks_and_lint() -> None:
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    assert {"testenv:tests", "testenv:benchmarks", "testenv:lint"} <= set(tox.sections())
    assert "benchmarks/" in tox["testenv:benchmarks"]["commands"]


def test_readme_documents_every_option_with_its_ini_twin() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(--[a-z-]+)[^`]*` \| `(llmenergy_\w+)` \|", readme, re.M))
    assert rows == {flag: option.ini for flag, option in BY_FLAG.items()}
