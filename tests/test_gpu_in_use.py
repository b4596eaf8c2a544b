"""Only the GPUs that work: a GPU meter reads the GPUs in use by default, and nothing
waits on (so opens a CUDA context on) or reads a GPU the session does not use.

The stand-in: two A100-like GPUs behind the fake pynvml, GPU 0 idle at 60 W and GPU 1
working at 300 W, each counter refreshed every 5 ms; "a model on GPU 1" is a module whose
parameters are on ``cuda:1``, held as ``load_model`` holds what it placed; torch's CUDA
entry points are replaced by ones that record every device they are asked about, and
``torch._C._cuda_hasPrimaryContext`` says where this process holds a context.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_llmenergy import open_meter
from pytest_llmenergy.controller.window import synchronize_devices
from pytest_llmenergy.gpu import in_use
from pytest_llmenergy.meters.gpu_meter import NONE_IN_USE, GpuMeter
from pytest_llmenergy.plugin.meter import gpu_meters
from pytest_llmenergy.storage.runfile import loads
from tests.fakes.fake_pynvml import NVML_DEVICE_ARCH_AMPERE, FakeGPU, fake_uuid, install_fake_pynvml
from tests.fakes.trace import PowerTrace

# imported once, before any in-process session: pytester drops what a session imported
torch = pytest.importorskip("torch")

IDLE_W, WORK_W = 60.0, 300.0
PERIOD_S = 0.005
# What reads a GPU's energy or power: none of it may reach GPU 0 in a window.
READS = (
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetFieldValues",
)


def tolerance_j(watts: float = WORK_W) -> float:
    """A counter refreshed every period is off by at most a period's energy per edge."""
    return 2 * PERIOD_S * watts + 0.001


class StandIn:
    """A model as ``load_model`` leaves one on ``cuda:index``: its weights say where."""

    def __init__(self, index: int = 1) -> None:
        self.weight = types.SimpleNamespace(device=torch.device("cuda", index))

    def parameters(self) -> Iterator[Any]:
        return iter([self.weight])

    def buffers(self) -> Iterator[Any]:
        return iter(())


@pytest.fixture(autouse=True)
def _nothing_placed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with nothing on any GPU, whatever another test left."""
    monkeypatch.setattr(in_use, "_placements", {})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Two GPUs: 0 idles at 60 W, 1 works at 300 W."""
    gpus = [
        FakeGPU(
            f"NVIDIA A100 #{n}",
            fake_uuid(n),
            NVML_DEVICE_ARCH_AMPERE,
            PowerTrace([(600.0, watts)]),
            counter_period_s=PERIOD_S,
        )
        for n, watts in ((0, IDLE_W), (1, WORK_W))
    ]
    return install_fake_pynvml(monkeypatch, gpus).fake


def recording_cuda(
    monkeypatch: pytest.MonkeyPatch, contexts: set[int], probe: bool = True
) -> list[tuple[str, Any]]:
    """torch's CUDA, used by this process, on two GPUs with a context on ``contexts``:
    every call that names a device is recorded; ``probe`` False: a torch that cannot tell
    where it holds a context."""
    calls: list[tuple[str, Any]] = []

    def recorder(name: str) -> Any:
        def call(device: Any = None, *args: Any, **kwargs: Any) -> None:
            calls.append((name, device))

        return call

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name in ("synchronize", "set_device", "mem_get_info", "init", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, recorder(name))
    if probe:
        monkeypatch.setattr(
            torch._C, "_cuda_hasPrimaryContext", lambda i: i in contexts, raising=False
        )
    else:
        monkeypatch.delattr(torch._C, "_cuda_hasPrimaryContext", raising=False)
    return calls


def touched(calls: list[tuple[str, Any]]) -> set[Any]:
    return {device for _, device in calls}


# -- the model's GPU, read alone --------------------------------------------------------


def test_the_model_on_gpu_1_is_read_alone(fake: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU 1's joules are the window's, not GPU 1's and idle GPU 0's; GPU 0 is never read
    by a window, nor waited on."""
    calls = recording_cuda(monkeypatch, contexts={1})
    model = StandIn(1)
    in_use.hold_module(model, "stand-in")
    with open_meter("nvml") as meter:
        opened = fake.calls_on(0, READS)
        with meter.measure("prefill") as m:
            time.sleep(0.1)
            m.mark("decode")
            time.sleep(0.1)
        assert list(m.by_domain) == ["gpu:1"]
        t0, t1 = m.measurement.t_start, m.measurement.t_end
        true_j = fake.gpus[1].trace.energy_between(t0, t1)
        assert abs(m.joules - true_j) <= tolerance_j()
        assert m.joules < true_j + IDLE_W * (t1 - t0) - tolerance_j(IDLE_W + WORK_W)
        assert fake.calls_on(0, READS) == opened  # the window never read GPU 0
        assert fake.calls_on(1, READS) > 0
    assert touched(calls) == {1}  # waited on GPU 1 alone, before each of the 3 readings
    assert [name for name, _ in calls] == ["synchronize"] * 3


def test_the_header_and_the_line_name_the_gpus_read(fake: Any) -> None:
    in_use.hold_module(model := StandIn(1), "stand-in")
    with open_meter("nvml") as meter:
        line = meter.describe()
        assert "now gpu:1 (where stand-in is placed)" in line
        assert "every visible one" in line  # how they are chosen
        assert isinstance(meter, GpuMeter)
        with meter.measure():
            pass
        news = meter.news()
        assert news == (
            "nvml reads gpu:1 NVIDIA A100 #1: where stand-in is placed; not read: gpu:0 "
            "(no work of this session there)"
        )
        assert meter.news() is None  # said once
    in_use.release(model)


def test_no_code_path_waits_on_or_reads_gpu_0(fake: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The meter's edges (nested windows, marks, idle power), the controller's edges and
    the loaded model's own waits: GPU 1 each time, GPU 0 never."""
    from pytest_llmenergy.llm.loader import LoadedModel

    calls = recording_cuda(monkeypatch, contexts={1})
    model = StandIn(1)
    in_use.hold_module(model, "stand-in")
    loaded = LoadedModel("stand-in", model, None, torch.device("cuda", 1), None, 64)
    with open_meter("auto", powercap_root="/nonexistent") as meter:
        opened = fake.calls_on(0)
        meter.measure_idle(0.02)
        with meter.measure() as outer:
            synchronize_devices()
            with meter.measure() as inner:
                loaded._synchronize()
                inner.mark("decode")
            synchronize_devices()
        assert fake.calls_on(0) == opened  # no call at all on GPU 0's handle
    assert touched(calls) == {1}
    gpus = [d for d in outer.by_domain if d.startswith("gpu")]
    assert gpus == ["gpu:1"] and [d for d in inner.by_domain if d.startswith("gpu")] == gpus
    assert set(meter.idle_power_w) >= {"gpu:1"} and "gpu:0" not in meter.idle_power_w


def test_a_torch_that_cannot_tell_waits_on_the_held_gpus_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = recording_cuda(monkeypatch, contexts=set(), probe=False)
    synchronize_devices()
    assert calls == []  # nothing held: nothing known to have work, nothing waited on
    in_use.hold_module(model := StandIn(1), "stand-in")
    synchronize_devices()
    assert calls == [("synchronize", 1)]
    in_use.release(model)


def test_a_context_never_opened_is_never_waited_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model on GPU 1, but (say) released: a wait asked for GPU 1 with no context
    there waits on nothing."""
    calls = recording_cuda(monkeypatch, contexts=set())
    assert in_use.synchronize(frozenset({0, 1})) == ()
    assert calls == []


# -- the other ways the GPUs in use are found -------------------------------------------


def test_without_a_model_the_gpus_this_process_uses(
    fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain function that runs its own CUDA work on GPU 1: torch's contexts say so."""
    recording_cuda(monkeypatch, contexts={1})
    with open_meter("nvml") as meter, meter.measure() as m:
        time.sleep(0.05)
    assert list(m.by_domain) == ["gpu:1"]
    assert meter.choice is not None
    assert meter.choice.why == "where this session's processes hold a GPU context"


def test_a_serving_engine_is_found_by_the_driver(fake: Any) -> None:
    """An engine in another process (attributed to the session, as --llm-serve does) with
    its context on GPU 1; another user's process on GPU 0 is not the session's."""
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake.start_context(1, pid=engine.pid, name="vllm")
        fake.start_context(0, pid=999_999_999, name="someone else")
        with open_meter("nvml", attributed_pids=(engine.pid,)) as meter:
            with meter.measure() as m:
                time.sleep(0.05)
            assert list(m.by_domain) == ["gpu:1"]
            fake.end_context(1, pid=engine.pid)
            with meter.measure() as m:
                pass
            assert list(m.by_domain) == ["gpu:0", "gpu:1"]  # nothing in use: every GPU
    finally:
        engine.kill()
        engine.wait()


def test_before_any_model_every_gpu_is_read_and_said(fake: Any) -> None:
    """Nothing in use (no model yet, or the driver lists the session under other PIDs, as
    in a container): every GPU, said in the header and the line; never zero GPUs."""
    fake.start_context(1, pid=424_242)  # the session's engine, as the host numbers it
    with open_meter("nvml") as meter:
        assert f"now gpu:0, gpu:1 ({NONE_IN_USE})" in meter.describe()
        with meter.measure() as m:
            time.sleep(0.05)
        assert list(m.by_domain) == ["gpu:0", "gpu:1"]
        assert "no GPU in use yet" in (meter.news() or "")
        model = StandIn(1)
        in_use.hold_module(model, "stand-in")
        with meter.measure() as m:
            pass
        assert list(m.by_domain) == ["gpu:1"]
        assert "where stand-in is placed" in (meter.news() or "")
        in_use.release(model)
        with meter.measure() as m:
            pass
        assert list(m.by_domain) == ["gpu:0", "gpu:1"]


def test_a_window_keeps_its_gpus_until_it_closes(fake: Any) -> None:
    """The outermost window chooses; a model placed while it is open changes the next
    window, not it or the windows nested in it (their readings must read the same GPUs)."""
    model = StandIn(1)
    with open_meter("nvml") as meter:
        with meter.measure() as outer:
            in_use.hold_module(model, "stand-in")
            with meter.measure() as inner:
                time.sleep(0.02)
        assert list(outer.by_domain) == list(inner.by_domain) == ["gpu:0", "gpu:1"]
        with meter.measure() as after:
            pass
        assert list(after.by_domain) == ["gpu:1"]
        assert list(meter.domains) == ["gpu:1"]  # what the next window reads
    in_use.release(model)


def test_a_collected_model_lets_its_gpus_go() -> None:
    import gc

    model = StandIn(1)
    assert in_use.hold_module(model, "stand-in") == in_use.Placement("stand-in", (1,))
    assert in_use.held_ordinals() == (1,) and in_use.held_by(model) == (1,)
    del model
    gc.collect()
    assert in_use.placements() == ()
    assert in_use.hold_module(StandIn(0), "on the CPU") is not None  # (collected at once)
    gc.collect()
    assert in_use.held_ordinals() == ()


def test_the_loader_holds_what_it_placed_until_the_pool_drops_it(
    tiny_cache: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """load_model holds its model's GPUs (on the CPU here, so GPU 1 stands in for what its
    weights would say), and the pool lets go of them as it drops the model."""
    from pytest_llmenergy.llm.loader import ModelPool

    monkeypatch.setattr(in_use, "module_ordinals", lambda module, api="cuda": (1,))
    with ModelPool(device="cpu", cache_dir=tiny_cache) as pool:
        loaded = pool.get("tiny-llama")
        assert in_use.placements() == (in_use.Placement("tiny-llama", (1,)),)
        assert in_use.held_by(loaded.model) == (1,)
        del loaded
    assert in_use.placements() == ()


def test_accelerate_device_map_counts_as_placed() -> None:
    """Layers offloaded by accelerate run on the GPU its map names, with no parameter on it."""
    model = StandIn(0)
    model.hf_device_map = {"embed": 0, "layers.0": "cuda:1", "lm_head": "cpu"}  # type: ignore[attr-defined]
    assert in_use.module_ordinals(model) == (0, 1)


# -- every GPU, or the ones listed, still as asked --------------------------------------


def test_energy_gpus_all_reads_every_gpu_and_warns_of_the_idle_one(fake: Any) -> None:
    in_use.hold_module(model := StandIn(1), "stand-in")
    with open_meter("nvml", every_gpu=True) as meter:
        with meter.measure() as m:
            time.sleep(0.1)
        assert list(m.by_domain) == ["gpu:0", "gpu:1"]
        t0, t1 = m.measurement.t_start, m.measurement.t_end
        both_j = sum(g.trace.energy_between(t0, t1) for g in fake.gpus)
        assert abs(m.joules - both_j) <= tolerance_j(IDLE_W + WORK_W)
        news = meter.news() or ""
        assert "WARNING: gpu:0 runs none of this session's work, so its idle power" in news
        assert "now gpu" not in meter.describe()  # as asked: no choosing to describe
    in_use.release(model)


def test_runs_compare_whichever_gpu_the_model_was_on(fake: Any) -> None:
    """A run's meter identity names the GPUs it may read, not the last window's: the same
    model on GPU 0 in one run and on GPU 1 in the next still compares; a run that read
    every GPU (as before) does not compare with one that read those in use."""
    with open_meter("nvml") as meter:
        before = meter.identity()
        in_use.hold_module(model := StandIn(1), "stand-in")
        with meter.measure():
            pass
        assert meter.identity() == before
        assert before == {"meter": "nvml", "domains": "gpu:0, gpu:1", "GPUs": "in use"}
    with open_meter("nvml", every_gpu=True) as meter:
        assert meter.identity() == {"meter": "nvml", "domains": "gpu:0, gpu:1"}
    in_use.release(model)


def test_energy_gpus_listed_are_honoured(fake: Any) -> None:
    in_use.hold_module(model := StandIn(1), "stand-in")
    with open_meter("nvml", gpus=(0,)) as meter, meter.measure() as m:
        pass
    assert list(m.by_domain) == ["gpu:0"]
    in_use.release(model)


def test_the_option_reads_all_and_used() -> None:
    from pytest_llmenergy.plugin.meter import METER_OPTIONS

    built = {}
    for text, every in (("all", True), ("used", False), ("ALL", True)):
        given: dict[str, Any] = {"gpus": METER_OPTIONS.options[0].parse(text)}
        METER_OPTIONS.complete(given)  # type: ignore[misc]
        built[text] = METER_OPTIONS.build(given, [])
        assert built[text].gpus is None and built[text].every_gpu is every
    assert METER_OPTIONS.options[0].parse("0,1") == (0, 1)


# -- a whole session ----------------------------------------------------------------------

SESSION_TEST = """
import time


def test_generate(energy_benchmark):
    energy_benchmark(time.sleep, 0.02, input_tokens=8, output_tokens=8)
"""
SESSION = (
    "-p",
    "no:randomly",
    "--energy-backend=nvml",
    "--energy-min-trials=3",
    "--energy-max-trials=3",
    "--energy-warmup=0",
    "--energy-json=run.json",
)


@pytest.mark.parametrize("how", ["default", "--energy-gpus=all", "llmenergy_gpus = all"])
def test_a_session_meters_the_model_gpu(
    fake: Any, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Header, line and run: GPU 1 alone by default, both with --energy-gpus=all (or its
    ini twin); every line the package writes fits an 80-column terminal."""
    monkeypatch.setenv("COLUMNS", "80")
    in_use.hold_module(model := StandIn(1), "stand-in")
    pytester.makepyfile(test_served=SESSION_TEST)
    every = how != "default"
    if how.startswith("llmenergy_"):
        pytester.makeini(f"[pytest]\n{how}\n")
    result = pytester.runpytest(*SESSION, *([how] if how.startswith("--") else []))
    assert result.ret == 0, result.stdout.str()
    lines = result.stdout.lines
    ours = [line for line in lines if line.startswith("llmenergy: ")]
    ours += [b for a, b in itertools.pairwise(lines) if a in ours and b.startswith("  ")]
    assert any("nvml reads" in line for line in ours), lines
    assert all(len(line) <= 80 for line in ours), [x for x in ours if len(x) > 80]
    text = " ".join(result.stdout.str().split())
    run = loads((pytester.path / "run.json").read_text(), pytester.path / "run.json")
    (case,) = run.cases
    by_domain = [t.joules_by_domain for t in case.trials]
    # each trial's joules are its domains' (the window's seconds hold the calls' gaps too,
    # so the GPUs' true joules are checked against the traces by the meter's tests above)
    assert all(t.joules == pytest.approx(sum(t.joules_by_domain.values())) for t in case.trials)
    if every:
        assert "now gpu:1" not in text
        assert "llmenergy: nvml reads gpu:0 NVIDIA A100 #0, gpu:1 NVIDIA A100 #1" in text
        assert "WARNING: gpu:0 runs none of this session's work, so its idle power" in text
        assert list(case.methods) == ["gpu:0", "gpu:1"]
        ratios = [j["gpu:0"] / j["gpu:1"] for j in by_domain]  # 60 W against 300 W
        assert all(abs(r - IDLE_W / WORK_W) < 0.1 for r in ratios), ratios
    else:
        assert "now gpu:1 (where stand-in is placed)" in text  # the header
        assert "llmenergy: nvml reads gpu:1 NVIDIA A100 #1: where stand-in is placed" in text
        assert list(case.methods) == ["gpu:1"]
        assert all(list(j) == ["gpu:1"] for j in by_domain), by_domain
    in_use.release(model)


def test_gpu_meters_are_found_in_the_session_meter(fake: Any) -> None:
    with open_meter("auto", powercap_root="/nonexistent") as meter:
        (found,) = gpu_meters(meter)
        assert found.backend == "nvml"
