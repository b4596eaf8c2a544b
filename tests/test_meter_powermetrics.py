"""The powermetrics meter: its parser on a recorded stream, and the whole meter driving a
real subprocess that replays that stream (tests/fakes/fake_powermetrics.py).

The recording's values are listed in tests/data/powermetrics/README.md and in ``ROWS``
below; the replay logs the ``time.perf_counter`` interval each sample stands for, so the
true energy of any window is known independently of the meter.
"""

from __future__ import annotations

import json
import os
import plistlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from pytest_llmenergy.errors import MeterError, MeterUnavailable
from pytest_llmenergy.meters import open_meter
from pytest_llmenergy.meters.powermetrics import (
    CPU_ALL,
    CPU_PROCESS,
    DOMAINS,
    GPU,
    PACKAGE,
    PlistStreamDecoder,
    PowermetricsMeter,
    decode_sample,
    default_command,
    parse_sample,
    powermetrics_args,
)
from pytest_llmenergy.meters.readings import Reading

HERE = Path(__file__).resolve().parent
RECORDING = HERE / "data" / "powermetrics" / "m1pro_200ms.plist-stream"
FAKE = HERE / "fakes" / "fake_powermetrics.py"

RECORDED_PID, RECORDED_CHILD_PID, RECORDED_POWERMETRICS_PID = 41357, 41362, 41377
# k -> (elapsed_ns, CPU mW, GPU mW, EI process, EI child, EI all other tasks)
ROWS = [
    (201523458, 1850.0, 96.0, 12.0, 3.0, 15.0),
    (203117917, 7420.0, 1250.0, 96.0, 24.0, 40.0),
    (200842375, 9815.0, 3480.0, 150.0, 30.0, 20.0),
    (202264042, 9640.0, 3512.0, 144.0, 36.0, 20.0),
    (201907625, 5210.0, 8875.0, 60.0, 12.0, 48.0),
    (200631500, 5085.0, 9010.0, 63.0, 9.0, 48.0),
    (204018333, 5160.0, 8940.0, 56.0, 16.0, 48.0),
    (201166208, 4990.0, 9120.0, 66.0, 6.0, 48.0),
    (202771958, 2400.0, 310.0, 20.0, 4.0, 16.0),
    (200919875, 1230.0, 64.0, 6.0, 2.0, 12.0),
]
POWERMETRICS_EI_FRACTION = 0.15  # of the other tasks' energy impact
SHARES = [0.5, 0.75, 0.9, 0.9, 0.6, 0.6, 0.6, 0.6, 0.6, 0.4]  # (process + child) / all


def share(k: int, *, child: bool = True, powermetrics: bool = False) -> float:
    _, _, _, ours, kid, others = ROWS[k]
    mine = (
        ours + (kid if child else 0.0) + (others * POWERMETRICS_EI_FRACTION if powermetrics else 0)
    )
    return mine / (ours + kid + others)


def truth_w(domain: str) -> Callable[[int], float]:
    """The true power of a domain in recorded sample k, from the table alone."""
    table: dict[str, Callable[[int], float]] = {
        CPU_PROCESS: lambda k: ROWS[k][1] * share(k) / 1000,
        GPU: lambda k: ROWS[k][2] / 1000,
        CPU_ALL: lambda k: ROWS[k][1] / 1000,
        PACKAGE: lambda k: (ROWS[k][1] + ROWS[k][2]) / 1000,
    }
    return table[domain]


def recorded_frames() -> list[bytes]:
    return PlistStreamDecoder().feed(RECORDING.read_bytes())


def fake_command(*extra: str) -> list[str]:
    return [sys.executable, str(FAKE), "--file", str(RECORDING), *extra]


# -- parser ----------------------------------------------------------------------------


def test_recorded_samples_parse_to_the_table() -> None:
    frames = recorded_frames()
    assert len(frames) == len(ROWS)
    ours = {RECORDED_PID, RECORDED_CHILD_PID}
    for k, frame in enumerate(frames):
        s = decode_sample(frame)
        elapsed_ns, cpu_mw, gpu_mw, *_ = ROWS[k]
        assert s.elapsed_s == pytest.approx(elapsed_ns / 1e9, rel=1e-12)
        assert s.cpu_w == pytest.approx(cpu_mw / 1000)
        assert s.gpu_w == pytest.approx(gpu_mw / 1000)
        assert s.package_w == pytest.approx((cpu_mw + gpu_mw) / 1000)
        assert s.process_share(ours) == pytest.approx(SHARES[k], rel=1e-9)
        power = s.power_w(ours)
        assert set(power) == set(DOMAINS)
        for domain, value in power.items():
            assert value == pytest.approx(truth_w(domain)(k), rel=1e-9), (k, domain)


def test_share_counts_exactly_the_given_pids_among_all_tasks() -> None:
    s = decode_sample(recorded_frames()[1])  # EI: process 96, child 24, others 40
    assert s.process_share({RECORDED_PID}) == pytest.approx(96 / 160)
    assert s.process_share({RECORDED_PID, RECORDED_CHILD_PID}) == pytest.approx(120 / 160)
    assert s.process_share({RECORDED_PID, RECORDED_CHILD_PID, RECORDED_POWERMETRICS_PID}) == (
        pytest.approx((120 + 0.15 * 40) / 160)
    )
    assert s.process_share(set()) == 0.0
    assert s.process_share({999_999}) == 0.0
    assert s.energy_impact[-1] == pytest.approx(0.05 * 40)  # DEAD_TASKS counts among all
    assert s.power_w({RECORDED_PID})[CPU_PROCESS] == pytest.approx(7.42 * 96 / 160)


def test_decoder_accepts_split_chunks_and_either_nul_placement() -> None:
    raw = RECORDING.read_bytes()
    whole = recorded_frames()
    decoder = PlistStreamDecoder()
    pieces: list[bytes] = []
    for i in range(0, len(raw), 997):
        pieces += decoder.feed(raw[i : i + 997])
    assert pieces == whole
    # NUL before each document (newer macOS): each is complete at </plist>, not one
    # sample late when the next NUL comes.
    decoder = PlistStreamDecoder()
    for frame in whole:
        assert decoder.feed(b"\0" + frame + b"\n") == [frame]
    # A truncated document followed by a NUL comes out as a frame that fails to parse.
    bad = PlistStreamDecoder().feed(b"<?xml version='1.0'?><plist><dict>\0" + whole[0] + b"\0")
    assert bad[1] == whole[0]
    with pytest.raises(ValueError, match="not a valid plist"):
        decode_sample(bad[0])


def _doc(**processor: float) -> dict[str, object]:
    tasks = [
        {"pid": 7, "name": "a", "energy_impact": 3.0},
        {"pid": 8, "name": "b", "energy_impact": 1.0},
    ]
    return {"elapsed_ns": 500_000_000, "processor": dict(processor), "tasks": tasks}


def test_parser_falls_back_and_names_what_is_missing() -> None:
    s = parse_sample(_doc(cpu_power=0.0, cpu_energy=1500, gpu_power=200.0, ane_power=50.0))
    assert s.cpu_w == pytest.approx(3.0)  # 1500 mJ over 0.5 s, since the power read 0
    assert s.package_w == pytest.approx(3.0 + 0.2 + 0.05)  # no combined_power: the sum
    assert s.process_share({7}) == pytest.approx(0.75)
    doc = _doc(cpu_power=1000.0)
    doc["gpu"] = {"gpu_energy": 100}
    assert parse_sample(doc).gpu_w == pytest.approx(0.2)
    with pytest.raises(ValueError, match="GPU"):
        parse_sample(_doc(cpu_power=1000.0))
    with pytest.raises(ValueError, match="CPU power"):
        parse_sample(_doc(gpu_power=1000.0))
    no_tasks = _doc(cpu_power=1.0, gpu_power=1.0)
    del no_tasks["tasks"]
    with pytest.raises(ValueError, match="tasks"):
        parse_sample(no_tasks)
    no_energy = _doc(cpu_power=1.0, gpu_power=1.0)
    no_energy["tasks"] = [{"pid": 7, "name": "a"}]
    with pytest.raises(ValueError, match="--show-process-energy"):
        parse_sample(no_energy)
    with pytest.raises(ValueError, match="elapsed_ns"):
        parse_sample({**_doc(cpu_power=1.0, gpu_power=1.0), "elapsed_ns": 0})


# -- integration, exact (samples fed at chosen times, no subprocess) -------------------


def _fed_meter(batch: int) -> tuple[PowermetricsMeter, list[float]]:
    """A meter holding the ten recorded samples back to back; returns the sample ends."""
    meter = PowermetricsMeter(0.2, command=["unused"])
    frames = recorded_frames()
    ends, t = [], time.perf_counter() - 1000.0  # in the past, so waits end at once
    for elapsed_ns, *_ in ROWS:
        t += elapsed_ns / 1e9
        ends.append(t)
    for i in range(0, len(frames), batch):
        last = min(i + batch, len(frames)) - 1
        meter.ingest(frames[i : last + 1], ends[last], {RECORDED_PID, RECORDED_CHILD_PID})
    return meter, ends


@pytest.mark.parametrize("interval_s", [0.2, 1.0])
def test_resolution_is_the_sampling_interval(interval_s: float) -> None:
    meter = PowermetricsMeter(interval_s, command=["unused"])
    assert meter.resolution_s == interval_s
    assert f"every {interval_s * 1000:.0f} ms" in meter.describe()


@pytest.mark.parametrize("batch", [1, 3])
def test_window_energy_is_the_exact_integral_of_the_interval_averages(batch: int) -> None:
    meter, ends = _fed_meter(batch)
    starts = [end - elapsed_ns / 1e9 for end, (elapsed_ns, *_) in zip(ends, ROWS)]
    a, b = starts[0] + 0.05, ends[6] - 0.07  # inside sample 0 ... inside sample 6
    got = meter._energy_j(Reading(t=a), Reading(t=b))
    for domain in DOMAINS:
        w = truth_w(domain)
        expected = (
            w(0) * (ends[0] - a)
            + sum(w(k) * (ends[k] - starts[k]) for k in range(1, 6))
            + w(6) * (b - starts[6])
        )
        assert got[domain] == pytest.approx(expected, rel=1e-9), domain
    covering = meter._samples(a, b)
    assert len(covering) == 7 and covering[0].t == pytest.approx(ends[0])


def test_window_end_without_a_covering_sample_is_an_error() -> None:
    meter, ends = _fed_meter(1)
    with pytest.raises(MeterError, match="no sample within"):
        meter._energy_j(Reading(t=ends[-1] - 0.1), Reading(t=ends[-1] + 0.05))


# -- the command line ------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal off macOS")
def test_create_off_macos_is_unavailable() -> None:
    with pytest.raises(MeterUnavailable, match="only on macOS"):
        open_meter("powermetrics")


def test_default_command_uses_sudo_without_prompting_unless_root() -> None:
    def which(name: str) -> str | None:
        return {"powermetrics": "/usr/bin/powermetrics", "sudo": "/usr/bin/sudo"}.get(name)

    assert default_command("darwin", which, euid=501) == [
        "/usr/bin/sudo",
        "-n",
        "/usr/bin/powermetrics",
    ]
    assert default_command("darwin", which, euid=0) == ["/usr/bin/powermetrics"]
    with pytest.raises(MeterUnavailable, match="sudo was not found"):
        default_command("darwin", lambda name: which(name) if name != "sudo" else None, euid=501)


@pytest.mark.skipif(os.path.exists("/usr/bin/powermetrics"), reason="powermetrics is here")
def test_default_command_without_the_binary_is_unavailable() -> None:
    with pytest.raises(MeterUnavailable, match="not found"):
        default_command("darwin", lambda name: None, euid=501)


def test_fake_accepts_the_meters_arguments_and_rejects_others() -> None:
    args = powermetrics_args(0.05)
    assert args[:2] == ["-i", "50"] and "--show-process-energy" in args
    ok = subprocess.run([*fake_command(), *args, "-n", "1"], capture_output=True, timeout=10)
    assert ok.returncode == 0 and ok.stdout.endswith(b"</plist>\n\0")
    for wrong in (["-f", "text"], ["-s", "cpu_power,bogus"], ["--no-such-option"]):
        bad = subprocess.run([*fake_command(), *args, *wrong], capture_output=True, timeout=10)
        assert bad.returncode == 2, wrong


def test_probe_takes_one_sample() -> None:
    PowermetricsMeter(0.05, command=fake_command()).probe()


def test_sudo_refusal_is_unavailable_and_says_how_to_allow_it() -> None:
    meter = PowermetricsMeter(command=fake_command("--refuse-sudo"))
    with pytest.raises(MeterUnavailable) as info:
        meter.probe()
    message = str(info.value)
    assert "a password is required" in message
    assert "NOPASSWD" in message and "sudoers" in message and "root" in message
    fresh = PowermetricsMeter(command=fake_command("--refuse-sudo"))
    with pytest.raises(MeterUnavailable, match="NOPASSWD"), fresh.measure():
        pass
    assert fresh._proc is None


# -- end to end through a real subprocess ----------------------------------------------


@pytest.fixture
def child_process() -> Iterator[subprocess.Popen[bytes]]:
    """A child of the test process, as an inference worker would be."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _truth_j(log: list[dict[str, float]], a: float, b: float, w: Callable[[int], float]) -> float:
    """Joules over [a, b] of the power the replay printed, on its own clock."""
    return sum(w(int(row["k"])) * max(0.0, min(row["t1"], b) - max(row["t0"], a)) for row in log)


def test_end_to_end_window_marks_and_attribution(
    tmp_path: Path, child_process: subprocess.Popen[bytes]
) -> None:
    log_path = tmp_path / "truth.jsonl"
    command = fake_command(
        "--pid", str(os.getpid()), "--child-pid", str(child_process.pid), "--log", str(log_path)
    )
    meter = PowermetricsMeter(0.2, command=command)
    assert meter._proc is None
    with meter.measure("prefill") as outer:
        proc = meter._proc
        assert proc is not None and proc.poll() is None
        with meter.measure() as inner:
            time.sleep(0.3)
        assert meter._proc is proc and proc.poll() is None  # the outer window still runs it
        time.sleep(0.35)
        outer.mark("decode")
        time.sleep(0.85)
    # gone once the last window closed
    assert meter._proc is None and proc.returncode is not None
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"

    log = [json.loads(line) for line in log_path.read_text().splitlines()]
    m = outer.measurement
    assert m.backend == "powermetrics" and m.seconds == pytest.approx(1.5, abs=0.2)
    for domain in DOMAINS:
        truth = _truth_j(log, m.t_start, m.t_end, truth_w(domain))
        assert m.by_domain[domain] == pytest.approx(truth, rel=0.02), domain
    for phase in m.phases.values():
        a = m.t_start + phase.offset_s
        for domain in (CPU_PROCESS, GPU):
            truth = _truth_j(log, a, a + phase.seconds, truth_w(domain))
            # Samples are stamped on arrival (as with the real tool): on a loaded machine the
            # reader thread's delay shifts a phase edge by tens of ms, i.e. a few per cent.
            assert phase.by_domain[domain] == pytest.approx(truth, rel=0.05), (phase.name, domain)
    assert list(m.phases) == ["prefill", "decode"]
    assert sum(p.by_domain[GPU] for p in m.phases.values()) == pytest.approx(m.by_domain[GPU])
    i = inner.measurement
    # 0.3 s between two 0.2 s samples stamped on arrival: a loaded machine's reader delay
    # moves its edges by tens of ms, as for the phases above
    assert i.by_domain[GPU] == pytest.approx(
        _truth_j(log, i.t_start, i.t_end, truth_w(GPU)), rel=0.1
    )

    # cpu:process counts the child and not powermetrics: the truth with either changed
    # is further from the measurement than the truth itself.
    cpu = m.by_domain[CPU_PROCESS]
    right = _truth_j(log, m.t_start, m.t_end, truth_w(CPU_PROCESS))
    for wrong_share in (
        lambda k: share(k, child=False),
        lambda k: share(k, powermetrics=True),
    ):
        wrong = _truth_j(log, m.t_start, m.t_end, lambda k, f=wrong_share: ROWS[k][1] * f(k) / 1000)
        assert abs(cpu - right) < abs(cpu - wrong)

    # Totals count cpu:process and gpu:0 only; cpu:all and cpu:package contain them.
    assert m.joules == pytest.approx(m.by_domain[CPU_PROCESS] + m.by_domain[GPU])
    assert m.by_domain[PACKAGE] > m.joules and m.by_domain[CPU_ALL] > m.by_domain[CPU_PROCESS]
    assert all(s.span_s == pytest.approx(0.2, abs=0.05) for s in m.samples)
    assert m.samples[0].t - m.samples[0].span_s <= m.t_start and m.samples[-1].t >= m.t_end


def test_powermetrics_dying_mid_window_is_a_meter_error() -> None:
    meter = PowermetricsMeter(0.05, command=fake_command("--fail-after", "3"))
    with pytest.raises(MeterError, match="invalid destination port"), meter.measure():
        time.sleep(0.5)
    assert meter._proc is None


def test_a_stalled_powermetrics_fails_the_window_within_the_bound() -> None:
    meter = PowermetricsMeter(0.05, command=fake_command("--stall-after", "2"))
    window = meter.measure()
    window.__enter__()
    time.sleep(0.2)
    proc = meter._proc
    t_close = time.perf_counter()
    with pytest.raises(MeterError, match="no sample within"):
        window.__exit__(None, None, None)
    waited_s = time.perf_counter() - t_close
    assert 3 * 0.05 + 1.0 - 0.1 < waited_s < 3 * 0.05 + 1.0 + 1.0
    assert proc is not None and proc.returncode is not None


def test_recording_is_what_the_replay_reads() -> None:
    """Guard the recording itself: plist documents, NUL-terminated, known pids present."""
    raw = RECORDING.read_bytes()
    assert raw.count(b"\0") == len(ROWS) and raw.endswith(b"</plist>\n\0")
    pids = {t["pid"] for t in plistlib.loads(raw.split(b"\0")[0])["tasks"]}
    assert {RECORDED_PID, RECORDED_CHILD_PID, RECORDED_POWERMETRICS_PID, -1} <= pids


def test_closing_the_pipe_ends_powermetrics_when_signals_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A root-owned sudo may refuse this user's SIGTERM; powermetrics must end anyway."""
    import pytest_llmenergy.meters.powermetrics as module

    monkeypatch.setattr(module, "_signal", lambda send: None)
    meter = PowermetricsMeter(0.05, command=fake_command())
    with meter.measure():
        proc = meter._proc
    assert proc is not None and proc.returncode is not None  # ended by the broken pipe
