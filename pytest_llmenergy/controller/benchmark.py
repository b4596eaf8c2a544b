"""The ``energy_benchmark`` fixture's object: run a target under the repetition rule.

Like pytest-benchmark's ``benchmark``, but for slow targets measured in joules: the
target runs exactly ``warmup + trials`` times, never more, and every trial is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import pytest

from ..errors import LLMEnergyError, TrialRejected
from ..figures import PASS_WINDOW_MULTIPLE, RESOLVED_MULTIPLE
from ..meters.background import BackgroundCpu
from ..meters.base import Meter
from ..meters.reference import case_reference_s
from ..meters.resources import ResourceProbe
from ..results import (
    CONVERGED,
    LIMIT,
    OOM,
    PREFILL,
    ROUNDS,
    CaseResult,
    CountedWork,
    GpuTelemetry,
    ThermalWait,
    Trial,
)
from .rule import RULES, ControllerSettings, decide, progress_line


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
    case.  The plugin's side of a paired run (``plugin/pairing.py``) is one.

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


# A bound on the prefill passes of one window (a 10 µs "prefill" on a 1 s counter).
MAX_PREFILL_PASSES = 10_000


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
    # the waits for the GPUs to cool before its visits: the first's temperatures, the
    # seconds summed (--energy-thermal-tolerance)
    thermal: ThermalWait | None = None
    # The case's result once it is done: after the last visit, or earlier when it cannot
    # go on (out of memory) or took its fixed rounds (``pedantic`` runs at the first visit).
    final: CaseResult | None = None

    @property
    def last(self) -> bool:
        return self.visit >= self.count

    def quota(self, max_trials: int) -> int:
        """Trials one visit may run: the case's limit shared among its visits."""
        return max(1, math.ceil(max_trials / self.count))


def _steadiness(out: Any) -> tuple[int, str] | None:
    """A server burst's steady window (``serving.target.Burst``): the tokens streamed in
    it and why it is unstable; None for any other target's result."""
    tokens, unstable = getattr(out, "steady_tokens", None), getattr(out, "unstable", None)
    if isinstance(tokens, int) and isinstance(unstable, str):
        return tokens, unstable
    return None


def _one_line(exc: BaseException) -> str:
    """An exception as one line for a run file and a table note."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class EnergyBenchmark:
    """Call it once per test: ``energy_benchmark(fn, *args, input_tokens=, output_tokens=)``."""

    def __init__(
        self,
        meter: Meter,
        options: ControllerSettings,
        *,
        nodeid: str,
        name: str,
        labels: Mapping[str, str],
        on_result: Callable[[CaseResult], None],
        progress: Callable[[str], None] | None = None,
        background: BackgroundCpu | None = None,
        exclusive: Callable[[], AbstractContextManager[None]] | None = None,
        trial_probe: TrialProbe | None = None,
        op_profiler: Callable[[Callable[[], Any]], Mapping[str, Any]] | None = None,
        work_counter: Callable[[Callable[[], Any]], CountedWork | None] | None = None,
        visits: CaseVisits | None = None,
        pacer: Pacer | None = None,
        settle: Callable[[Callable[[str], None] | None], ThermalWait | None] | None = None,
        conversions: Mapping[str, float] | None = None,
    ) -> None:
        self.visits = visits
        # the session's gCO2e and price per kWh: the co2_g and cost figures' factors, for
        # a CI target on them, the case's result and a paired run's gates
        self.conversions = dict(conversions or {})
        # waits for the GPUs to cool before the warm-up (--energy-thermal-tolerance)
        self.settle = settle
        self._thermal: ThermalWait | None = None
        # a paired run's turns: the other session measures between this one's trials
        self.pacer = pacer
        # --energy-profile-ops: one more run after the trials, outside every window
        self.op_profiler = op_profiler
        # --energy-count-work: one more run after the trials, its work counted, unmeasured
        self.work_counter = work_counter
        self.meter = meter
        # the GPUs' clock, temperature and throttle reasons around every trial; a trial
        # throttled by heat or a power brake is kept, left out and repeated, like a
        # disturbed one
        self.trial_probe = trial_probe
        self.background = background  # None: trials are not checked for a busy machine
        # held from the warm-up to the last trial: other processes sharing the meter wait
        self._exclusive = exclusive or contextlib.nullcontext
        self.options = options
        self.nodeid = nodeid
        self.name = name
        self.labels = dict(labels)
        self._on_result = on_result
        self._progress = progress
        self.result: CaseResult | None = None
        self.calls = 0  # how often the target ran, warm-up included
        # The reference workload's time before the trials, once per visit: the machine's
        # speed while this case ran (a gate normalizes by the median over a session's
        # cases, compare.session_speeds; one cheap reading a case is what that needs).
        self._reference: list[float] = visits.reference if visits is not None else []

    def __call__(
        self,
        fn: Callable[..., Any],
        *args: Any,
        input_tokens: int,
        output_tokens: int,
        prefill_pass: Callable[[], Any] | None = None,
        queries: int = 1,
        **kwargs: Any,
    ) -> CaseResult:
        """Warm up, then repeat ``fn(*args, **kwargs)`` until the stopping rule says so.

        ``prefill_pass`` runs the case's prefill alone (one forward pass over the prompt,
        no cache kept).  When the trials' prefill is shorter than the meter resolves, it
        is repeated back to back inside windows long enough, and their joules divided by
        the count give the prefill's energy (figure ``prefill_pass_j``).

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
                    fn,
                    call_args,
                    input_tokens=input_tokens,
                    output_tokens=output_tokens,
                    warmup=warmup,
                    rounds=rounds,
                    prefill_pass=prefill_pass,
                    queries=queries,
                )
        finally:
            if self._progress is not None and rounds is None:
                self._progress("")  # the case is done: a live status is erased

    def _measure(
        self,
        fn: Callable[..., Any],
        call_args: Callable[[], tuple[Sequence[Any], Mapping[str, Any]]],
        *,
        input_tokens: int,
        output_tokens: int,
        warmup: int,
        rounds: int | None,
        prefill_pass: Callable[[], Any] | None,
        queries: int = 1,
    ) -> CaseResult:
        visits = self.visits if rounds is None else None  # fixed rounds: all at once
        trials: list[Trial] = list(visits.trials) if visits is not None else []
        disturbed: list[Trial] = list(visits.disturbed) if visits is not None else []
        earlier = len(trials) + len(disturbed)  # measured at earlier visits
        paused = False  # this visit's share is done; the case goes on at its next visit
        status = ROUNDS
        stopped = ""  # why the precision was not reached, when it was not
        pacer = self.pacer if rounds is None and visits is None else None
        pairs: Mapping[int, int] = {}
        background = self.background
        # readings of what the rest of the machine did, from before the warm-up on
        history = [background.read()] if background is not None else []
        try:
            for _ in range(warmup):
                args, kwargs = call_args()
                try:
                    out = self._call(fn, args, kwargs)
                except TrialRejected:  # unmeasured: the measured trials check it again
                    continue
                self._check_tokens(out, input_tokens, output_tokens, queries)
            if pacer is None:  # paired trials share the machine's speed: nothing to read
                self._reference.append(case_reference_s())
            # the previous trial's end reading starts the next trial: between them only
            # this process ran (the stopping rule), which the share leaves out anyway; in a
            # paired run the span restarts at each turn, after the other side's
            fresh = False
            with ResourceProbe() as probe:
                while True:
                    if pacer is not None:
                        word = pacer.turn(self._pacer_meta(input_tokens, output_tokens, queries))
                        if word is not None:
                            status, stopped, pairs = word.status, word.why, word.pairs
                            break
                    args, kwargs = call_args()
                    if pacer is not None and pacer.warm_up:
                        with contextlib.suppress(TrialRejected):
                            self._call(fn, args, kwargs)
                        args, kwargs = call_args()
                    if background is not None and pacer is not None and pacer.began:
                        history = [background.read()]  # not back into the other side's turn
                    elif background is not None and not fresh:
                        history.append(background.read())
                    gpu_probe = self.trial_probe
                    if gpu_probe is not None:
                        gpu_probe.start()
                    rejected = ""
                    try:
                        with self.meter.measure() as window:
                            try:
                                out = self._call(fn, args, kwargs)
                            except TrialRejected as exc:  # ran, but not the case: repeat
                                out, rejected = None, _one_line(exc)
                    finally:
                        gpu = gpu_probe.stop() if gpu_probe is not None else None
                    share = None
                    if background is not None:
                        end = background.read()
                        share = background.share_around(history, end)
                        history.append(end)
                        fresh = True
                    n_in, n_out = input_tokens, output_tokens
                    if not rejected:
                        n_in, n_out = self._check_tokens(out, input_tokens, output_tokens, queries)
                    index = len(trials) + len(disturbed) + 1
                    trial = Trial.from_measurement(
                        index,
                        window.measurement,
                        n_in,
                        n_out,
                        background_cpu=share,
                        queries=queries,
                        requests=tuple(getattr(out, "requests", ())),
                    )
                    if gpu is not None:
                        trial = dataclasses.replace(trial, gpu=gpu)
                    steady = _steadiness(out)
                    if steady is not None:
                        trial = dataclasses.replace(
                            trial, steady_tokens=steady[0], unstable=steady[1]
                        )
                    if visits is not None:
                        trial = dataclasses.replace(trial, visit=visits.visit)
                    if rejected:
                        trial = dataclasses.replace(trial, rejected=rejected)
                    throttled = gpu.throttled if gpu is not None else ""
                    shared = ", ".join(n.describe() for n in gpu.neighbours) if gpu else ""
                    busy = self.options.disturbed(share) or bool(throttled or shared or rejected)
                    (disturbed if busy else trials).append(trial)
                    if rounds is not None:
                        if index >= rounds:
                            break
                        continue
                    counted = {name: d.counted for name, d in self.meter.domains.items()}
                    quiet = self._progress is None and pacer is None and visits is None
                    if quiet and not self._may_stop(len(trials), len(disturbed)):
                        continue  # the rule could not stop yet: no need to ask it
                    decision = decide(
                        self.options, trials, len(disturbed), counted, self.conversions
                    )
                    if self._progress is not None:
                        line = progress_line(self.options, len(trials), decision)
                        if rejected:
                            line += f" [trial {index} rejected: {rejected}; repeated]"
                        elif throttled:
                            line += f" [trial {index} throttled ({throttled}); repeated]"
                        elif shared:
                            line += (
                                f" [trial {index} disturbed: on the GPU too: {shared}; repeated]"
                            )
                        elif busy and share is not None:
                            line += (
                                f" [trial {index} disturbed: other processes used "
                                f"{share:.0%} of the CPUs; repeated]"
                            )
                        self._progress(line)
                    if pacer is not None:  # the pairs, not this side's trials, decide
                        pacer.trial(trial, counted, busy)
                        continue
                    if visits is not None and not visits.last:
                        ran = len(trials) + len(disturbed) - earlier
                        if decision.stop or ran >= visits.quota(self.options.max_trials):
                            paused = True
                            break
                    if decision.stop:
                        status = CONVERGED if decision.converged else LIMIT
                        stopped = decision.why() if trials else ""  # else: busy
                        break
                passes = (
                    ()
                    if paused
                    else self._prefill_passes(prefill_pass, trials, input_tokens, queries)
                )
            ran_any = (trials or disturbed) and not paused
            op_profile = self._profile_ops(fn, args, kwargs) if ran_any else None
            work = self._count_work(fn, args, kwargs) if ran_any else None
        except BaseException as exc:
            if not is_out_of_memory(exc):
                raise
            del exc
            _free_memory()
            reason = f"OOM at {input_tokens} input tokens ({output_tokens} output tokens)"
            if queries != 1:
                reason += f" x {queries} queries at once"
            self._finish(
                input_tokens,
                output_tokens,
                OOM,
                trials,
                reason=reason,
                disturbed=disturbed,
                queries=queries,
            )
            pytest.skip(reason)
        if pairs:
            trials = [dataclasses.replace(t, pair=pairs.get(t.index, 0)) for t in trials]
        if paused:
            assert visits is not None  # only a visit pauses
            visits.trials, visits.disturbed = trials, disturbed
        result = self._finish(
            input_tokens,
            output_tokens,
            status,
            trials,
            reason=stopped,
            resources=probe.usage,
            disturbed=disturbed,
            prefill_passes=passes,
            queries=queries,
            op_profile=op_profile,
            work=work,
            keep=not paused,
        )
        if not trials and disturbed and all(t.rejected for t in disturbed):
            # kept in the run (every trial's reason), but the case was never done
            pytest.fail(
                f"every trial ({len(disturbed)}) was rejected; the first: {disturbed[0].rejected}",
                pytrace=False,
            )
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

    def _may_stop(self, measured: int, disturbed: int) -> bool:
        """Whether the stopping rule could stop after this many trials: below the
        minimum and the limit it cannot (``decide`` says so too, at the cost of its
        statistics after every trial)."""
        options = self.options
        return measured >= max(2, options.min_trials) or measured + disturbed >= options.max_trials

    def _pacer_meta(self, input_tokens: int, output_tokens: int, queries: int) -> dict[str, Any]:
        """What the coordinator of a paired run needs of this case: its size, the
        session's conversions (the factors of gated co2_g and cost), and its limits.  Not
        the rule's default minimum time: it keeps a single session's interval from resting
        on too little, where a paired case's rests on its pairs, each turn long against
        the meter's resolution; a minimum time the user set applies."""
        o = self.options
        rule_default = o.min_time == (RULES[o.rule].min_time_s or 0.0)
        return {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "queries": queries,
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
        """The counted work of one more run of the last trial's call, unmeasured: the
        counting's overhead never enters a measured trial."""
        if self.work_counter is None:
            return None
        return self.work_counter(lambda: self._call(fn, args, kwargs))

    def _prefill_passes(
        self,
        prefill_pass: Callable[[], Any] | None,
        trials: list[Trial],
        input_tokens: int,
        queries: int = 1,
    ) -> tuple[Trial, ...]:
        """Windows of back-to-back prefill passes, when a single prefill is too short for
        the meter: each window lasts at least PASS_WINDOW_MULTIPLE x the resolution."""
        resolution_s = self.meter.resolution_s
        prefills = [t.phases[PREFILL].seconds for t in trials if PREFILL in t.phases]
        if prefill_pass is None or resolution_s is None or not prefills:
            return ()
        one_s = max(sum(prefills) / len(prefills), 1e-6)
        if one_s >= RESOLVED_MULTIPLE * resolution_s:
            return ()
        needed_s = PASS_WINDOW_MULTIPLE * resolution_s
        count = min(MAX_PREFILL_PASSES, math.ceil(needed_s / one_s))
        windows: list[Trial] = []
        for index in range(1, max(2, self.options.min_trials) + 1):
            with self.meter.measure() as window:
                for _ in range(count):
                    prefill_pass()
            m = window.measurement
            windows.append(
                Trial(
                    index=index,
                    seconds=m.seconds / count,
                    joules=m.joules / count,
                    net_joules=m.net_joules / count,
                    joules_by_domain={d: j / count for d, j in m.by_domain.items()},
                    net_joules_by_domain={d: j / count for d, j in m.net_by_domain.items()},
                    input_tokens=input_tokens,
                    output_tokens=0,
                    passes=count,
                    queries=queries,
                )
            )
        return tuple(windows)

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
        # the machine's speed at the trials (meters/reference.py), over the visits
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
            counted={name: d.counted for name, d in domains.items()},
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
