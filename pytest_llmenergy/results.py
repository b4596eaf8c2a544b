"""The core data model: what a benchmark case leaves behind, every trial of it.

Trials keep plain numbers (no meter objects) so that a result can be written to JSON
and read back as it was.  Figures derived from the trials (energy per token, throughput,
...) are defined once, in :mod:`pytest_llmenergy.figures`, which reads this module and
is never read by it: ``figures.value(result, "j_per_token")``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .meters.readings import Measurement
from .meters.validity import Telemetry
from .stats import Summary, summarize

if TYPE_CHECKING:
    from .probes.resources import ResourceUsage

PREFILL, DECODE = "prefill", "decode"
# A burst of concurrent requests to a server, split where its batch is full: filling up,
# every request generating (the steady window, what a server's figures should rest on),
# and draining once the first request is done.
RAMP_UP, STEADY, DRAIN = "ramp-up", "steady", "drain"
# What a per-trial figure rests on (``figures.Figure.source``): the measured trials, or
# prefill-only passes repeated back to back, measured after them.
TRIALS, PREFILL_PASSES = "trials", "prefill_passes"
# How a trial's prefill | decode split came about (``Trial.split``): "" its marks (the
# meter read at the first token), or a window of prefill-only passes measured right
# after it, the decode being the rest (a coarse counter cannot split at a mark)
SPLIT_MARKS, SPLIT_PASSES = "", "prefill passes"
SPLITS = (SPLIT_MARKS, SPLIT_PASSES)


class RepeatSettings(Protocol):
    """How a case was repeated (``controller.rule.ControllerSettings``); the data model
    needs only its confidence level and minimum measured time, and must not depend on the
    controller."""

    @property
    def confidence(self) -> float: ...

    @property
    def min_time(self) -> float: ...


def busy_guard(cases: Sequence[CaseResult]) -> dict[str, str]:
    """How the cases' trials were checked for a busy machine, as a run's identity says it
    (``{"busy guard": "25%"}`` or ``"off"``): a run measured with the check off counts
    trials that other processes slowed, so its figures mean something else; {} without
    cases (nothing to say), or where the settings do not say (imported research data)."""
    shares: dict[str, None] = {}
    for case in cases:
        if not hasattr(case.options, "max_background"):
            continue
        share = case.options.max_background
        shares["off" if share is None else f"{share:.0%}"] = None
    return {"busy guard": ", ".join(shares)} if shares else {}


@dataclass(frozen=True)
class PhaseRecord:
    seconds: float
    joules: float  # counted domains, gross
    joules_by_domain: Mapping[str, float]


@dataclass(frozen=True)
class GpuNeighbour:
    """Another process the driver listed on a measured GPU (``conditions.isolation``)."""

    gpu: str  # gpu:0
    pid: int
    name: str = ""

    def describe(self) -> str:
        return f"{self.gpu} pid {self.pid}" + (f" {self.name}" if self.name else "")


@dataclass(frozen=True)
class GpuTelemetry:
    """What the GPUs did during one trial (``conditions.telemetry``); None: not read."""

    temperature_c_max: float | None = None
    sm_clock_mhz_mean: float | None = None
    reasons: tuple[str, ...] = ()  # clock-event (throttle) reasons seen, e.g. sw_power_cap
    power_capped_s: float | None = None  # held back by the power limit (violation counter)
    thermal_s: float | None = None  # held back by heat
    throttled: str = ""  # why the trial does not show its setting (heat, power brake)
    power_limit_w: float | None = None  # the limit in force (enforced) as the trial began
    # Other processes on the measured GPUs before or during the trial: it is disturbed.
    neighbours: tuple[GpuNeighbour, ...] = ()


@dataclass(frozen=True)
class ThermalWait:
    """How a case waited for the GPUs to cool before it began (``conditions.thermal``)."""

    start_c: tuple[float | None, ...]  # each GPU's temperature as the case began
    reference_c: tuple[float | None, ...] = ()  # what it had to come back near (): first
    tolerance_c: float = 0.0  # how far above its reference a GPU may start
    waited_s: float = 0.0
    gave_up: bool = False  # the longest wait passed first: it began hotter


@dataclass(frozen=True)
class RequestRecord:
    """One request of a trial sent to a server, timed from its streamed response."""

    ttft_s: float | None  # from sending the request to the first output token (None: not streamed)
    latency_s: float  # from sending it to the last byte of the response
    output_tokens: int  # as the response's usage counted them
    # A served workload's request (serving/replay.py): its input tokens, when it was sent
    # (seconds after the workload's window opened), why it did not complete as asked ("":
    # it did), its joules as attributed (serving/attribution.py: prefill and decode net of
    # idle power, so they may be below 0; ``plain_j``: ML.ENERGY's steady J/token x its
    # output tokens) and why its share is not its own ("": the meter resolves it).  None
    # and "": a burst's request, whose trial's joules are shared alike.
    input_tokens: int | None = None
    sent_s: float | None = None
    status: str = ""
    prefill_j: float | None = None
    decode_j: float | None = None
    plain_j: float | None = None
    coarse: str = ""

    @property
    def energy_j(self) -> float | None:
        """The request's attributed joules (prefill + decode); None: not attributed."""
        if self.prefill_j is None or self.decode_j is None:
            return None
        return self.prefill_j + self.decode_j

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (latency - TTFT) / (output tokens - 1)."""
        if self.output_tokens < 2 or self.ttft_s is None:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class PowerSlice:
    """The meter's joules over one stretch of a served workload's window, in seconds
    from the window's start: its power over time, drawn under its requests."""

    start_s: float
    end_s: float
    joules: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Trial:
    """One measured run of the target."""

    index: int  # 1-based, warm-up not counted
    seconds: float
    joules: float  # gross, every counted domain once
    net_joules: float  # gross minus idle power x duration
    joules_by_domain: Mapping[str, float]
    net_joules_by_domain: Mapping[str, float]
    input_tokens: int
    output_tokens: int
    phases: Mapping[str, PhaseRecord] = field(default_factory=dict)
    # Share of the machine's CPU capacity other processes used meanwhile (None: not read).
    background_cpu: float | None = None
    # Back-to-back runs in the window this trial stands for; its figures are per run.
    passes: int = 1
    # Queries the trial ran together, each of ``input_tokens`` -> ``output_tokens``: a
    # batch of prompts, or requests in flight at once.  The window's joules are theirs.
    queries: int = 1
    # Each request's timing, when the target was a server (empty otherwise).
    requests: tuple[RequestRecord, ...] = ()
    # The GPUs' temperature, clock and throttle reasons during the trial, when read.
    gpu: GpuTelemetry | None = None
    # Why the target's result did not count (errors.TrialRejected, e.g. a server counted
    # other tokens); such a trial is kept with the disturbed ones.  Empty: it counted.
    rejected: str = ""
    # Which session of a pooled run measured it (``llmenergy merge`` numbers its runs
    # from 1); 0 in a run of one session.  Comparisons count sessions, not trials.
    session: int = 0
    # Which visit of its case measured it, under --energy-interleave (the session visits
    # every case several times, in a new random order each time); 0: not interleaved.
    visit: int = 0
    # The reference workload's time around the case's trials in this trial's session
    # (probes/reference.py): the machine's speed then; None where it was not read.
    reference_s: float | None = None
    # Which pair of a paired run (``llmenergy ab``) it belongs to: the other side's trial
    # of the same number ran next to it in time.  0: not paired.
    pair: int = 0
    # A burst to a server: the output tokens streamed in its steady window (the STEADY
    # phase), and why the burst had no steady window worth measuring ("": it had, or the
    # trial was no burst).  An unstable burst's case is flagged and never gated.
    steady_tokens: int = 0
    unstable: str = ""
    # The steady window's mean batch: requests generating, averaged over its time (0: no
    # window).  ML.ENERGY rejects a batch size whose mean stays under 85 % of it.
    steady_batch: float = 0.0
    # "": no running-requests gauge, or none that strayed; else how the gauge strayed from
    # what that batch rests on: the engine's timings, or the client's counts
    # (serving/steady.py).
    steady_batch_note: str = ""
    # A sampling meter's telemetry of the window, judged (meters/validity.py): every
    # device read, no long hole, the edges covered.  None: the meter does not sample.
    telemetry: Telemetry | None = None
    # How its prefill | decode phases were split (SPLITS): "" at the marks, or "prefill
    # passes": the prefill's joules from a window of prefill-only passes right after it
    # (controller/passes.py), the decode's the trial's rest.  Seconds are the marks'.
    split: str = SPLIT_MARKS
    # Counted though other processes used more than the case's --energy-max-background
    # of the CPUs meanwhile: the machine was busy for the whole stretch, and the session
    # measured anyway (controller/busy.py).  Its case is busy: never gated.
    busy: bool = False
    # A served workload's window, slice by slice (serving/replay.py): the energy over
    # time its requests ran in.  Empty for any other trial.
    power: tuple[PowerSlice, ...] = ()

    @classmethod
    def from_measurement(
        cls,
        index: int,
        m: Measurement,
        input_tokens: int,
        output_tokens: int,
        background_cpu: float | None = None,
        queries: int = 1,
        requests: tuple[RequestRecord, ...] = (),
        power: tuple[PowerSlice, ...] = (),
    ) -> Trial:
        return cls(
            index=index,
            seconds=m.seconds,
            joules=m.joules,
            net_joules=m.net_joules,
            joules_by_domain=dict(m.by_domain),
            net_joules_by_domain=m.net_by_domain,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            phases={
                name: PhaseRecord(p.seconds, p.joules, dict(p.by_domain))
                for name, p in m.phases.items()
            }
            if len(m.phases) > 1
            else {},
            background_cpu=background_cpu,
            queries=queries,
            requests=requests,
            power=power,
        )

    @property
    def total_tokens(self) -> int:
        """Input + output tokens of every query of the trial: what J/token divides by."""
        return self.queries * (self.input_tokens + self.output_tokens)


@dataclass(frozen=True)
class OpWork:
    """One operator's counted work in one phase of a case (``predict.work_count``).

    Counted, not measured: the same code, inputs and library versions give the same
    numbers on every machine, so they need no statistics.
    """

    name: str  # aten::mm
    op_class: str  # matmul, attention, embedding, elementwise, other
    calls: int
    flops: float
    bytes: int  # inputs + outputs of each call: an upper bound of memory traffic
    # Some of ``flops`` is a guess: an attention mask the count could not read, an
    # attention kernel run outside any attention call, or a torch formula that refused
    # the shapes (its FLOPs are missing).
    estimated: bool = False


@dataclass(frozen=True)
class CountedWork:
    """The work one unmeasured run of a case dispatched, per phase and operator.

    ``prefill`` runs up to the first output token, ``decode`` after it; without the
    mark (a target that does not generate) everything is in ``prefill`` and ``marked``
    is False.
    """

    prefill: tuple[OpWork, ...] = ()
    decode: tuple[OpWork, ...] = ()
    marked: bool = False
    seconds: float = 0.0  # the counting run's wall time: its cost, not a figure
    # Under torchrun: each rank's own work, in rank order; the fields above are the job's
    # (every rank's summed), so figures per token are the job's.  Empty elsewhere.
    ranks: tuple[CountedWork, ...] = ()
    # Decode steps whose work was derived from the sampled ones, not counted
    # (predict.work_count); and why a run was counted in full after all ("": it was not).
    derived_steps: int = 0
    full_because: str = ""

    def ops(self, phase: str | None = None) -> tuple[OpWork, ...]:
        """The operators of one phase (PREFILL or DECODE), or of both (None)."""
        if phase == PREFILL:
            return self.prefill
        if phase == DECODE:
            return self.decode
        return (*self.prefill, *self.decode)

    def total(self, attr: str, phase: str | None = None, op_class: str | None = None) -> float:
        """Summed ``calls``, ``flops`` or ``bytes`` of a phase (None: both), optionally
        of one operator class."""
        return math.fsum(
            float(getattr(o, attr))
            for o in self.ops(phase)
            if op_class is None or o.op_class == op_class
        )

    @property
    def estimated(self) -> bool:
        """Some FLOPs are the project's estimate, not torch's formula."""
        return any(o.estimated for o in self.ops())

    @staticmethod
    def of_job(ranks: Sequence[CountedWork]) -> CountedWork:
        """The work of a torchrun job: every rank's operators summed, each rank's kept."""

        def summed(phase: str) -> tuple[OpWork, ...]:
            rows: dict[tuple[str, str], list[Any]] = {}
            for w in ranks:
                for o in w.ops(phase):
                    row = rows.setdefault((o.name, o.op_class), [0, 0.0, 0, False])
                    row[0] += o.calls
                    row[1] += o.flops
                    row[2] += o.bytes
                    row[3] = row[3] or o.estimated
            return tuple(OpWork(n, c, *v) for (n, c), v in sorted(rows.items()))

        return CountedWork(
            summed(PREFILL),
            summed(DECODE),
            all(w.marked for w in ranks),
            max((w.seconds for w in ranks), default=0.0),
            tuple(ranks),
        )


# How a case ended.
CONVERGED = "converged"  # every CI target held (the precision was reached)
LIMIT = "limit"  # stopped at the trial limit or time budget before the targets held
ROUNDS = "rounds"  # pedantic: a fixed number of rounds, no stopping rule
OOM = "oom"  # ran out of memory; recorded and skipped


@dataclass(frozen=True)
class CaseResult:
    """One benchmark case: its identity, how it was run, every trial, and its status."""

    nodeid: str
    name: str
    labels: Mapping[str, str]  # e.g. model, sweep: for grouping in reports
    input_tokens: int
    output_tokens: int
    status: str
    options: RepeatSettings
    trials: tuple[Trial, ...] = ()
    methods: Mapping[str, str] = field(default_factory=dict)  # domain -> counter/sampled/...
    counted: Mapping[str, bool] = field(default_factory=dict)  # domain -> in the totals?
    backend: str = ""
    reason: str = ""  # for OOM and other non-measurements; for LIMIT, the unmet targets
    resources: ResourceUsage | None = None
    # Trials taken while the machine was busy with other work: kept, but out of every
    # figure and test (``trials`` holds the undisturbed ones).
    disturbed: tuple[Trial, ...] = ()
    # The meter's resolution (``Meter.resolution_s``): energy over shorter stretches than
    # it resolves is marked and never gated.  None: unknown.
    resolution_s: float | None = None
    # Prefill-only passes repeated back to back, one Trial per window, per pass: the
    # prefill's energy where a single prefill is too short for the meter.
    prefill_passes: tuple[Trial, ...] = ()
    # The session's factors from joules to gCO2e and money (conversions.py), per kWh.
    conversions: Mapping[str, float] = field(default_factory=dict)
    # Queries per trial (batch size x concurrent requests); tokens above are per query.
    queries: int = 1
    # The operator trace of one unmeasured run after the trials (--energy-profile-ops):
    # plain JSON from predict.op_profile.  None: not profiled.
    op_profile: Mapping[str, Any] | None = None
    # The work one more unmeasured run dispatched, counted (--energy-count-work): FLOPs,
    # bytes and operator calls per phase.  None: not counted.
    work: CountedWork | None = None
    # The reference workload's CPU seconds around the trials (probes/reference.py): how
    # fast the machine ran while this case did.  None: not read.
    reference_s: float | None = None
    # How it waited for the GPUs to cool before it began (--energy-thermal-tolerance);
    # None: it did not.
    thermal: ThermalWait | None = None

    # -- status --------------------------------------------------------------
    @property
    def converged(self) -> bool:
        return self.status == CONVERGED

    @property
    def measured(self) -> bool:
        return bool(self.trials)

    @property
    def measured_s(self) -> float:
        """The runtime of the trials its figures rest on (what the minimum time counts)."""
        return math.fsum(t.seconds * t.passes for t in self.trials)  # whole windows

    @property
    def short_of_time(self) -> bool:
        """Its intervals held, but it stopped at the trial limit before the minimum measured
        time (a short case): precise on less time than the rule asks, so shown apart.  A
        paired run's case (``llmenergy ab``) stops on its pairs, never at this limit."""
        paired = any(t.pair for t in self.trials)
        return self.converged and not paired and self.measured_s < self.options.min_time

    @property
    def busy(self) -> bool:
        """Some trials were disturbed by other work on the machine, or counted though the
        machine was busy: its figures may be too, so a gate cannot fail on them.  (Trials
        left out only because the GPU was throttled by heat or a power brake are
        ``throttled``, not busy.)"""
        return bool(self.busy_counted) or any(
            not t.rejected and (t.gpu is None or not t.gpu.throttled) for t in self.disturbed
        )

    @property
    def busy_counted(self) -> tuple[Trial, ...]:
        """Its figures' trials that the machine's other work may have slowed: counted
        anyway, the machine being busy throughout (``Trial.busy``)."""
        return tuple(t for t in self.trials if t.busy)

    @property
    def busy_share(self) -> float:
        """The largest share of the CPUs other processes used during a counted busy trial
        (0: none): how far its figures may be off follows from it (controller/busy.py)."""
        return max((t.background_cpu or 0.0 for t in self.busy_counted), default=0.0)

    @property
    def throttled(self) -> tuple[Trial, ...]:
        """Trials left out because the GPU ran slowed by heat or a power brake."""
        return tuple(
            t for t in self.disturbed if not t.rejected and t.gpu is not None and t.gpu.throttled
        )

    @property
    def busy_trials(self) -> tuple[Trial, ...]:
        """The disturbed trials that other processes disturbed (not a throttled GPU, not a
        rejected result)."""
        left = {id(t) for t in (*self.throttled, *self.rejected)}
        return tuple(t for t in self.disturbed if id(t) not in left)

    @property
    def unstable(self) -> tuple[Trial, ...]:
        """Kept bursts with no steady window worth measuring: the case is never gated."""
        return tuple(t for t in self.trials if t.unstable)

    @property
    def invalid_telemetry(self) -> tuple[Trial, ...]:
        """Kept trials whose power telemetry was not valid: the case is never gated."""
        return tuple(t for t in self.trials if t.telemetry is not None and not t.telemetry.valid)

    @property
    def rejected(self) -> tuple[Trial, ...]:
        """Trials whose result did not count (``errors.TrialRejected``), kept and repeated."""
        return tuple(t for t in self.disturbed if t.rejected)

    @property
    def max_background_cpu(self) -> float | None:
        shares = [t.background_cpu for t in (*self.trials, *self.disturbed)]
        known = [s for s in shares if s is not None]
        return max(known) if known else None

    @property
    def estimated(self) -> bool:
        return any(m == "estimated" for d, m in self.methods.items() if self.counted.get(d, True))

    # -- time and energy -----------------------------------------------------
    @property
    def time(self) -> Summary:
        """Seconds per trial: the ``time_s`` figure (a batch's queries end together)."""
        return summarize([t.seconds for t in self.trials], self.options.confidence)

    @property
    def energy(self) -> Summary:
        """Joules per trial: the meter's whole window, every query of a batch or a burst.
        Not the ``energy_j`` figure, joules per query, where a trial runs several queries;
        kept as the guide documents it (users' tests read it; for one query the two
        agree).  The figure: ``figures.FIGURES["energy_j"].summary(result)``."""
        return summarize([t.joules for t in self.trials], self.options.confidence)

    @property
    def net_energy(self) -> Summary:
        """Joules per trial above idle power (``energy``'s net twin; ``net_energy_j`` is
        per query)."""
        return summarize([t.net_joules for t in self.trials], self.options.confidence)

    def domain_joules(self) -> dict[str, float]:
        """Mean gross joules per domain."""
        if not self.trials:
            return {}
        names = self.trials[0].joules_by_domain
        return {d: _mean([t.joules_by_domain[d] for t in self.trials]) for d in names}

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def has_phases(self) -> bool:
        """Every trial was split into prefill and decode (at the first output token)."""
        return bool(self.trials) and all(
            PREFILL in t.phases and DECODE in t.phases for t in self.trials
        )

    # -- 0.1.0's per-figure properties: deprecated, removed in 0.3 ----------------------
    # Each is the registry's figure of the same meaning (tests/test_figures.py checks they
    # agree); figures.value(result, key) replaces them.
    def _deprecated(self, name: str, key: str) -> None:
        warnings.warn(
            f"CaseResult.{name} is deprecated; use pytest_llmenergy.figures.value(result, {key!r})",
            DeprecationWarning,
            stacklevel=3,
        )

    @property
    def joules_per_token(self) -> float:
        self._deprecated("joules_per_token", "j_per_token")
        return _mean([t.joules / (t.input_tokens + t.output_tokens) for t in self.trials])

    @property
    def tokens_per_s(self) -> float:
        self._deprecated("tokens_per_s", "tokens_per_s")
        return _mean([(t.input_tokens + t.output_tokens) / t.seconds for t in self.trials])

    @property
    def power_w(self) -> float:
        self._deprecated("power_w", "power_w")
        return _mean([t.joules / t.seconds for t in self.trials])

    @property
    def prefill_seconds(self) -> float:
        self._deprecated("prefill_seconds", "ttft_s")
        return self._old_phase(PREFILL, "seconds")

    @property
    def decode_seconds(self) -> float:
        self._deprecated("decode_seconds", "decode_s")
        return self._old_phase(DECODE, "seconds")

    @property
    def prefill_joules(self) -> float:
        self._deprecated("prefill_joules", "prefill_j")
        return self._old_phase(PREFILL, "joules")

    @property
    def decode_joules(self) -> float:
        self._deprecated("decode_joules", "decode_j")
        return self._old_phase(DECODE, "joules")

    def _old_phase(self, name: str, attr: str) -> float:
        if not self.has_phases:
            return math.nan
        return _mean([getattr(t.phases[name], attr) for t in self.trials])


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def _id_levels(nodeid: str, by_param: bool) -> list[str]:
    """A node id's names from the shortest to the whole id: the parameter id (when
    ``by_param``: every row is a case of one test), the test with it, then its class(es),
    its file, its folders."""
    path, _, rest = nodeid.partition("::")
    names = rest.split("::") if rest else []
    folders = path.split("/") if path else []
    test = names[-1] if names else (folders.pop() if folders else nodeid)
    levels = []
    if by_param and test.endswith("]") and "[" in test:
        levels.append(test.split("[", 1)[1][:-1])
    levels.append(test)
    for outer in reversed(names[:-1]):
        levels.append(f"{outer}::{levels[-1]}")
    if folders:
        levels.append(f"{folders[-1]}::{levels[-1]}")
        for folder in reversed(folders[:-1]):
            levels.append(f"{folder}/{levels[-1]}")
    return levels


def distinct_names(nodeids: Sequence[str]) -> dict[str, str]:
    """Each node id's shortest part that no other of ``nodeids`` shares, so tables name
    rows briefly and still tell apart same-named tests of two files or classes:
    ``test_a.py::test_small`` and ``TestK::test_small``; a lone test keeps its name."""
    ids = list(dict.fromkeys(nodeids))
    # Parameter ids alone name rows only among the cases of one test (and of several).
    by_param = len(ids) > 1 and len({n.split("[", 1)[0] for n in ids}) == 1
    levels = {n: _id_levels(n, by_param) for n in ids}
    taken: dict[str, int] = {}
    for n in ids:
        for name in levels[n]:
            taken[name] = taken.get(name, 0) + 1
    return {n: next((x for x in levels[n] if taken[x] == 1), n) for n in ids}


def work_tokens(case: CaseResult, phase: str | None) -> int:
    """The tokens a phase's counted work is divided by: the prefill's by the input
    tokens, the decode's by the tokens it produced (output - 1), the whole run's (None)
    by input + output; every query of a batch counts."""
    if phase == PREFILL:
        tokens = case.input_tokens
    elif phase == DECODE:
        tokens = max(case.output_tokens - 1, 0)
    else:
        tokens = case.input_tokens + case.output_tokens
    return tokens * max(case.queries, 1)
