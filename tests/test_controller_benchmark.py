"""The benchmark loop: how often the target runs, what a trial records, phases, OOM."""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_llmenergy import mark_phase, open_meter
from pytest_llmenergy.controller.benchmark import CaseFeatures, CaseIdentity, EnergyBenchmark
from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.controller.targets import parse_ci_targets
from pytest_llmenergy.errors import ConfigError, LLMEnergyError
from pytest_llmenergy.figures import value
from pytest_llmenergy.results import CONVERGED, LIMIT, OOM, ROUNDS, CaseResult
from pytest_llmenergy.storage.runfile import dumps, loads
from tests.fakes.fake_pynvml import NVML_DEVICE_ARCH_PASCAL, FakeGPU, install_fake_pynvml
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace, SwitchTrace
from tests.test_storage_runfile import sample_run


@dataclass(frozen=True)
class Gen:
    input_tokens: int
    output_tokens: int


def make_bench(meter: Any, **options: Any) -> tuple[EnergyBenchmark, list[CaseResult], list[str]]:
    results: list[CaseResult] = []
    lines: list[str] = []
    options.setdefault("rule", "research")  # the trial counts below are the research rule's
    bench = EnergyBenchmark(
        meter,
        ControllerSettings(**options),
        CaseIdentity("t.py::test_case[x]", "test_case[x]", {"model": "m"}),
        results.append,
        CaseFeatures(progress=lines.append),
    )
    return bench, results, lines


def constant_meter(watts: float = 100.0) -> TraceMeter:
    return TraceMeter({"gpu:0": PowerTrace([(3600, watts)])})


def test_target_runs_exactly_warmup_plus_trials_and_trials_are_recorded() -> None:
    bench, results, lines = make_bench(constant_meter(), warmup=2)
    calls: list[int] = []

    def target(x: int, *, y: int) -> Gen:
        calls.append(x + y)
        time.sleep(0.01)
        return Gen(8, 4)

    result = bench(target, 1, y=2, input_tokens=8, output_tokens=4)
    assert result.status == CONVERGED and len(result.trials) == 3  # tight at once: the minimum
    assert calls == [3] * 5 and bench.calls == 5
    # a line per trial, then an empty one: the case is done (a live status is erased)
    assert results == [result] and len(lines) == 4 and lines[-2].startswith("trial 3:")
    assert lines[-1] == ""
    for i, trial in enumerate(result.trials, 1):
        assert trial.index == i and trial.seconds >= 0.01
        assert trial.joules == pytest.approx(100.0 * trial.seconds)  # the trace's truth
        assert trial.joules_by_domain == {"gpu:0": trial.joules}
        assert trial.net_joules == trial.joules  # no idle baseline measured
        assert (trial.input_tokens, trial.output_tokens) == (8, 4)
    assert result.energy.mean == pytest.approx(100.0 * result.time.mean)
    assert value(result, "power_w") == pytest.approx(100.0)
    assert value(result, "j_per_token") == pytest.approx(result.energy.mean / 12)
    tokens_per_s = sum(12 / t.seconds for t in result.trials) / 3  # mean of the trials'
    assert value(result, "tokens_per_s") == pytest.approx(tokens_per_s)
    assert result.methods == {"gpu:0": "counter"} and not result.estimated
    assert result.resources is not None and result.resources.wall_seconds >= 0.03


def test_old_result_properties_still_work_with_a_deprecation_warning() -> None:
    bench, _, _ = make_bench(constant_meter(), warmup=0)
    result = bench(time.sleep, 0.01, input_tokens=8, output_tokens=4)
    with pytest.warns(DeprecationWarning, match=r"value\(result, 'power_w'\)"):
        assert result.power_w == pytest.approx(100.0)
    with pytest.warns(DeprecationWarning, match="'j_per_token'"):
        assert result.joules_per_token == pytest.approx(result.energy.mean / 12)
    with pytest.warns(DeprecationWarning, match="'tokens_per_s'"):
        assert result.tokens_per_s == pytest.approx(sum(12 / t.seconds for t in result.trials) / 3)
    # gone: the whole query's joules per input/output token, and the decode helpers
    for gone in (
        "joules_per_input_token",
        "joules_per_output_token",
        "decode_tokens",
        "output_tokens_per_s",
    ):
        assert not hasattr(result, gone), gone
    with pytest.raises(ConfigError, match=r"'j_per_in_token' is gone: .*prefill_j_per_in_token"):
        value(result, "j_per_in_token")
    with pytest.raises(ConfigError, match=r"'j_per_out_token' is gone: .*decode_j_per_out_token"):
        value(result, "j_per_out_token")


def test_the_old_results_module_still_imports_with_a_deprecation_warning() -> None:
    name = "pytest_llmenergy.controller.results"
    sys.modules.pop(name, None)  # the warning is given on import
    try:
        with pytest.warns(DeprecationWarning, match="moved to pytest_llmenergy.results"):
            old = importlib.import_module(name)
        assert old.CaseResult is CaseResult and (old.CONVERGED, old.OOM) == (CONVERGED, OOM)
    finally:
        sys.modules.pop(name, None)


def test_idle_baseline_gives_net_energy() -> None:
    meter = constant_meter(100.0)
    meter.idle_power_w = {"gpu:0": 40.0}
    bench, _, _ = make_bench(meter, warmup=0)
    result = bench(time.sleep, 0.01, input_tokens=1, output_tokens=1)
    for t in result.trials:
        assert t.net_joules == pytest.approx(60.0 * t.seconds)
        assert t.net_joules_by_domain["gpu:0"] == pytest.approx(60.0 * t.seconds)


def test_stops_at_the_limit_when_the_target_never_holds() -> None:
    bench, _, lines = make_bench(
        constant_meter(), warmup=0, max_trials=4, targets=parse_ci_targets("time_s:1ms")
    )
    durations = iter([0.001, 0.03, 0.001, 0.03, 0.001, 0.03])
    result = bench(lambda: time.sleep(next(durations)), input_tokens=1, output_tokens=1)
    assert result.status == LIMIT and not result.converged
    assert len(result.trials) == 4 and bench.calls == 4 and len(lines) == 5


def test_energy_target_can_drive_the_repetitions() -> None:
    """Runtime is steady but power is not: only an energy target keeps repeating."""
    trace = SwitchTrace(10.0)
    watts = iter([10.0, 400.0, 10.0, 400.0, 10.0, 400.0, 10.0, 400.0])

    def target() -> None:
        trace.set(next(watts))
        time.sleep(0.01)

    meter = TraceMeter({"gpu:0": trace})  # type: ignore[dict-item]
    bench, _, _ = make_bench(
        meter, warmup=0, max_trials=6, targets=parse_ci_targets("time_s:0.5s,energy_j:5%")
    )
    result = bench(target, input_tokens=1, output_tokens=1)
    assert result.status == LIMIT and len(result.trials) == 6


def test_pedantic_runs_setup_each_round_and_exactly_rounds_plus_warmup() -> None:
    bench, _, lines = make_bench(constant_meter())
    seen: list[int] = []
    counter = iter(range(100))

    def setup() -> tuple[tuple[int], dict[str, Any]]:
        return (next(counter),), {}

    result = bench.pedantic(
        seen.append, setup=setup, rounds=3, warmup_rounds=2, input_tokens=2, output_tokens=3
    )
    assert seen == [0, 1, 2, 3, 4] and bench.calls == 5
    assert result.status == ROUNDS and len(result.trials) == 3 and lines == []
    with pytest.raises(ValueError, match="rounds"):
        make_bench(constant_meter())[0].pedantic(
            seen.append, rounds=0, input_tokens=1, output_tokens=1
        )


def test_used_once_per_test() -> None:
    bench, _, _ = make_bench(constant_meter(), warmup=0, min_trials=2, max_trials=2)
    bench(lambda: None, input_tokens=1, output_tokens=1)
    with pytest.raises(LLMEnergyError, match="only once"):
        bench(lambda: None, input_tokens=1, output_tokens=1)


def test_token_counts_reported_by_the_target_must_match_the_case() -> None:
    bench, _, _ = make_bench(constant_meter(), warmup=0)
    with pytest.raises(LLMEnergyError, match=r"produced 31 output tokens.*output_tokens=32"):
        bench(lambda: Gen(8, 31), input_tokens=8, output_tokens=32)


def fake_generate(trace: SwitchTrace, prefill_s: float, decode_s: float) -> Gen:
    """Prefill at 50 W, the first token, decode at 10 W; the power changes at the mark."""
    trace.set(50.0)
    time.sleep(prefill_s)
    trace.set(10.0)
    assert mark_phase("decode", ending="prefill")
    time.sleep(decode_s)
    trace.set(1.0)
    return Gen(8, 17)


def test_prefill_decode_split_on_a_counter_meter_is_exact() -> None:
    trace = SwitchTrace(1.0)
    meter = TraceMeter({"gpu:0": trace})  # type: ignore[dict-item]
    bench, _, _ = make_bench(meter, warmup=0, max_trials=3)
    result = bench(fake_generate, trace, 0.03, 0.06, input_tokens=8, output_tokens=17)
    assert result.has_phases
    for trial in result.trials:
        pre, dec = trial.phases["prefill"], trial.phases["decode"]
        assert pre.seconds + dec.seconds == pytest.approx(trial.seconds)
        assert pre.seconds >= 0.03 and dec.seconds >= 0.06
        # 50 W before the mark, 10 W after; the power switches a few microseconds away
        # from the window's edges and the mark, so allow 0.4 ms at 50 W (a misplaced
        # mark would move about 0.3 J)
        assert pre.joules == pytest.approx(50.0 * pre.seconds, abs=0.02)
        assert dec.joules == pytest.approx(10.0 * dec.seconds, abs=0.02)
    assert value(result, "ttft_s") == pytest.approx(
        sum(t.phases["prefill"].seconds for t in result.trials) / 3
    )
    # 17 output tokens: the prefill pass made the first, the decode passes the other 16
    decode = [t.phases["decode"] for t in result.trials]
    assert value(result, "out_tokens_per_s") == pytest.approx(
        sum(16 / d.seconds for d in decode) / 3
    )
    assert value(result, "decode_j_per_out_token") == pytest.approx(
        sum(d.joules / 16 for d in decode) / 3
    )
    pre = [t.phases["prefill"] for t in result.trials]
    assert value(result, "prefill_j_per_in_token") == pytest.approx(
        sum(p.joules / 8 for p in pre) / 3
    )
    # 0.1.0's phase properties: the same means, with a deprecation warning
    with pytest.warns(DeprecationWarning, match="'ttft_s'"):
        assert result.prefill_seconds == pytest.approx(value(result, "ttft_s"))
    with pytest.warns(DeprecationWarning, match="'decode_j'"):
        assert result.decode_joules == pytest.approx(sum(d.joules for d in decode) / 3)
    for gone in ("decode_tokens_per_s", "joules_per_decode_token"):
        assert not hasattr(result, gone), gone


@pytest.mark.serial  # a sampling thread's readings, timed
def test_prefill_decode_split_on_a_sampled_meter(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Pascal GPU (no energy counter): the power samples are split at the first token."""
    trace = SwitchTrace(1.0)
    gpu = FakeGPU("Tesla P100", "GPU-p100", NVML_DEVICE_ARCH_PASCAL, trace)  # type: ignore[arg-type]
    install_fake_pynvml(monkeypatch, [gpu])
    with open_meter("nvml", sample_interval_s=0.005) as meter:
        assert str(meter.domains["gpu:0"].method) == "sampled"
        bench, _, _ = make_bench(meter, warmup=0, max_trials=3)
        result = bench(fake_generate, trace, 0.2, 0.4, input_tokens=8, output_tokens=17)
    for trial in result.trials:
        pre, dec = trial.phases["prefill"], trial.phases["decode"]
        # Trapezoids over 5 ms samples smear the 40 W step by about one sample (1 %);
        # 10 % leaves room for a loaded machine delaying the sampler, and still fails a
        # split that is off by more than ~10 samples.
        assert pre.joules == pytest.approx(50.0 * pre.seconds, rel=0.10)
        assert dec.joules == pytest.approx(10.0 * dec.seconds, rel=0.10)


def test_out_of_memory_is_recorded_and_skipped() -> None:
    import torch

    bench, results, _ = make_bench(constant_meter(), warmup=1)

    def target() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(pytest.skip.Exception, match="OOM at 2048 input tokens"):
        bench(target, input_tokens=2048, output_tokens=32)
    assert [r.status for r in results] == [OOM]
    assert results[0].reason.startswith("OOM at 2048 input tokens") and not results[0].trials


def test_other_errors_propagate() -> None:
    bench, results, _ = make_bench(constant_meter(), warmup=0)
    with pytest.raises(ZeroDivisionError):
        bench(lambda: 1 / 0, input_tokens=1, output_tokens=1)
    assert results == []


class _ResetMeter(TraceMeter):
    """A counter that drops back by ``drop_j`` at its ``at``-th reading and counts on from
    there, as NVML's does when the driver reloads mid-run."""

    def __init__(self, at: int, drop_j: float = 1000.0) -> None:
        super().__init__({"gpu:0": PowerTrace([(3600, 100.0)])})
        self.at, self.drop_j = at, drop_j

    def _read(self) -> Any:
        reading = super()._read()
        if self.reads >= self.at:
            return type(reading)(t=reading.t, state={"gpu:0": reading.state["gpu:0"] - self.drop_j})
        return reading


def test_a_counter_that_goes_backwards_rejects_its_trial_and_the_run_file_reads_back(
    tmp_path: Any,
) -> None:
    """A window across a counter reset reads less than no energy: that trial is rejected
    (kept with its reading as evidence, repeated), every counted trial's joules are the
    trace's own, and the run file written from the case is one its reader takes back
    (before, it wrote -0.00015 J and its reader refused the file)."""
    meter = _ResetMeter(at=4)  # the 2nd trial's closing reading, after a warm-up's
    bench, _, _ = make_bench(meter, warmup=1, min_trials=3, max_trials=6)
    result = bench(lambda: time.sleep(0.01) or Gen(8, 4), input_tokens=8, output_tokens=4)
    (reset,) = result.rejected
    assert reset.rejected.startswith("the meter read -9")
    assert "J on gpu:0 over the trial: its energy counter went backwards" in reset.rejected
    assert reset.joules < 0  # the evidence, as read
    assert len(result.trials) >= 3
    for trial in result.trials:
        assert trial.joules == pytest.approx(100.0 * trial.seconds)
    path = tmp_path / "run.json"
    path.write_text(dumps(sample_run((result,))))
    (back,) = loads(path.read_text(), path).cases
    assert back.rejected[0].rejected == reset.rejected
    assert back.rejected[0].joules == pytest.approx(reset.joules)
