"""``--energy-profile-ops`` and ``--energy-count-work``: the feature objects that run each
case once more after its trials, unmeasured, to profile it or count its work.

The energy_benchmark fixture asks it for a profiler per case; the profile goes into the
case's ``op_profile`` with the model's sizes (from its config, when the case names a
model whose config can be read) so that ``llmenergy calibrate`` needs nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from ..errors import ConfigError
from ..results import CaseResult, CountedWork
from ..tables import wrap

Profiler = Callable[[Callable[[], Any]], Mapping[str, Any]]


class OpProfiling:
    """Registered with the plugin manager when ``--energy-profile-ops`` is on."""

    def __init__(self) -> None:
        import importlib.util

        if importlib.util.find_spec("torch") is None:  # stop at start, not at every case
            raise pytest.UsageError(
                "--energy-profile-ops needs torch (its profiler): pip install torch==2.13.0, "
                "or leave the option off"
            )
        self.profiled = 0
        self.profile_s = 0.0  # profiling and summarizing, summed over the cases

    def header(self) -> list[str]:
        return [
            "operator profiles: one more run of each case after its trials, under "
            "torch.profiler, unmeasured (--energy-profile-ops)"
        ]

    def profiler_for(self, labels: Mapping[str, str]) -> Profiler:
        extra: dict[str, Any] = {}
        model = labels.get("model_source") or labels.get("model")
        if model:
            try:
                from .features import load_config

                # the config itself, not sizes derived from it: a later version of the
                # features reads it afresh
                name, config = load_config(f"{labels.get('model', '')}={model}")
                extra["model_name"], extra["model_config"] = name, config
            except (ConfigError, OSError, ValueError):
                pass  # a hub id: the profile alone

        def run(call: Callable[[], Any]) -> Mapping[str, Any]:
            import time

            from .op_profile import profile_call

            start = time.perf_counter()
            profile = profile_call(call, extra=extra)
            self.profile_s += time.perf_counter() - start
            self.profiled += 1
            return profile

        return run

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.profiled:
            terminalreporter.write_line(
                f"llmenergy: {self.profiled} operator profiles recorded in "
                f"{self.profile_s:.1f} s (outside the measured trials)"
            )


OP_PROFILING = pytest.StashKey[OpProfiling]()


class WorkCounting:
    """Registered when ``--energy-count-work`` is on (the default): each case's work,
    counted once in its warm-up run (``work_count``), outside every measured window."""

    def __init__(
        self,
        gather: Callable[[CountedWork | None], list[CountedWork | None]] | None = None,
        cases: Callable[[], Sequence[CaseResult]] = tuple,
        *,
        after_trials: bool = False,
    ) -> None:
        # a case without a warm-up runs once more after its trials to be counted
        # (--energy-count-work=on); by default it is not counted
        self.after_trials = after_trials
        # under torchrun: every rank's count, in rank order (a collective: every rank
        # counts every case, as it runs every case)
        self.gather = gather
        # the session's cases as they are kept: under xdist the controller counts
        # nothing itself, its workers' work arrives with their cases
        self.cases = cases

    def header(self) -> list[str]:
        return [
            "counted work: each case's warm-up run, its operators' FLOPs, bytes and calls "
            "counted, unmeasured (--energy-count-work=off skips it)"
        ]

    def counter(self) -> Callable[[Callable[[], Any]], CountedWork | None]:
        def run(call: Callable[[], Any]) -> CountedWork | None:
            import sys

            if "torch" not in sys.modules:  # the case ran no torch operator: none to count
                return None
            from .work_count import count_work

            # under torchrun every rank counts every step: a rank that found its steps
            # off the line would run the generation again alone, and the others wait
            work: CountedWork | None = count_work(call, sample=self.gather is None)
            assert work is not None
            if self.gather is not None:  # the job's work, each rank's share kept
                ranks = self.gather(work)
                if any(w is None for w in ranks):
                    return None
                work = CountedWork.of_job([w for w in ranks if w is not None])
            return work if work.ops() else None

        return run

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        works = [c.work for c in self.cases() if c.work is not None]
        if works:
            _say(
                terminalreporter,
                f"the work of {len(works)} case(s) counted in "
                f"{sum(w.seconds for w in works):.1f} s (outside the measured trials)",
            )
            full = [w.full_because for w in works if w.full_because]
            if full:
                _say(
                    terminalreporter,
                    f"{len(full)} case(s) counted every decode step, not a sample: {full[0]}",
                )


def _say(terminalreporter: pytest.TerminalReporter, line: str) -> None:
    """``llmenergy: line`` fitted to the terminal, continued indented as the session's
    header lines are (plugin/session.py, a layer above this one)."""
    prefix = "llmenergy: "
    width = terminalreporter.config.get_terminal_writer().fullwidth
    for part in wrap(prefix + line, width, indent=" " * (len(prefix) + 2)):
        terminalreporter.write_line(part)


WORK_COUNTING = pytest.StashKey[WorkCounting]()
