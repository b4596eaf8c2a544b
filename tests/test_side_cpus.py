"""``llmenergy ab --side-cpus``: which CPUs the two sides share, checked before a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_llmenergy.errors import ConfigError
from pytest_llmenergy.pairing.cpus import cpus_text, parse_side_cpus, pin, side_cpus

LINUX = hasattr(os, "sched_setaffinity")
needs_affinity = pytest.mark.skipif(not LINUX, reason="pinning needs sched_setaffinity")


@needs_affinity
def test_one_is_a_single_cpu_this_process_may_use_and_all_is_no_pinning() -> None:
    allowed = os.sched_getaffinity(0)
    one = side_cpus(parse_side_cpus("one"))
    assert one is not None and len(one) == 1 and one <= allowed
    assert side_cpus(parse_side_cpus("ALL")) is None


@needs_affinity
def test_a_cpu_list_is_read_as_ranges_and_said_back_as_ranges() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    spec = f"{allowed[0]}-{allowed[-1]}"
    assert side_cpus(parse_side_cpus(spec)) == frozenset(range(allowed[0], allowed[-1] + 1))
    assert cpus_text(frozenset({0, 1, 2, 5})) == "CPUs 0-2,5"
    assert cpus_text(frozenset({3})) == "CPU 3"
    assert cpus_text(None) == "the CPUs the OS picks"


@needs_affinity
def test_a_cpu_this_process_may_not_use_is_refused_with_the_ones_it_may() -> None:
    beyond = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(ConfigError, match=rf"CPU\(s\) {beyond} are not among"):
        side_cpus(parse_side_cpus(str(beyond)))


@pytest.mark.parametrize("bad", ["x", "1-", "-1", "3-1", "1,,2", "0-99999", "1e400", ""])
def test_a_bad_cpu_list_is_one_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"CPU list|CPU range"):
        parse_side_cpus(bad)


@given(st.text(max_size=30))
def test_any_text_is_a_spec_or_one_config_error(text: str) -> None:
    try:
        spec = parse_side_cpus(text)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert spec in ("one", "all") or spec[0].isdigit()


@needs_affinity
def test_a_pinned_process_and_the_threads_it_starts_keep_to_its_cpu() -> None:
    """Pinned right after it starts, as ab pins a side: the process, and threads it
    starts later, run on that CPU alone."""
    cpu = side_cpus("one")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, threading, time; sys.stdin.readline(); out = [];"
            "t = threading.Thread(target=lambda: out.append(os.sched_getaffinity(0)));"
            "t.start(); t.join(); print(sorted(os.sched_getaffinity(0)), sorted(out[0]))",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pin(child.pid, cpu)
    out, _ = child.communicate("go\n", timeout=60)
    assert cpu is not None
    assert out.split("] [") == [f"[{min(cpu)}", f"{min(cpu)}]\n"]


def test_pinning_a_process_that_is_gone_is_no_error(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    pin(child.pid, side_cpus("one"))  # its log, not this, says why it died
