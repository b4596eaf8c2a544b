"""The real-engine tier: vLLM started through ``--llm-serve=vllm``, measured, stopped.

Not part of the default run's work: every test here skips, in one line, unless
``LLMENERGY_SERVE_PYTHON`` names an interpreter with vLLM installed (``tox -e vllm``
sets it; a start takes ~30 s on 2 CPU cores).  Select the tier with ``-m engine``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psutil
import pytest

from pytest_llmenergy.serving.engine import ENGINES, engine_version
from tests.fakes.signals import ctrl_c_reaches_it
from tests.test_plugin import assert_one_line_usage_error
from tests.test_plugin_suite import BENCHMARKS

pytestmark = pytest.mark.engine


def _vllm_python() -> str:
    """The engine's interpreter (absolute: pytester runs elsewhere), else a skip; CI sets
    LLMENERGY_REQUIRE_ENGINE=vllm, which makes a missing engine a failure, not a skip."""
    python = os.environ.get("LLMENERGY_SERVE_PYTHON", "")
    give_up = pytest.fail if os.environ.get("LLMENERGY_REQUIRE_ENGINE") == "vllm" else pytest.skip
    if not python:
        give_up("vLLM tier: set LLMENERGY_SERVE_PYTHON to a Python with vLLM (tox -e vllm)")
    python = os.path.abspath(python) if os.sep in python else python
    try:
        engine_version(ENGINES["vllm"], python)
    except Exception as exc:
        give_up(f"vLLM tier: {exc}")
    return python


def _engine_processes() -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if "vllm.entrypoints" in line or "VLLM::" in line:
            found.append(p.pid)
    return found


@pytest.fixture
def suite(pytester: pytest.Pytester, tiny_cache: Path, monkeypatch: pytest.MonkeyPatch):
    python = _vllm_python()
    monkeypatch.setenv("LLMENERGY_CACHE", str(tiny_cache))
    monkeypatch.setenv("LLMENERGY_SERVE_PYTHON", python)
    monkeypatch.setenv("PYTHONPATH", str(BENCHMARKS.parent), prepend=os.pathsep)
    pytester.makeconftest((BENCHMARKS / "conftest.py").read_text())
    pytester.makepyfile(test_input_tokens=(BENCHMARKS / "test_input_tokens.py").read_text())
    return pytester


def test_vllm_serves_exact_counts_at_concurrency_1_and_8_and_is_stopped(
    suite: pytest.Pytester,
) -> None:
    before = _engine_processes()
    result = suite.runpytest_subprocess(
        "--llm-serve=vllm",
        "--llm-model=tiny-llama-h32",
        "--llm-input-tokens=64",
        "--llm-concurrency=1,8",
        "--energy-backend=estimate",
        "--energy-max-trials=5",
        "--energy-json=run.json",
        timeout=600,
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*server: vllm* started here (pid *, answered after *"])
    run = json.loads((suite.path / "run.json").read_text())
    assert run["options"]["serve_engine"]["engine"] == "vllm"
    assert "--no-enable-prefix-caching" in run["options"]["serve_engine"]["argv"]
    for case in run["cases"]:
        queries = case["queries"]
        for trial in case["trials"]:
            assert len(trial["requests"]) == queries
            assert all(r["output_tokens"] == 32 for r in trial["requests"])
            assert all(0 < r["ttft_s"] < r["latency_s"] for r in trial["requests"])
    assert _engine_processes() == before  # nothing left behind


def test_a_model_vllm_cannot_serve_stops_the_session_with_its_log(
    suite: pytest.Pytester,
) -> None:
    """tiny-llama's heads have 16 dimensions; vLLM's CPU kernels take 32 and up: vLLM
    starts, and its engine fails the first request (then exits)."""
    result = suite.runpytest_subprocess(
        "--llm-serve=vllm", "--llm-model=tiny-llama", "--energy-backend=estimate", timeout=600
    )
    assert_one_line_usage_error(
        result,
        "--llm-serve: http://127.0.0.1:",
        "could not complete a first request",
        "last lines:",
    )
    assert _engine_processes() == []


def test_ctrl_c_stops_the_engine(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_wait="""
        import time
        def test_wait(llm_server):
            print("READY", flush=True)
            time.sleep(600)
        """
    )
    proc = subprocess.Popen(
        [
            "python",
            "-m",
            "pytest",
            "test_wait.py",
            "-s",
            "--llm-serve=vllm",
            "--llm-model=tiny-llama-h32",
            "--energy-backend=estimate",
            "-p",
            "no:cacheprovider",
        ],
        cwd=suite.path,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_reaches_it,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "READY" in line:
            break
    assert _engine_processes()
    proc.send_signal(2)  # SIGINT, as Ctrl-C
    proc.communicate(timeout=120)
    assert _engine_processes() == []
