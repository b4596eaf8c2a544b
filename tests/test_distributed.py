"""Measuring across ranks, without launching any: the environment, the merged windows,
energy counted once, the layout check, and GPUs a device_map spreads a model over.

The other ranks are stand-ins that answer every collective the way a real rank would
(its own window's time and joules); the real thing under torchrun is tests/test_torchrun.py.
"""

from __future__ import annotations

import json
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy import ConfigError, MeterSettings, open_meter
from pytest_llmenergy.distributed import (
    DistEnv,
    DistributedMeter,
    NullMeter,
    RankLost,
    detect,
    node_of_domain,
    qualified,
)
from pytest_llmenergy.llm.loader import occupied_gpus, tensor_parallel_problem, unmetered_gpus
from pytest_llmenergy.meters.marks import mark_phase
from tests.fakes.fake_pynvml import NVML_DEVICE_ARCH_AMPERE, FakeGPU, fake_uuid, install_fake_pynvml
from tests.fakes.scripted import TraceMeter
from tests.fakes.trace import PowerTrace

TORCHRUN_ENV = {
    "RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
}


def test_the_job_is_read_from_torchruns_environment() -> None:
    env = detect(TORCHRUN_ENV)
    assert env == DistEnv(rank=1, world_size=4, local_rank=1, local_world_size=2, node_rank=0)
    assert env.nnodes == 2 and not env.reads_host
    assert env.node_of(3) == 1
    assert detect({}) is None
    assert detect({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: nothing to share


@pytest.mark.parametrize(
    ("changes", "words"),
    [({"RANK": "one"}, "RANK='one' is not a number"), ({"LOCAL_WORLD_SIZE": "3"}, "do not fit")],
)
def test_a_broken_environment_is_one_clear_error(changes: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        detect({**TORCHRUN_ENV, **changes})


class StandInGroup:
    """This rank's side of the collectives; ``others(mine)`` is what the other ranks
    contribute to the same call (in rank order, this rank's slot left out)."""

    def __init__(self, env: DistEnv, others: Callable[[Any], list[Any]]) -> None:
        self.env = env
        self.others = others
        self.barriers = 0
        self.backend = "gloo"
        self.lost: str | None = None

    def all_gather(self, obj: Any) -> list[Any]:
        if self.lost:
            raise RankLost(self.lost)
        out = self.others(obj)
        out.insert(self.env.rank, obj)
        return out

    def barrier(self) -> None:
        self.barriers += 1


def _env(rank: int, world: int = 2, per_node: int = 2) -> DistEnv:
    return DistEnv(rank, world, rank % per_node, per_node, rank // per_node)


def _rank_meter_of(meter: Any, env: DistEnv) -> Any:
    """What a rank with ``meter`` announces when the distributed meter opens."""
    from pytest_llmenergy.distributed import RankMeter

    return RankMeter(
        rank=env.rank,
        node=env.node_rank,
        backend=meter.backend,
        kind=meter.kind,
        domains=tuple(
            (qualified(n, env), str(d.method), d.counted) for n, d in meter.domains.items()
        ),
        resolution_s=meter.resolution_s,
        idle_power_w=(),
        notes=(),
        settings=(),
    )


def test_two_nodes_windows_sum_every_nodes_joules_and_take_the_slowest_time() -> None:
    """Two nodes, one rank each; node 1's rank reports 30 W on its package for 0.25 s
    longer than this rank's window: the job's window is the longer one and holds both."""
    env0, env1 = _env(0, 2, 1), _env(1, 2, 1)
    local = TraceMeter({"cpu:package-0": PowerTrace([(60.0, 10.0)])})
    remote = TraceMeter({"cpu:package-0": PowerTrace([(60.0, 30.0)])})
    remote_window: dict[str, Any] = {}

    def others(mine: Any) -> list[Any]:
        if not isinstance(mine, tuple):  # the meters' announcement
            return [_rank_meter_of(remote, env1)]
        seconds = mine[0] + 0.25
        joules = {"cpu:package-0@node1": 30.0 * seconds}
        phases = [
            (p, s + 0.125, {"cpu:package-0@node1": 30.0 * (s + 0.125)}) for p, s, _ in mine[2]
        ]
        remote_window.update(seconds=seconds)
        return [(seconds, joules, phases)]

    group = StandInGroup(env0, others)
    meter = DistributedMeter(local, group)  # type: ignore[arg-type]
    assert list(meter.domains) == ["cpu:package-0@node0", "cpu:package-0@node1"]
    with meter.measure(phase="prefill") as window:
        time.sleep(0.02)
        assert mark_phase("decode")  # the local window is the innermost one
        time.sleep(0.02)
    m = window.measurement
    assert group.barriers == 2  # before and after the trial
    assert m.seconds == pytest.approx(remote_window["seconds"])
    own_s = m.seconds - 0.25
    assert m.by_domain["cpu:package-0@node0"] == pytest.approx(10.0 * own_s, rel=1e-6)
    assert m.by_domain["cpu:package-0@node1"] == pytest.approx(30.0 * m.seconds, rel=1e-6)
    assert m.joules == pytest.approx(10.0 * own_s + 30.0 * m.seconds, rel=1e-6)
    assert list(m.phases) == ["prefill", "decode"]
    assert sum(p.joules for p in m.phases.values()) == pytest.approx(m.joules, rel=1e-6)
    assert node_of_domain("cpu:package-0@node1") == 1 and node_of_domain("gpu:0") is None


def test_one_node_keeps_a_single_process_names_and_counts_each_gpu_once() -> None:
    env = _env(0)
    local = TraceMeter(
        {"cpu:package-0": PowerTrace([(60.0, 10.0)]), "gpu:0": PowerTrace([(60.0, 100.0)])}
    )
    remote = TraceMeter({"gpu:1": PowerTrace([(60.0, 50.0)])})

    def announce(mine: Any) -> list[Any]:
        return [_rank_meter_of(remote, _env(1))]

    meter = DistributedMeter(local, StandInGroup(env, announce))  # type: ignore[arg-type]
    assert sorted(meter.domains) == ["cpu:package-0", "gpu:0", "gpu:1"]
    assert meter.owner == {"cpu:package-0": 0, "gpu:0": 0, "gpu:1": 1}
    assert "rank 1: gpu:1 (counter)" in meter.describe()

    twice = TraceMeter({"gpu:0": PowerTrace([(60.0, 50.0)])})
    with pytest.raises(ConfigError, match="both measure gpu:0"):
        DistributedMeter(local, StandInGroup(env, lambda mine: [_rank_meter_of(twice, _env(1))]))  # type: ignore[arg-type]


def test_each_rank_counts_its_own_process_share_under_the_estimate() -> None:
    env = _env(1)
    assert qualified("cpu:process", env) == "cpu:process@rank1"
    estimate = open_meter("estimate", cpu_tdp_w=20.0)
    try:
        # the estimate on one rank and nothing on the other would miss that rank's CPU time
        with pytest.raises(ConfigError, match="every rank"):
            DistributedMeter(
                NullMeter(),
                StandInGroup(env, lambda mine: [_rank_meter_of(estimate, _env(0))]),  # type: ignore[arg-type]
            )
    finally:
        estimate.close()


def test_a_lost_rank_fails_the_window_with_its_message() -> None:
    group = StandInGroup(_env(0), lambda mine: [_rank_meter_of(NullMeter(), _env(1))])
    meter = DistributedMeter(NullMeter(), group)  # type: ignore[arg-type]
    group.lost = "rank 1 (node 0) stopped answering"
    with pytest.raises(RankLost, match="rank 1 \\(node 0\\)"), meter.measure():
        pass


def test_tensor_parallel_needs_heads_that_divide_by_the_world_size(tmp_path: Path) -> None:
    """Read from the config alone, before any rank loads weights: 6 heads, 2 key/value."""
    folder = tmp_path / "six-heads"
    folder.mkdir()
    config = {"model_type": "llama", "num_attention_heads": 6, "num_key_value_heads": 2}
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 48}))
    assert tensor_parallel_problem(str(folder), 2) is None
    problem = tensor_parallel_problem(str(folder), 3)
    assert problem is not None and "2 key/value heads do not divide by the world size 3" in problem
    problem = tensor_parallel_problem(str(folder), 4)
    assert problem is not None and "6 attention heads do not divide by the world size 4" in problem
    assert "--llm-parallel=none" in problem


def test_a_model_spread_over_two_gpus_is_metered_on_both(monkeypatch: pytest.MonkeyPatch) -> None:
    """device_map="auto" puts layers on GPUs 0 and 1: the default NVML meter reads both
    (their joules add up to both traces), and --energy-gpus=0 is caught as missing GPU 1."""
    gpus = [
        FakeGPU(
            f"NVIDIA A100 #{n}",
            fake_uuid(n),
            NVML_DEVICE_ARCH_AMPERE,
            PowerTrace([(60.0, w)]),
            counter_period_s=0.01,
        )
        for n, w in ((0, 100.0), (1, 50.0))
    ]
    install_fake_pynvml(monkeypatch, gpus)
    model = types.SimpleNamespace(
        hf_device_map={
            "model.embed_tokens": 0,
            "model.layers.0": 0,
            "model.layers.1": 1,
            "lm_head": "cuda:1",
        }
    )
    occupied = occupied_gpus(model)
    assert occupied == (0, 1)
    with open_meter("nvml", MeterSettings(sample_interval_s=0.01)) as meter:
        assert unmetered_gpus(occupied, meter.domains) == []
        with meter.measure() as window:
            time.sleep(0.3)
        m = window.measurement
        assert set(m.by_domain) == {"gpu:0", "gpu:1"}
        assert m.joules == pytest.approx(150.0 * m.seconds, rel=0.35)  # counters' resolution
        assert m.by_domain["gpu:0"] > m.by_domain["gpu:1"]
    with open_meter("nvml", MeterSettings(gpus=(0,))) as meter:
        assert unmetered_gpus(occupied, meter.domains) == [1]


def test_tensor_parallel_needs_a_plan_and_a_grid_leaves_out_its_models_without_one(
    tiny_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers cannot split Falcon: named, it is one line; from the grid's defaults,
    it is left out and the header says so."""
    from pytest_llmenergy.llm.tiny import ensure_tiny_model
    from pytest_llmenergy.plugin.models import LLMSettings
    from pytest_llmenergy.plugin.options import PluginSettings
    from pytest_llmenergy.plugin.torchrun import check_layout

    monkeypatch.setenv("LLMENERGY_CACHE", str(tiny_cache))
    for name in ("tiny-llama", "tiny-falcon"):
        ensure_tiny_model(name)
    problem = tensor_parallel_problem("tiny-falcon", 2, cache_dir=tiny_cache)
    assert problem is not None and "no tensor-parallel plan" in problem and "(Falcon)" in problem
    grid_options = PluginSettings(llm=LLMSettings(grid_name="quick", parallel="tp"))
    options, notes = check_layout(grid_options, _env(0))
    assert options.llm.grid.models == ("tiny-llama", "tiny-mistral")
    assert notes == [
        "--llm-parallel=tp: model tiny-falcon left out: transformers has no tensor-parallel "
        "plan for its architecture (Falcon)"
    ]
    named = PluginSettings(llm=LLMSettings(models=("tiny-falcon",), parallel="tp"))
    with pytest.raises(pytest.UsageError, match="model tiny-falcon cannot be split over 2"):
        check_layout(named, _env(0))
