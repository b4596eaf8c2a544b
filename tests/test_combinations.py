"""Features together (docs/combinations.md): refused pairs stop in one line, allowed ones
run together with their figures checked, and the document is the registry's."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmenergy.plugin.combinations import PAIRS, markdown
from tests.test_plugin import TRACE_CONFTEST
from tests.test_plugin_suite import model_cache, suite  # noqa: F401  # fixtures

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "combinations.md"

# What turns each refused pair on; the session must stop at start with the pair's line.
REFUSING: dict[tuple[str, str], tuple[str, ...]] = {
    ("xdist", "serving"): (
        "-n",
        "2",
        "--llm-endpoint=http://127.0.0.1:9",
        "--llm-model=tiny-llama",
    ),
    ("xdist", "gpu"): ("-n", "2", "--energy-gpu-power-limits=100W"),
    ("serving", "batch"): (
        "--llm-endpoint=http://127.0.0.1:9",
        "--llm-model=tiny-llama",
        "--llm-batch-sizes=1,2",
    ),
    ("serving", "profiles"): (
        "--llm-endpoint=http://127.0.0.1:9",
        "--llm-model=tiny-llama",
        "--energy-profile-ops",
    ),
}


def test_the_document_is_the_registry() -> None:
    assert DOC.read_text(encoding="utf-8") == markdown(), (
        "docs/combinations.md is out of date: python -c 'from pytest_llmenergy.plugin."
        'combinations import markdown; print(markdown(), end="")\' > docs/combinations.md'
    )


def test_every_checked_pair_names_a_test_that_exists() -> None:
    for p in PAIRS:
        if not p.checked:
            continue
        path, _, name = p.checked.partition("::")
        function = name.split("[", 1)[0]
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert function in names, f"{p.features}: {p.checked} does not exist"
        if "[" in name:
            assert name.split("[", 1)[1][:-1] in COMBINED_IDS, p.checked


def test_every_refused_pair_is_run_here() -> None:
    refused = {p.features for p in PAIRS if p.refused}
    assert set(REFUSING) | {("torchrun", "gpu")} == refused


@pytest.mark.parametrize("features", sorted(REFUSING), ids="-".join)
def test_refused_pairs_stop_in_one_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, features: tuple[str, str]
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT), prepend=os.pathsep)
    pytester.makeconftest(TRACE_CONFTEST)
    pytester.makepyfile(test_x="def test_x(energy_benchmark): pass\n")
    result = pytester.runpytest_subprocess("--energy-backend=trace", *REFUSING[features])
    [line] = [p.refused for p in PAIRS if p.features == features]
    errors = [x for x in result.stderr.lines if x.startswith("ERROR: ")]
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: {line}"), result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def _nvml_starts() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    return True


@pytest.mark.skipif(
    not _nvml_starts(), reason="without NVML, the GPU options' NVML check refuses first"
)
def test_torchrun_with_gpu_axes_is_refused(tmp_path: Path) -> None:
    """One rank is enough to be under torchrun."""
    (tmp_path / "conftest.py").write_text(TRACE_CONFTEST)
    (tmp_path / "test_x.py").write_text("def test_x(energy_benchmark): pass\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=1",
            "-m",
            "pytest",
            "--energy-backend=trace",
            "--energy-gpu-power-limits=100W",
            "-p",
            "no:randomly",
        ],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    [line] = [p.refused for p in PAIRS if p.features == ("torchrun", "gpu")]
    assert f"ERROR: {line}" in done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stdout


COMBINED_IDS = ("xdist-batch-profiles-exports-gates", "pytest-benchmark-exports-gates")

BENCHMARK_TESTS = """
import time

def test_sleep(benchmark):
    benchmark.pedantic(time.sleep, args=(0.002,), rounds=5, iterations=1)

def test_energy_case(energy_benchmark):
    energy_benchmark(time.sleep, 0.01, input_tokens=1, output_tokens=1)
"""


def _exported(path: Path) -> dict[str, float]:
    entries = json.loads(path.read_text())
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), "two export entries share a name"
    return {e["name"]: e["value"] for e in entries}


@pytest.mark.parametrize("combined", COMBINED_IDS)
def test_allowed_features_together(
    request: pytest.FixtureRequest, pytester: pytest.Pytester, combined: str
) -> None:
    """Every feature of the set at once: a baseline run, then a gated run over it that
    exports to the same path again; the figures are checked in the run file and export."""
    export = "--energy-export=github-action-benchmark:gab.json"
    if combined.startswith("xdist"):
        project = request.getfixturevalue("suite")
        common = (
            "-n",
            "2",
            "--energy-backend=trace",
            "--llm-model=tiny-llama",
            "--llm-input-tokens=16",
            "--llm-output-tokens=4",
            "--llm-batch-sizes=1,2",
            "--energy-profile-ops",
            "--energy-rule=research",
            "--energy-max-trials=3",
            "-p",
            "no:randomly",
            export,
        )
        run = project.runpytest_subprocess
        cases = 4  # two sweeps' case x two batch sizes
    else:
        # under xdist, pytest-benchmark would take the inner session for a worker too
        request.getfixturevalue("monkeypatch").delenv("PYTEST_XDIST_WORKER", raising=False)
        project = pytester
        project.makeconftest(TRACE_CONFTEST)
        project.makepyfile(test_b=BENCHMARK_TESTS)
        common = ("--energy-backend=trace", "--energy-rule=research", export)
        run = project.runpytest
        cases = 1
    first = run(*common, "--energy-json=base.json")
    assert first.ret == 0, first.stdout.str()
    before = _exported(project.path / "gab.json")
    # The gate's machinery together with the rest, not its precision: these sessions run
    # with the busy-machine check off (tests/conftest.py), and a loaded machine slowed a
    # 10 ms case 46-fold between the two sessions on the constant-power trace meter.
    gate = "j_per_token:10000%"
    second = run(*common, "--energy-compare=base.json", f"--energy-compare-fail={gate}")
    assert second.ret == 0, second.stdout.str()
    second.stdout.fnmatch_lines([f"llmenergy: energy gate passed ({gate})*"])
    after = _exported(project.path / "gab.json")  # replaced: an export is derived
    assert set(after) == set(before) and len(after) == 3 * cases
    assert all(v > 0 for v in after.values())
    data = json.loads((project.path / "base.json").read_text())
    assert len(data["cases"]) == cases
    for case in data["cases"]:
        assert f"{case['nodeid']} j_per_token" in after
        if combined.startswith("xdist"):
            assert case["op_profile"]["classes"]["matmul"]["flops"] > 0
    if combined.startswith("xdist"):
        assert {c["queries"] for c in data["cases"]} == {1, 2}
