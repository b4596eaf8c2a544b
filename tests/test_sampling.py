"""Integration of power samples against traces whose true energy is known."""

from __future__ import annotations

import itertools
import time

import pytest

from pytest_llmenergy.errors import MeterError
from pytest_llmenergy.meters.readings import PowerSample
from pytest_llmenergy.meters.sampling import (
    PeriodicThread,
    PowerSampler,
    integrate_instant,
    integrate_intervals,
)
from tests.fakes.trace import PowerTrace


def _instant(trace: PowerTrace, times: list[float]) -> list[PowerSample]:
    return [PowerSample(t=t, power_w={"gpu:0": trace.power_at(t)}) for t in times]


def test_trapezoid_is_exact_for_constant_power() -> None:
    trace = PowerTrace([(100, 250.0)], origin=0.0)
    samples = _instant(trace, [0.0, 0.1, 0.25, 0.4])
    out = integrate_instant(samples, 0.05, 0.37, ["gpu:0"])
    assert out["gpu:0"] == pytest.approx(250.0 * 0.32)


def test_trapezoid_interpolates_at_the_edges() -> None:
    samples = [PowerSample(0.0, {"d": 0.0}), PowerSample(1.0, {"d": 100.0})]  # a ramp
    out = integrate_instant(samples, 0.5, 1.0, ["d"])
    assert out["d"] == pytest.approx((50.0 + 100.0) / 2 * 0.5)


@pytest.mark.parametrize("jitter_s", [0.0, 0.013])
def test_sampling_at_100ms_is_within_2_percent_for_1s_steps(jitter_s: float) -> None:
    trace = PowerTrace([(1.0, 80.0), (1.2, 300.0), (1.0, 120.0), (1.5, 250.0)], origin=0.0)
    times = [i * 0.1 + (jitter_s if i % 3 == 1 else 0.0) for i in range(0, 48)]
    t0, t1 = 0.0, 4.7
    samples = _instant(trace, [t0, *times[1:], t1])
    out = integrate_instant(samples, t0, t1, ["gpu:0"])
    truth = trace.energy_between(t0, t1)
    assert out["gpu:0"] == pytest.approx(truth, rel=0.02)
    assert out["gpu:0"] != pytest.approx(truth, rel=1e-6)  # steps do cost some accuracy


def test_interval_averages_are_cut_exactly_at_the_edges() -> None:
    # three 200 ms averages of 10, 20 and 30 W ending at 0.2, 0.4, 0.6 s
    samples = [PowerSample(t, {"d": w}, span_s=0.2) for t, w in [(0.2, 10), (0.4, 20), (0.6, 30)]]
    out = integrate_intervals(samples, 0.1, 0.5, ["d"])
    assert out["d"] == pytest.approx(10 * 0.1 + 20 * 0.2 + 30 * 0.1)


def test_sampler_thread_samples_and_brackets_windows() -> None:
    counter = itertools.count()
    sampler = PowerSampler(lambda: {"d": float(next(counter))}, 0.01, "test sampler")
    sampler.start()
    try:
        t0 = sampler.sample_now()
        time.sleep(0.1)
        t1 = sampler.sample_now()
        inside = sampler.between(t0, t1)
        assert inside[0].t == t0 and inside[-1].t == t1
        assert len(inside) >= 5  # the thread sampled in between
        assert [s.t for s in inside] == sorted(s.t for s in inside)
    finally:
        sampler.stop()
    assert sampler.between(0, float("inf")) == ()  # buffer released with the last window


def test_a_dying_reader_is_reported() -> None:
    calls = itertools.count()

    def read() -> None:
        if next(calls) == 2:
            raise OSError("device lost")

    thread = PeriodicThread(read, 0.005, "flaky reader")
    thread.start()
    time.sleep(0.1)
    thread.stop()
    with pytest.raises(MeterError, match="flaky reader failed: device lost"):
        thread.check()
