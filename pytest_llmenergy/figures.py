"""The figures: every quantity a case yields, under one name, with its unit and meaning.

Table columns (``case_tables``), gate metrics (``compare``), CI targets
(``controller.targets``), ``llmenergy show --columns``, ``llmenergy metrics``, the
figures' data and exports all draw from ``FIGURES``, so a new figure is one row here.

Per token, as the research means it
    ``j_per_token`` is the query's joules over *all* its tokens (input + output): the
    research's energy per token and the gates' default.  ``prefill_j_per_in_token`` is the
    prefill pass's joules per input token, and ``decode_j_per_out_token`` the decode
    passes' joules per token they produce; since the prefill pass produces the first output
    token, decode produces ``output_tokens - 1`` tokens, so
    ``prefill_j_per_in_token * in + decode_j_per_out_token * (out - 1)`` is the query's
    joules.

A figure with a per-trial value (``trial``, or ``family``: the energy of one family of
domains, GPU, CPU or DRAM) can be compared between runs (``sessions.py``), gated and used as a CI
target; its case value is the mean over the trials.  Figures without one (token counts,
the trial count, memory) are shown only.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .conversions import G_PER_KWH, J_PER_KWH, PRICE_PER_KWH
from .errors import ConfigError
from .meters.readings import PROCESS_DOMAIN
from .results import (
    DECODE,
    PREFILL,
    PREFILL_PASSES,
    SPLIT_MARKS,
    STEADY,
    TRIALS,
    CaseResult,
    Trial,
    work_tokens,
)
from .stats import Summary, summarize

Value = int | float | str | bool | None


class DeprecatedName(FutureWarning):
    """An old figure name was used; it still works for one release.  FutureWarning, so
    that users (not only developers) see it."""


@dataclass(frozen=True)
class Figure:
    """One quantity: its name everywhere, how it is computed, and how it is shown.

    ``trial`` gives the figure of one trial (None where the trial lacks it, e.g. no
    prefill/decode split); ``case`` overrides the case value, which is otherwise the mean
    over the trials.  ``priority`` orders columns for narrowing a table to the terminal:
    the highest numbers are left out first.
    """

    key: str
    label: str
    unit: str
    meaning: str
    trial: Callable[[Trial], float | None] | None = None
    case: Callable[[CaseResult], Value] | None = None
    lower_is_better: bool | None = True  # None: not a performance figure (a count, a name)
    needs_phases: bool = False
    energy: bool = False  # shown with the ~ mark when the energy is an estimate
    with_ci: bool = False  # shown as mean ± CI half-width
    priority: int = 5
    numeric: bool = True
    # the stretch an energy figure comes from: None the whole trial, else a phase's name;
    # a stretch shorter than the meter resolves is marked and never gated (``resolved``)
    phase: str | None = None
    # "trials", or "prefill_passes": prefill-only passes repeated back to back in windows
    # long enough for the meter, one value per window
    source: str = TRIALS
    # The key of the case's ``conversions`` (its session's gCO2e or price per kWh) that
    # multiplies every trial value; a case without that factor does not have the figure.
    conversion: str | None = None
    # The joules of one family of domains ("gpu", "cpu", "dram") in a trial, and the figure
    # made of them: ``gpu_j``, ``gpu_j_per_token``.  Which domains count is the meter's
    # (a core inside a package does not), so the value needs the case's ``counted``.
    family: tuple[str, Callable[[float, Trial], float | None]] | None = None
    # Counted, not measured (predict.work_count): identical in every session with the
    # same code and library versions, so a gate compares the case values exactly, with
    # no statistics.  It has no value per trial, so it is no CI target.
    exact: bool = False

    @property
    def per_trial(self) -> bool:
        """Comparable between runs and gateable; a CI target unless ``exact``."""
        return self.trial is not None or self.family is not None or self.exact

    def of_trial(self, t: Trial, counted: Mapping[str, bool] | None = None) -> float | None:
        """One trial's value; ``counted`` (domain -> in the totals?) for a family figure."""
        if self.family is not None:
            name, formula = self.family
            joules = [
                j
                for d, j in t.joules_by_domain.items()
                if (counted or {}).get(d, True) and _family(d) == name
            ]
            return formula(math.fsum(joules), t) if joules else None
        return self.trial(t) if self.trial is not None else None

    def values_of(
        self,
        trials: Sequence[Trial],
        *,
        counted: Mapping[str, bool] | None = None,
        conversions: Mapping[str, float] | None = None,
        prefill_passes: Sequence[Trial] = (),
    ) -> list[float] | None:
        """Every trial's value, from the trials (or prefill passes: ``source``) of a case
        still being measured or paired as well as of a finished one: the one place a
        per-trial value is computed.  ``counted``: domain -> in the totals? (a family
        figure); ``conversions``: the session's factors per kWh (co2_g, cost).  None when
        a trial lacks the figure, there are no trials, or its factor is not given."""
        chosen = prefill_passes if self.source == PREFILL_PASSES else trials
        if not self.per_trial or not chosen:
            return None
        scale = 1.0
        if self.conversion is not None:
            found = (conversions or {}).get(self.conversion)
            if found is None:
                return None
            scale = found
        values = [self.of_trial(t, counted) for t in chosen]
        if any(v is None or not math.isfinite(v) for v in values):
            return None
        return [float(v) * scale for v in values if v is not None]

    def trial_values(self, r: CaseResult) -> list[float] | None:
        """Every trial's value in a finished case (``values_of`` its trials)."""
        return self.values_of(
            r.trials,
            counted=r.counted,
            conversions=r.conversions,
            prefill_passes=r.prefill_passes,
        )

    def summary(self, r: CaseResult) -> Summary | None:
        values = self.trial_values(r)
        return None if values is None else summarize(values, r.options.confidence)

    def value(self, r: CaseResult) -> Value:
        """The case's figure; None where it has none (NaN never leaves this method)."""
        if self.case is not None:
            raw = self.case(r)
        else:
            values = self.trial_values(r)
            raw = math.fsum(values) / len(values) if values else None
        if isinstance(raw, float) and not math.isfinite(raw):
            return None
        return raw


# -- per-trial formulas -----------------------------------------------------------------
def _per(numerator: float | None, denominator: float) -> float | None:
    if numerator is None or not denominator or denominator <= 0:
        return None
    return numerator / denominator


def _phase(name: str, attr: str) -> Callable[[Trial], float | None]:
    def value(t: Trial) -> float | None:
        phase = t.phases.get(name)
        return None if phase is None else float(getattr(phase, attr))

    return value


def decode_tokens(t: Trial) -> int:
    """Tokens the decode passes produce: the prefill pass produces the first one (of
    every query of the trial)."""
    return max(t.output_tokens - 1, 0) * t.queries


def _per_query(joules: float | None, t: Trial) -> float | None:
    """A trial's joules shared by its queries (a batch's, or a burst of requests')."""
    return None if joules is None else joules / t.queries


def _both_phases(t: Trial) -> bool:
    return PREFILL in t.phases and DECODE in t.phases


def _prefill_j_per_in_token(t: Trial) -> float | None:
    n_in = t.input_tokens * t.queries
    return _per(_phase(PREFILL, "joules")(t), n_in) if _both_phases(t) else None


def _decode_j_per_out_token(t: Trial) -> float | None:
    return _per(_phase(DECODE, "joules")(t), decode_tokens(t)) if _both_phases(t) else None


def _steady_j_per_token(t: Trial) -> float | None:
    return _per(_phase(STEADY, "joules")(t), t.steady_tokens)


def _steady_j_per_response(t: Trial) -> float | None:
    per_token = _steady_j_per_token(t)
    return None if per_token is None else per_token * t.output_tokens


def _steady_tokens_per_j(t: Trial) -> float | None:
    return _per(t.steady_tokens, _phase(STEADY, "joules")(t) or 0.0)


def _out_tokens_per_s(t: Trial) -> float | None:
    return _per(decode_tokens(t), _phase(DECODE, "seconds")(t) or 0.0) if _both_phases(t) else None


# -- per-case formulas ------------------------------------------------------------------
def _family(domain: str) -> str:
    if domain.startswith("gpu:"):
        return "gpu"
    if domain.startswith(("cpu:dram", "dram")):
        return "dram"
    if domain.startswith("cpu:"):
        return "cpu"
    return "other"


def _resource(attr: str, scale: float = 1.0) -> Callable[[CaseResult], float | None]:
    def value(r: CaseResult) -> float | None:
        return None if r.resources is None else getattr(r.resources, attr) / scale

    return value


def _trials(r: CaseResult) -> int | None:
    return len(r.trials) if r.measured else None


def _work(attr: str, phase: str | None = None) -> Callable[[CaseResult], float | None]:
    """Counted work per token: of the whole query per token (input + output, as
    ``j_per_token``), of the prefill per input token, of the decode per token it
    produces (output tokens - 1); every query of a batch counts."""

    def value(r: CaseResult) -> float | None:
        w = r.work
        if w is None or (phase is not None and not w.marked):
            return None
        return _per(w.total(attr, phase), work_tokens(r, phase))

    return value


_COUNTED = (
    "counted in the case's warm-up run, unmeasured (on by default; --energy-count-work=off "
    "skips it): exact, the same in every session with the same code and library versions"
)
_FLOPS = (
    "FLOPs by torch's formulas, attention's by its attended query-key pairs: the same on "
    "every device and attention backend"
)
_BYTES = (
    "bytes of every operator's tensor inputs and outputs: an upper bound of memory "
    "traffic, not cache-aware"
)
_OPS = "aten operator calls, views included"


def _work_figures() -> tuple[Figure, ...]:
    """Work per token, and its prefill and decode twins, for FLOPs, bytes and calls."""
    out = []
    for attr, unit, short, what in (
        ("flops", "FLOP", "FLOP", _FLOPS),
        ("bytes", "B", "B", _BYTES),
        ("calls", "ops", "ops", _OPS),
    ):
        key = "ops" if attr == "calls" else attr
        for phase, suffix, label, per in (
            (None, "per_token", "/tok", "per token (input + output)"),
            (PREFILL, "per_input_token", "/in", "of the prefill per input token"),
            (DECODE, "per_output_token", "/out", "of the decode per output token after the first"),
        ):
            name = f"{key}_{suffix}" if phase is None else f"{phase}_{key}_{suffix}"
            shown = f"{short}{label}" if phase is None else f"{phase} {short}{label}"
            out.append(
                Figure(
                    name,
                    shown,
                    unit,
                    f"{what}, {per}; {_COUNTED}",
                    case=_work(attr, phase),
                    exact=True,
                    needs_phases=phase is not None,
                    # FLOPs per token is on the default table: kept as long as out tok/s
                    priority=3 if name == "flops_per_token" else 7,
                )
            )
    return tuple(out)


# -- a server's requests (``--llm-endpoint``): timed from their streamed responses ----------
def _request_mean(attr: str) -> Callable[[Trial], float | None]:
    """The mean over a trial's requests (None: not a server's trial)."""

    def value(t: Trial) -> float | None:
        found = [getattr(q, attr) for q in t.requests]
        known = [v for v in found if v is not None]
        return math.fsum(known) / len(known) if known else None

    return value


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the two nearest ranks (numpy's
    default), so p50 of an even count is the mean of the middle two."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _latency_percentile(q: float) -> Callable[[CaseResult], float | None]:
    """Over every request of every trial of the case: one request is one query's wait."""

    def value(r: CaseResult) -> float | None:
        latencies = [req.latency_s for t in r.trials for req in t.requests]
        return percentile(latencies, q) if latencies else None

    return value


FIGURES: dict[str, Figure] = {
    f.key: f
    for f in (
        # -- what the case is ---------------------------------------------------------
        Figure(
            "name",
            "name",
            "",
            "the test's name with its parameter id",
            case=lambda r: r.name,
            lower_is_better=None,
            numeric=False,
            priority=9,
        ),
        Figure(
            "tokens_in",
            "in",
            "tokens",
            "input (prompt) tokens per query",
            case=lambda r: r.input_tokens,
            lower_is_better=None,
            priority=0,
        ),
        Figure(
            "tokens_out",
            "out",
            "tokens",
            "output (generated) tokens per query",
            case=lambda r: r.output_tokens,
            lower_is_better=None,
            priority=0,
        ),
        Figure(
            "trials",
            "trials",
            "",
            "measured trials; ✓ every CI target held, ✓< held but stopped at the trial limit "
            "short of the minimum time, ✗ stopped at the trial limit",
            case=_trials,
            lower_is_better=None,
            priority=2,
        ),
        Figure(
            "status",
            "status",
            "",
            "how the case ended: converged, limit, rounds or oom",
            case=lambda r: r.status,
            lower_is_better=None,
            numeric=False,
            priority=9,
        ),
        Figure(
            "disturbed",
            "busy trials",
            "",
            "trials taken while other processes kept the CPUs busy (over "
            "--energy-max-background): kept in the run, left out of every figure",
            case=lambda r: len(r.disturbed) if r.measured or r.disturbed else None,
            lower_is_better=None,
            priority=9,
        ),
        Figure(
            "background_cpu",
            "background CPU",
            "",
            "the most other processes used of the machine's CPUs during one of the "
            "case's trials, as a share (0.5: half the CPUs)",
            case=lambda r: r.max_background_cpu,
            lower_is_better=None,
            priority=9,
        ),
        # -- the whole query ----------------------------------------------------------
        Figure(
            "time_s",
            "s ± CI",
            "s",
            "seconds per query (runtime), mean ± CI half-width; a batch's or a burst's "
            "queries end together, so for them it is the trial's: each query's wait",
            trial=lambda t: t.seconds,
            with_ci=True,
            priority=1,
        ),
        Figure(
            "energy_j",
            "J ± CI",
            "J",
            "joules per query over the counted domains, mean ± CI half-width (a batch's "
            "or a burst's joules shared by its queries: the trial's joules / queries)",
            trial=lambda t: t.joules / t.queries,
            energy=True,
            with_ci=True,
            priority=1,
        ),
        Figure(
            "net_energy_j",
            "net J ± CI",
            "J",
            "joules per query above idle power (needs --energy-idle), mean ± CI half-width",
            trial=lambda t: t.net_joules / t.queries,
            energy=True,
            with_ci=True,
            priority=6,
        ),
        Figure(
            "j_per_token",
            "J/token",
            "J",
            "joules per token: the query's joules / (input + output tokens), the research's "
            "energy per token and the gates' default; tokens summed over a batch's or a "
            "burst's queries",
            trial=lambda t: _per(t.joules, t.total_tokens),
            energy=True,
            priority=0,
        ),
        Figure(
            "power_w",
            "avg W",
            "W",
            "mean power during a query: joules / seconds",
            trial=lambda t: _per(t.joules, t.seconds),
            energy=True,
            priority=4,
        ),
        Figure(
            "tokens_per_s",
            "tok/s",
            "tokens/s",
            "total throughput: (input + output tokens) of every query of a trial / seconds",
            # a plain function without token counts has no throughput (not 0 tok/s)
            trial=lambda t: _per(t.total_tokens, t.seconds) if t.total_tokens else None,
            lower_is_better=False,
            priority=4,
        ),
        # -- prefill | decode ---------------------------------------------------------
        Figure(
            "prefill_j_per_in_token",
            "prefill J/in",
            "J",
            "prefill joules per input token: the prefill pass's joules / input tokens",
            trial=_prefill_j_per_in_token,
            energy=True,
            needs_phases=True,
            phase=PREFILL,
            priority=2,
        ),
        Figure(
            "decode_j_per_out_token",
            "decode J/out",
            "J",
            "decode joules per output token: the decode passes' joules / the tokens they "
            "produce (output tokens - 1; the prefill pass produces the first)",
            trial=_decode_j_per_out_token,
            energy=True,
            needs_phases=True,
            phase=DECODE,
            priority=2,
        ),
        Figure(
            "out_tokens_per_s",
            "out tok/s",
            "tokens/s",
            "decode throughput: output tokens per second of the decode passes (the first "
            "token, made by the prefill pass, not counted)",
            trial=_out_tokens_per_s,
            lower_is_better=False,
            needs_phases=True,
            priority=3,
        ),
        Figure(
            "ttft_s",
            "TTFT s",
            "s",
            "time to first token: seconds of the prefill pass",
            trial=lambda t: _phase(PREFILL, "seconds")(t) if _both_phases(t) else None,
            needs_phases=True,
            priority=6,
        ),
        Figure(
            "decode_s",
            "decode s",
            "s",
            "seconds of the decode passes",
            trial=lambda t: _phase(DECODE, "seconds")(t) if _both_phases(t) else None,
            needs_phases=True,
            priority=6,
        ),
        Figure(
            "prefill_j",
            "prefill J",
            "J",
            "joules of the prefill pass (per query)",
            trial=lambda t: (
                _per_query(_phase(PREFILL, "joules")(t), t) if _both_phases(t) else None
            ),
            energy=True,
            needs_phases=True,
            phase=PREFILL,
            priority=6,
        ),
        Figure(
            "decode_j",
            "decode J",
            "J",
            "joules of the decode passes (per query)",
            trial=lambda t: _per_query(_phase(DECODE, "joules")(t), t) if _both_phases(t) else None,
            energy=True,
            needs_phases=True,
            phase=DECODE,
            priority=6,
        ),
        Figure(
            "prefill_pass_j",
            "prefill-pass J",
            "J",
            "joules of one prefill pass, measured as many passes back to back in one "
            "window divided by their count: for prefills shorter than the meter resolves",
            trial=lambda t: t.joules / t.queries,
            energy=True,
            with_ci=True,
            source=PREFILL_PASSES,
            priority=6,
        ),
        Figure(
            "prefill_pass_j_per_in_token",
            "prefill-pass J/in",
            "J",
            "prefill joules per input token from repeated prefill-only passes "
            "(prefill_pass_j / input tokens)",
            trial=lambda t: _per(t.joules, t.input_tokens * t.queries),
            energy=True,
            source=PREFILL_PASSES,
            priority=6,
        ),
        # -- a server's steady window (serving/steady.py) -----------------------------------
        Figure(
            "steady_power_w",
            "steady W",
            "W",
            "a burst's power in its steady window, every request generating (the meter's "
            "joules from the last first token to the first finished response / its seconds)",
            trial=lambda t: _per(_phase(STEADY, "joules")(t), _phase(STEADY, "seconds")(t) or 0.0),
            energy=True,
            phase=STEADY,
            priority=5,
        ),
        Figure(
            "steady_j_per_token",
            "steady J/out",
            "J",
            "joules per output token in a burst's steady window: the window's joules / the "
            "output tokens streamed in it, as ML.ENERGY's benchmark measures servers",
            trial=_steady_j_per_token,
            energy=True,
            phase=STEADY,
            priority=3,
        ),
        Figure(
            "steady_j_per_response",
            "steady J/resp",
            "J",
            "joules per response at the steady window's rate: steady J/out x the output "
            "tokens of one response (ML.ENERGY's energy per response)",
            trial=_steady_j_per_response,
            energy=True,
            phase=STEADY,
            priority=6,
        ),
        Figure(
            "steady_tokens_per_s_per_w",
            "steady tok/s/W",
            "tokens/s/W",
            "output throughput per watt in the steady window: (tokens streamed / seconds) / "
            "(joules / seconds), so tokens per joule (ML.ENERGY's throughput per watt)",
            trial=_steady_tokens_per_j,
            energy=True,
            lower_is_better=False,
            phase=STEADY,
            priority=7,
        ),
        Figure(
            "steady_batch",
            "steady batch",
            "requests",
            "a burst's mean batch in its steady window: the requests past their first token "
            "and not finished, averaged over the window's time (ML.ENERGY's batch, which "
            "must reach 85 % of the concurrency)",
            trial=lambda t: t.steady_batch or None,
            lower_is_better=None,
            phase=STEADY,
            priority=7,
        ),
        # -- what the energy costs (--energy-carbon-intensity, --energy-price) -----------
        Figure(
            "co2_g",
            "gCO2e",
            "g",
            "grams of CO2-equivalent per query: joules / 3.6e6 x the session's gCO2e/kWh "
            "(--energy-carbon-intensity)",
            trial=lambda t: t.joules / t.queries / J_PER_KWH,
            conversion=G_PER_KWH,
            energy=True,
            priority=6,
        ),
        Figure(
            "co2_g_per_1k_tokens",
            "gCO2e/1k tok",
            "g",
            "grams of CO2-equivalent per 1,000 tokens (input + output)",
            trial=lambda t: _per(1000 * t.joules / J_PER_KWH, t.total_tokens),
            conversion=G_PER_KWH,
            energy=True,
            priority=5,
        ),
        Figure(
            "cost",
            "cost",
            "money",
            "money per query: joules / 3.6e6 x the session's price per kWh (--energy-price)",
            trial=lambda t: t.joules / t.queries / J_PER_KWH,
            conversion=PRICE_PER_KWH,
            energy=True,
            priority=6,
        ),
        Figure(
            "cost_per_1k_tokens",
            "cost/1k tok",
            "money",
            "money per 1,000 tokens (input + output) at the session's price per kWh",
            trial=lambda t: _per(1000 * t.joules / J_PER_KWH, t.total_tokens),
            conversion=PRICE_PER_KWH,
            energy=True,
            priority=5,
        ),
        # -- where the energy went, and what the process used ---------------------------
        Figure(
            "gpu_j",
            "GPU J",
            "J",
            "joules per query of the GPUs",
            family=("gpu", _per_query),
            energy=True,
            priority=5,
        ),
        Figure(
            "gpu_j_per_token",
            "GPU J/tok",
            "J",
            "joules of the GPUs per token (input + output): a gate on one part of the machine",
            family=("gpu", lambda j, t: _per(j, t.total_tokens)),
            energy=True,
            priority=8,
        ),
        Figure(
            "cpu_j",
            "CPU J",
            "J",
            "joules per query of the CPU packages (or this process's share)",
            family=("cpu", _per_query),
            energy=True,
            priority=5,
        ),
        Figure(
            "cpu_j_per_token",
            "CPU J/tok",
            "J",
            "joules of the CPU packages (or this process's share) per token (input + "
            "output): a gate on one part of the machine",
            family=("cpu", lambda j, t: _per(j, t.total_tokens)),
            energy=True,
            priority=8,
        ),
        Figure(
            "dram_j",
            "DRAM J",
            "J",
            "joules per query of the DRAM",
            family=("dram", _per_query),
            energy=True,
            priority=5,
        ),
        Figure(
            "dram_j_per_token",
            "DRAM J/tok",
            "J",
            "joules of the DRAM per token (input + output): a gate on one part of the machine",
            family=("dram", lambda j, t: _per(j, t.total_tokens)),
            energy=True,
            priority=8,
        ),
        Figure(
            "peak_rss_mib",
            "peak RSS MiB",
            "MiB",
            "peak resident memory of the process during the trials",
            case=_resource("peak_rss_bytes", 2**20),
            priority=7,
        ),
        Figure(
            "cpu_s",
            "CPU s",
            "s",
            "CPU seconds of the process during the trials",
            case=_resource("cpu_seconds"),
            priority=7,
        ),
        Figure(
            "process_j",
            "process J",
            "J",
            "joules per query attributed to this process tree: the CPU packages' energy x "
            "its share of the machine's CPU time (rapl), or of all tasks' energy impact "
            "(powermetrics); the rest of the package is other processes' and idle",
            trial=lambda t: _per_query(t.joules_by_domain.get(PROCESS_DOMAIN), t),
            energy=True,
            priority=6,
        ),
        # -- batches and servers (--llm-batch-sizes, --llm-concurrency, --llm-endpoint) ------
        Figure(
            "queries",
            "queries",
            "",
            "queries per trial: the batch size, or the requests sent at once to a server; the "
            "per-query figures share the trial's joules among them, J/token sums their tokens",
            case=lambda r: r.queries,
            lower_is_better=None,
            priority=0,
        ),
        Figure(
            "req_ttft_s",
            "req TTFT s",
            "s",
            "a server's time to first token: from sending a request to its first streamed "
            "token, mean over the trial's requests",
            trial=_request_mean("ttft_s"),
            priority=3,
        ),
        Figure(
            "tpot_s",
            "TPOT s",
            "s",
            "a server's time per output token after the first: (latency - TTFT) / (output "
            "tokens - 1), mean over the trial's requests",
            trial=_request_mean("tpot_s"),
            priority=3,
        ),
        Figure(
            "latency_p50_s",
            "p50 s",
            "s",
            "median latency of a server's requests (send to last token), over every request "
            "of every trial",
            case=_latency_percentile(50),
            priority=4,
        ),
        Figure(
            "latency_p90_s",
            "p90 s",
            "s",
            "90th percentile of the requests' latency",
            case=_latency_percentile(90),
            priority=7,
        ),
        Figure(
            "latency_p99_s",
            "p99 s",
            "s",
            "99th percentile of the requests' latency",
            case=_latency_percentile(99),
            priority=4,
        ),
        Figure(
            "out_throughput",
            "out tok/s all",
            "tokens/s",
            "output throughput of a whole trial: output tokens of every query / the trial's "
            "seconds (prefill included, unlike out tok/s)",
            trial=lambda t: _per(t.output_tokens * t.queries, t.seconds),
            lower_is_better=False,
            priority=6,
        ),
        # -- counted work (--energy-count-work) -----------------------------------------
        *_work_figures(),
    )
}

DEFAULT_COLUMNS: tuple[str, ...] = (
    "tokens_in",
    "tokens_out",
    "queries",
    "trials",
    "time_s",
    "energy_j",
    "j_per_token",
    "prefill_j_per_in_token",
    "decode_j_per_out_token",
    "steady_j_per_token",
    # the work behind the joules, counted (predict.work_count): "more work" or "the same
    # work done slower" read off one row; a narrow terminal leaves it out early
    "flops_per_token",
    "tokens_per_s",
    "out_tokens_per_s",
    "power_w",
    "gpu_j",
    "cpu_j",
    "dram_j",
    "req_ttft_s",
    "tpot_s",
    "latency_p50_s",
    "latency_p99_s",
)
# An energy figure is resolved when its stretch lasts at least this many times the
# meter's resolution: a counter that updates every 100 ms reads a 30 ms prefill as 0 or
# as 100 ms worth.  Longer stretches still carry up to one update's worth of error, but
# it is random from trial to trial, so the confidence interval shows it.
RESOLVED_MULTIPLE = 2.0
# A phase split at its marks (the meter read at the first token) is biased, not only
# noisy: a counter refreshed every R seconds puts, on average, R/2 of the neighbouring
# phase's power into the phase at each mark, and takes R/2 of its own out.  So a phase
# of T seconds between neighbours drawing up to twice its power (or nothing) is off by up
# to R/T of its energy: it is resolved from T = 34 R on (under 3 %).  Shorter ones are
# split by a window of prefill-only passes instead (controller/passes.py).
MARK_RESOLVED_MULTIPLE = 34.0
# Repeated prefill passes fill windows this many times the resolution: within ~10 %.
PASS_WINDOW_MULTIPLE = 10.0
SPLIT_PHASES = (PREFILL, DECODE)


def _stretches(f: Figure, r: CaseResult) -> list[float]:
    """Seconds of each stretch an energy figure's joules were measured over."""
    if f.source == PREFILL_PASSES:
        return [t.seconds * t.passes for t in r.prefill_passes]
    if f.phase is None:
        return [t.seconds * t.passes for t in r.trials]
    if f.phase in SPLIT_PHASES and split_at_marks(r):
        # one call's phase: its marks' bias is the same in every call of a window, so
        # summing a window's calls does not shrink it
        return [t.phases[f.phase].seconds for t in r.trials if f.phase in t.phases]
    # a window of several calls: its phase's stretches summed (each call's rounding is
    # random, so their sum is as good as one stretch as long); split by prefill passes:
    # the trial's own window, and the passes' windows, each long enough by construction
    if f.phase in SPLIT_PHASES:
        return [t.seconds * t.passes for t in r.trials if f.phase in t.phases]
    return [t.phases[f.phase].seconds * t.passes for t in r.trials if f.phase in t.phases]


def split_at_marks(r: CaseResult) -> bool:
    """Whether the case's prefill | decode split rests on its marks (any trial's does)."""
    return any(t.split == SPLIT_MARKS for t in r.trials if PREFILL in t.phases)


def stretch_s(f: Figure, r: CaseResult) -> float | None:
    """Mean seconds of the stretch an energy figure's joules were measured over."""
    windows = _stretches(f, r)
    return math.fsum(windows) / len(windows) if windows else None


def resolved(f: Figure, r: CaseResult) -> bool:
    """False for an energy figure measured over stretches shorter than the meter can
    tell apart (``RESOLVED_MULTIPLE`` x its resolution; a phase split at its marks:
    ``MARK_RESOLVED_MULTIPLE``): shown marked, never gated."""
    if not f.energy or r.resolution_s is None:
        return True
    seconds = stretch_s(f, r)
    marks = f.phase in SPLIT_PHASES and f.source != PREFILL_PASSES and split_at_marks(r)
    multiple = MARK_RESOLVED_MULTIPLE if marks else RESOLVED_MULTIPLE
    return seconds is None or seconds >= multiple * r.resolution_s


DEFAULT_GATE_METRIC = "j_per_token"
DEFAULT_COMPARE_METRICS: tuple[str, ...] = ("j_per_token", "energy_j", "time_s")

# Names of 0.1.0, accepted with a DeprecatedName warning until 0.3.0.
ALIASES: dict[str, str] = {
    "seconds": "time_s",
    "time": "time_s",
    "joules": "energy_j",
    "energy": "energy_j",
    "net_joules": "net_energy_j",
    "energy_per_token": "j_per_token",
    "joules_per_token": "j_per_token",
    "watts": "power_w",
    "power": "power_w",
    "prefill_s": "ttft_s",
    "prefill_seconds": "ttft_s",
    "prefill_joules": "prefill_j",
    "decode_joules": "decode_j",
    "decode_tokens_per_s": "out_tokens_per_s",
}

# Names of 0.1.0 whose figure meant something else than its name said: refused, saying why.
_PER_IN = (
    "it was the whole query's joules per input token, not the prefill's; use "
    "prefill_j_per_in_token (prefill joules per input token) or j_per_token"
)
_PER_OUT = (
    "it was the whole query's joules per output token, not the decode's; use "
    "decode_j_per_out_token (decode joules per output token) or j_per_token"
)
REMOVED: dict[str, str] = {
    "j_per_in_token": _PER_IN,
    "energy_per_input_token": _PER_IN,
    "j_per_out_token": _PER_OUT,
    "energy_per_output_token": _PER_OUT,
}


def canonical(name: str, *, warn: bool = True, choices: Iterable[str] | None = None) -> str:
    """The figure key a name stands for.  An old name warns (DeprecatedName) unless
    ``warn`` is off (reading saved files); an unknown or removed one is a ConfigError
    listing ``choices`` (default: every figure)."""
    key = name.strip().lower()
    if key in FIGURES:
        return key
    if key in ALIASES:
        new = ALIASES[key]
        if warn:
            warnings.warn(
                f"figure name {key!r} is deprecated, use {new!r} (the old name works "
                "until pytest-llmenergy 0.3)",
                DeprecatedName,
                stacklevel=3,
            )
        return new
    if key in REMOVED:
        raise ConfigError(f"{key!r} is gone: {REMOVED[key]}")
    listed = ", ".join(choices if choices is not None else FIGURES)
    raise ConfigError(f"unknown figure {name.strip()!r}; choose from: {listed}")


def figure(name: str, *, per_trial: bool = False, warn: bool = True) -> Figure:
    """The figure a name stands for; ``per_trial`` insists it can be gated or targeted."""
    f = FIGURES[canonical(name, warn=warn, choices=per_trial_keys() if per_trial else None)]
    if per_trial and not f.per_trial:
        raise ConfigError(
            f"{f.key!r} has no value per trial, so it cannot be compared, gated or targeted; "
            f"choose from: {', '.join(per_trial_keys())}"
        )
    return f


def value(result: CaseResult, key: str) -> Value:
    """A case's figure by name: ``value(result, "j_per_token")``; None where the case has
    none (no prefill/decode split, no GPU measured, nothing measured).  A figure per token
    of a case that declared none of the tokens it divides by is a ConfigError saying so:
    there a silent None would hide a missing ``output_tokens=``."""
    f = figure(key)
    _require_tokens(f, result)
    return f.value(result)


def value_or_none(result: CaseResult, key: str) -> Value:
    """``value`` that gives None for a case without tokens too: for the package's own
    tables and exports, which read every case's figures and show a dash where one has none."""
    return figure(key).value(result)


def divided_by(f: Figure) -> tuple[str, ...]:
    """The declared token counts a figure per token divides by: ``input_tokens``,
    ``output_tokens`` or both (per token, per 1,000 tokens); none for other figures."""
    if not per_token(f):
        return ()
    per = f.key.rsplit("_per_", 1)[1]
    if per.startswith(("in_", "input_")):
        return ("input_tokens",)
    if per.startswith(("out_", "output_")):
        return ("output_tokens",)
    return ("input_tokens", "output_tokens")


def _require_tokens(f: Figure, result: CaseResult) -> None:
    """A figure per token of a case that declared none of its tokens has no value, and
    the reason is a missing argument: say which."""
    names = divided_by(f)
    if not names or any(getattr(result, n) for n in names):
        return
    what = names[0].replace("_", " ") if len(names) == 1 else "tokens"
    given = " and ".join(f"{n}=" for n in names)
    raise ConfigError(
        f"{result.name}: the case declared no {what}, so {f.key} has no value; "
        f"pass {given} to energy_benchmark"
    )


def per_trial_keys() -> list[str]:
    return [k for k, f in FIGURES.items() if f.per_trial]


def describe(keys: Iterable[str] | None = None) -> list[dict[str, Value]]:
    """One plain record per figure, for ``llmenergy metrics`` and the docs."""
    chosen = list(keys) if keys is not None else list(FIGURES)
    out: list[dict[str, Value]] = []
    for key in chosen:
        f = FIGURES[key]
        out.append(
            {
                "key": f.key,
                "label": f.label,
                "unit": f.unit,
                "meaning": f.meaning,
                "better": {True: "lower", False: "higher", None: ""}[f.lower_is_better],
                "per_trial": f.per_trial,
                # how a gate judges it: tested on the trials, or compared exactly (counted)
                "gated": "exact" if f.exact else "tested" if f.per_trial else "",
                "needs_phases": f.needs_phases,
                "default_column": f.key in DEFAULT_COLUMNS,
                "old_names": ", ".join(a for a, k in ALIASES.items() if k == f.key),
            }
        )
    return out


# Units a threshold or CI target may carry, per figure unit (the first is the figure's own).
UNIT_SCALES: dict[str, dict[str, float]] = {
    "s": {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9},
    "J": {"j": 1.0, "mj": 1e-3, "kj": 1e3},
    "W": {"w": 1.0, "mw": 1e-3, "kw": 1e3},
    "tokens/s": {"": 1.0},
    "MiB": {"mib": 1.0, "gib": 1024.0},
    "FLOP": {"flop": 1.0, "kflop": 1e3, "mflop": 1e6, "gflop": 1e9, "tflop": 1e12},
    "B": {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024.0, "mib": 2.0**20},
    "ops": {"ops": 1.0},
    "g": {"g": 1.0, "mg": 1e-3, "kg": 1e3},
}


def per_token(f: Figure) -> bool:
    """A figure per token (or per 1,000 tokens): its amounts are small, and a bare number
    on it is almost always a percentage whose ``%`` was forgotten."""
    return "_per_" in f.key and "token" in f.key.rsplit("_per_", 1)[1]


def _refuse_bare_per_token(f: Figure, amount: str, scales: Mapping[str, float]) -> None:
    """``j_per_token:5`` read as 5 J a token would pass every regression; where the
    figure has units to name, a number without one (other than 0) is refused."""
    from .values import split_number

    parsed = split_number(amount)
    units = [u for u in scales if u]
    if not per_token(f) or not units or parsed is None or parsed[1] or parsed[0] == 0:
        return
    n = f"{parsed[0]:g}"
    smaller = [u for u in units if scales[u] < 1]  # a token's amounts are small: mJ, mg
    raise ConfigError(
        f"a number without a unit on a figure per token is ambiguous: write {n}% for a "
        f"share of the baseline, or the amount with its unit ({', '.join(units)}), e.g. "
        f"{n}{(smaller or units)[0]}"
    )


def parse_figure_threshold(
    text: str, examples: str, *, percent_range: tuple[float, float] | None = None
) -> tuple[Figure, float, bool]:
    """``FIGURE:AMOUNT`` (a gate, a CI target) -> (figure, amount in its unit or a
    fraction, relative?).  Any problem is a ConfigError quoting ``text``."""
    from .values import threshold  # values is a leaf module; imported here to keep it so

    name, sep, amount = text.partition(":")
    if not sep or not name.strip() or not amount.strip():
        raise ConfigError(f"bad {text!r}: expected FIGURE:AMOUNT such as {examples}")
    try:
        f = figure(name, per_trial=True)
        scales = UNIT_SCALES.get(f.unit, {"": 1.0})
        _refuse_bare_per_token(f, amount, scales)
        # a counted figure may be gated at 0: any growth of its work fails
        value, relative = threshold(amount, scales, percent_range=percent_range, zero=f.exact)
    except ConfigError as exc:
        raise ConfigError(f"bad {text!r}: {exc}") from None
    return f, value, relative


def format_amount(f: Figure, value: float, relative: bool) -> str:
    """The inverse of ``parse_figure_threshold``: ``time_s:0.5s``, ``j_per_token:5%``."""
    if relative:
        return f"{f.key}:{value * 100:g}%"
    unit = f.unit if f.unit in ("s", "J", "W") else ""
    if not unit and per_token(f) and value:  # a bare number would not parse back
        unit = next((u for u in UNIT_SCALES.get(f.unit, {}) if u), "")
    return f"{f.key}:{value:g}{unit}"
