"""Gates divide CPU-measured figures by each session's machine speed (compare.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_llmenergy.cli import main
from pytest_llmenergy.compare import (
    BUSY,
    FAIL,
    MIN_SPEED_CASES,
    compare_cases,
    evidence_line,
    parse_gates,
    session_speeds,
)
from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.storage.pool import pool_cases
from pytest_llmenergy.storage.runfile import Run, dumps
from tests.casefactory import make_case

GATES = parse_gates("j_per_token:5%")
SIZES = (8, 16, 32, 64, 128, 256)


def cpu_case(seconds: list[float], reference_s: float, input_tokens: int) -> CaseResult:
    """A case measured on the CPU only (the estimate meter's domain)."""
    case = make_case(seconds, input_tokens=input_tokens)
    return replace(
        case,
        counted={"cpu:process": True},
        methods={"cpu:process": "estimated"},
        reference_s=reference_s,
    )


def session(work: float, machine: float, *, gpu: bool = False) -> list[CaseResult]:
    """Six cases: ``work`` scales the code's cost, ``machine`` the machine's slowness
    (times and the speed reference alike)."""
    cases = []
    for i, n in enumerate(SIZES):
        base_s = 0.1 * (1 + i) * work * machine
        seconds = [base_s * (1 + d) for d in (-0.01, 0.0, 0.01, 0.005)]
        case = cpu_case(seconds, 0.005 * machine, n)
        cases.append(make_case(seconds, input_tokens=n) if gpu else case)
    return cases


def test_a_slower_machine_alone_does_not_fail_the_gate() -> None:
    base, head = session(1.0, 1.0), session(1.0, 1.3)
    raw = compare_cases(base, head, gates=GATES, session_noise=0.05, normalize=False)
    assert raw.failed and len(raw.failures) == len(SIZES)  # what it was before
    norm = compare_cases(base, head, gates=GATES, session_noise=0.05)
    assert not norm.failed
    assert all(abs(d.speed - 1.3) < 1e-9 for d in norm.deltas)
    assert "normalized by the machine's speed" in evidence_line(norm)
    assert "+30%" in norm.speed_note


def test_a_regression_is_found_at_any_machine_speed() -> None:
    base = session(1.0, 1.0)
    same_speed = compare_cases(base, session(1.3, 1.0), gates=GATES, session_noise=0.05)
    assert len(same_speed.failures) == len(SIZES)
    # +30 % of work on a machine 30 % faster: the raw figures barely move
    faster = session(1.3, 1 / 1.3)
    raw = compare_cases(base, faster, gates=GATES, session_noise=0.05, normalize=False)
    assert not raw.failed
    norm = compare_cases(base, faster, gates=GATES, session_noise=0.05)
    assert len(norm.failures) == len(SIZES)
    assert all(abs(d.test.log_ratio - 0.2624) < 1e-3 for d in norm.deltas if d.test)


def test_gpu_figures_and_few_cases_are_left_as_measured() -> None:
    gpu = compare_cases(
        session(1.0, 1.0, gpu=True), session(1.0, 1.3, gpu=True), gates=GATES, session_noise=0.05
    )
    assert gpu.failed and all(d.speed == 1.0 for d in gpu.deltas) and not gpu.speed_note
    few = MIN_SPEED_CASES - 1
    small = compare_cases(
        session(1.0, 1.0)[:few], session(1.0, 1.3)[:few], gates=GATES, session_noise=0.05
    )
    assert small.failed and all(d.speed == 1.0 for d in small.deltas)


def test_pooled_sessions_keep_their_own_speeds() -> None:
    slow, quick = session(1.0, 1.2), session(1.0, 1.0)
    pooled = [pool_cases([a, b]) for a, b in zip(slow, quick)]
    speeds = session_speeds(pooled)
    assert set(speeds) == {1, 2}
    assert speeds[1] - speeds[2] == pytest.approx(0.1823, abs=1e-3)  # log 1.2
    # every trial carries its case's reference, so a merged run still knows it
    assert {t.reference_s for t in pooled[0].trials} == {0.005 * 1.2, 0.005}


def test_a_few_disturbed_trials_do_not_blind_the_gate() -> None:
    base = session(1.0, 1.0)
    head = session(1.3, 1.0)
    extra = replace(head[0].trials[0], index=99, background_cpu=0.7)
    one = [replace(head[0], disturbed=(extra,)), *head[1:]]  # 1 of 4 kept trials
    assert compare_cases(base, one, gates=GATES, session_noise=0.05).deltas[0].verdict == FAIL
    two = [replace(head[0], disturbed=(extra, replace(extra, index=98))), *head[1:]]
    assert compare_cases(base, two, gates=GATES, session_noise=0.05).deltas[0].verdict == BUSY


def test_llmenergy_compare_normalizes_on_the_same_hardware_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def write(name: str, hardware: str, cases: list[CaseResult]) -> Path:
        run = Run("", name, "2026-01-01T00:00:00Z", "complete", hardware, {}, {}, {}, {})
        path = tmp_path / f"{name}.json"
        path.write_text(dumps(dataclasses.replace(run, cases=tuple(cases))))
        return path

    base = write("base", "hw", session(1.0, 1.0))
    slower = write("slower", "hw", session(1.0, 1.3))
    elsewhere = write("elsewhere", "other-hw", session(1.0, 1.3))
    argv = ["compare", "--fail-on", "j_per_token:5%", "--session-noise", "5%", base]
    assert main([*map(str, argv), str(slower)]) == 0  # the machine, not the code
    assert "normalized by the machine's speed" in capsys.readouterr().out
    # another machine: its speed is what is compared
    assert main([*map(str, argv), str(elsewhere)]) == 1
    assert "normalized" not in capsys.readouterr().out
