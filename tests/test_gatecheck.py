"""What a runner's gate can see: the judging of gatecheck's sessions, and the injected
regression it measures with."""

from __future__ import annotations

import json
import random
import re
import statistics
import time
from pathlib import Path

import pytest

from pytest_llmenergy import gatecheck
from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import parse_gates
from pytest_llmenergy.storage.runfile import dumps
from tests.test_sessions import run_of, session


def sessions_of(sigma: float, rounds: int = 2, seed: int = 5) -> list[gatecheck.Session]:
    """gatecheck's schedule, with simulated sessions: +50 % injected really +50 %."""
    rng = random.Random(seed)
    out = []
    for r, share in gatecheck.schedule(rounds, [0.5]):
        run = run_of(session(rng, sigma, 1.0 + share), f"s{len(out)}")
        out.append(gatecheck.Session(gatecheck.share_text(share), share, r, run, 10.0))
    return out


def test_schedule_is_a_then_each_size_then_a_per_round() -> None:
    assert gatecheck.schedule(2, [0.1, 0.5]) == [
        (1, 0.0), (1, 0.1), (1, 0.5), (1, 0.0),
        (2, 0.0), (2, 0.1), (2, 0.5), (2, 0.0),
    ]  # fmt: skip


def test_judging_a_quiet_runner_finds_the_regression_and_no_false_alarm() -> None:
    outcomes, times = gatecheck.judge(
        sessions_of(0.02), parse_gates("j_per_token:5%"), confidence=0.95, session_noise=0.02
    )
    assert set(outcomes) == {"single", "single+history", "2 rounds"}
    for by in outcomes.values():
        assert by["A"].any_fail == 0
        assert by["+50%"].case_share >= 0.9
    assert outcomes["single"]["A"].comparisons == 6  # every earlier A against every later
    assert times["2 rounds"] == pytest.approx(4 * 10.0)


def test_a_noisy_runner_is_told_it_sees_little() -> None:
    """Sessions differing by 30 %, assumed so: no false alarm, and the table says the
    smallest regression it could see is large."""
    got = gatecheck.judge(
        sessions_of(0.3), parse_gates("j_per_token:5%"), confidence=0.95, session_noise=0.3
    )[0]["single"]["A"]
    assert got.any_fail == 0
    assert min(got.detectable) > 0.5


def test_judge_only_reads_an_earlier_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = []
    for i, s in enumerate(sessions_of(0.02)):
        name = f"{i:03d}.json"
        (tmp_path / name).write_text(dumps(s.run))
        rows.append({"file": name, "label": s.label, "injected": s.injected, "round": s.round,
                     "seconds": 10.0})  # fmt: skip
    (tmp_path / "sessions.json").write_text(json.dumps(rows))
    argv = ["gatecheck", "--out", str(tmp_path), "--judge-only", "--session-noise", "2%"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "what this runner's energy gate can see" in out
    assert re.search(r"found \+50% \(real \+(4[89]|5[012])%\)", out)  # +50 % and noise
    assert main(["gatecheck", "--out", str(tmp_path / "none"), "--judge-only"]) == 2
    assert "not a gatecheck folder" in capsys.readouterr().err


def test_the_injected_regression_adds_its_share_of_the_forward_pass() -> None:
    """Two copies of one layer, one injected, timed in turns on one math thread: the
    machine's load moves both alike (timed apart, a busy spell between them read +15 %
    for the +50 % injected), and no worker thread spins into the CPU time."""
    torch = pytest.importorskip("torch")
    import copy

    from pytest_llmenergy.llm.inject import inject_regression

    torch.manual_seed(0)
    # a pass long enough (about 1 ms) that the hooks' own cost stays out of the ratio
    plain = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU())
    injected = copy.deepcopy(plain)
    inject_regression(injected, 0.5)
    x = torch.randn(256, 512)

    def cpu_s(model: object) -> float:
        start = time.process_time()
        with torch.no_grad():
            for _ in range(100):
                model(x)  # type: ignore[operator]
        return time.process_time() - start

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cpu_s(plain), cpu_s(injected)  # warm
        ratios = [cpu_s(injected) / cpu_s(plain) for _ in range(5)]
    finally:
        torch.set_num_threads(threads)
    assert 1.4 <= statistics.median(ratios) <= 1.8  # +50 % of each pass's own CPU time


def paired_runs(sigma: float, share: float, seed: int) -> gatecheck.PairedRun:
    """One simulated paired run: both sides share each pair's speed (which moves by
    ``sigma``), head slower by ``share``; trials agree within 1 %."""
    import dataclasses

    from tests.casefactory import make_case

    rng = random.Random(seed)
    sides: dict[str, list] = {"base": [], "head": []}
    for i in range(6):
        speeds = [(1.0 + i / 10) * (1 + rng.gauss(0.0, sigma)) for _ in range(8)]
        for side, factor in (("base", 1.0), ("head", 1.0 + share)):
            case = make_case([s * factor * (1 + rng.gauss(0, 0.01)) for s in speeds],
                             input_tokens=8 * (i + 1))  # fmt: skip
            trials = tuple(dataclasses.replace(t, pair=k) for k, t in enumerate(case.trials, 1))
            sides[side].append(dataclasses.replace(case, trials=trials))
    base, head = (
        dataclasses.replace(run_of(sides[s], s), pairing={"id": f"x{seed}", "side": s})
        for s in ("base", "head")
    )
    return gatecheck.PairedRun(gatecheck.share_text(share), share, 1, base, head, 25.0)


def test_gatecheck_judges_paired_runs_beside_the_sessions() -> None:
    """Pairs whose speed moves by 20 % cancel it: A/A never fails, +10 % is found, and the
    paired row says what a paired run costs."""
    paired = [paired_runs(0.2, 0.0, 1), paired_runs(0.2, 0.0, 2), paired_runs(0.2, 0.1, 3)]
    sessions = [s for s in sessions_of(0.02) if s.injected in (0.0, 0.5)]
    outcomes, times = gatecheck.judge(
        sessions, parse_gates("j_per_token:5%"), confidence=0.95, paired=paired
    )
    row = outcomes[gatecheck.PAIRED]
    assert row["A"].comparisons == 2 and row["A"].any_fail == 0
    assert row["+10%"].case_share == 1.0
    assert times[gatecheck.PAIRED] == pytest.approx(25.0)
    assert all(d <= 0.1 for d in row["A"].detectable)
