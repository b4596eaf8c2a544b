"""The process-tree CPU counter behind the estimate meter and the busy-machine check.

Each scenario burns a known amount of CPU time in real child processes, so the truth
is known: a live worker is counted while it runs, a child collected inside a window adds
only its CPU time inside the window, and grandchildren count too.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from pytest_llmenergy.meters import open_meter
from pytest_llmenergy.probes.process_tree import ProcessTreeCpu, machine_busy_cpu_seconds

# spin until this process has used S CPU-seconds, then sleep T seconds (alive, idle)
_SPIN = (
    "import sys, time\n"
    "end = time.process_time() + float(sys.argv[1])\n"
    "while time.process_time() < end: pass\n"
    "time.sleep(float(sys.argv[2]))\n"
)


def _spin(cpu_s: float) -> None:
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


def _wait_until(predicate: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_a_running_multiprocessing_worker_is_counted_while_it_runs() -> None:
    """The issue's case: 2.0 CPU-s in a live worker used to read as 0.02 J."""
    tree = ProcessTreeCpu()
    ctx = multiprocessing.get_context("spawn")
    worker = ctx.Process(target=_spin, args=(2.0,))
    before = tree.read()
    worker.start()
    try:
        import psutil

        proc = psutil.Process(worker.pid)
        # still running (not collected), well into its spin
        _wait_until(lambda: proc.cpu_times().user + proc.cpu_times().system >= 1.0)
        during = tree.read()
        assert during - before >= 1.0  # the live worker's time is in
    finally:
        worker.join()
    after = tree.read()
    # the whole 2.0 s of the worker (+ its interpreter start-up), once: not twice
    assert 2.0 <= after - before <= 2.0 + 1.5


def test_a_child_collected_inside_a_window_adds_only_its_time_inside() -> None:
    """The issue's other case: a child collected inside a 0.1 ms window added its
    whole lifetime (12.8 J)."""
    tree = ProcessTreeCpu()
    child = subprocess.Popen([sys.executable, "-c", _SPIN, "0.5", "0.3"])
    import psutil

    proc = psutil.Process(child.pid)
    _wait_until(lambda: proc.status() == psutil.STATUS_ZOMBIE)  # done, not yet collected
    start = tree.read()
    child.wait()  # collected inside the window
    end = tree.read()
    assert end - start <= 0.03  # a /proc tick or two, never the 0.5 s lifetime


def test_grandchildren_are_counted_live_and_after_their_parent_collects_them() -> None:
    tree = ProcessTreeCpu()
    code = (
        "import subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', {_SPIN!r}, '0.6', '0'], check=True)\n"
        "import time; time.sleep(0.5)\n"
    )
    before = tree.read()
    child = subprocess.Popen([sys.executable, "-c", code])
    readings = []
    while child.poll() is None:
        readings.append(tree.read())
        time.sleep(0.05)
    child.wait()
    after = tree.read()
    assert readings == sorted(readings)  # a counter: never goes back
    assert 0.6 <= after - before <= 0.6 + 1.5  # the grandchild's 0.6 s, once


def test_another_process_can_be_the_root() -> None:
    """For a serving engine: the tree of a given PID."""
    child = subprocess.Popen([sys.executable, "-c", _SPIN, "0.4", "5"])
    try:
        import psutil

        proc = psutil.Process(child.pid)
        _wait_until(lambda: proc.cpu_times().user + proc.cpu_times().system >= 0.4)
        tree = ProcessTreeCpu(child.pid)
        assert 0.4 <= tree.read() <= 0.4 + 1.5
    finally:
        child.kill()
        child.wait()


def test_the_estimate_meter_charges_a_worker_process() -> None:
    meter = open_meter("estimate", cpu_tdp_w=20)
    per_cpu_w = 20 / meter.logical_cpus  # type: ignore[attr-defined]
    ctx = multiprocessing.get_context("spawn")
    with meter.measure() as window:
        worker = ctx.Process(target=_spin, args=(1.0,))
        worker.start()
        worker.join()
    # the worker's 1.0 CPU-s (+ interpreter start-up) at TDP / logical CPUs
    assert per_cpu_w * 1.0 <= window.joules <= per_cpu_w * 2.5


def test_machine_busy_time_leaves_out_idle_and_iowait() -> None:
    times = SimpleNamespace(
        user=10.0, nice=1.0, system=4.0, idle=100.0, iowait=5.0, irq=0.5, softirq=0.5,
        steal=0.0, guest=3.0, guest_nice=0.0,
        _fields=(
            "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest",
            "guest_nice",
        ),
    )  # fmt: skip
    assert machine_busy_cpu_seconds(lambda: times) == pytest.approx(16.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_machine_counter_sees_this_process_spin() -> None:
    a = machine_busy_cpu_seconds()
    _spin(0.3)
    b = machine_busy_cpu_seconds()
    assert b - a >= 0.3 - 0.02 * (os.cpu_count() or 1)


def test_the_no_children_shortcut_sees_children_of_any_thread_and_zombies() -> None:
    """The scan of every thread's children is skipped only when ``waitid`` says this
    process has no child at all: a child started by another thread counts, and so does
    one that ended but was not collected (its time is not yet in the parent's)."""
    import threading

    import psutil

    from pytest_llmenergy.probes.process_tree import _descendants, _has_no_children

    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(
        target=lambda: started.append(subprocess.Popen([sys.executable, "-c", _SPIN, "0.3", "0"]))
    )
    thread.start()
    thread.join()
    child = started[0]
    try:
        assert not _has_no_children()
        assert child.pid in _descendants(psutil.Process())
        _wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)
        assert not _has_no_children()  # ended, not collected: still a child
        assert child.pid in _descendants(psutil.Process())
        tree = ProcessTreeCpu()
        assert tree.read() >= 0.3  # its CPU time, read while it waits to be collected
    finally:
        child.wait()
    # and a process with no child at all takes the shortcut
    code = (
        "from pytest_llmenergy.probes.process_tree import _has_no_children as f; "
        "import subprocess, sys; a = f(); subprocess.run([sys.executable, '-c', '']); "
        "print(a, f())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
