"""The Slurm tier: the job scripts of examples/slurm/ submitted to a real Slurm.

A single-node Slurm started by ``scripts/slurm-local start`` (Debian's slurm-wlm and
munge) takes the jobs: a 3-part array of the quick grid with the dependent job that joins
the parts and gates the joined run against an unsharded session's, the one-node torchrun
job (2 ranks, tensor-parallel, gloo on CPU), and an array cancelled with scancel.  Every
test skips in one line unless the tier is selected (``-m slurm``) and a Slurm node answers;
``LLMENERGY_REQUIRE_SLURM=1`` makes that a failure.  Accounting is off on such a cluster
(sacct has nothing): jobs' states come from ``scontrol show job``, kept for 10 minutes
after their end (MinJobAge in slurm-local's configuration).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "slurm"
BENCHMARKS = ROOT / "benchmarks"
# short runs: two trials a case, no warm-up; the shards disturb each other (and other
# work on the machine disturbs them), which the busy-machine check must not reject
QUICK = [
    "-p",
    "no:randomly",
    "-p",
    "no:cacheprovider",
    "--energy-min-trials=2",
    "--energy-max-trials=2",
    "--energy-warmup=0",
    "--energy-min-time=0",
    "--energy-max-background=1",
]
# how many parts of an array run side by side (1: the machine may be shared; the node
# takes 2 one-CPU jobs at once)
AT_ONCE = int(os.environ.get("LLMENERGY_SLURM_AT_ONCE", "1"))
# the states a job ends in (squeue forgets it then; scontrol keeps it for MinJobAge)
ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


@pytest.fixture(scope="module")
def slurm(request: pytest.FixtureRequest) -> None:
    """A Slurm that takes jobs, else a skip (a failure with LLMENERGY_REQUIRE_SLURM=1)."""
    required = os.environ.get("LLMENERGY_REQUIRE_SLURM") == "1"
    give_up = pytest.fail if required else pytest.skip
    if "slurm" not in (request.config.getoption("markexpr") or "") and not required:
        pytest.skip("Slurm tier: select it with -m slurm (after scripts/slurm-local start)")
    if shutil.which("sbatch") is None:
        give_up("Slurm tier: no sbatch here; scripts/slurm-local start installs and starts one")
    states = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=30
    )
    if states.returncode != 0 or not {"idle", "mixed", "allocated"} & set(states.stdout.split()):
        why = (states.stderr.strip() or states.stdout.strip() or "no node").splitlines()[-1]
        give_up(f"Slurm tier: no node takes jobs ({why}); run scripts/slurm-local start")


@pytest.fixture(scope="module")
def job_env(slurm: None, tiny_cache: Path) -> dict[str, str]:
    """The environment jobs inherit (sbatch's --export=ALL): this checkout's plugin and
    this interpreter, the built-in models built once before the jobs would race for them."""
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "LLMENERGY_CACHE": str(tiny_cache),
        "LLMENERGY_PYTHON": sys.executable,
        "LLMENERGY_SUITE": str(BENCHMARKS),
        "OMP_NUM_THREADS": "1",
    }
    cli = Path(bin_dir) / "llmenergy"
    if cli.exists():
        env["LLMENERGY_CLI"] = str(cli)
    code = (
        "from pytest_llmenergy.llm.grid import TINY_MODEL_NAMES\n"
        "from pytest_llmenergy.llm.tiny import ensure_tiny_model\n"
        "for name in TINY_MODEL_NAMES: ensure_tiny_model(name)"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    return env


def sbatch(*argv: str, env: dict[str, str], cwd: Path) -> str:
    """Submit one of examples/slurm/ as a user would (sbatch's options, the script, its
    arguments): its job id."""
    done = subprocess.run(
        ["sbatch", "--parsable", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


# an array's tasks that never started share one record, named by their range while they
# wait (ArrayTaskId=2-3%1) and by none once they have ended (4294967294): as Slurm's own
# listings do, it is named by the range it was last seen with (``12_[2-3]``)
_WAITING: dict[str, str] = {}
NO_TASK = "4294967294"


def states(job: str) -> dict[str, str]:
    """Each task's state as Slurm reports it (``scontrol show job``): ``{"12": ...}`` for
    a job, ``{"12_1": ..., "12_[2-3]": ...}`` for an array's tasks."""
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30
    )
    found = {}
    for line in shown.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        task = fields.get("ArrayTaskId")
        if task is None:
            found[fields["JobId"]] = fields["JobState"]
            continue
        if task == NO_TASK:
            task = _WAITING.get(fields["JobId"], "?")
        elif not task.isdigit():
            task = _WAITING[fields["JobId"]] = task.split("%")[0]
        name = task if task.isdigit() else f"[{task}]"
        found[f"{fields['ArrayJobId']}_{name}"] = fields["JobState"]
    return found


def wait_for(jobs: list[str], timeout_s: float) -> dict[str, str]:
    """Poll until every task of ``jobs`` has ended: their final states.  At the timeout
    the jobs are cancelled and the test fails with what each was doing."""
    deadline = time.monotonic() + timeout_s
    while True:
        now: dict[str, str] = {}
        for job in jobs:
            now.update(states(job))
        pending = [s for s in now.values() if s not in ENDED]
        if now and not pending:
            # for the log (-rP): the jobs' ends as Slurm reports them
            print("slurm:", ", ".join(f"{task} {state}" for task, state in sorted(now.items())))
            return now
        if time.monotonic() > deadline:
            subprocess.run(["scancel", *jobs], timeout=30)
            pytest.fail(f"Slurm jobs still not ended after {timeout_s:.0f} s: {now}")
        time.sleep(2)


def case_ids(path: Path) -> list[str]:
    return [case["nodeid"] for case in json.loads(path.read_text())["cases"]]


def test_the_one_node_torchrun_example_runs_two_ranks_tensor_parallel(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    job = sbatch(
        str(EXAMPLES / "energy-one-node.sbatch"),
        *QUICK,
        "--llm-input-tokens=8",
        "--llm-output-tokens=8",
        env=job_env,
        cwd=tmp_path,
    )
    assert wait_for([job], timeout_s=600) == {job: "COMPLETED"}
    out = (tmp_path / f"llmenergy-{job}.out").read_text()
    assert "2 ranks on 1 node(s)" in out
    (saved,) = (tmp_path / ".llmenergy").glob("*/0001_tp-1node-2ranks.json")
    run = json.loads(saved.read_text())
    assert run["run"]["status"] == "complete"
    layout = run["machine"]["distributed"]
    assert (layout["world_size"], layout["nodes"], layout["parallel"]) == (2, 1, "tp")
    assert len(run["cases"]) == 2 and all(len(c["trials"]) == 2 for c in run["cases"])
    # rank 0 alone printed the tables
    assert out.count("sweep output · model tiny-llama") == 1


def test_a_cancelled_array_keeps_its_finished_cases_and_the_merge_names_what_is_missing(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    """Part 1 cancelled once it has saved a case, parts 2 and 3 before they start: the
    merge job (afterany) fails naming all three; with LLMENERGY_PARTIAL=1 it joins what
    part 1 saved."""
    array = sbatch(
        "--array=1-3%1", str(EXAMPLES / "grid-shards.sbatch"), *QUICK, env=job_env, cwd=tmp_path
    )
    merge_env = {**job_env, "LLMENERGY_PARTIAL": "0"}
    merge = sbatch(
        f"--dependency=afterany:{array}",
        f"--export=ALL,LLMENERGY_SHARDS_JOB={array}",
        str(EXAMPLES / "merge-shards.sbatch"),
        env=merge_env,
        cwd=tmp_path,
    )
    partial = sbatch(
        f"--dependency=afterany:{merge}",
        f"--export=ALL,LLMENERGY_SHARDS_JOB={array},LLMENERGY_PARTIAL=1",
        str(EXAMPLES / "merge-shards.sbatch"),
        env=merge_env,
        cwd=tmp_path,
    )
    part = tmp_path / "llmenergy-shards" / array / "shard-1.json"
    deadline = time.monotonic() + 600
    while not (part.exists() and case_ids(part)):  # written whole after each case
        assert time.monotonic() < deadline, f"no case saved by {array}_1: {states(array)}"
        time.sleep(1)
    assert states(array) == {f"{array}_1": "RUNNING", f"{array}_[2-3]": "PENDING"}
    subprocess.run(["scancel", f"{array}_[2-3]"], check=True, timeout=30)
    subprocess.run(["scancel", f"{array}_1"], check=True, timeout=30)
    ended = wait_for([array, merge, partial], timeout_s=300)
    assert ended == {
        f"{array}_1": "CANCELLED",
        f"{array}_[2-3]": "CANCELLED",
        merge: "FAILED",
        partial: "COMPLETED",
    }
    saved = json.loads(part.read_text())
    assert saved["run"]["status"] == "running"  # killed: its last write, kept whole
    assert saved["cases"] and all(case["trials"] for case in saved["cases"])
    said = (tmp_path / f"llmenergy-merge-{merge}.out").read_text()
    assert "shard 2/3, 3/3 missing; shard 1/3 ended early" in said, said
    assert f"{len(saved['cases'])} case(s) saved" in said
    joined = json.loads((part.parent / "grid.json").read_text())
    assert joined["run"]["status"] == "interrupted"
    assert case_ids(part.parent / "grid.json") == case_ids(part)


def test_a_three_part_array_and_its_merge_job_make_the_unsharded_sessions_cases(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    """The quick grid once unsharded (the saved baseline), then as a 3-part array whose
    merge job joins the parts and gates the joined run against the baseline."""
    baseline = tmp_path / "unsharded.json"
    whole = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(BENCHMARKS),
            "--llm-grid=quick",
            *QUICK,
            f"--energy-json={baseline}",
        ],
        cwd=tmp_path,
        env=job_env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert whole.returncode == 0, whole.stdout[-3000:]
    array = sbatch(
        f"--array=1-3%{AT_ONCE}",
        str(EXAMPLES / "grid-shards.sbatch"),
        *QUICK,
        env=job_env,
        cwd=tmp_path,
    )
    merge = sbatch(
        f"--dependency=afterany:{array}",
        f"--export=ALL,LLMENERGY_SHARDS_JOB={array}",
        str(EXAMPLES / "merge-shards.sbatch"),
        env={
            **job_env,
            "LLMENERGY_BASELINE": str(baseline),
            # two trials a case on a shared machine: a loose gate, but a real one (its
            # table is printed and its exit code is the job's)
            "LLMENERGY_GATE": "j_per_token:50%",
        },
        cwd=tmp_path,
    )
    ended = wait_for([array, merge], timeout_s=1800)
    assert ended == {
        f"{array}_1": "COMPLETED",
        f"{array}_2": "COMPLETED",
        f"{array}_3": "COMPLETED",
        merge: "COMPLETED",
    }
    joined = case_ids(tmp_path / "llmenergy-shards" / array / "grid.json")
    unsharded = case_ids(baseline)
    assert len(unsharded) == 18
    assert len(joined) == len(set(joined)) and sorted(joined) == sorted(unsharded)
    parts = [case_ids(tmp_path / "llmenergy-shards" / array / f"shard-{i}.json") for i in (1, 2, 3)]
    assert all(parts) and sum(map(len, parts)) == 18
    said = (tmp_path / f"llmenergy-merge-{merge}.out").read_text()
    assert "the shards of one grid joined into one run, 18 cases" in said, said
    assert "j_per_token" in said or "J/token" in said, said
