"""The real-engine tier: llama.cpp (llama-cpp-python's server) started through
``--llm-serve=llama.cpp``, its model converted to GGUF by llama.cpp's own converter.

Every test here skips, in one line, unless ``LLMENERGY_LLAMACPP_PYTHON`` names an
interpreter with ``llama-cpp-python[server]`` and ``LLMENERGY_GGUF_CONVERTER`` names
``convert_hf_to_gguf.py`` (``tox -e llamacpp`` builds both; the build compiles for
~10 min).  Select the tier with ``-m engine``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import psutil
import pytest

from pytest_llmenergy.serving.engine import ENGINES, engine_version
from tests.test_plugin_suite import BENCHMARKS

pytestmark = pytest.mark.engine


def _llamacpp() -> tuple[str, str]:
    python = os.environ.get("LLMENERGY_LLAMACPP_PYTHON", "")
    converter = os.environ.get("LLMENERGY_GGUF_CONVERTER", "")
    if not python or not converter:
        pytest.skip(
            "llama.cpp tier: set LLMENERGY_LLAMACPP_PYTHON (llama-cpp-python[server]) and "
            "LLMENERGY_GGUF_CONVERTER (convert_hf_to_gguf.py) (tox -e llamacpp)"
        )
    try:
        engine_version(ENGINES["llama.cpp"], python)
    except Exception as exc:
        pytest.skip(f"llama.cpp tier: {exc}")
    return python, converter


def _servers() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "llama_cpp.server" in " ".join(p.info["cmdline"] or [])
    ]


def test_the_gguf_tokenizes_prompts_as_the_models_own_tokenizer(
    tiny_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built-in models' BPE is unknown to the converter and converted as GPT-2's
    pre-tokenizer: llama.cpp must then count every prompt as transformers does."""
    python, converter = _llamacpp()
    from pytest_llmenergy.llm.loader import load_prompts
    from pytest_llmenergy.llm.tiny import ensure_tiny_model
    from pytest_llmenergy.serving.engine import Preparation

    monkeypatch.setenv("LLMENERGY_CACHE", str(tiny_cache))
    folder = str(ensure_tiny_model("tiny-llama-h32", tiny_cache))
    prepare = ENGINES["llama.cpp"].prepare
    assert prepare is not None
    gguf = prepare(folder, Preparation(python, converter, builtin=True))
    prompts = load_prompts(folder, cache_dir=tiny_cache)
    tok = prompts.tokenizer
    texts = [
        tok.decode(prompts.prompt_list(n, row)[1:], clean_up_tokenization_spaces=False)
        for n in (8, 32, 200)
        for row in range(4)
    ]
    code = (
        "import json, sys\n"
        "from llama_cpp import Llama\n"
        "llm = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)\n"
        "texts = json.load(sys.stdin)\n"
        "print(json.dumps([llm.tokenize(t.encode()) for t in texts]))\n"
    )
    done = subprocess.run(
        [python, "-c", code, gguf],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [tok(t)["input_ids"] for t in texts]
    assert theirs == ours


def test_llama_cpp_serves_exact_counts_or_says_which_it_missed_and_is_stopped(
    pytester: pytest.Pytester, tiny_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python, converter = _llamacpp()
    monkeypatch.setenv("LLMENERGY_CACHE", str(tiny_cache))
    monkeypatch.setenv("PYTHONPATH", str(BENCHMARKS.parent), prepend=os.pathsep)
    pytester.makeconftest((BENCHMARKS / "conftest.py").read_text())
    pytester.makepyfile(test_input_tokens=(BENCHMARKS / "test_input_tokens.py").read_text())
    before = _servers()
    result = pytester.runpytest_subprocess(
        "--llm-serve=llama.cpp",
        "--llm-model=tiny-llama-h32",
        f"--llm-serve-python={python}",
        f"--llm-gguf-converter={converter}",
        "--llm-input-tokens=32",
        "--llm-concurrency=1,4",
        "--energy-backend=estimate",
        "--energy-max-trials=4",
        "--energy-json=run.json",
        timeout=900,
    )
    out = result.stdout.str()
    assert "server: llama_cpp_python 0.3.36 started here" in out
    assert "requests are not streamed" in out
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 2
    # a trial is rejected (and a case whose every trial is, fails) only by llama.cpp's
    # extra tokens (finishing a character split at a UTF-8 boundary), named as such
    overshoot = re.compile(r"request \d+ of \d+: the server counted 32 input and (\d+) output")
    failures = re.findall(r"^FAILED .*$", out, flags=re.M)
    assert len(failures) == outcomes.get("failed", 0)
    for line in failures:
        found = overshoot.search(line)
        assert found and int(found.group(1)) > 32 and "every trial" in line, line
    run = json.loads((pytester.path / "run.json").read_text())
    for case in run["cases"]:
        for trial in case["disturbed_trials"]:
            if trial.get("rejected"):  # others: a busy machine
                found = overshoot.search(trial["rejected"])
                assert found and int(found.group(1)) > 32, trial["rejected"]
    if outcomes.get("passed"):
        assert run["options"]["serve_engine"]["engine"] == "llama.cpp"
        assert run["options"]["serve_engine"]["prompt"] == "text"
        for case in run["cases"]:
            for trial in case["trials"]:
                assert len(trial["requests"]) == case["queries"]
                assert all(r["output_tokens"] == 32 for r in trial["requests"])
                assert all(r["ttft_s"] is None for r in trial["requests"])
    assert _servers() == before  # nothing left behind
