"""pytest under torchrun, for real: two nodes simulated on this machine, and a rank killed.

Each torchrun launch costs a few seconds of imports per rank on two cores, so there are
two tests: two launches with node ranks 0 and 1 (one rank each, each node with its own
fake RAPL tree at a known power) that run the built-in tiny Llama tensor-parallel over both
ranks, one launch of two ranks of which one is killed mid-session, and one of two ranks
that writes the HTML report.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmenergy.llm.tiny import tiny_model_dir
from tests.fakes.powercap import FakePowercap, FakeZone
from tests.fakes.trace import PowerTrace

pytest.importorskip("torch.distributed")
ROOT = Path(__file__).resolve().parents[1]

TP_TEST = """
import json, os

def test_tp(energy_benchmark, llm_pool):
    model = llm_pool.get("tiny-llama")
    weight = model.model.model.layers[0].self_attn.q_proj.weight
    local = weight.to_local() if hasattr(weight, "to_local") else weight
    ids = model.prompt_ids(8)
    result = energy_benchmark(model.generate, ids, 8, input_tokens=8, output_tokens=8)
    with open(f"rank{os.environ['RANK']}.json", "w") as f:
        json.dump({"rows": local.shape[0], "all_rows": weight.shape[0],
                   "trials": [t.seconds for t in result.trials]}, f)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *args],
        cwd=cwd,
        # this checkout's plugin, whatever the environment has installed
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _build_tiny_llama(cache: Path) -> None:
    """Once, before the ranks would race for it; in a process of its own, since pytester
    drops the modules a test imported, which would leave transformers half-imported."""
    if tiny_model_dir("tiny-llama", cache).is_dir():  # builds appear whole (renamed)
        return
    code = "from pytest_llmenergy.llm.tiny import ensure_tiny_model as e; e('tiny-llama')"
    subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT), "LLMENERGY_CACHE": str(cache)},
        check=True,
        timeout=300,
    )


def _node_tree(root: Path, package_w: float, dram_w: float) -> FakePowercap:
    package = FakeZone("package-0", PowerTrace([(1.0, package_w)]))
    dram = FakeZone("dram", PowerTrace([(1.0, dram_w)]))
    return FakePowercap(root, {0: (package, [dram])}).start()


def test_two_nodes_run_tiny_llama_tensor_parallel_and_rank_0_keeps_both_nodes_energy(
    pytester: pytest.Pytester, tiny_cache: Path
) -> None:
    _build_tiny_llama(tiny_cache)
    pytester.makepyfile(test_tp=TP_TEST)
    port = _free_port()
    common = [
        "--nnodes=2",
        "--nproc-per-node=1",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
    ]
    pytest_args = [
        "-m",
        "pytest",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--llm-parallel=tp",
        "--energy-backend=rapl",
        "--energy-warmup=0",
        "--energy-min-trials=2",
        "--energy-max-trials=2",
        "--energy-json=run.json",
        "--energy-count-work",
    ]
    trees = [
        _node_tree(pytester.path / "node0", 10.0, 2.0),
        _node_tree(pytester.path / "node1", 20.0, 3.0),
    ]
    try:
        launches = [
            _torchrun(
                [*common, f"--node-rank={node}", *pytest_args],
                pytester.path,
                {
                    "LLMENERGY_POWERCAP_ROOT": str(pytester.path / f"node{node}"),
                    "LLMENERGY_CACHE": str(tiny_cache),
                },
            )
            for node in (0, 1)
        ]
        outputs = [p.communicate(timeout=300)[0] for p in launches]
    finally:
        for tree in trees:
            tree.stop()
    assert [p.returncode for p in launches] == [0, 0], outputs
    # the model really was split: each rank holds half of the query projection's rows
    ranks = [json.loads((pytester.path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rows"] * 2 for r in ranks] == [r["all_rows"] for r in ranks]
    # every rank ran the same trials (lockstep): the same merged times
    assert ranks[0]["trials"] == ranks[1]["trials"]
    # rank 0 alone shows the table and keeps the run
    assert "energy per token" in outputs[0] and "energy per token" not in outputs[1]
    run = json.loads((pytester.path / "run.json").read_text())
    layout = run["machine"]["distributed"]
    assert (layout["world_size"], layout["nodes"], layout["ranks_per_node"]) == (2, 2, 1)
    assert layout["parallel"] == "tp"
    assert [r["domains"][:2] for r in layout["ranks"]] == [
        ["cpu:package-0@node0", "cpu:dram-0@node0"],
        ["cpu:package-0@node1", "cpu:dram-0@node1"],
    ]
    # each node's energy is its own tree's power x the time its own meter measured (the
    # trials are the only windows here); the job's time is the slower node's
    # trials and the fake trees' resolution (their writer's longest gap, at each edge)
    by_node, node_s = layout["energy_by_node_j"], layout["window_s_by_node"]
    windows = sum(len(case["trials"]) for case in run["cases"])
    for node, watts, tree in (("node0", 12.0, trees[0]), ("node1", 23.0, trees[1])):
        resolution_j = watts * 2 * windows * tree.max_gap_s
        assert by_node[node] == pytest.approx(watts * node_s[node], rel=0.01, abs=resolution_j)
    seconds = sum(t["seconds"] for case in run["cases"] for t in case["trials"])
    assert max(node_s.values()) <= seconds * 1.001
    joules = sum(t["joules"] for case in run["cases"] for t in case["trials"])
    assert joules == pytest.approx(by_node["node0"] + by_node["node1"], rel=1e-9)
    # the counted work: each rank's share kept, the job's the sum; split evenly, and
    # together the products of one whole model (counted here in one process)
    work = run["cases"][0]["work"]
    assert len(work["ranks"]) == 2
    assert _flops(work) == pytest.approx(sum(_flops(r) for r in work["ranks"]))
    shares = [_flops(r, "matmul") for r in work["ranks"]]
    assert shares[0] == pytest.approx(shares[1]) and shares[0] > 0
    assert sum(shares) == pytest.approx(_whole_model_matmul_flops(tiny_cache), rel=0.01)


def _flops(work: dict, op_class: str | None = None) -> float:
    return sum(
        o["flops"]
        for phase in ("prefill", "decode")
        for o in work[phase]
        if op_class is None or o["class"] == op_class
    )


def _whole_model_matmul_flops(cache: Path) -> float:
    from pytest_llmenergy.llm.loader import load_model
    from pytest_llmenergy.predict.work_count import count_work

    model = load_model("tiny-llama", cache_dir=cache)
    ids = model.prompt_ids(8)
    work = count_work(lambda: model.generate(ids, 8))
    return work.total("flops", op_class="matmul")


FAULT_TEST = """
import os, signal, time

def test_first(energy_benchmark):
    energy_benchmark(time.sleep, 0.05, input_tokens=1, output_tokens=1)

def test_second(energy_benchmark):
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    energy_benchmark(time.sleep, 0.05, input_tokens=1, output_tokens=1)

def test_third(energy_benchmark):
    energy_benchmark(time.sleep, 0.05, input_tokens=1, output_tokens=1)
"""


def test_a_killed_rank_is_named_and_rank_0_saves_what_was_measured_as_incomplete(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_fault=FAULT_TEST)
    launch = _torchrun(
        [
            "--nproc-per-node=2",
            f"--master-port={_free_port()}",
            "-m",
            "pytest",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "--energy-shuffle=off",
            "--energy-backend=estimate",
            "--energy-min-trials=3",
            "--energy-max-trials=3",
            "--energy-dist-timeout=20",
            "--energy-json=run.json",
        ],
        pytester.path,
        {},
    )
    out = launch.communicate(timeout=200)[0]
    assert launch.returncode != 0
    assert "run incomplete: rank 1 (node 0) stopped answering" in out, out
    run = json.loads((pytester.path / "run.json").read_text())
    assert run["run"]["status"] == "incomplete"
    assert "rank 1 (node 0)" in run["machine"]["distributed"]["fault"]
    assert [c["name"] for c in run["cases"]] == ["test_first"]


REPORT_TEST = """
import time

def test_first(energy_benchmark):
    energy_benchmark(time.sleep, 0.02, input_tokens=4, output_tokens=2)

def test_second(energy_benchmark):
    energy_benchmark(time.sleep, 0.02, input_tokens=8, output_tokens=2)
"""


def test_energy_report_under_torchrun_is_one_report_written_by_rank_0(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("vl_convert")
    pytester.makepyfile(test_report=REPORT_TEST)
    launch = _torchrun(
        [
            "--nproc-per-node=2",
            f"--master-port={_free_port()}",
            "-m",
            "pytest",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "--energy-backend=estimate",
            "--energy-min-trials=2",
            "--energy-max-trials=2",
            "--energy-report=report.html",
        ],
        pytester.path,
        {},
    )
    out = launch.communicate(timeout=200)[0]
    assert launch.returncode == 0, out
    # both ranks ran the session; rank 0 alone wrote the report and announced it
    assert out.count("2 passed") == 2, out
    assert out.count("llmenergy: HTML report of 2 case(s): report.html") == 1, out
    assert [p.name for p in pytester.path.glob("*.html")] == ["report.html"]
    page = (pytester.path / "report.html").read_text()
    assert "test_first" in page and "test_second" in page
    assert "<dd>2 ranks (none) under torchrun</dd>" in page  # the job's layout
