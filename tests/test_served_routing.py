"""``llmenergy route`` from served workloads: each system's requests with their attributed
joules, routed on their lengths, beside the one-at-a-time cases when a run holds both.

Two kinds of truth: requests whose joules follow a known line exactly (the threshold is
then a formula), and two stand-in engines of known step costs replayed with the same
Alpaca workload (the threshold from the attributed joules against the one from each
request's true joules, tests/fakes/batch_engine.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pytest_llmenergy.results import CaseResult, RequestRecord
from pytest_llmenergy.routing import INPUT
from pytest_llmenergy.routing.decide import RouteSettings, route
from pytest_llmenergy.routing.profile import Profile, profiles_from_cases
from pytest_llmenergy.routing.served import served_profiles_from_cases
from pytest_llmenergy.routing.workload import Workload
from pytest_llmenergy.serving.client import Endpoint
from pytest_llmenergy.serving.replay import run_workload
from pytest_llmenergy.serving.workload_plan import draw, parse_workload
from tests.casefactory import make_case
from tests.fakes.batch_engine import BatchEngine, StepCosts
from tests.fakes.fake_openai_server import Behaviour, FakeServer
from tests.fakes.scripted import TraceMeter
from tests.test_cli import HW_A, HW_B, cli, save
from tests.test_request_energy import prompt_for, truths

OUT = 32  # the one-at-a-time input sweep's output length


@dataclasses.dataclass(frozen=True)
class Machine:
    """A request's joules above idle: prefill J/token x input + decode J/token x output."""

    prefill_j: float
    decode_j: float

    def joules(self, n_in: int, n_out: int) -> float:
        return self.prefill_j * n_in + self.decode_j * n_out


# A: dear prefill, cheap decode; B the reverse.
LINE_A, LINE_B = Machine(0.06, 0.20), Machine(0.01, 0.26)


def lengths(n: int = 150, seed: int = 4) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return [(int(a), int(b)) for a, b in zip(rng.integers(10, 200, n), rng.integers(5, 120, n))]


def record(n_in: int, n_out: int, joules: float, status: str = "") -> RequestRecord:
    """A served request whose joules are 20 % prefill, 80 % decode."""
    return RequestRecord(
        0.05, 0.01 * n_out + 0.1, n_out, n_in, 0.0, status, 0.2 * joules, 0.8 * joules
    )


def served_case(requests: Sequence[RequestRecord], seconds: float = 30.0) -> CaseResult:
    """A workload case as ``llm_workload`` records it: one trial, every request in it."""
    trial = dataclasses.replace(make_case([seconds]).trials[0], requests=tuple(requests))
    case = make_case([seconds], sweep="workload")
    return dataclasses.replace(case, trials=(trial,), input_tokens=10_000, output_tokens=5_000)


def alone_cases(joules_of: Machine | None, decode_alone_j: float) -> list[CaseResult]:
    """An input sweep at ``OUT`` output tokens, each query alone (3 trials of 1 s)."""
    line = joules_of or Machine(0.0, 0.0)
    return [
        make_case(
            [1.0] * 3,
            input_tokens=n,
            output_tokens=OUT,
            watts=line.prefill_j * n + decode_alone_j * OUT,
        )
        for n in (8, 16, 32, 64, 128, 256, 512)
    ]


def threshold(out: str, measured: str) -> int | None:
    """The input threshold of the JSON decision measured so."""
    (decision,) = [d for d in json.loads(out) if d["measured"] == measured]
    return decision["policy"]["rules"][0].get("max_input_tokens")


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "queries.csv"
    path.write_text("input_tokens,output_tokens\n" + "".join(f"{n},40\n" for n in range(1, 801)))
    return path


# -- a known line ------------------------------------------------------------------------
def line_threshold(a: Machine, b: Machine, fixed: int) -> float:
    """Where A's joules at ``fixed`` output tokens meet B's: A takes inputs up to it."""
    return (b.decode_j - a.decode_j) * fixed / (a.prefill_j - b.prefill_j)


def test_the_served_threshold_is_where_the_systems_joules_cross(
    tmp_path: Path, workload: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sizes = lengths()
    root = tmp_path / "store"
    for hw, line in ((HW_A, LINE_A), (HW_B, LINE_B)):
        save(root, [served_case([record(i, o, line.joules(i, o)) for i, o in sizes])], hardware=hw)
    code, out, _ = cli(
        capsys, "route", "--profile", f"{HW_A}/0001", "--profile", f"{HW_B}/0001",
        "--workload", workload, "--format", "json", "--storage", root,
    )  # fmt: skip
    assert code == 0
    fixed = round(np.mean([o for _, o in sizes]))
    truth = line_threshold(LINE_A, LINE_B, fixed)
    assert threshold(out, "served workload") == pytest.approx(truth, abs=1)


def test_served_and_one_at_a_time_thresholds_side_by_side(
    tmp_path: Path, workload: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Alone, a query pays the whole decode step (B's dearer weights' reads): B takes
    only the long prompts.  In a batch of about 5 it pays a fifth, and B wins sooner."""
    sizes = lengths()
    alone_a, alone_b = 0.8 + 0.05, 1.1 + 0.05  # J per decode step, a batch of one
    root = tmp_path / "store"
    for hw, line, alone in ((HW_A, LINE_A, alone_a), (HW_B, LINE_B, alone_b)):
        served = served_case([record(i, o, line.joules(i, o)) for i, o in sizes])
        save(root, [*alone_cases(line, alone), served], hardware=hw)
    args = ("route", "--profile", f"{HW_A}/0001", "--profile", f"{HW_B}/0001",
            "--workload", workload, "--storage", root)  # fmt: skip
    code, out, _ = cli(capsys, *args, "--format", "json")
    assert code == 0
    alone_truth = (alone_b - alone_a) * OUT / (LINE_A.prefill_j - LINE_B.prefill_j)
    # between the measured 128 and 256 tokens the one-at-a-time curve is a power law
    assert threshold(out, "one at a time") == pytest.approx(alone_truth, rel=0.05)
    fixed = round(np.mean([o for _, o in sizes]))
    served_truth = line_threshold(LINE_A, LINE_B, fixed)
    assert threshold(out, "served workload") == pytest.approx(served_truth, abs=1)
    code, text, _ = cli(capsys, *args)
    assert code == 0
    assert "thresholds from one-at-a-time cases and from a served workload" in text
    assert "(served workload): by input" in text
    assert "net of idle power" in text


def test_failed_and_unattributed_requests_are_left_out_and_said(
    tmp_path: Path, workload: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sizes = lengths()
    root = tmp_path / "store"
    for hw, line in ((HW_A, LINE_A), (HW_B, LINE_B)):
        requests = [record(i, o, line.joules(i, o)) for i, o in sizes]
        requests += [
            record(50, 10, 5.0, status="failed after 3 tokens: HTTP 500"),
            record(60, 10, -0.5),  # net of idle, below zero
            RequestRecord(0.05, 0.2, 10, 70, 0.0, "", None, None),  # not attributed
        ]
        save(root, [served_case(requests)], hardware=hw)
    code, out, _ = cli(
        capsys, "route", "--profile", f"{HW_A}/0001", "--profile", f"{HW_B}/0001",
        "--workload", workload, "--storage", root,
    )  # fmt: skip
    assert code == 0
    assert "3 requests left out (failed, cut, or not above idle)" in out
    assert "Traceback" not in out


def test_a_workload_case_is_never_routed_as_one_query() -> None:
    served = served_case([record(i, o, LINE_A.joules(i, o)) for i, o in lengths(20)])
    cases = [*alone_cases(LINE_A, 0.85), served]
    (alone,) = profiles_from_cases(cases, "A", "")
    assert max(p.input_tokens for p in alone.points) == 512  # not the workload's 10,000
    (profile,) = served_profiles_from_cases(cases, "A", "")
    assert profile.served and sum(p.trials for p in profile.points) == 20


def test_the_requests_seconds_add_up_to_the_window() -> None:
    served = served_case([record(i, o, LINE_A.joules(i, o)) for i, o in lengths(30)], 12.5)
    (profile,) = served_profiles_from_cases([served], "A", "")
    assert math.fsum(s for p in profile.points for s in p.seconds) == pytest.approx(12.5)


# -- two stand-in engines ------------------------------------------------------------------
# Same steps as tests/test_request_energy.py (long enough for threads to stream on time);
# A's prefill is dear and its decode step cheap, B the reverse.
ENGINE_A = StepCosts(step_s=0.012, prefill_base_s=0.003, prefill_j_per_token=0.16, step_j=0.8)
ENGINE_B = StepCosts(step_s=0.012, prefill_base_s=0.003, prefill_j_per_token=0.01, step_j=1.6)
WORKLOAD = "alpaca:rate=13,requests=120,scale=0.5,seed=2"


@dataclasses.dataclass(frozen=True)
class Replayed:
    """A workload on a stand-in engine: its requests as attributed, the same requests with
    their true joules, the window's seconds and the engine's mean decode batch (the mean
    over its decode steps: a decode token pays ``step_j`` / it)."""

    attributed: list[RequestRecord]
    true: list[RequestRecord]
    window_s: float
    batch: float

    def profiles(self, system: str, true: bool = False) -> list[Profile]:
        case = served_case(self.true if true else self.attributed, self.window_s)
        return served_profiles_from_cases([case], system, "")


def replayed(costs: StepCosts) -> Replayed:
    """``WORKLOAD`` on a stand-in engine, metered by a counter on its trace."""
    engine = BatchEngine(costs)
    meter = TraceMeter({"gpu:0": engine.trace})
    meter.measure_idle(0.1)
    try:
        with FakeServer(Behaviour(engine=engine)) as server:
            endpoint = Endpoint(server.url, "fake-model", timeout_s=30)
            plan = draw(parse_workload(WORKLOAD))
            run = run_workload(meter, endpoint, plan, prompt_for, slice_s=0.05)
    finally:
        engine.stop()
    truth = truths(engine, len(run.requests))
    true = [
        dataclasses.replace(q, prefill_j=t.prefill_j, decode_j=t.decode_j)
        for q, t in zip(run.requests, truth)
    ]
    window_s = max((q.sent_s or 0.0) + q.latency_s for q in run.requests)
    decode_j = sum(t.decode_j for t in truth) / sum(t.steps for t in truth)
    batch = costs.step_j / (decode_j - costs.step_j_per_request)  # per decode step
    return Replayed(list(run.requests), true, window_s, batch)


def served_threshold(profiles: Sequence[Profile], workload: Workload) -> int | None:
    (routed,) = route(profiles, workload, RouteSettings(by=INPUT))
    return routed.decision.policy.rules[0].max_input_tokens


def test_two_stand_in_engines_give_the_threshold_their_true_joules_give() -> None:
    a, b = replayed(ENGINE_A), replayed(ENGINE_B)
    n = np.arange(1, 801)
    workload = Workload("queries", n, np.full_like(n, 40))
    found = served_threshold([*a.profiles("A"), *b.profiles("B")], workload)
    truth = served_threshold([*a.profiles("A", true=True), *b.profiles("B", true=True)], workload)
    # by hand: a decode token costs step_j / batch + step_j_per_request
    fixed = round(np.mean([q.output_tokens for q in a.attributed if not q.status]))
    decode_a = ENGINE_A.step_j / a.batch + ENGINE_A.step_j_per_request
    decode_b = ENGINE_B.step_j / b.batch + ENGINE_B.step_j_per_request
    prefill = ENGINE_A.prefill_j_per_token - ENGINE_B.prefill_j_per_token
    by_hand = (decode_b - decode_a) * (fixed - 1) / prefill
    alone = (ENGINE_B.step_j - ENGINE_A.step_j) * (fixed - 1) / prefill
    print(
        f"served threshold: attributed {found} input tokens, true joules {truth}, by hand "
        f"{by_hand:.1f} (batches {a.batch:.2f} and {b.batch:.2f}); alone {alone:.0f}"
    )
    assert found == pytest.approx(truth, rel=0.1, abs=2)
    assert truth == pytest.approx(by_hand, rel=0.25)
    assert found < alone / 2  # batching moved the threshold, by far
