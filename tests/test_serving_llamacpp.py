"""llama.cpp as an engine (``--llm-serve=llama.cpp``) against stand-ins with its real
semantics: the fake server's llama.cpp mode (text prompts only, ``ignore_eos`` ignored,
no usage in streams, one token more now and then) and a converter script that writes a
file where llama.cpp's would.  The real engine is tests/engines/test_llamacpp.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.serving.client import CountMismatch, Endpoint
from pytest_llmenergy.serving.engine import ENGINES, Preparation, start_engine
from pytest_llmenergy.serving.gguf import ensure_gguf, find_converter, gguf_path
from pytest_llmenergy.serving.target import TEXT, ServerTarget
from tests.fakes.fake_openai_server import Behaviour, FakeServer
from tests.test_plugin import assert_one_line_usage_error
from tests.test_serving import SUITE_TEST, Prompts, WordTokenizer

ROOT = Path(__file__).resolve().parent.parent

# Stands in for llama.cpp's convert_hf_to_gguf.py: what the driver needs of it (a
# module with main() reading sys.argv), and it counts its runs beside its output.
FAKE_CONVERTER = """
import sys
from pathlib import Path

def main():
    args = sys.argv[1:]
    model, out = Path(args[0]), Path(args[args.index("--outfile") + 1])
    if (model / "BROKEN").exists():
        print("loading model", file=sys.stderr)
        raise SystemExit("Unsupported architecture FooForCausalLM")
    out.write_bytes(b"GGUF" + (model / "config.json").read_bytes())
    runs = Path(__file__).with_name("runs")
    runs.write_text(str(int(runs.read_text()) + 1 if runs.exists() else 1))
"""


@pytest.fixture
def converter(tmp_path: Path) -> Path:
    path = tmp_path / "llama.cpp" / "convert_hf_to_gguf.py"
    path.parent.mkdir()
    path.write_text(FAKE_CONVERTER)
    return path


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "hf-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    return folder


def test_the_llama_cpp_target_goes_text_and_unstreamed_and_catches_the_extra_token() -> None:
    tokenizer = WordTokenizer()
    behaviour = Behaviour.llama_cpp(extra_token_every=4)
    behaviour.count_text = lambda text: len(tokenizer(text)["input_ids"])
    with FakeServer(behaviour) as s:
        target = ServerTarget(Endpoint(s.url, "fake-model"), Prompts(), tokenizer)
        burst = target.run(8, 4)  # after the probe's two completions: the 3rd
        assert target.prompt_kind == TEXT and target.endpoint.stream is False
        assert burst.requests[0].ttft_s is None and burst.requests[0].tpot_s is None
        assert burst.requests[0].latency_s > 0 and burst.requests[0].output_tokens == 4
        assert s.requests[-1]["stream"] is False and s.requests[-1]["min_tokens"] == 4
        with pytest.raises(CountMismatch, match="counted 8 input and 5 output tokens"):
            target.run(8, 4)  # the 4th: one token more, as llama.cpp does
        assert target.run(8, 4).output_tokens == 4  # the next trial is fine again


def test_the_converter_is_found_or_one_line_says_how_to_get_it(
    converter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMENERGY_GGUF_CONVERTER", raising=False)
    assert find_converter(str(converter.parent), sys.executable) == converter.resolve()
    monkeypatch.setenv("LLMENERGY_GGUF_CONVERTER", str(converter))
    assert find_converter(None, "/nowhere/bin/python") == converter.resolve()
    monkeypatch.delenv("LLMENERGY_GGUF_CONVERTER")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "convert_hf_to_gguf.py").write_text(FAKE_CONVERTER)
    assert find_converter(None, str(venv / "bin" / "python")).parent == venv / "bin"
    with pytest.raises(ConfigError) as info:
        find_converter(None, "/nowhere/bin/python")
    text = str(info.value)
    assert "pip download --no-binary :all: --no-deps llama-cpp-python" in text
    assert "--llm-gguf-converter" in text and "\n" not in text
    with pytest.raises(ConfigError, match=r"no llama\.cpp GGUF converter at /no/such"):
        find_converter("/no/such/convert.py", sys.executable)


def test_a_model_is_converted_once_atomically_and_again_when_it_changes(
    converter: Path, model_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = ensure_gguf(str(model_dir), converter, cache_dir=cache)
    assert first.parent == cache / "gguf" and first.name.endswith("-f32.gguf")
    assert first.read_bytes() == b'GGUF{"model_type": "llama"}'
    assert ensure_gguf(str(model_dir), converter, cache_dir=cache) == first
    assert converter.with_name("runs").read_text() == "1"  # cached: not converted again
    (model_dir / "config.json").write_text('{"model_type": "llama", "x": 1}')
    assert gguf_path(str(model_dir), cache_dir=cache) != first  # changed files: new name
    assert [p.name for p in (cache / "gguf").iterdir() if p.name.startswith(".")] == []


def test_a_failed_conversion_is_one_line_with_the_converters_words_and_no_file(
    converter: Path, model_dir: Path, tmp_path: Path
) -> None:
    (model_dir / "BROKEN").write_text("")
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError) as info:
        ensure_gguf(str(model_dir), converter, cache_dir=cache)
    text = str(info.value)
    assert "could not convert" in text and "Unsupported architecture FooForCausalLM" in text
    assert "\n" not in text
    assert list((cache / "gguf").iterdir()) == []  # no half-written or empty file


def test_llama_cpp_not_installed_says_how_to_build_it(converter: Path) -> None:
    hint = r"llama\.cpp is not installed.*llama-cpp-python\[server\]"
    with pytest.raises(ConfigError, match=hint):
        start_engine("llama.cpp", "m", python=sys.executable, converter=str(converter))


def test_the_llama_cpp_spec_serves_the_gguf_with_a_context_for_the_cases(
    converter: Path, model_dir: Path
) -> None:
    spec = ENGINES["llama.cpp"]
    assert spec.prepare is not None
    served = spec.prepare(str(model_dir), Preparation(sys.executable, str(converter)))
    assert served.endswith(".gguf") and Path(served).is_file()
    assert spec.prepare("/m/x.gguf", Preparation(sys.executable)) == "/m/x.gguf"  # as is
    argv = spec.command("/venv/bin/python", served, 8123)
    assert argv[:3] == ["/venv/bin/python", "-m", "llama_cpp.server"]
    assert argv[argv.index("--model") + 1] == served
    assert argv[argv.index("--port") + 1] == "8123" and int(argv[argv.index("--n_ctx") + 1]) >= 4096


# -- the plugin, as users run it: the llama.cpp spec with the fake server behind it ------
FAKE_LLAMA_CONFTEST = f"""
import dataclasses
from pytest_llmenergy.llm.tiny import ensure_tiny_model
from pytest_llmenergy.serving import engine

TOKENIZER = str(ensure_tiny_model("tiny-llama"))

def command(python, model, port):
    return [python, "-m", "tests.fakes.fake_openai_server", "--port", str(port),
            "--model", model, "--llama-cpp", "--extra-token-every", "7",
            "--tokenizer", TOKENIZER, "--spawn-child"]

engine.ENGINES["llama.cpp"] = dataclasses.replace(
    engine.ENGINES["llama.cpp"], command=command,
    env={{"PYTHONPATH": {str(ROOT)!r}}}, distributions=("pytest",),
)
"""


def _fake_servers() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "--llama-cpp" in " ".join(p.info["cmdline"] or [])
    ]


def test_serve_llama_cpp_converts_serves_flags_the_extra_token_and_stops(
    pytester: pytest.Pytester,
    tiny_cache: Path,
    converter: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLMENERGY_CACHE", str(tiny_cache))
    monkeypatch.setenv("PYTHONPATH", str(ROOT), prepend=os.pathsep)
    pytester.makeconftest(FAKE_LLAMA_CONFTEST)
    pytester.makepyfile(test_served=SUITE_TEST)
    before = _fake_servers()
    result = pytester.runpytest_subprocess(
        "--llm-serve=llama.cpp",
        "--llm-model=tiny-llama",
        f"--llm-gguf-converter={converter}",
        "--llm-input-tokens=16",
        "--llm-concurrency=1,4",
        "--energy-backend=estimate",
        "--energy-min-trials=3",
        "--energy-max-trials=3",
        "--energy-json=run.json",
        "--energy-shuffle=off",  # c1's requests are completions 3-6, c4's 7-22
        "--energy-max-background=off",  # a busy machine must not add trials to c1
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=2)
    out = " ".join(result.stdout.str().split())  # the header wraps at the terminal's width
    assert "server: pytest" in out and "-f32.gguf; log " in out  # started, serving the GGUF
    result.stdout.fnmatch_lines(
        ["*requests are not streamed: latency is measured, time to first token*"]
    )
    # every 7th completion has one token more: that trial is rejected (kept, left out,
    # repeated within the trial limit) and the table marks it
    result.stdout.fnmatch_lines(["*x*", "*+Nx: N more trials were rejected*"])
    run = json.loads((pytester.path / "run.json").read_text())
    (c4,) = [c for c in run["cases"] if c["name"].endswith("-c4]")]
    rejected = [t["rejected"] for t in c4["disturbed_trials"] if t.get("rejected")]
    assert rejected and all("the server counted 16 input and 33 output" in r for r in rejected)
    assert len(c4["trials"]) + len(c4["disturbed_trials"]) == 3  # within the limit
    assert len(c4["trials"]) >= 1  # the measured ones are exact
    record = run["options"]["serve_engine"]
    assert record["engine"] == "llama.cpp" and record["model"].endswith(".gguf")
    assert record["prompt"] == "text" and record["streamed"] is False
    assert _fake_servers() == before  # nothing left behind


def test_serve_llama_cpp_without_a_converter_stops_at_start_in_one_line(
    pytester: pytest.Pytester, tiny_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMENERGY_CACHE", str(tiny_cache))
    monkeypatch.setenv("PYTHONPATH", str(ROOT), prepend=os.pathsep)
    monkeypatch.delenv("LLMENERGY_GGUF_CONVERTER", raising=False)
    pytester.makeconftest(FAKE_LLAMA_CONFTEST)
    pytester.makepyfile(test_served=SUITE_TEST)
    result = pytester.runpytest_subprocess(
        "--llm-serve=llama.cpp", "--llm-model=tiny-llama", "--energy-backend=estimate"
    )
    assert_one_line_usage_error(result, "--llm-serve:", "convert_hf_to_gguf.py", "pip download")


def test_an_unstreamed_request_keeps_no_ttft_through_the_run_file() -> None:
    from pytest_llmenergy.controller.rule import ControllerSettings
    from pytest_llmenergy.figures import value
    from pytest_llmenergy.results import CaseResult, RequestRecord, Trial
    from pytest_llmenergy.storage.runfile import decode_case, encode_case

    requests = (RequestRecord(None, 0.5, 16), RequestRecord(None, 0.7, 16))
    assert requests[0].tpot_s is None
    trial = Trial(1, 0.7, 4.0, 4.0, {}, {}, 32, 16, queries=2, requests=requests)
    options = ControllerSettings()
    case = CaseResult("n", "n", {}, 32, 16, "rounds", options, trials=(trial,), queries=2)
    again = decode_case(encode_case(case))
    assert again.trials[0].requests == requests
    assert value(again, "req_ttft_s") is None and value(again, "tpot_s") is None
    assert value(again, "latency_p50_s") == pytest.approx(0.6)
