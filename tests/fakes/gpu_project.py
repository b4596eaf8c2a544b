"""A fake A100 for whole sessions: what a project's conftest.py installs, and the cases
whose true time and energy at every setting the physics says.

A session (in-process under pytester, or a real subprocess) gets the fake through
``install()`` in its conftest.py; the GPU's settings live in the state file named by
``$FAKE_GPU_STATE`` (as a driver keeps them between processes), ``$FAKE_GPU_ROOT=0``
makes the process a normal user, ``$FAKE_GPU_THERMAL=3,7`` makes those work calls
(1-based) thermally throttled, and ``$FAKE_GPU_HEAT=TAU`` gives the GPU a temperature that
rises with the power it draws and decays toward its idle level with time constant TAU
seconds (gpu_physics.Heat); a wait for it to cool passes in virtual time.
``$FAKE_GPU_VENDOR=amd`` makes it an AMD MI300X-like GPU behind a fake ``amdsmi``
instead (power caps only: no clock locking, no thermal script).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .fake_amdsmi import FakeAmdGpu, build_fake_amdsmi, mi300x, process_entry
from .fake_pynvml import NVML_DEVICE_ARCH_AMPERE, FakeGPU, build_fake_pynvml, fake_uuid
from .gpu_physics import Heat, Phase, Physics
from .trace import SwitchTrace

PHYSICS = Physics()
NAME = "NVIDIA A100-SXM4-40GB"
# $FAKE_GPU_BOARD=h100: a second system, faster and hungrier, for routing between two.
BOARDS = {
    "a100": (NAME, Physics(), 400_000),
    "h100": (
        "NVIDIA H100 80GB HBM3",
        Physics(idle_w=70.0, static_w=120.0, compute_dynamic_w=580.0, memory_base_w=90.0,
                memory_dynamic_w=240.0, speed=2.0),
        700_000,
    ),
}  # fmt: skip
MAX_MHZ = 1410
MIN_MHZ = 210
# The AMD stand-in: an MI300X-like board, hungrier than the A100 (as fast: the virtual
# time leaks a few real ms per phase, which longer phases keep under 1 %), capped at 750 W.
AMD_NAME = "AMD Instinct MI300X"
AMD_PHYSICS = Physics(idle_w=90.0, static_w=210.0, compute_dynamic_w=540.0,
                      memory_base_w=120.0, memory_dynamic_w=300.0, speed=1.0)  # fmt: skip
AMD_MAX_UW = 750_000_000
AMD_MIN_UW = 200_000_000
AMD_MAX_MHZ = 2100
AMD_MIN_MHZ = 500


@dataclass(frozen=True)
class FakeQuery:
    """One case: a prefill of ``input_tokens`` (compute-bound) and a decode of
    ``output_tokens`` (memory-bound), with seconds at full clock per token."""

    model: str
    sweep: str
    input_tokens: int
    output_tokens: int
    prefill_s_per_token: float = 1.0 / 2048  # virtual seconds: a 1 s prefill of 2048
    decode_s_per_token: float = 1.0 / 256

    @property
    def phases(self) -> tuple[Phase, ...]:
        return (
            Phase("compute", self.input_tokens * self.prefill_s_per_token),
            Phase("memory", self.output_tokens * self.decode_s_per_token),
        )

    @property
    def id(self) -> str:
        return f"{self.model}-in{self.input_tokens}-out{self.output_tokens}"

    def labels(self) -> dict[str, str]:
        return {"model": self.model, "sweep": self.sweep}

    def truth(self, power_limit_w: float, sm_clock_mhz: int | None = None) -> tuple[float, float]:
        """True (seconds, joules) at this setting."""
        lock = None if sm_clock_mhz is None else sm_clock_mhz / MAX_MHZ
        return PHYSICS.run(self.phases, power_limit_w, lock, MIN_MHZ / MAX_MHZ)

    def amd_truth(self, power_cap_w: float) -> tuple[float, float]:
        """True (seconds, joules) on the AMD stand-in at this power cap."""
        return AMD_PHYSICS.run(self.phases, power_cap_w, None, AMD_MIN_MHZ / AMD_MAX_MHZ)


SMALL = (
    FakeQuery("fake-7b", "input", 2048, 8),  # prefill-heavy: compute-bound
    FakeQuery("fake-7b", "output", 8, 256),  # decode-heavy: memory-bound
)
# A sweep of sizes, enough for the router to fit curves ($FAKE_GPU_GRID=1).
GRID = (
    *(FakeQuery("fake-7b", "input", n, 8) for n in (64, 256, 1024, 2048)),
    *(FakeQuery("fake-7b", "output", 8, n) for n in (16, 64, 256)),
)
QUERIES = GRID if os.environ.get("FAKE_GPU_GRID") == "1" else SMALL


def heat_from_env() -> Heat | None:
    tau = os.environ.get("FAKE_GPU_HEAT", "")
    return Heat(tau_s=float(tau)) if tau else None


def make_gpu(
    index: int = 0,
    thermal_works: frozenset[int] = frozenset(),
    board: str = "a100",
    heat: Heat | None = None,
) -> FakeGPU:
    name, physics, max_mw = BOARDS[board]
    return FakeGPU(
        name,
        fake_uuid(index),
        NVML_DEVICE_ARCH_AMPERE,
        SwitchTrace(physics.idle_w),  # type: ignore[arg-type]
        counter_period_s=1e-4,
        physics=physics,
        thermal_works=thermal_works,
        heat=heat,
        power_limit_mw=max_mw,
        default_power_limit_mw=max_mw,
        max_power_limit_mw=max_mw,
    )


def make_amd_gpu(index: int = 0, heat: Heat | None = None) -> FakeAmdGpu:
    """The MI300X-like stand-in: counter refreshed every 0.1 ms, caps in µW; ``heat``:
    its temperature follows its power (``$FAKE_GPU_HEAT``)."""
    return mi300x(
        index,
        SwitchTrace(AMD_PHYSICS.idle_w),  # type: ignore[arg-type]
        counter_period_s=1e-4,
        physics=AMD_PHYSICS,
        power_cap_uw=AMD_MAX_UW,
        default_power_cap_uw=AMD_MAX_UW,
        max_power_cap_uw=AMD_MAX_UW,
        min_power_cap_uw=AMD_MIN_UW,
        max_gfx_clock_mhz=AMD_MAX_MHZ,
        min_gfx_clock_mhz=AMD_MIN_MHZ,
        heat=heat,
    )


def amd() -> bool:
    return os.environ.get("FAKE_GPU_VENDOR") == "amd"


def build_amd() -> Any:
    """The fake amdsmi as the environment describes it (virtual time, as build())."""
    return build_fake_amdsmi(
        [make_amd_gpu(0, heat_from_env())],
        root=os.environ.get("FAKE_GPU_ROOT", "1") == "1",
        state_path=os.environ.get("FAKE_GPU_STATE") or None,
        virtual_time=True,
    )


def build() -> Any:
    """The fake module as the environment describes it.  Its time is virtual: work takes
    exactly its simulated duration, so the true frontier is known to the joule; the
    meter reads the fake GPU's clock (``use_clock``) as it reads its counters."""
    thermal = os.environ.get("FAKE_GPU_THERMAL", "")
    works = frozenset(int(x) for x in thermal.split(",") if x.strip())
    board = os.environ.get("FAKE_GPU_BOARD", "a100")
    return build_fake_pynvml(
        [make_gpu(0, works, board, heat_from_env())],
        root=os.environ.get("FAKE_GPU_ROOT", "1") == "1",
        state_path=os.environ.get("FAKE_GPU_STATE") or None,
        virtual_time=True,
    )


def _vendor(vendor: str | None = None) -> tuple[str, str, Callable[[], Any]]:
    """The fake's module name, the meter module that times windows, and its builder."""
    if vendor == "amd" or (vendor is None and amd()):
        return "amdsmi", "pytest_llmenergy.meters.amdsmi", build_amd
    return "pynvml", "pytest_llmenergy.meters.nvml", build


def install(vendor: str | None = None) -> Any:
    """For a whole process: ``import pynvml`` (``import amdsmi`` with
    ``$FAKE_GPU_VENDOR=amd``) gives the fake, and its meter and the thermal wait time
    windows on the fake GPU's clock."""
    import importlib

    import pytest_llmenergy.conditions.thermal as thermal

    name, meter, make = _vendor(vendor)
    module = make()
    sys.modules[name] = module
    importlib.import_module(meter).perf_counter = module.fake.clock  # type: ignore[attr-defined]
    thermal.monotonic = module.fake.clock  # type: ignore[attr-defined]
    thermal.sleep = virtual_sleep(module.fake)
    return module


def virtual_sleep(fake: Any) -> Any:
    """``time.sleep`` on the fake's virtual clock: the GPU idles that long, at once."""

    def sleep(seconds: float) -> None:
        fake.virtual_s += max(0.0, seconds)

    return sleep


def install_for_test(monkeypatch: Any) -> Any:
    """The same for one test (undone when it ends): for in-process pytester sessions."""
    name, meter, make = _vendor()
    module = make()
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(f"{meter}.perf_counter", module.fake.clock)
    monkeypatch.setattr("pytest_llmenergy.conditions.thermal.monotonic", module.fake.clock)
    monkeypatch.setattr("pytest_llmenergy.conditions.thermal.sleep", virtual_sleep(module.fake))
    return module


def neighbour(pid: int, name: str, present: bool = True) -> None:
    """Another program opens (``present``) or closes a context on GPU 0, whichever
    vendor's fake is installed: what the isolation check must see."""
    if amd():
        listed = sys.modules["amdsmi"].fake.gpus[0].processes
        listed[:] = [p for p in listed if p["pid"] != pid]
        if present:
            listed.append(process_entry(pid, name, 2 * 2**30))
    else:
        contexts = sys.modules["pynvml"].fake.gpus[0].processes
        contexts.pop(pid, None)
        if present:
            contexts[pid] = (name, 2 * 2**30)


def run(query: FakeQuery) -> float:
    """The benchmark target: the query's work on GPU 0, split at the first output token."""
    from pytest_llmenergy.meters import mark_phase

    fake = sys.modules["amdsmi" if amd() else "pynvml"].fake
    return fake.work(0, query.phases, between=lambda: mark_phase("decode", ending="prefill"))


# What a project's test file says, for pytester and for trying it by hand (with
# tests/fakes/driver first on PYTHONPATH, or install() in its conftest.py).
TEST_FILE = """
import pytest

from tests.fakes.gpu_project import QUERIES, run


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_query(energy_benchmark, query):
    energy_benchmark(
        run, query, input_tokens=query.input_tokens, output_tokens=query.output_tokens
    )
"""
