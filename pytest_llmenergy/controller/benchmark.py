"""The ``energy_benchmark`` fixture's object: run a target under the repetition rule.

Like pytest-benchmark's ``benchmark``, but for slow targets measured in joules: every
trial is kept.  A trial is one call, or, where the meter is coarser than a call is long
(a 100 ms GPU counter), a window of back-to-back calls long enough for the meter
(``controller/window.py``), its figures per call, as pytest-benchmark's rounds hold
calibrated iterations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NoReturn, Protocol

import pytest

from ..errors import LLMEnergyError, TrialRejected
from ..meters.base import Meter
from ..meters.readings import Measurement
from ..meters.validity import judge
from ..probes.background import BackgroundCpu, CpuActivity
from ..probes.reference import case_reference_s
from ..probes.resources import ResourceProbe
from ..results import (
    CONVERGED,
    LIMIT,
    OOM,
    ROUNDS,
    CaseResult,
    CountedWork,
    GpuTelemetry,
    ThermalWait,
    Trial,
)
from .busy import BusyWatch
from .passes import needs_passes, pass_window, split_by_passes
from .rule import RULES, ControllerSettings, StopDecision, decide, may_stop, progress_line
from .window import (
    EdgeDelay,
    WindowPlan,
    min_time_window_s,
    summed_phases,
    synchronize_devices,
    window_target_s,
)


@dataclasses.dataclass(frozen=True)
class PacerStop:
    """A paired run's word that a case is done on this side: its status, why (when it
    stopped at a limit), and which of this side's trials pair with the other side's."""

    status: str
    why: str = ""
    pairs: Mapping[int, int] = dataclasses.field(default_factory=dict)


class Pacer(Protocol):
    """Who may measure next, when two sessions take turns (``llmenergy ab``): asked
    before every measured trial, told every trial; it, not the stopping rule, ends the
    case.  The plugin's side of a paired run (``plugin/ab_side.py``) is one.

    ``began`` is true when the last ``turn`` started a new turn: the other side may have
    run just before, so what the rest of the machine did is judged from there on (the
    other side's own work is not a busy machine).  ``warm_up`` asks for one unmeasured
    call first: the other side's turn left this side's caches cold and its threads
    asleep, which made a short trial up to three times as long."""

    began: bool
    warm_up: bool

    def turn(self, meta: Mapping[str, Any]) -> PacerStop | None: ...

    def trial(self, trial: Trial, counted: Mapping[str, bool], disturbed: bool) -> None: ...


class TrialProbe(Protocol):
    """Reads something around every trial (``conditions.telemetry.TrialTelemetry``)."""

    def start(self) -> None: ...

    def stop(self) -> GpuTelemetry | None: ...


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OOM (CUDA, MPS or CPU allocator) or Python's MemoryError; torch not imported
    means it cannot be torch's."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return oom is not None and isinstance(exc, oom)


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclasses.dataclass
class CaseVisits:
    """What the visits of one case measured so far (``--energy-interleave=N``).

    The session visits every case ``count`` times, in a new random order each time, and
    each visit runs a share of the case's trials: the case's mean then samples the whole
    session's machine speed, not the one stretch of seconds its trials would otherwise
    share (randomized multiple interleaved trials, Abedi & Brecht, ICPE 2017).
    """

    count: int
    visit: int = 0  # the visit running now, from 1
    trials: list[Trial] = dataclasses.field(default_factory=list)
    disturbed: list[Trial] = dataclasses.field(default_factory=list)
    reference: list[float] = dataclasses.field(default_factory=list)
    # windows of prefill-only passes, one after each trial whose marks could not split it
    passes: list[Trial] = dataclasses.field(default_factory=list)
    # the waits for the GPUs to cool before its visits: the first's temperatures, the
    # seconds summed (--energy-thermal-tolerance)
    thermal: ThermalWait | None = None
    # its counted work, from its first visit's warm-up (--energy-count-work)
    work: CountedWork | None = None
    # The case's result once it is done: after the last visit, or earlier when it cannot
    # go on (out of memory) or took its fixed rounds (``pedantic`` runs at the first visit).
    final: CaseResult | None = None

    @property
    def last(self) -> bool:
        return self.visit >= self.count

    def quota(self, max_trials: int) -> int:
        """Trials one visit may run: the case's limit shared among its visits."""
        return max(1, math.ceil(max_trials / self.count))


def _steadiness(out: Any) -> tuple[int, str, float, str] | None:
    """A server burst's steady window (``serving.target.Burst``): the tokens streamed in
    it, why it is unstable, its mean batch and what that batch rests on when the server's
    gauge was set aside; None for any other target's result."""
    tokens, unstable = getattr(out, "steady_tokens", None), getattr(out, "unstable", None)
    batch = getattr(out, "steady_batch", 0.0)
    note = getattr(out, "steady_batch_note", "")
    if isinstance(tokens, int) and isinstance(unstable, str):
        batch = float(batch) if isinstance(batch, (int, float)) else 0.0
        return tokens, unstable, batch, note if isinstance(note, str) else ""
    return None


def _below_zero(trial: Trial, parts: Sequence[Measurement]) -> str:
    """Where the meter read less than no energy ("": nowhere).  Only a counter that went
    backwards reads that (a driver reloaded, a counter reset mid-window), so the reading
    is not the trial's energy: the trial is rejected (kept as evidence, repeated), and
    never saved as a figure its run file's reader would refuse."""
    spans = [("the trial", trial.joules_by_domain)]
    spans += [(f"its {name}", p.joules_by_domain) for name, p in trial.phases.items()]
    spans += [(f"its call {i}", m.by_domain) for i, m in enumerate(parts, 1)]
    for where, by_domain in spans:
        for domain, joules in by_domain.items():
            if joules < 0:
                return (
                    f"the meter read {joules:.3g} J on {domain} over {where}: its energy "
                    "counter went backwards (a driver reload or a counter reset?)"
                )
    return ""


def _skip(reason: str) -> None:
    """A case that measured nothing is no pass: it is skipped, with why."""
    pytest.skip(reason)


def _unmeasured_reason(result: CaseResult) -> str:
    """Why a case has no figure: every trial was left out (its result keeps them)."""
    n = len(result.disturbed)
    share = result.max_background_cpu
    if result.busy_trials and share is not None:
        why = f"other processes used up to {share:.0%} of the CPUs"
        advice = "--energy-busy=measure measures anyway, marked busy"
    elif result.throttled:
        why = "the GPU was throttled"
        advice = "let it cool, or see docs/troubleshooting.md"
    else:
        why = "other processes ran on its GPUs"
        advice = "free the GPUs"
    return f"not measured: all {n} trials were disturbed ({why}); {advice}"


def _one_line(exc: BaseException) -> str:
    """An exception as one line for a run file and a table note."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


@dataclasses.dataclass(frozen=True)
class _Target:
    """What a case calls, and what it declares each call does (its trials check it)."""

    fn: Callable[..., Any]
    call_args: Callable[[], tuple[Sequence[Any], Mapping[str, Any]]]
    input_tokens: int
    output_tokens: int
    queries: int = 1
    # a window of several calls on a coarse meter; pedantic rounds are one call each
    # (their setup runs between calls, outside every window)
    windowed: bool = True
    # the case's prefill alone, for a window of passes after each trial whose marks
    # cannot split it (controller/passes.py)
    prefill_pass: Callable[[], Any] | None = None


@dataclasses.dataclass
class _OthersCpu:
    """What the rest of the machine did around each trial (``BackgroundCpu``).  The
    previous trial's end reading starts the next trial: between them only this process
    ran (the stopping rule), which the share leaves out anyway; a paired run's span
    restarts at each turn, after the other side's."""

    background: BackgroundCpu
    history: list[CpuActivity]  # readings from before the warm-up on
    fresh: bool = False  # the last trial's end reading starts the next trial

    @classmethod
    def start(cls, background: BackgroundCpu | None) -> _OthersCpu | None:
        return cls(background, [background.read()]) if background is not None else None

    def begin(self, restart: bool) -> None:
        """A trial begins; ``restart``: not back into the other side's turn."""
        if restart:
            self.history = [self.background.read()]
        elif not self.fresh:
            self.history.append(self.background.read())

    def end(self) -> float:
        """The share of the CPUs other processes used around the trial that just ended."""
        end = self.background.read()
        share = self.background.share_around(self.history, end)
        self.history.append(end)
        self.fresh = True
        return share


@dataclasses.dataclass
class _CaseTrials:
    """A case's trials so far (its earlier visits' included), and the last call's
    arguments (what the operator profile and the work count run again)."""

    kept: list[Trial]
    disturbed: list[Trial]
    cpu: _OthersCpu | None = None  # None: trials are not checked for a busy machine
    last_call: tuple[Sequence[Any], Mapping[str, Any]] | None = None
    passes: list[Trial] = dataclasses.field(default_factory=list)  # controller/passes.py

    @classmethod
    def resume(cls, visits: CaseVisits | None, cpu: _OthersCpu | None) -> _CaseTrials:
        if visits is None:
            return cls([], [], cpu)
        return cls(list(visits.trials), list(visits.disturbed), cpu, passes=list(visits.passes))

    @property
    def count(self) -> int:
        return len(self.kept) + len(self.disturbed)

    @property
    def disturbed_s(self) -> float:
        """The runtime of its disturbed trials: the time budget counts it too."""
        return math.fsum(t.seconds * t.passes for t in self.disturbed)

    def count_busy(self, max_background: float | None) -> None:
        """The machine turned busy: the trials only the CPUs' other users disturbed
        count now, marked busy (those a GPU's state or a bad result left out stay)."""
        moved = [t for t in self.disturbed if _only_cpu_disturbed(t, max_background)]
        if not moved:
            return
        left = {id(t) for t in moved}
        self.disturbed = [t for t in self.disturbed if id(t) not in left]
        self.kept = sorted(
            [*self.kept, *(dataclasses.replace(t, busy=True) for t in moved)],
            key=lambda t: t.index,
        )


def _only_cpu_disturbed(trial: Trial, max_background: float | None) -> bool:
    """Left out only because other processes used too much of the CPUs."""
    gpu = trial.gpu
    return (
        not trial.rejected
        and (gpu is None or not (gpu.throttled or gpu.neighbours))
        and max_background is not None
        and (trial.background_cpu or 0.0) > max_background
    )


@dataclasses.dataclass(frozen=True)
class _Step:
    """One measured trial, and whether it is left out of the statistics and repeated."""

    trial: Trial
    share: float | None  # of the CPUs other processes used meanwhile
    busy_cpu: bool  # that share was too much

    @property
    def throttled(self) -> str:
        return self.trial.gpu.throttled if self.trial.gpu is not None else ""

    @property
    def neighbours(self) -> str:
        """Other processes on its GPUs."""
        gpu = self.trial.gpu
        return ", ".join(n.describe() for n in gpu.neighbours) if gpu is not None else ""

    @property
    def busy(self) -> bool:
        return self.busy_cpu or bool(self.throttled or self.neighbours or self.trial.rejected)

    def note(self) -> str:
        """Why the trial is repeated, for the live status ("" when it counted)."""
        index = self.trial.index
        if self.trial.rejected:
            return f" [trial {index} rejected: {self.trial.rejected}; repeated]"
        if self.throttled:
            return f" [trial {index} throttled ({self.throttled}); repeated]"
        if self.neighbours:
            return f" [trial {index} disturbed: on the GPU too: {self.neighbours}; repeated]"
        if self.busy_cpu and self.share is not None:
            return (
                f" [trial {index} disturbed: other processes used "
                f"{self.share:.0%} of the CPUs; repeated]"
            )
        return ""


@dataclasses.dataclass(frozen=True)
class _Ran:
    """What one trial's window ran: the last call's result and every call's, the calls'
    own nested windows (several calls), the window's measurement, the GPUs' telemetry,
    and why it was rejected ("": not)."""

    out: Any
    outs: tuple[Any, ...]
    parts: tuple[Measurement, ...]
    measurement: Measurement
    gpu: GpuTelemetry | None
    rejected: str
    calls: int = 1


def _per_call(trial: Trial, parts: Sequence[Measurement], calls: int) -> Trial:
    """A window of ``calls`` calls as one trial whose figures are per call; its phases
    where every call had a nested window split into them."""
    return dataclasses.replace(
        trial,
        seconds=trial.seconds / calls,
        joules=trial.joules / calls,
        net_joules=trial.net_joules / calls,
        joules_by_domain={d: j / calls for d, j in trial.joules_by_domain.items()},
        net_joules_by_domain={d: j / calls for d, j in trial.net_joules_by_domain.items()},
        phases=summed_phases(parts, calls) if len(parts) == calls else {},
        passes=calls,
    )


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """How a case's trials ended: its status, why it missed its precision, a paired
    run's pairs (this side's trial -> pair), or only this visit's share done."""

    status: str = ROUNDS
    why: str = ""
    pairs: Mapping[int, int] = dataclasses.field(default_factory=dict)
    paused: bool = False


@dataclasses.dataclass(frozen=True)
class CaseIdentity:
    """Which case a benchmark measures: its pytest node id, name and labels (model,
    tokens, the axes) as the run file keeps them."""

    nodeid: str
    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CaseFeatures:
    """What the session's features lend a case, each filling in its own field (None, or
    the default: the feature is not in use).  A new feature adds a field here and fills
    it in where the fixture builds this, not another parameter of the benchmark."""

    # each trial's live line (``plugin/progress.py``)
    progress: Callable[[str], None] | None = None
    # the rest of the machine's CPU use around each trial: a busy trial is repeated
    background: BackgroundCpu | None = None
    # held from the warm-up to the last trial (xdist workers sharing one meter)
    exclusive: Callable[[], AbstractContextManager[None]] | None = None
    # the GPUs' clock, temperature and throttle reasons around every trial; a throttled
    # trial is kept, left out and repeated, like a disturbed one
    trial_probe: TrialProbe | None = None
    # --energy-profile-ops: one more run after the trials, outside every window
    op_profiler: Callable[[Callable[[], Any]], Mapping[str, Any]] | None = None
    # --energy-count-work: the work counted in the first warm-up call, unmeasured;
    # without a warm-up, in one more run after the trials when ``count_after_trials``
    work_counter: Callable[[Callable[[], Any]], CountedWork | None] | None = None
    count_after_trials: bool = True
    # --energy-interleave: the case's visits so far
    visits: CaseVisits | None = None
    # llmenergy ab: the other session measures between this one's trials
    pacer: Pacer | None = None
    # --energy-thermal-tolerance: waits for the GPUs to cool before the warm-up
    settle: Callable[[Callable[[str], None] | None], ThermalWait | None] | None = None
    # the session's gCO2e and price per kWh (the co2_g and cost figures' factors)
    conversions: Mapping[str, float] | None = None
    # whether a coarse meter's trial may hold several calls: not under torchrun, whose
    # ranks must run the same calls in lockstep (each would time its own window)
    windows: bool = True
    # the session's judgement of the machine (controller/busy.py): once it is busy,
    # disturbed trials count, marked busy, under the "measure" policy
    busy: BusyWatch | None = None
    # what a case that measured nothing does (its result kept): pytest.skip by default;
    # the plugin fails it under --energy-strict
    not_measured: Callable[[str], None] | None = None


class EnergyBenchmark:
    """Call it once per test: ``energy_benchmark(fn, *args, input_tokens=, output_tokens=)``."""

    def __init__(
        self,
        meter: Meter,
        options: ControllerSettings,
        case: CaseIdentity,
        on_result: Callable[[CaseResult], None],
        features: CaseFeatures | None = None,
    ) -> None:
        f = features or CaseFeatures()
        visits = f.visits
        self.visits = visits
        self.conversions = dict(f.conversions or {})
        self.settle = f.settle
        self._thermal: ThermalWait | None = None
        self.pacer = f.pacer
        self.op_profiler = f.op_profiler
        self.work_counter = f.work_counter
        self.count_after_trials = f.count_after_trials
        self.meter = meter
        self.trial_probe = f.trial_probe
        self.background = f.background  # None: trials are not checked for a busy machine
        # held from the warm-up to the last trial: other processes sharing the meter wait
        self._exclusive = f.exclusive or contextlib.nullcontext
        self.options = options
        self.nodeid = case.nodeid
        self.name = case.name
        self.labels = dict(case.labels)
        self._on_result = on_result
        self._progress = f.progress
        self.result: CaseResult | None = None
        self.calls = 0  # how often the target ran, warm-up included
        # The reference workload's time before the trials, once per visit: the machine's
        # speed while this case ran (a gate normalizes by the median over a session's
        # cases, compare.session_speeds; one cheap reading a case is what that needs).
        self._reference: list[float] = visits.reference if visits is not None else []
        # how many calls a trial's window holds (one, unless the meter is coarse or a call
        # too short for the rule's minimum time), and the random wait before a coarse
        # meter's window opens
        self._window = WindowPlan(
            max(window_target_s(meter.resolution_s, options), min_time_window_s(options))
            if f.windows
            else 0.0
        )
        # (none where the window's edges wait for the counter's refreshes instead)
        self._edge_delay = EdgeDelay(None if meter.tick_period_s else meter.resolution_s)
        # windows of prefill passes after the trials whose marks cannot split them: not
        # under torchrun either (each rank would time its own window's passes)
        self._split_by_passes = f.windows
        self._busy = f.busy
        self._not_measured = f.not_measured or _skip

    def __call__(
        self,
        fn: Callable[..., Any],
        *args: Any,
        input_tokens: int = 0,
        output_tokens: int = 0,
        prefill_pass: Callable[[], Any] | None = None,
        queries: int = 1,
        **kwargs: Any,
    ) -> CaseResult:
        """Warm up, then repeat ``fn(*args, **kwargs)`` until the stopping rule says so.

        ``input_tokens`` and ``output_tokens`` are what one call processes and produces;
        a plain function without them has its figures per call (no per-token figure).

        ``prefill_pass`` runs the case's prefill alone (one forward pass over the prompt,
        no cache kept).  Where the trials' prefill is too short for the meter's marks to
        split it without bias, each trial is followed by a window of it repeated back
        to back: their joules divided by the count are the trial's prefill joules, the
        rest its decode's (``controller/passes.py``; figure ``prefill_pass_j``).

        ``queries`` is how many queries of ``input_tokens`` -> ``output_tokens`` one call
        runs together (a batch of prompts, or concurrent requests to a server): the
        figures per query share each trial's joules among them, and J/token divides by
        the tokens of all of them.
        """
        return self._run(
            fn,
            lambda: (args, kwargs),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            warmup=self.options.warmup,
            rounds=None,
            prefill_pass=prefill_pass,
            queries=queries,
        )

    def pedantic(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        input_tokens: int,
        output_tokens: int,
        setup: Callable[[], tuple[Sequence[Any], Mapping[str, Any]] | None] | None = None,
        rounds: int = 1,
        warmup_rounds: int = 0,
        queries: int = 1,
    ) -> CaseResult:
        """Exactly ``rounds`` measured calls after ``warmup_rounds``, no stopping rule.

        ``setup`` runs before every call, outside the measurement; if it returns
        ``(args, kwargs)`` those are used for that call (then ``args``/``kwargs`` must be
        empty), as in pytest-benchmark's pedantic mode.
        """
        if rounds < 1 or warmup_rounds < 0:
            raise ValueError("pedantic needs rounds >= 1 and warmup_rounds >= 0")
        if setup is not None and (args or kwargs):
            raise TypeError("pedantic: pass args/kwargs or a setup that returns them, not both")
        fixed = (tuple(args), dict(kwargs or {}))

        def call_args() -> tuple[Sequence[Any], Mapping[str, Any]]:
            if setup is None:
                return fixed
            made = setup()
            return (tuple(made[0]), dict(made[1])) if made is not None else fixed

        return self._run(
            fn,
            call_args,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            warmup=warmup_rounds,
            rounds=rounds,
            queries=queries,
        )

    # -- the loop ------------------------------------------------------------------
    def _run(
        self,
        fn: Callable[..., Any],
        call_args: Callable[[], tuple[Sequence[Any], Mapping[str, Any]]],
        *,
        input_tokens: int,
        output_tokens: int,
        warmup: int,
        rounds: int | None,
        prefill_pass: Callable[[], Any] | None = None,
        queries: int = 1,
    ) -> CaseResult:
        if self.result is not None or self.calls:
            raise LLMEnergyError("energy_benchmark can be used only once per test")
        if input_tokens < 0 or output_tokens < 0:
            raise ValueError("input_tokens and output_tokens must be >= 0")
        if queries < 1:
            raise ValueError(f"queries must be >= 1, got {queries}")
        done = self.visits.final if self.visits is not None else None
        if done is not None:  # it ended at an earlier visit
            if done.status == OOM:
                pytest.skip(done.reason)
            return done
        if self.settle is not None:
            self._thermal = self._settled(self.settle(self._progress))
        try:
            with self._exclusive():
                return self._measure(
                    _Target(
                        fn,
                        call_args,
                        input_tokens,
                        output_tokens,
                        queries,
                        rounds is None,
                        prefill_pass,
                    ),
                    warmup=warmup,
                    rounds=rounds,
                )
        finally:
            if self._progress is not None and rounds is None:
                self._progress("")  # the case is done: a live status is erased

    def _measure(
        self,
        target: _Target,
        *,
        warmup: int,
        rounds: int | None,
    ) -> CaseResult:
        """Warm up, run the mode's trials, then what follows them: the operator profile
        and the counted work; out of memory, the case is skipped."""
        visits = self.visits if rounds is None else None  # fixed rounds: all at once
        pacer = self.pacer if rounds is None and visits is None else None
        state = _CaseTrials.resume(visits, _OthersCpu.start(self.background))
        try:
            # the work is counted in the case's first warm-up call (of its first visit)
            earlier = visits.work if visits is not None else None
            work = self._warm_up(target, warmup, count=earlier is None) or earlier
            if visits is not None:
                visits.work = work
            if pacer is None:  # paired trials share the machine's speed: nothing to read
                self._reference.append(case_reference_s())
            with ResourceProbe() as probe:
                if rounds is not None:
                    outcome = self._fixed_rounds(target, state, rounds)
                elif pacer is not None:
                    outcome = self._paired_turns(target, state, pacer)
                else:
                    outcome = self._until_rule(target, state, visits)
            last = state.last_call if state.count and not outcome.paused else None
            op_profile = self._profile_ops(target.fn, *last) if last is not None else None
            if work is None and last is not None and self.count_after_trials:
                work = self._count_work(target.fn, *last)
        except BaseException as exc:
            if not is_out_of_memory(exc):
                raise
            del exc  # its frames may hold the memory
            self._out_of_memory(target, state)
        return self._conclude(
            target,
            state,
            outcome,
            resources=probe.usage,
            op_profile=op_profile,
            work=work,
        )

    def _warm_up(self, target: _Target, warmup: int, *, count: bool) -> CountedWork | None:
        """Unmeasured calls first; a rejected one is not repeated (the measured trials
        check it again).  With ``count``, the first one's work is counted too: the call
        is unmeasured anyway, so the count costs the session no run of its own."""
        work = None
        for index in range(warmup):
            args, kwargs = target.call_args()
            try:
                if index == 0 and count and self.work_counter is not None:
                    out, work = self._counted_call(target.fn, args, kwargs)
                else:
                    out = self._call(target.fn, args, kwargs)
            except TrialRejected:
                continue
            self._check_tokens(out, target.input_tokens, target.output_tokens, target.queries)
        return work

    def _counted_call(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[Any, CountedWork | None]:
        """One call with its work counted: its result (the last, when the count ran it
        again in full) and the work."""
        assert self.work_counter is not None
        outs: list[Any] = []
        work = self.work_counter(lambda: outs.append(self._call(fn, args, kwargs)))
        if not outs:  # nothing to count (no torch in the process): the call still runs
            return self._call(fn, args, kwargs), None
        return outs[-1], work

    # -- the modes: each runs trials until its own end -----------------------------------
    def _fixed_rounds(self, target: _Target, state: _CaseTrials, rounds: int) -> _Outcome:
        """``pedantic``: exactly ``rounds`` trials, disturbed ones among them; no rule."""
        for _ in range(rounds):
            self._trial(target, state)
        return _Outcome(ROUNDS)

    def _paired_turns(self, target: _Target, state: _CaseTrials, pacer: Pacer) -> _Outcome:
        """``llmenergy ab``: one trial at each turn the other session grants; the pairs,
        not this side's trials, decide, so the pacer ends the case."""
        while True:
            word = pacer.turn(self._pacer_meta(target))
            if word is not None:
                return _Outcome(word.status, word.why, word.pairs)
            step = self._trial(target, state, warm_up=pacer.warm_up, restart=pacer.began)
            counted = self._counted()
            if self._progress is not None:
                self._show(state, step, self._decide(state, counted))
            pacer.trial(step.trial, counted, step.busy)

    def _until_rule(
        self, target: _Target, state: _CaseTrials, visits: CaseVisits | None
    ) -> _Outcome:
        """Trials until the stopping rule says so; with visits, until this visit's share
        is done (the rule then speaks at the last visit)."""
        earlier = state.count  # measured at earlier visits
        quiet = self._progress is None and visits is None
        while True:
            step = self._trial(target, state, visit=visits.visit if visits is not None else 0)
            kept, disturbed = len(state.kept), len(state.disturbed)
            if quiet and not may_stop(self.options, kept, disturbed, state.disturbed_s):
                continue  # the rule could not stop yet: no need to ask it
            decision = self._decide(state, self._counted())
            self._show(state, step, decision)
            if visits is not None and not visits.last:
                ran = state.count - earlier
                if decision.stop or ran >= visits.quota(self.options.max_trials):
                    return _Outcome(paused=True)
            if decision.stop:
                status = CONVERGED if decision.converged else LIMIT
                return _Outcome(status, decision.why() if state.kept else "")  # else: busy

    # -- the step every mode shares ------------------------------------------------------
    def _trial(
        self,
        target: _Target,
        state: _CaseTrials,
        *,
        visit: int = 0,
        warm_up: bool = False,
        restart: bool = False,
    ) -> _Step:
        """One measured trial, filed with the counted or the disturbed ones.  ``warm_up``:
        one unmeasured call first; ``restart``: the rest of the machine is judged from
        now on (a paired run's new turn)."""
        args, kwargs = target.call_args()
        if warm_up:
            with contextlib.suppress(TrialRejected):
                self._call(target.fn, args, kwargs)
            args, kwargs = target.call_args()
        state.last_call = (args, kwargs)
        self._edge_delay.wait()  # before the window, and before the CPU's reading
        if state.cpu is not None:
            state.cpu.begin(restart)
        ran = self._windowed_call(target, args, kwargs)
        out, measurement, gpu, rejected = ran.out, ran.measurement, ran.gpu, ran.rejected
        share = state.cpu.end() if state.cpu is not None else None
        n_in, n_out = target.input_tokens, target.output_tokens
        if not rejected:
            for each in ran.outs:
                n_in, n_out = self._check_tokens(each, n_in, n_out, target.queries)
        steady_tokens, unstable, steady_batch, batch_note = _steadiness(out) or (0, "", 0.0, "")
        trial = Trial.from_measurement(
            state.count + 1,
            measurement,
            n_in,
            n_out,
            background_cpu=share,
            queries=target.queries,
            requests=tuple(getattr(out, "requests", ())),
            power=tuple(getattr(out, "power", ())),
        )
        if ran.parts:  # a window of calls: the figures per call
            trial = _per_call(trial, ran.parts, ran.calls)
        rejected = rejected or _below_zero(trial, ran.parts)
        if not rejected:
            trial = self._split(target, state, trial)
        trial = dataclasses.replace(
            trial,
            gpu=gpu,
            steady_tokens=steady_tokens,
            unstable=unstable,
            steady_batch=steady_batch,
            steady_batch_note=batch_note,
            visit=visit,
            rejected=rejected,
            telemetry=judge(measurement, self.options.max_sample_gap_s),
        )
        step = _Step(trial, share, busy_cpu=self.options.disturbed(share))
        (state.disturbed if step.busy else state.kept).append(trial)
        self._judge_machine(state, step)
        return step

    def _judge_machine(self, state: _CaseTrials, step: _Step) -> None:
        """Tell the session's watch what the trial saw; once the machine is busy (and
        not in a paired run, whose pairs judge a busy machine themselves), the trials
        only the CPUs' other users disturbed count, marked busy."""
        if self._busy is None or step.share is None or self.pacer is not None:
            return
        self._busy.observe(step.share, step.busy_cpu)
        if self._busy.measuring_anyway:
            state.count_busy(self.options.max_background)

    def _windowed_call(
        self, target: _Target, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> _Ran:
        """One meter window, the devices synchronized at both edges and the GPUs read
        around it: one call, or for a coarse meter calls until the window has lasted
        long enough, each in a window of its own, nested, whose phases (prefill | decode)
        add up to the trial's."""
        gpu_probe = self.trial_probe
        synchronize_devices()  # nothing queued before the window runs inside it
        if gpu_probe is not None:
            gpu_probe.start()
        outs: list[Any] = []
        parts: list[Measurement] = []
        rejected = ""
        calls = 1
        try:
            with self.meter.measure(aligned=True) as window:
                try:
                    if target.windowed and self._window.windowed:
                        calls = self._calls_until_long_enough(target, args, kwargs, outs, parts)
                    else:
                        outs.append(self._call(target.fn, args, kwargs))
                except TrialRejected as exc:  # ran, but not the case: repeat
                    rejected = _one_line(exc)
                synchronize_devices()  # everything the window queued runs inside it
        finally:
            gpu = gpu_probe.stop() if gpu_probe is not None else None
        if rejected:
            outs = []
        out = outs[-1] if outs else None
        return _Ran(out, tuple(outs), tuple(parts), window.measurement, gpu, rejected, calls)

    def _calls_until_long_enough(
        self,
        target: _Target,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        outs: list[Any],
        parts: list[Measurement],
    ) -> int:
        """Calls back to back until the enclosing window has lasted the plan's length;
        how many.  Each in its own nested window, waited for, where the first call
        marked phases (prefill | decode) for them to add up; else plainly, as
        pytest-benchmark's iterations run (a nested window cost a 2 ms call 2 %)."""
        start_s = time.perf_counter()
        calls, nested = 0, True
        while True:
            if nested:
                with self.meter.measure() as part:
                    outs.append(self._call(target.fn, args, kwargs))
                    synchronize_devices()
                parts.append(part.measurement)
                nested = len(part.measurement.phases) >= 2
            else:
                outs.append(self._call(target.fn, args, kwargs))
            calls += 1
            if not self._window.more(time.perf_counter() - start_s, calls):
                return calls
            if _steadiness(outs[-1]) is not None:  # a server's burst: its own window
                return calls
            args, kwargs = target.call_args()

    def _counted(self) -> dict[str, bool]:
        """Which of the meter's domains its totals count."""
        return {name: d.counted for name, d in self.meter.domains.items()}

    def _decide(self, state: _CaseTrials, counted: Mapping[str, bool]) -> StopDecision:
        return decide(
            self.options,
            state.kept,
            len(state.disturbed),
            counted,
            self.conversions,
            disturbed_s=state.disturbed_s,
        )

    def _show(self, state: _CaseTrials, step: _Step, decision: StopDecision) -> None:
        """The live status after a trial (``-v``), with why it is repeated."""
        if self._progress is not None:
            repeated = len(state.disturbed)
            so_far = f" [{repeated} trial(s) repeated so far]" if repeated else ""
            line = progress_line(self.options, len(state.kept), decision)
            self._progress(line + (step.note() or so_far))

    # -- after the trials ----------------------------------------------------------------
    def _out_of_memory(self, target: _Target, state: _CaseTrials) -> NoReturn:
        """Keep the trials measured so far as an OOM case, and skip the test."""
        _free_memory()
        reason = f"OOM at {target.input_tokens} input tokens ({target.output_tokens} output tokens)"
        if target.queries != 1:
            reason += f" x {target.queries} queries at once"
        self._finish(
            target.input_tokens,
            target.output_tokens,
            OOM,
            state.kept,
            reason=reason,
            disturbed=state.disturbed,
            queries=target.queries,
        )
        pytest.skip(reason)

    def _conclude(
        self,
        target: _Target,
        state: _CaseTrials,
        outcome: _Outcome,
        *,
        resources: Any,
        op_profile: Mapping[str, Any] | None,
        work: CountedWork | None,
    ) -> CaseResult:
        """The case's result: its trials numbered by their pairs (paired), a visit's
        share kept for the next visit; a case whose every trial was rejected fails."""
        trials, disturbed = state.kept, state.disturbed
        if outcome.pairs:
            trials = [dataclasses.replace(t, pair=outcome.pairs.get(t.index, 0)) for t in trials]
        if outcome.paused:
            assert self.visits is not None  # only a visit pauses
            self.visits.trials, self.visits.disturbed = trials, disturbed
            self.visits.passes = state.passes
        result = self._finish(
            target.input_tokens,
            target.output_tokens,
            outcome.status,
            trials,
            reason=outcome.why,
            resources=resources,
            disturbed=disturbed,
            prefill_passes=tuple(state.passes),
            queries=target.queries,
            op_profile=op_profile,
            work=work,
            keep=not outcome.paused,
        )
        if not trials and disturbed and all(t.rejected for t in disturbed):
            # kept in the run (every trial's reason), but the case was never done
            pytest.fail(
                f"every trial ({len(disturbed)}) was rejected; the first: {disturbed[0].rejected}",
                pytrace=False,
            )
        if not trials and disturbed and not outcome.paused:
            self._not_measured(_unmeasured_reason(result))
        return result

    def _settled(self, wait: ThermalWait | None) -> ThermalWait | None:
        """This visit's wait, added to the earlier visits' (one wait without visits)."""
        visits = self.visits
        if visits is None or wait is None:
            return wait
        earlier = visits.thermal
        if earlier is not None:
            wait = dataclasses.replace(
                earlier,
                waited_s=earlier.waited_s + wait.waited_s,
                gave_up=earlier.gave_up or wait.gave_up,
            )
        visits.thermal = wait
        return wait

    def _pacer_meta(self, target: _Target) -> dict[str, Any]:
        """What the coordinator of a paired run needs of this case: its size, the
        session's conversions (the factors of gated co2_g and cost), and its limits.  Not
        the rule's default minimum time: it keeps a single session's interval from resting
        on too little, where a paired case's rests on its pairs, each turn long against
        the meter's resolution; a minimum time the user set applies."""
        o = self.options
        rule_default = o.min_time == (RULES[o.rule].min_time_s or 0.0)
        return {
            "input_tokens": target.input_tokens,
            "output_tokens": target.output_tokens,
            "queries": target.queries,
            "max_trials": o.max_trials,
            "min_time_s": 0.0 if rule_default else o.min_time,
            "max_time_s": o.max_time,
            "conversions": self.conversions,
        }

    def _profile_ops(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        """The operator trace of one more run of the last trial's call, unmeasured: the
        profiler's overhead never enters a measured trial."""
        if self.op_profiler is None:
            return None
        return self.op_profiler(lambda: self._call(fn, args, kwargs))

    def _count_work(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> CountedWork | None:
        """The counted work of one more run of the last trial's call, unmeasured (a case
        without a warm-up, or visited in turns): the counting's overhead never enters a
        measured trial."""
        if self.work_counter is None:
            return None
        return self.work_counter(lambda: self._call(fn, args, kwargs))

    def _split(self, target: _Target, state: _CaseTrials, trial: Trial) -> Trial:
        """The trial split by a window of prefill-only passes right after it, where its
        marks cannot split it on this meter (controller/passes.py)."""
        off = self.options.prefill_passes == "off"
        if target.prefill_pass is None or not self._split_by_passes or off:
            return trial
        if not needs_passes(trial, self.meter.resolution_s):
            return trial
        self._edge_delay.wait()
        window = pass_window(
            self.meter,
            target.prefill_pass,
            index=len(state.passes) + 1,
            input_tokens=target.input_tokens,
            queries=target.queries,
        )
        state.passes.append(window)
        return split_by_passes(trial, window)

    def _call(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        self.calls += 1
        return fn(*args, **kwargs)

    @staticmethod
    def _check_tokens(
        out: Any, input_tokens: int, output_tokens: int, queries: int = 1
    ) -> tuple[int, int]:
        """Use the counts the target reports (a ``Generation``), and insist they match."""
        n_in = getattr(out, "input_tokens", None)
        n_out = getattr(out, "output_tokens", None)
        if not (isinstance(n_in, int) and isinstance(n_out, int)):
            return input_tokens, output_tokens
        n_queries = getattr(out, "queries", queries)
        if n_queries != queries:
            raise LLMEnergyError(
                f"the target ran {n_queries} queries at once, but the case declares "
                f"queries={queries}"
            )
        if (n_in, n_out) != (input_tokens, output_tokens):
            raise LLMEnergyError(
                f"the target processed {n_in} input and produced {n_out} output tokens, "
                f"but the case declares input_tokens={input_tokens}, "
                f"output_tokens={output_tokens}"
            )
        return n_in, n_out

    def _finish(
        self,
        input_tokens: int,
        output_tokens: int,
        status: str,
        trials: list[Trial],
        *,
        reason: str = "",
        resources: Any = None,
        disturbed: list[Trial] | None = None,
        prefill_passes: tuple[Trial, ...] = (),
        queries: int = 1,
        op_profile: Mapping[str, Any] | None = None,
        work: CountedWork | None = None,
        keep: bool = True,
    ) -> CaseResult:
        """The case's result; ``keep`` False: a visit's share, shown to the test but not
        kept (the last visit keeps the whole case)."""
        domains = self.meter.domains
        # the machine's speed at the trials (probes/reference.py), over the visits
        speed_s = statistics.fmean(self._reference) if self._reference else None
        if speed_s is not None:  # on every trial: it stays with them when runs are pooled
            trials = [dataclasses.replace(t, reference_s=speed_s) for t in trials]
        self.result = CaseResult(
            nodeid=self.nodeid,
            name=self.name,
            labels=self.labels,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            status=status,
            options=self.options,
            trials=tuple(trials),
            methods={name: str(d.method) for name, d in domains.items()},
            counted=self._counted(),
            backend=self.meter.backend,
            reason=reason,
            resources=resources,
            disturbed=tuple(disturbed or ()),
            resolution_s=self.meter.resolution_s,
            prefill_passes=prefill_passes,
            queries=queries,
            op_profile=op_profile,
            work=work,
            reference_s=speed_s,
            thermal=self._thermal,
            conversions=self.conversions,
        )
        if keep:
            if self.visits is not None:
                self.visits.final = self.result
            self._on_result(self.result)
        return self.result
