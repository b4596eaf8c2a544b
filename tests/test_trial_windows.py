"""Trial windows a coarse meter can measure (controller/window.py): calls back to back
until the window lasts long enough, figures per call, phases summed over the calls,
the devices synchronized at both edges, and a random wait before each window."""

from __future__ import annotations

import math
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_llmenergy import mark_phase
from pytest_llmenergy.controller import window as window_mod
from pytest_llmenergy.controller.benchmark import CaseIdentity, EnergyBenchmark
from pytest_llmenergy.controller.rule import ControllerSettings
from pytest_llmenergy.controller.targets import CITarget
from pytest_llmenergy.controller.window import (
    MAX_WINDOW_CALLS,
    MAX_WINDOW_S,
    WINDOW_ERROR_SHARE,
    EdgeDelay,
    WindowPlan,
    window_target_s,
)
from pytest_llmenergy.figures import FIGURES, resolved
from pytest_llmenergy.meters.readings import Reading
from pytest_llmenergy.results import CaseResult
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace, SwitchTrace


@dataclass(frozen=True)
class Gen:
    input_tokens: int
    output_tokens: int


class CoarseCounter(TraceMeter):
    """A counter refreshed only every ``period_s`` (as NVML's on Hopper, every 100 ms):
    a reading is the trace's energy at the last refresh.  Its resolution is the period."""

    def __init__(self, traces: Mapping[str, Any], period_s: float) -> None:
        super().__init__(traces)
        self.period_s = period_s
        self._resolution_s = period_s
        self.events: list[str] = []

    def _read(self) -> Reading:
        self.reads += 1
        self.events.append("read")
        t = time.perf_counter()
        tick = math.floor(t / self.period_s) * self.period_s
        return Reading(t=t, state={n: tr.energy_until(tick) for n, tr in self.traces.items()})


class ExactWithResolution(TraceMeter):
    """The trace's exact integral, but declaring a coarse resolution: the window logic's
    arithmetic (sums, divisions) checked to the microjoule."""

    def __init__(self, traces: Mapping[str, Any], resolution_s: float) -> None:
        super().__init__(traces)
        self._resolution_s = resolution_s


def bench_for(meter: Any, **options: Any) -> tuple[EnergyBenchmark, list[CaseResult]]:
    results: list[CaseResult] = []
    options.setdefault("rule", "research")
    bench = EnergyBenchmark(
        meter,
        ControllerSettings(**options),
        CaseIdentity("t.py::test_w[x]", "test_w[x]", {"model": "m"}),
        results.append,
    )
    return bench, results


# -- the plan --------------------------------------------------------------------------------
def test_the_window_follows_the_resolution_and_the_energy_target() -> None:
    default = ControllerSettings()
    # a 100 ms counter under the default 10 % energy target: one refresh is a third of it
    assert window_target_s(0.1, default) == pytest.approx(0.1 / (WINDOW_ERROR_SHARE * 0.10))
    assert window_target_s(0.1, default) == pytest.approx(3.0)
    # a tighter target asks for a longer window
    tight = ControllerSettings(targets=(CITarget("energy_j", 0.05, True),), max_time_s=0)
    assert window_target_s(0.1, tight) == pytest.approx(6.0)
    # a meter of microsecond resolution (or unknown) keeps one call a trial
    assert window_target_s(1e-6, default) == 0.0
    assert window_target_s(None, default) == 0.0
    # a rule without a relative energy target takes the default rule's
    assert window_target_s(0.01, ControllerSettings(rule="research")) == pytest.approx(0.3)


def test_the_window_fits_the_cases_budget_and_a_bound() -> None:
    # a 1 s power average: 30 s by the target, but three trials must fit 15 s measured
    assert window_target_s(1.0, ControllerSettings()) == pytest.approx(5.0)
    # no measured-time budget: at most MAX_WINDOW_S
    assert window_target_s(1.0, ControllerSettings(rule="research")) == MAX_WINDOW_S


def test_the_plan_asks_for_calls_until_the_window_is_long_enough() -> None:
    plan = WindowPlan(1.0)
    assert plan.windowed and plan.more(0.5, 3) and not plan.more(1.0, 3)
    assert not plan.more(0.0, MAX_WINDOW_CALLS)  # bounded
    assert not WindowPlan(0.0).windowed


def test_the_edge_delay_is_random_and_shorter_than_the_resolution() -> None:
    delays = [EdgeDelay(0.004, seed=s).wait() for s in range(12)]
    assert all(0.0 <= d < 0.004 for d in delays)
    assert len({round(d, 6) for d in delays}) > 6  # not one fixed offset
    assert EdgeDelay(1e-6).wait() == 0.0 and EdgeDelay(None).wait() == 0.0


# -- trials of several calls -------------------------------------------------------------------
def test_a_coarse_counter_gets_windows_of_calls_whose_figures_are_per_call() -> None:
    watts, period_s = 100.0, 0.01
    meter = CoarseCounter({"gpu:0": PowerTrace([(3600, watts)])}, period_s)
    bench, _ = bench_for(meter, warmup=1, min_trials=4, max_trials=4)
    calls: list[int] = []

    def target() -> Gen:
        calls.append(1)
        time.sleep(0.004)
        return Gen(8, 4)

    result = bench(target, input_tokens=8, output_tokens=4)
    target_s = window_target_s(period_s, ControllerSettings(rule="research"))  # 0.3 s
    assert len(result.trials) == 4
    assert sum(t.passes for t in result.trials) + 1 == len(calls) == bench.calls
    for trial in result.trials:
        window_s = trial.seconds * trial.passes
        assert trial.passes > 1 and window_s >= target_s
        assert trial.seconds == pytest.approx(window_s / trial.passes)
        # the counter's rounding is at most one refresh at each edge of the window
        true_j = watts * trial.seconds
        assert abs(trial.joules - true_j) <= 2 * watts * period_s / trial.passes + 1e-9
        assert trial.input_tokens == 8 and trial.output_tokens == 4
    # per token: the window's joules over its calls' tokens
    j_per_token = FIGURES["j_per_token"]
    assert j_per_token.trial is not None
    assert j_per_token.trial(result.trials[0]) == pytest.approx(
        result.trials[0].joules / 12, rel=1e-12
    )
    # the windows are what the meter can resolve: the figure is not marked
    assert resolved(FIGURES["energy_j"], result)
    # the stopping rule's measured time counts whole windows
    assert result.measured_s == pytest.approx(sum(t.seconds * t.passes for t in result.trials))


def test_one_call_a_trial_on_a_counter_of_fine_resolution() -> None:
    meter = ExactWithResolution({"gpu:0": PowerTrace([(3600, 50.0)])}, 1e-6)
    bench, _ = bench_for(meter, warmup=0, min_trials=3, max_trials=3)
    result = bench(lambda: time.sleep(0.002), input_tokens=1, output_tokens=1)
    assert [t.passes for t in result.trials] == [1, 1, 1] and bench.calls == 3


def fake_generate(trace: SwitchTrace) -> Gen:
    """Prefill at 50 W for 3 ms, the first token, decode at 10 W for 5 ms."""
    trace.set(50.0)
    time.sleep(0.003)
    trace.set(10.0)
    mark_phase("decode", ending="prefill")
    time.sleep(0.005)
    trace.set(1.0)
    return Gen(8, 17)


def test_the_phases_of_a_window_are_its_calls_phases_summed_per_call() -> None:
    trace = SwitchTrace(1.0)
    meter = ExactWithResolution({"gpu:0": trace}, resolution_s=0.005)  # windows of 0.15 s
    bench, _ = bench_for(meter, warmup=0, min_trials=3, max_trials=3)
    result = bench(fake_generate, trace, input_tokens=8, output_tokens=17)
    for trial in result.trials:
        assert trial.passes > 5
        pre, dec = trial.phases["prefill"], trial.phases["decode"]
        # per call: each call's prefill lasted >= 3 ms at 50 W, its decode >= 5 ms at 10 W
        assert 0.003 <= pre.seconds < 0.008 and 0.005 <= dec.seconds < 0.012
        # the power switches a few microseconds away from each call's mark: 5 % (a split
        # misplaced by a phase would be off by 5x)
        assert pre.joules == pytest.approx(50.0 * pre.seconds, rel=0.05)
        assert dec.joules == pytest.approx(10.0 * dec.seconds, rel=0.05)
        # the calls' phases lie inside the trial's window
        assert pre.seconds + dec.seconds <= trial.seconds + 1e-9
    ttft = FIGURES["ttft_s"]
    assert ttft.trial is not None and ttft.trial(result.trials[0]) == pytest.approx(
        result.trials[0].phases["prefill"].seconds
    )


def test_pedantic_rounds_stay_one_call_each() -> None:
    meter = ExactWithResolution({"gpu:0": PowerTrace([(3600, 50.0)])}, 0.01)
    bench, _ = bench_for(meter)
    setups: list[int] = []

    def setup() -> tuple[tuple[float], dict[str, Any]]:
        setups.append(1)
        return (0.001,), {}

    result = bench.pedantic(time.sleep, setup=setup, rounds=3, input_tokens=1, output_tokens=1)
    assert [t.passes for t in result.trials] == [1, 1, 1] and len(setups) == 3


# -- clean edges -------------------------------------------------------------------------------
def test_the_devices_are_synchronized_at_both_edges_of_every_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Queued GPU work never crosses a window's edge: the devices are waited for before
    the window's first reading and before its last (Zeus does the same); only those with
    a context (GPU 1 here): waiting on GPU 0 would open one there."""
    meter = CoarseCounter({"gpu:0": PowerTrace([(3600, 10.0)])}, 0.002)
    syncs: list[int] = []

    class FakeCuda:
        @staticmethod
        def is_initialized() -> bool:
            return True

        @staticmethod
        def device_count() -> int:
            return 2

        @staticmethod
        def synchronize(index: int) -> None:
            syncs.append(index)
            meter.events.append(f"sync{index}")

    class FakeTorch:
        cuda = FakeCuda
        _C = types.SimpleNamespace(_cuda_hasPrimaryContext=lambda index: index == 1)

    monkeypatch.setitem(window_mod.sys.modules, "torch", FakeTorch)
    bench, _ = bench_for(meter, warmup=0, min_trials=2, max_trials=2)
    meter.events.clear()
    result = bench(lambda: time.sleep(0.02), input_tokens=1, output_tokens=1)
    assert all(t.passes >= 3 for t in result.trials)  # 20 ms calls, 60 ms windows
    events = meter.events
    # each trial: sync GPU 1, open (read), the call's own window (read ... sync, read),
    # sync GPU 1, close (read)
    first_read = events.index("read")
    assert events[first_read - 1 : first_read] == ["sync1"]
    assert events[-2:] == ["sync1", "read"]
    assert set(syncs) == {1}


def test_without_cuda_in_use_nothing_is_synchronized(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeCuda:
        @staticmethod
        def is_initialized() -> bool:
            return False

        @staticmethod
        def synchronize(index: int) -> None:  # pragma: no cover - must not be called
            raise AssertionError("synchronized a device never used")

    class FakeTorch:
        cuda = FakeCuda

    monkeypatch.setitem(window_mod.sys.modules, "torch", FakeTorch)
    window_mod.synchronize_devices()
    monkeypatch.delitem(window_mod.sys.modules, "torch")
    window_mod.synchronize_devices()  # torch never imported: nothing to do
