"""Window semantics shared by every meter: edges, marks, nesting, totals, idle."""

from __future__ import annotations

import dataclasses
import time

import pytest

from pytest_llmenergy import Method
from pytest_llmenergy.meters.readings import Measurement, Phase, duration_text
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace


def test_trace_energy_is_exact() -> None:
    trace = PowerTrace([(1.0, 10.0), (2.0, 40.0)], origin=100.0)
    assert trace.energy_between(100.0, 101.0) == pytest.approx(10.0)
    assert trace.energy_between(100.5, 102.0) == pytest.approx(5.0 + 40.0)
    assert trace.energy_between(102.0, 105.0) == pytest.approx(40.0 + 2 * 40.0)  # last held
    assert trace.power_at(99.0) == 10.0 and trace.energy_until(99.0) == 0.0


def test_window_reports_trace_energy_and_time() -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(0.05, 100.0), (10, 300.0)])})
    with meter.measure() as m:
        time.sleep(0.1)
    truth = meter.traces["gpu:0"].energy_between(m.measurement.t_start, m.measurement.t_end)
    assert m.seconds == pytest.approx(m.measurement.t_end - m.measurement.t_start)
    assert m.seconds >= 0.1
    assert m.joules == pytest.approx(truth)
    assert m.by_domain == {"gpu:0": pytest.approx(truth)}
    assert m.methods == {"gpu:0": Method.COUNTER}
    assert m.measurement.backend == "trace"


def test_result_is_not_readable_while_open() -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(1, 1.0)])})
    with meter.measure() as m, pytest.raises(RuntimeError, match="still open"):
        _ = m.joules


def test_marks_split_phases_that_add_up() -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(0.05, 50.0), (10, 200.0)])})
    with meter.measure(phase="prefill") as m:
        time.sleep(0.03)
        m.mark("decode")
        time.sleep(0.05)
    phases = m.phases
    assert list(phases) == ["prefill", "decode"]
    pre, dec = phases["prefill"], phases["decode"]
    assert pre.offset_s == 0.0
    assert dec.offset_s == pytest.approx(pre.seconds)
    assert pre.seconds + dec.seconds == pytest.approx(m.seconds)
    assert pre.joules + dec.joules == pytest.approx(m.joules)
    trace = meter.traces["gpu:0"]
    t_mark = m.measurement.t_start + dec.offset_s
    assert dec.joules == pytest.approx(trace.energy_between(t_mark, m.measurement.t_end))
    # the trace quadruples its power after 50 ms, so decode draws more per second
    assert dec.power_w > pre.power_w


def test_duplicate_mark_and_mark_outside_window_are_errors() -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(1, 1.0)])})
    window = meter.measure()
    with pytest.raises(RuntimeError):
        window.mark("x")
    with window as m:
        m.mark("decode")
        with pytest.raises(ValueError, match="already marked"):
            m.mark("decode")


def test_windows_nest_independently() -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(10, 100.0)])})
    with meter.measure() as outer:
        time.sleep(0.02)
        with meter.measure() as inner:
            time.sleep(0.02)
        time.sleep(0.02)
    assert inner.seconds < outer.seconds
    assert inner.joules == pytest.approx(100.0 * inner.seconds)
    assert outer.joules == pytest.approx(100.0 * outer.seconds)
    assert meter._active == 0


def test_total_counts_only_counted_domains() -> None:
    meter = TraceMeter(
        {
            "cpu:package-0": PowerTrace([(10, 50.0)]),
            "cpu:core-0": PowerTrace([(10, 30.0)]),  # part of package
            "cpu:dram-0": PowerTrace([(10, 5.0)]),
        },
        counted={"cpu:core-0": False},
    )
    with meter.measure() as m:
        time.sleep(0.02)
    assert m.joules == pytest.approx(55.0 * m.seconds)
    assert sum(m.by_domain.values()) == pytest.approx(85.0 * m.seconds)


def test_idle_baseline_gives_net_energy() -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(0.05, 20.0), (10, 120.0)])})
    idle = meter.measure_idle(0.03)  # within the 20 W stretch
    assert idle["gpu:0"] == pytest.approx(20.0)
    time.sleep(0.03)
    with meter.measure() as m:
        time.sleep(0.02)
    assert m.measurement.idle_power_w == {"gpu:0": pytest.approx(20.0)}
    assert m.net_joules == pytest.approx(m.joules - 20.0 * m.seconds)
    assert m.net_joules == pytest.approx(100.0 * m.seconds)


def test_window_result_survives_an_exception_in_the_block() -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(10, 10.0)])})
    window = meter.measure()
    with pytest.raises(KeyError), window:
        raise KeyError("boom")
    assert window.joules == pytest.approx(10.0 * window.seconds)
    assert meter._active == 0


def test_a_failed_start_leaves_the_meter_usable() -> None:
    class FlakyStart(TraceMeter):
        fail = True
        starts = 0

        def _start(self) -> None:
            self.starts += 1
            if self.fail:
                raise OSError("sampler could not start")

    meter = FlakyStart({"gpu:0": PowerTrace([(10, 10.0)])})
    with pytest.raises(OSError), meter.measure():
        pass
    assert meter._active == 0
    meter.fail = False
    with meter.measure() as m:
        pass
    assert meter.starts == 2 and m.joules >= 0


def test_mark_phase_splits_the_innermost_open_window() -> None:
    from pytest_llmenergy import mark_phase

    meter = TraceMeter({"gpu:0": PowerTrace([(3600, 10.0)])})
    assert mark_phase("decode") is False  # no window: nothing to mark
    with meter.measure() as outer:
        with meter.measure() as inner:
            time.sleep(0.01)
            assert mark_phase("decode", ending="prefill") is True
            time.sleep(0.01)
        assert mark_phase("tail") is True  # the inner window closed: outer is innermost now
    assert list(inner.phases) == ["prefill", "decode"]
    assert list(outer.phases) == ["main", "tail"]
    assert inner.phases["prefill"].seconds + inner.phases["decode"].seconds == pytest.approx(
        inner.seconds
    )
    assert mark_phase("late") is False


def test_mark_ending_cannot_reuse_a_name() -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(3600, 10.0)])})
    with meter.measure() as m:
        m.mark("b")
        with pytest.raises(ValueError, match="already marked"):
            m.mark("c", ending="main")


# -- resolution ------------------------------------------------------------------------


def test_resolution_is_unknown_unless_the_meter_says_and_describe_shows_it() -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(10, 1.0)])})
    assert meter.resolution_s is None
    assert meter.describe() == "trace: gpu:0 (counter)"
    meter._resolution_s = 0.1
    assert meter.resolution_s == 0.1
    assert meter.describe() == "trace: gpu:0 (counter); resolution 100 ms"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(2.0, "2 s"), (0.1, "100 ms"), (0.001, "1 ms"), (0.0156, "15.6 ms"), (1e-6, "1 us")],
)
def test_duration_text(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


# -- what the fast window close builds --------------------------------------------------


def test_a_closed_window_carries_every_field_of_its_dataclasses() -> None:
    """Results are built without their __init__: none of their fields may be left out."""
    meter = TraceMeter({"gpu:0": PowerTrace([(10, 100.0)])})
    with meter.measure() as single:
        pass
    with meter.measure(phase="prefill") as split:
        split.mark("decode")
    for window in (single, split):
        m = window.measurement
        assert {f.name for f in dataclasses.fields(Measurement)} == set(vars(m))
        for phase in m.phases.values():
            assert {f.name for f in dataclasses.fields(Phase)} == set(vars(phase))
        rebuilt = Measurement(**{f.name: getattr(m, f.name) for f in dataclasses.fields(m)})
        assert rebuilt == m
        with pytest.raises(dataclasses.FrozenInstanceError):
            m.seconds = 0.0  # type: ignore[misc]


def test_phases_of_a_single_phase_window_behave_as_a_mapping() -> None:
    meter = TraceMeter({"gpu:0": PowerTrace([(10, 100.0)])})
    with meter.measure(phase="generate") as m:
        time.sleep(0.01)
    phases = m.phases
    assert len(phases) == 1 and list(phases) == ["generate"]
    assert "generate" in phases and "main" not in phases
    phase = phases["generate"]
    assert phase.name == "generate" and phase.offset_s == 0.0
    assert phase.seconds == m.seconds and phase.by_domain == m.by_domain
    assert phase.by_domain is not m.by_domain  # each its own dict, as before
    assert phases["generate"] is phase  # made once
    assert phases == {"generate": phase} and dict(phases) == {"generate": phase}
    assert phases.get("other") is None
    assert repr(phases).startswith("{'generate': Phase(")
    with pytest.raises(KeyError):
        phases["other"]


def test_counter_meters_without_background_work_skip_start_and_stop() -> None:
    class Started(TraceMeter):
        starts = 0

        def _start(self) -> None:
            self.starts += 1

    plain = TraceMeter({"gpu:0": PowerTrace([(10, 1.0)])})
    started = Started({"gpu:0": PowerTrace([(10, 1.0)])})
    assert not plain._uses_start_stop and started._uses_start_stop
    for meter in (plain, started):
        with meter.measure(), meter.measure():
            pass
        assert meter._active == 0
    assert started.starts == 1  # nested windows start it once
