"""The per-case resource probe: peak memory of its own stretch, CPU time, I/O wait."""

from __future__ import annotations

import os
import sys
import time
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_llmenergy.probes import resources
from pytest_llmenergy.probes.resources import ResourceProbe, ResourceUsage

MB = 1024 * 1024
ALLOC_BYTES = 200 * MB


def _touch_memory(hold_s: float = 0.0) -> None:
    """Allocate and write 200 MB (so the pages are resident), then free them."""
    block = b"\x01" * ALLOC_BYTES
    time.sleep(hold_s)
    assert block[-1] == 1
    del block


def _kernel_peak_available() -> bool:
    return sys.platform.startswith("linux") and os.access("/proc/self/clear_refs", os.W_OK)


def test_peak_rss_is_the_probes_own(tmp_path: Path) -> None:
    _touch_memory()  # the process's lifetime peak is now high; the next probe must not see it
    with ResourceProbe() as quiet:
        pass
    with ResourceProbe() as busy:
        _touch_memory()
    assert busy.usage.peak_rss_bytes - quiet.usage.peak_rss_bytes >= 150 * MB
    if _kernel_peak_available():
        assert quiet.peak_method == busy.peak_method == "kernel"


@pytest.mark.parametrize("force", ["flag", "unwritable"])
def test_sampling_fallback(force: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if force == "flag":
        make = lambda: ResourceProbe(use_kernel_peak=False)  # noqa: E731
    else:
        monkeypatch.setattr(resources, "_CLEAR_REFS", tmp_path / "no-dir" / "clear_refs")
        make = ResourceProbe
    with make() as quiet:
        time.sleep(0.05)
    with make() as busy:
        _touch_memory(hold_s=0.1)  # longer than the 10 ms sampling period
    assert quiet.peak_method == busy.peak_method == "sampled"
    assert busy.usage.peak_rss_bytes - quiet.usage.peak_rss_bytes >= 150 * MB


def test_nested_probes_do_not_reset_each_other() -> None:
    with ResourceProbe() as outer:
        _touch_memory()
        with ResourceProbe() as inner:
            time.sleep(0.03)
    with ResourceProbe() as quiet:
        pass
    if _kernel_peak_available():
        assert (outer.peak_method, inner.peak_method) == ("kernel", "sampled")
    assert outer.usage.peak_rss_bytes - quiet.usage.peak_rss_bytes >= 150 * MB
    assert inner.usage.peak_rss_bytes < outer.usage.peak_rss_bytes - 150 * MB
    # The kernel counter is free again for the next probe.
    with ResourceProbe() as after:
        pass
    assert after.peak_method == outer.peak_method


def test_cpu_and_wall_time() -> None:
    with ResourceProbe() as busy:  # 0.3 CPU-seconds, however long a busy machine takes
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
    with ResourceProbe() as idle:
        time.sleep(0.3)
    assert busy.usage.cpu_seconds >= 0.3
    assert idle.usage.cpu_seconds < 0.1
    assert busy.usage.wall_seconds >= 0.3 and idle.usage.wall_seconds >= 0.3
    for usage in (busy.usage, idle.usage):
        assert usage.iowait_share is None or 0.0 <= usage.iowait_share <= 1.0


def test_no_gpu_without_cuda() -> None:
    torch = sys.modules.get("torch")
    with ResourceProbe() as probe:
        pass
    if torch is None or not torch.cuda.is_available():
        assert probe.usage.peak_gpu_bytes is None


def test_gpu_peak_is_summed_over_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    resets: list[int] = []
    peaks = {0: 100 * MB, 1: 300 * MB}
    fake_cuda = SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        device_count=lambda: 2,
        reset_peak_memory_stats=resets.append,
        max_memory_allocated=peaks.__getitem__,
    )
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=fake_cuda))
    with ResourceProbe() as probe:
        pass
    assert resets == [0, 1]
    assert probe.usage.peak_gpu_bytes == 400 * MB


def test_a_cpu_model_on_a_gpu_machine_reads_no_gpu_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA available but never initialised (the model runs on the CPU): torch 2.11 on
    an H100 raised "Invalid device argument" at the reset and failed the case."""

    def refuse(device: int) -> None:
        raise RuntimeError("Invalid device argument")

    fake_cuda = SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: False,
        device_count=lambda: 1,
        reset_peak_memory_stats=refuse,
        max_memory_allocated=refuse,
    )
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=fake_cuda))
    with ResourceProbe() as probe:
        pass
    assert probe.usage.peak_gpu_bytes is None


def test_torch_is_not_imported_by_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with ResourceProbe() as probe:
        pass
    assert "torch" not in sys.modules
    assert probe.usage.peak_gpu_bytes is None


def test_usage_only_after_the_block() -> None:
    probe = ResourceProbe()
    with pytest.raises(RuntimeError, match="after the with block"):
        _ = probe.usage
    with probe, pytest.raises(RuntimeError):
        _ = probe.usage
    assert isinstance(probe.usage, ResourceUsage)
    with pytest.raises(RuntimeError, match="only once"), probe:
        pass


Times = namedtuple("Times", "user nice system idle iowait guest guest_nice")
NoIowait = namedtuple("NoIowait", "user system idle")


def test_iowait_share_arithmetic() -> None:
    before = Times(10, 0, 5, 80, 5, 1, 0)
    after = Times(20, 0, 10, 100, 15, 3, 0)  # guest is inside user: not counted twice
    assert resources._iowait_share(before, after) == pytest.approx(10 / 45)
    assert resources._iowait_share(before, before) == 0.0
    assert resources._iowait_share(NoIowait(1, 1, 1), NoIowait(2, 2, 2)) is None
