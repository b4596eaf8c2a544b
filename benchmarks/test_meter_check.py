"""Does the configured meter see work?  Idle against a fixed CPU workload, same length."""

from __future__ import annotations

import time

import numpy as np

from pytest_llmenergy import Meter

WINDOW_S = 1.0


def busy(seconds: float) -> None:
    a = np.random.default_rng(0).random((256, 256))
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = np.tanh(a @ a)


def test_work_costs_more_energy_than_idle(energy_meter: Meter, record_energy) -> None:
    with energy_meter.measure() as idle:
        time.sleep(WINDOW_S)
    with energy_meter.measure() as work:
        busy(WINDOW_S)
    record_energy("idle", idle.measurement)
    record_energy("busy", work.measurement)
    assert work.seconds >= WINDOW_S and idle.seconds >= WINDOW_S
    assert work.joules / work.seconds > idle.joules / idle.seconds
