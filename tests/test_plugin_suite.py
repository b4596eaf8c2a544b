"""The benchmark suite as users run it (pytester): grids, ids, order, markers, -v, OOM.

The suite's own files from ``benchmarks/`` are copied into each run, with a conftest
that registers a scripted meter, so these runs exercise exactly what ships.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch  # noqa: F401  # see below

from tests.test_plugin import assert_one_line_usage_error

# torch is imported above, before any in-process (pytester.runpytest) run: those runs
# unload the modules they import, and torch, a C extension, cannot be imported twice.

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

TRACE_METER = """
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace
def pytest_llmenergy_meters(config):
    return {"trace": lambda options: TraceMeter({"gpu:0": PowerTrace([(3600, 200.0)])})}
"""


@pytest.fixture(scope="module")
def model_cache(tiny_cache: Path) -> Iterator[Path]:
    """The runs (subprocesses too) find the test run's tiny-model cache through the env."""
    path = tiny_cache
    old = os.environ.get("LLMENERGY_CACHE")
    os.environ["LLMENERGY_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("LLMENERGY_CACHE", None)
    else:
        os.environ["LLMENERGY_CACHE"] = old


@pytest.fixture
def suite(
    pytester: pytest.Pytester, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> pytest.Pytester:
    """The suite's files; runs that load models use ``runpytest_subprocess`` (a fresh
    process, as users run it: torch cannot be unloaded and reloaded in-process)."""
    monkeypatch.setenv("PYTHONPATH", str(BENCHMARKS.parent), prepend=os.pathsep)
    conftest = (BENCHMARKS / "conftest.py").read_text()
    pytester.makeconftest(conftest + "\n" + TRACE_METER)
    for name in ("test_input_tokens.py", "test_output_tokens.py"):
        pytester.makepyfile(**{name[:-3]: (BENCHMARKS / name).read_text()})
    return pytester


def collected_ids(result: pytest.RunResult) -> list[str]:
    return [line for line in result.stdout.lines if "::" in line and "[" in line]


def test_default_grid_ids_and_counts(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--collect-only", "-q", "--energy-shuffle=off")
    ids = collected_ids(result)
    assert len(ids) == 3 * 9 + 3 * 10  # models x (8..2048 inputs, 8..4096 outputs)
    assert "test_input_tokens.py::test_input_tokens[tiny-llama-in512-out32]" in ids
    assert "test_output_tokens.py::test_output_tokens[tiny-falcon-in32-out4096]" in ids
    assert ids[0].endswith("[tiny-llama-in8-out32]")  # file order when not shuffled
    result.stdout.fnmatch_lines(["llmenergy: grid default: input 8..2048 (output 32)*"])


def test_paper_grid_and_overrides(suite: pytest.Pytester) -> None:
    ids = collected_ids(suite.runpytest("--collect-only", "-q", "--llm-grid=paper"))
    assert len(ids) == 57 and any(i.endswith("[Llama-2-7b-hf-in2048-out32]") for i in ids)
    result = suite.runpytest(
        "--collect-only",
        "-q",
        "--llm-model=tiny-mistral",
        "--llm-input-tokens=8,100",
        "--llm-output-tokens=16..64",
    )
    assert sorted(i.split("[")[1] for i in collected_ids(result)) == sorted(
        [
            "tiny-mistral-in8-out32]",
            "tiny-mistral-in100-out32]",
            "tiny-mistral-in32-out16]",
            "tiny-mistral-in32-out32]",
            "tiny-mistral-in32-out64]",
        ]
    )


def test_case_order_is_random_reproducible_and_grouped_by_model(suite: pytest.Pytester) -> None:
    def order(*args: str) -> list[str]:
        return collected_ids(suite.runpytest("--collect-only", "-q", *args))

    a, b = order("--energy-seed=1"), order("--energy-seed=1")
    c = order("--energy-seed=2")
    assert a == b and a != c and sorted(a) == sorted(c)
    assert a != order("--energy-shuffle=off")
    models = [re.search(r"\[(tiny-\w+)-", i).group(1) for i in a]  # type: ignore[union-attr]
    changes = sum(1 for x, y in itertools.pairwise(models) if x != y)
    assert changes == 2  # each model's cases in one block: loaded once
    header = suite.runpytest("--collect-only", "-q", "--energy-seed=77", "-v")
    header.stdout.fnmatch_lines(["llmenergy: cases in random order, seed 77 (repeat with*"])
    plain = suite.runpytest("--collect-only", "-q", "--energy-shuffle=off")
    plain.stdout.no_fnmatch_line("*random order*")


def test_small_grid_runs_and_prints_a_table_per_sweep_and_model(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(
        "--energy-backend=trace",
        "--llm-model=tiny-llama",
        "--llm-input-tokens=8,64",
        "--llm-output-tokens=4",
        "--energy-json=run.json",
    )
    result.assert_outcomes(passed=3)
    result.stdout.re_match_lines(
        [
            r"^=+ llmenergy: energy per token =+$",
            r"^sweep input · model tiny-llama$",
            r"^\s*in\s+out\s+trials\s+s ± CI\s+J ± CI\s+J/token\s+prefill J/in\s+"
            r"decode J/out\s+FLOP/tok\s+tok/s\s+out tok/s\s+avg W\s+GPU J$",
            r"^\s+8\s+32\s+\d+ [✓✗]<?\s+",  # converged, or not on a busy machine
            r"^\s*64\s+32\s+\d+ [✓✗]<?\s+",
            r"^sweep output · model tiny-llama$",
            r"^\s*32\s+4\s+\d+ [✓✗]<?\s+.*\s200(\.0+)?\s+\S+$",  # avg W: the meter's 200 W
        ]
    )
    assert "~" not in result.stdout.str()  # a counter meter: nothing marked estimated
    run = json.loads((suite.path / "run.json").read_text())
    cases = {c["name"]: c for c in run["cases"]}
    assert set(cases) == {
        "test_input_tokens[tiny-llama-in8-out32]",
        "test_input_tokens[tiny-llama-in64-out32]",
        "test_output_tokens[tiny-llama-in32-out4]",
    }
    for case in cases.values():
        assert case["status"] in ("converged", "limit") and 3 <= len(case["trials"]) <= 25
        for trial in case["trials"]:
            assert set(trial["phases"]) == {"prefill", "decode"}
            assert trial["joules"] == pytest.approx(200.0 * trial["seconds"], rel=1e-3)
        assert case["resources"]["peak_rss_bytes"] > 0


def test_verbose_shows_trials_converging(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(
        "--energy-backend=trace",
        "--llm-model=tiny-falcon",
        "--llm-input-tokens=8",
        "--llm-output-tokens=8",
        "-k",
        "input",
        "-v",
        "--energy-ci-target=time_s:1ns",
        "--energy-min-time=1",
        "--energy-max-trials=4",
    )
    result.assert_outcomes(passed=1)
    case = r"test_input_tokens\[tiny-falcon-in8-out32\]"
    # windows of 1/3 s (the minimum within half the limit): short of it at the first
    result.stdout.re_match_lines(
        [
            # (a machine slowed by other work may measure a second at the first)
            rf"\s+{case}: trial 1: time_s \S+ s \(no CI yet\)(; measured \S+ s \(< 1 s\))?$",
            rf"\s+{case}: trial 4: time_s \S+ s ±\S+ \(> 1e-09 s\)$",
            r"^\s+8\s+32\s+4 ✗\s+",  # stopped at the limit: not converged
        ]
    )


def test_marker_overrides_and_rejects_unknown_kwargs(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TRACE_METER)
    pytester.makepyfile(
        """
        import time, pytest

        @pytest.mark.llmenergy(max_trials=2, ci_target="energy_j:1e-9J", warmup=0)
        def test_marked(energy_benchmark):
            calls = []
            r = energy_benchmark(lambda: calls.append(time.sleep(0.001)), input_tokens=1,
                                 output_tokens=1)
            assert len(r.trials) == 2 and r.status == "limit"
            assert len(calls) == sum(t.passes for t in r.trials)  # windows of calls

        def test_default(energy_benchmark):
            # the default rule wants 1 s measured: 20 ms calls run in windows of 1/12 s,
            # so that it is measured well within the trial limit, and converge there
            r = energy_benchmark(time.sleep, 0.02, input_tokens=1, output_tokens=1)
            assert len(r.trials) < 25 and r.status == "converged" and r.measured_s >= 1
        """
    )
    pytester.runpytest("--energy-backend=trace").assert_outcomes(passed=2)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.llmenergy(max_trial=2)
        def test_typo(energy_benchmark):
            pass
        """
    )
    result = pytester.runpytest("--energy-backend=trace")
    assert_one_line_usage_error(
        result, "test_typo", "unknown argument max_trial", "allowed: min_trials, max_trials"
    )


def test_out_of_memory_case_is_skipped_and_the_sweep_goes_on(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TRACE_METER)
    pytester.makepyfile(
        """
        import pytest, torch

        class Model:
            def generate(self, n_in, n_out):
                if n_in >= 1024:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB")
                return None

        @pytest.mark.parametrize("n_in", [512, 1024, 2048])
        def test_sweep(energy_benchmark, n_in):
            energy_benchmark(Model().generate, n_in, 32, input_tokens=n_in, output_tokens=32)
        """
    )
    result = pytester.runpytest(
        "--energy-backend=trace", "-rs", "--energy-shuffle=off", "--energy-rule=research"
    )
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.re_match_lines(
        [
            r"^\S*\s+512\s+32\s+3 ✓\s+",
            r"^\S*\s+1024\s+32\s+—\s+",
            r"^(test_sweep\[)?1024\]?: OOM at 1024 input tokens \(32 output tokens\)$",
            r"SKIPPED .* OOM at 1024 input tokens \(32 output tokens\)$",
            r"SKIPPED .* OOM at 2048 input tokens \(32 output tokens\)$",
        ]
    )


@pytest.mark.parametrize(
    ("arg", "needle"),
    [
        ("--energy-ci-target=speed:1s", "unknown figure 'speed'; choose from: time_s"),
        ("--energy-max-trials=0", "a whole number >= 1"),
        ("--energy-warmup=-1", "a whole number >= 0"),
        ("--energy-confidence=1.5", "between 0 and 1"),
        ("--energy-seed=x", "a whole number >= 0"),
        ("--energy-shuffle=maybe", "one of on, off, auto"),
        ("--llm-grid=huge", "one of default, paper, quick"),
        ("--llm-input-tokens=0", "token counts >= 1"),
        ("--llm-dtype=int3", "one of auto, float32, float16, bfloat16"),
    ],
)
def test_bad_suite_options_are_one_line_errors(
    pytester: pytest.Pytester, arg: str, needle: str
) -> None:
    pytester.makepyfile("def test_x(): pass")
    assert_one_line_usage_error(pytester.runpytest(arg), arg.split("=")[0], needle)


def test_min_above_max_trials_is_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--energy-min-trials=5", "--energy-max-trials=3")
    assert_one_line_usage_error(result, "max_trials must be an integer >= min_trials (5)")


def test_repetition_options_from_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TRACE_METER)
    pytester.makeini(
        "[pytest]\nllmenergy_max_trials = 2\nllmenergy_min_trials = 2\n"
        "llmenergy_ci_target = time_s:1ns, energy_j:1%\nllmenergy_warmup = 0\n"
    )
    pytester.makepyfile(
        """
        import time

        def test_x(energy_benchmark):
            r = energy_benchmark(time.sleep, 0.001, input_tokens=1, output_tokens=1)
            assert len(r.trials) == 2 and r.status == "limit"
            assert [str(t) for t in r.options.targets] == ["time_s:1e-09s", "energy_j:1%"]
        """
    )
    result = pytester.runpytest("--energy-backend=trace", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["llmenergy: repetition: 2-2 trials after 0 warm-up*"])


def test_a_model_that_cannot_load_stops_the_session_at_start(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no 25 s of retries against an absent network
    result = suite.runpytest_subprocess("--llm-model=no-such-org/no-such-model")
    assert_one_line_usage_error(
        result, "--llm-model=no-such-org/no-such-model: cannot load model", "tiny-llama"
    )
    result.stdout.no_fnmatch_line("*test_input_tokens*")
    result = suite.runpytest_subprocess("--llm-model=./not/here")
    assert_one_line_usage_error(result, "--llm-model=./not/here", "no such directory")
    result = suite.runpytest_subprocess("--llm-model=tiny-llama", "--llm-device=cuda")
    assert_one_line_usage_error(result, "--llm-model=tiny-llama", "cuda")


REORDERING_PLUGIN = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    # a stand-in for pytest-randomly: moves every test before the energy plugin orders
    items.reverse()
"""


def test_another_plugin_reordering_tests_does_not_change_the_energy_cases_order(
    suite: pytest.Pytester,
) -> None:
    """What the header says holds even when a plugin such as pytest-randomly moved the tests
    first: the file order with --energy-shuffle=off, the seed's order with a seed."""

    def order(*args: str) -> list[str]:
        return collected_ids(suite.runpytest("--collect-only", "-q", "--llm-grid=quick", *args))

    plain_off, plain_seeded = order("--energy-shuffle=off"), order("--energy-seed=5")
    suite.makeconftest(suite.path.joinpath("conftest.py").read_text() + REORDERING_PLUGIN)
    assert order("--energy-shuffle=off") == plain_off
    assert order("--energy-seed=5") == plain_seeded
    assert plain_off[0].endswith("[tiny-llama-in8-out32]") and plain_off != plain_seeded


def test_live_status_is_written_after_a_while_and_erased(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without -v on a terminal: the trial's line after the dot, then nothing left."""
    import contextlib

    from pytest_llmenergy.plugin import LiveStatus

    status = LiveStatus(contextlib.nullcontext, after_s=0.0)
    status("trial 1: time_s 9.1 s (no CI yet)")
    status("trial 2: time_s 9.2 s ±0.4 (<= 0.5 s)")
    status("")
    out = capsys.readouterr().out
    first, second = " trial 1: time_s 9.1 s (no CI yet)", " trial 2: time_s 9.2 s ±0.4 (<= 0.5 s)"
    n1, n2 = len(first), len(second)
    assert out == (
        first
        + "\b" * n1 + " " * n1 + "\b" * n1 + second
        + "\b" * n2 + " " * n2 + "\b" * n2
    )  # fmt: skip
    late = LiveStatus(contextlib.nullcontext, after_s=60.0)
    late("trial 1: ...")  # a short case: nothing shown, nothing to erase
    late("")
    assert capsys.readouterr().out == ""


def test_a_log_gets_no_live_status(pytester: pytest.Pytester) -> None:
    """Not a terminal (CI logs, files): no backspaces, no extra lines."""
    pytester.makeconftest(TRACE_METER)
    pytester.makepyfile(
        """
        import time
        def test_long(energy_benchmark):
            energy_benchmark(time.sleep, 0.3, input_tokens=1, output_tokens=1)
        """
    )
    result = pytester.runpytest("--energy-backend=trace", "--energy-rule=research")
    result.assert_outcomes(passed=1)
    assert "\b" not in result.stdout.str() and "trial 1" not in result.stdout.str()


def test_an_unknown_model_in_a_test_fails_it_in_one_line(
    pytester: pytest.Pytester, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 61, item 10: ``llm_pool.get("tiny-gpt")`` ended with "did you mean
    tiny-mistral?" only after about 450 lines of transformers' traceback."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pytester.makepyfile(
        test_typo="""
        def test_typo(llm_pool):
            llm_pool.get("tiny-gpt")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    said = [line for line in out.splitlines() if line.startswith("test_typo.py::test_typo: ")]
    assert len(said) == 1 and "cannot load model 'tiny-gpt'" in said[0], out
    assert "did you mean tiny-mistral?" in said[0]
    assert "Traceback" not in out and "transformers" not in out.split("FAILURES")[-1], out
    assert len(out.splitlines()) < 40, out
