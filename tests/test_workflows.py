"""The CI files users copy must use options and commands that exist."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_llmenergy.cli import _parser
from pytest_llmenergy.plugin.options import BY_FLAG

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def workflow(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def commands(flow: dict[str, Any], job_name: str | None = None) -> list[list[str]]:
    """Every shell command of every step (of one job), split into words, line continuations
    joined; shell keywords and subshell parentheses left out."""
    found = []
    for name, job in flow["jobs"].items():
        if job_name is not None and name != job_name:
            continue
        for step in job["steps"]:
            script = step.get("run", "").replace("\\\n", " ")
            for line in script.splitlines():
                line = line.split(" >>")[0].strip().lstrip("(").rstrip(")")
                keywords = ("#", "if ", "fi", "else", "then", "for ", "done", "echo ", "mkdir ")
                if line and not line.startswith(keywords):
                    words = shlex.split(line)
                    if words[:2] == ["cd", words[1]] and "&&" in words:
                        words = words[words.index("&&") + 1 :]
                    found.append(words)
    return found


def guarded(condition: str) -> bool:
    """A pull request job runs a fork's code only after a maintainer's label."""
    return (
        "github.event.pull_request.head.repo.full_name == github.repository" in condition
        and "github.event.label.name == 'energy-gate:run'" in condition
        and "github.event.action != 'labeled'" in condition
    )


def test_energy_gate_runs_only_when_enabled_and_forks_only_after_a_label() -> None:
    flow = workflow("energy-gate.yml")
    triggers = flow[True]  # YAML reads the key `on` as true
    assert triggers["push"]["branches"] == ["main"]
    assert "labeled" in triggers["pull_request"]["types"]
    assert "pull_request_target" not in triggers  # never the base's secrets for a fork's code
    jobs = flow["jobs"]
    for name, job in jobs.items():
        assert "vars.LLMENERGY_ENERGY_GATE == 'on'" in job["if"], name
        assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    assert guarded(jobs["paired"]["if"]) and guarded(jobs["alternate"]["if"])
    assert guarded(jobs["against-baseline"]["if"])
    # one mode at a time: paired by default, the others when asked
    assert "vars.LLMENERGY_GATE_MODE == ''" in jobs["paired"]["if"]
    assert "vars.LLMENERGY_GATE_MODE == 'alternate'" in jobs["alternate"]["if"]
    assert "github.event_name == 'push'" in jobs["baseline"]["if"]
    uploads = [s for s in jobs["baseline"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert uploads[0]["with"]["name"] == "energy-baseline"
    header = (WORKFLOWS / "energy-gate.yml").read_text().split("\nname:")[0]
    assert "fork" in header and "energy-gate:run" in header


def test_the_default_job_measures_base_and_head_in_one_paired_run() -> None:
    job = workflow("energy-gate.yml")["jobs"]["paired"]
    refs = [s["with"]["ref"] for s in job["steps"] if "checkout" in s.get("uses", "")]
    assert refs == [
        "${{ github.event.pull_request.base.sha }}",
        "${{ github.event.pull_request.head.sha }}",
    ]
    calls = [w for w in commands(workflow("energy-gate.yml"), "paired") if w[0] == "llmenergy"]
    assert [c[3] for c in calls] == ["ab", "report"]
    assert calls[0][4:6] == ["base", "head"] and "--gate" in calls[0] and "--save" in calls[0]
    assert calls[1][4:6] == ["pr-base", "pr-head"]  # the HTML report of the pair


def test_the_alternating_job_measures_base_and_head_alternately_then_pools() -> None:
    job = workflow("energy-gate.yml")["jobs"]["alternate"]
    refs = [s["with"]["ref"] for s in job["steps"] if "checkout" in s.get("uses", "")]
    assert refs == [
        "${{ github.event.pull_request.base.sha }}",
        "${{ github.event.pull_request.head.sha }}",
    ]
    measure = next(s["run"] for s in job["steps"] if s.get("name", "").startswith("Measure"))
    assert "for side in base head" in measure and 'seq 1 "$ROUNDS"' in measure
    calls = [w for w in commands(workflow("energy-gate.yml"), "alternate") if w[0] == "llmenergy"]
    assert [c[1] for c in calls] == ["merge", "merge", "compare", "report", "export"]
    assert calls[0][2] == "runs/base-*.json" and calls[1][2] == "runs/head-*.json"
    assert calls[2][2:4] == ["runs/base.json", "runs/head.json"] and "--fail-on" in calls[2]
    assert calls[3][2:4] == ["runs/base.json", "runs/head.json"]  # the HTML report


def test_the_gate_jobs_keep_the_html_report_and_link_it_from_the_summary() -> None:
    flow = workflow("energy-gate.yml")
    for name, report in (
        ("paired", "runs/"),
        ("alternate", "runs/"),
        ("against-baseline", "energy-pr.html"),
    ):
        steps = flow["jobs"][name]["steps"]
        keep = next(s for s in steps if s.get("id") == "keep")
        assert report in keep["with"]["path"]
        link = next(s for s in steps if s.get("name") == "Link the report from the job summary")
        assert link["env"]["URL"] == "${{ steps.keep.outputs.artifact-url }}"
        assert "$GITHUB_STEP_SUMMARY" in link["run"]


def test_actions_are_pinned_least_privileged_and_keep_no_credentials() -> None:
    for name in ("energy-gate.yml", "ci.yml"):
        text = (WORKFLOWS / name).read_text()
        for line in text.splitlines():
            if "uses:" in line:
                assert re.search(r"uses: [\w/-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), line
        flow = workflow(name)
        assert flow["permissions"] == {}
        for job in flow["jobs"].values():
            assert "permissions" in job and "write" not in str(job["permissions"])
            for step in job["steps"]:
                if "actions/checkout" in step.get("uses", ""):
                    assert step["with"]["persist-credentials"] is False


def test_every_pytest_option_in_the_workflows_exists() -> None:
    used = set()
    for name in ("energy-gate.yml", "ci.yml"):
        for words in commands(workflow(name)):
            used |= {w.split("=")[0] for w in words if w.startswith(("--energy-", "--llm-"))}
    assert "--energy-compare-fail" in used and "--energy-json" in used
    assert used <= set(BY_FLAG), used - set(BY_FLAG)


def test_every_gate_and_cli_call_in_the_workflows_parses() -> None:
    from pytest_llmenergy.compare import parse_gate

    calls = []
    for words in commands(workflow("energy-gate.yml")):
        for w in words:
            if w.startswith("--energy-compare-fail="):
                parse_gate(w.split("=", 1)[1])
        if words[0] == "llmenergy":
            words = words[: words.index("--")] if "--" in words else words  # ab: pytest's
            # the shell expands runs/base-*.json into one file per round
            rounds = [w.replace("*", str(i)) for w in words[1:] for i in (1, 2) if "*" in w]
            args = _parser().parse_args([w for w in words[1:] if "*" not in w] + rounds)
            calls.append(args.command)
            if args.command in ("compare", "ab"):
                assert args.format == "markdown"
    assert sorted(calls) == [
        "ab", "compare", "compare", "export", "merge", "merge", "report", "report"
    ]  # fmt: skip


def test_the_workflow_linter_runs_in_ci_and_tox() -> None:
    assert "zizmor --offline .github/workflows" in (ROOT / ".ci" / "run").read_text()
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    assert "zizmor --offline .github/workflows" in tox["testenv:lint"]["commands"]
    assert ["zizmor", "--offline", ".github/workflows"] in commands(workflow("ci.yml"))


def test_own_ci_installs_torch_pinned_before_the_package() -> None:
    steps = [" ".join(w) for w in commands(workflow("ci.yml"))]
    torch = steps.index("pip install torch==2.13.0")
    assert steps.index("pip install -e .[llm,dev]") > torch
    assert "python -m pytest" in steps
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip install torch==2\.13\.0\n.*pip install -e \"\.\[llm,dev\]\"", ci_run)


def test_tox_has_tests_benchmarks_and_lint() -> None:
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    assert {"testenv:tests", "testenv:benchmarks", "testenv:lint"} <= set(tox.sections())
    assert "benchmarks/" in tox["testenv:benchmarks"]["commands"]


def test_ci_installs_what_the_readme_says_and_users_get_extras_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    develop = next(b for b in blocks if "pip install -e" in b)
    installs = [line.strip() for line in develop.splitlines() if line.startswith("pip install")]
    assert installs == ["pip install torch==2.13.0", 'pip install -e ".[llm,dev]"']
    ci_run = (ROOT / ".ci" / "run").read_text()
    at = [ci_run.index(line + "\n") for line in installs]  # the same lines, in this order
    assert at == sorted(at)
    steps = [" ".join(w) for w in commands(workflow("ci.yml"))]
    assert [s for s in steps if s.startswith("pip install")] == [
        " ".join(shlex.split(line)) for line in installs
    ]
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    assert tox["testenv:tests"]["extras"] == "llm,dev"
    assert installs[0] in tox["testenv"]["commands_pre"]
    # the user's lines name extras the package has, and leave out the developers' one
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = set(re.findall(r"^([\w-]+) = \[", section, re.M))
    users = re.findall(r"pytest-llmenergy\[([\w,]+)\]", readme)
    assert users and all(set(u.split(",")) <= extras - {"dev", "docs"} for u in users)
    assert {"llm", "report", "nvml", "dev"} <= extras and "test" not in extras


def test_the_perf_benchmarks_run_reported_in_ci_and_enforced_in_tox() -> None:
    """Their figures are seen on every GitHub CI run (reported, not enforced: a shared
    runner drifts) and in tox -e perf; .ci/run leaves them out (over 8 min here)."""
    perf = "python -m pytest tests/perf --benchmark-only"
    assert perf not in (ROOT / ".ci" / "run").read_text()
    step = [s for s in workflow("ci.yml")["jobs"]["tests"]["steps"] if perf in s.get("run", "")]
    assert len(step) == 1 and step[0]["env"] == {"LLMENERGY_PERF_ENFORCE": "0"}
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    assert perf in tox["testenv:perf"]["commands"]
    assert "LLMENERGY_PERF_ENFORCE" in tox["testenv:perf"]["passenv"]


# -- what the workflows install -------------------------------------------------------------
# every workflow file, the examples' too
EXAMPLE_FLOWS = sorted([*WORKFLOWS.glob("*.y*ml"), *(ROOT / "examples").rglob("*.y*ml")])
PINNED_SHA = "0123456789abcdef0123456789abcdef01234567"


def _resolved(word: str, env: dict[str, str]) -> str:
    """A word of a step's script with its ``$VAR`` read from the step's env, a variable
    left unset: its expression's default (``${{ vars.X || 'torch==2.13.0' }}``) or ""."""
    if not word.startswith("$"):
        return word
    value = str(env.get(word.strip("${}"), ""))
    unset = re.fullmatch(r"\$\{\{ vars\.\w+(?: \|\| '([^']*)')? \}\}", value)
    return (unset.group(1) or "") if unset else value


def test_every_workflow_installs_torch_pinned_and_never_the_package_by_name() -> None:
    """pytest-llmenergy is not on PyPI: a bare ``pytest-llmenergy[...]`` installs nothing
    that exists; an unpinned ``torch`` pulls whatever build is newest."""
    installs = []
    for path in EXAMPLE_FLOWS:
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            for step in job["steps"]:
                one_step = {"jobs": {"j": {"steps": [step]}}}
                for words in commands(one_step):
                    if words[:2] == ["pip", "install"]:
                        env = step.get("env", {})
                        installs += [(path.name, _resolved(w, env)) for w in words[2:]]
    torch = [req for _, req in installs if req.startswith("torch")]
    assert torch and all(re.fullmatch(r"torch==\d+\.\d+\.\d+", req) for req in torch), torch
    for name, req in installs:
        if req.lower().startswith(("pytest-llmenergy", "pytest_llmenergy")):
            assert " @ " in req, f"{name}: {req} is looked up on PyPI"
    assert ("energy-gate.yml", "") in installs  # LLMENERGY_PACKAGE: no default; see below


def _install_steps() -> list[dict[str, Any]]:
    return [
        step
        for job in workflow("energy-gate.yml")["jobs"].values()
        for step in job["steps"]
        if step.get("name") == "Install"
    ]


@pytest.mark.parametrize(
    ("package", "installed"),
    [
        ("", False),
        ("pytest-llmenergy[llm,nvml,report]", False),  # PyPI has no such package
        ("pytest-llmenergy[llm,nvml] @ git+https://example.org/p/pytest-llmenergy@main", False),
        (
            f"pytest-llmenergy[llm,nvml] @ git+https://example.org/p/pytest-llmenergy@{PINNED_SHA}",
            True,
        ),
        ("/opt/wheels/pytest_llmenergy-0.2.0-py3-none-any.whl[llm,nvml,report]", True),
        ("/opt/wheels/pytest_llmenergy-0.2.0-py3-none-any.whl", True),
    ],
)
def test_the_install_steps_take_the_package_at_a_commit_or_a_wheel(
    tmp_path: Path, package: str, installed: bool
) -> None:
    """Each Install step's script, run by bash as the runner runs it, with python3 and pip
    stood in for (they log what they were asked): a package pip would look up by name, or
    a branch that moves, stops the job before anything is installed."""
    tools = tmp_path / "tools"
    tools.mkdir()
    venv = 'mkdir -p .venv/bin && echo "PATH=$TOOLS:\\$PATH" > .venv/bin/activate\n'
    (tools / "python3").write_text(f"#!/bin/sh\n{venv}")
    (tools / "pip").write_text('#!/bin/sh\necho "$*" >> "$PIP_LOG"\n')
    for tool in tools.iterdir():
        tool.chmod(0o755)
    log = tmp_path / "pip.log"
    steps = _install_steps()
    assert len(steps) == 4 and all(s["run"] == steps[0]["run"] for s in steps)
    env = {**os.environ, "PATH": os.environ["PATH"], "TOOLS": str(tools), "PIP_LOG": str(log)}
    env |= {"TORCH": _resolved("$TORCH", steps[0]["env"]), "PACKAGE": package}
    done = subprocess.run(
        ["bash", "-e", "-c", steps[0]["run"]],
        cwd=tmp_path,
        env={**env, "PATH": f"{tools}{os.pathsep}{env['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if installed:
        assert done.returncode == 0, done.stdout + done.stderr
        assert log.read_text().splitlines() == ["install torch==2.13.0", f"install {package}"]
    else:
        assert done.returncode == 1 and not log.exists() and not (tmp_path / ".venv").exists()
        assert done.stdout.splitlines() == [
            f"LLMENERGY_PACKAGE='{package}': give the package at a commit or a wheel's path "
            "(see this file's header)"
        ]
