"""The steady window of a burst: the server running the batch it was asked to hold.

A server's energy per token depends on how many requests it batches.  A burst fills its
batch one prefill at a time (ramp-up) and empties it one finished request at a time
(drain); only between the two does it run the batch it was asked to, so only that window
says what the server costs at that batch.  ML.ENERGY's benchmark measures that window
alone, and so does this, from what a client can see of it.  A burst sends ``requests``
requests with at most ``concurrency`` in flight (a new one as soon as one finishes, as a
server's queue refills its batch); the window opens when ``concurrency`` requests have
streamed their first token and closes when ``requests - concurrency - 1`` have finished
(at least one): ML.ENERGY's two moments, the last one a request early so that the drain
is never measured.  The meter's window is marked at both (phases ``ramp-up`` | ``steady``
| ``drain``), so the steady window's joules are the meter's own readings over it, never
a share of the burst's.

ML.ENERGY rejects a run whose steady state is too short or whose batch was not full.
Here a burst is unstable (kept, shown, never gated; ``serving_rules`` judges whole
configurations) when it has no window (a request finished before the batch first held
them all, and no request was left to refill it), or its window lasted less than
``--llm-min-steady`` (ML.ENERGY: 20 s), or its mean batch stayed under
``--llm-min-batch-fill`` of the concurrency (ML.ENERGY: 85 %): the server holds fewer at
once (its batch limit, its KV cache), or the responses were not streamed.

The mean batch is the server's own where it publishes one, as ML.ENERGY reads it: its
running-requests gauge (vLLM's ``vllm:num_requests_running`` on ``/metrics``), sampled
through the burst (``BatchSampler``) and averaged over the window's time.  When vLLM
updates it (V1 engine, read in vLLM 0.32's source): the scheduler's stats are made at the
end of every engine step (``Scheduler.make_stats``: ``len(self.running)`` once the step's
finished requests are out) and ride with that step's outputs to the API server, whose
output handler sets the Prometheus gauge after it has passed the step's tokens on
(``AsyncLLM``'s ``output_handler`` -> ``PrometheusStatLogger.record``).  So the gauge has
no refresh period of its own: it changes once per engine step, holds its value through a
long step and while idle, and a request enters it with the step that streams its first
token (a prompt prefilled in one step), as the client counts it.  A reading is the gauge
at some moment of its HTTP request, which a busy frontend may answer a good part of a
second late; it stands at the request's midpoint and holds until the next reading.

The gauge is only as current as that API server: on a machine short of CPU (vLLM's CPU
build on 2 cores, where its engine and worker take most of both) the API server falls
behind its engine, passes a whole response on at its end, and sets the gauge then, so the
gauge and the client's own count both read about half a request at concurrency 1 while
the engine ran one all the time (docs/evidence.md).  So where the server also publishes
its engine's own request times (vLLM's ``vllm:request_inference_time_seconds``: each
finished request's seconds from its first scheduled step to its last token, on the
engine's clock), the burst's engine share is their sum over the requests' latencies as
the client saw them, and the engine's batch over the window is the client's requests in
flight times that share (Little's law: a request queued behind a full batch is in flight,
not running).  That is the batch; the gauge checks it, and a gauge further from it than
``GAUGE_SLACK`` of the concurrency is named (``Steadiness.batch_note``, kept in the run
and shown in the notes).  The gauge does not decide even where it is within the slack:
inside a test session on 2 cores it read 1.07 of 2 in a burst whose neighbours read 1.46
and 1.48 by the engine's timings, the difference between a rejected concurrency and an
accepted one.

Where the server publishes a gauge and no engine times, the gauge is checked against the
client's counts instead.  The client counts the requests past their first token and not
finished, averaged over the window's time: that leaves out each request's prefill, so it
reads low where prefill is a large part of a request.  The server cannot run fewer of the
burst's requests than the client is streaming tokens from, nor more than the client has
in flight (sent, not finished); a gauge outside those two counts by more than
``GAUGE_SLACK`` of the concurrency measures something else (a stale or lagging gauge,
another client's requests), and the batch then rests on the client's count, named.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..results import DRAIN, RAMP_UP, STEADY

Mark = Callable[[str, str], None]  # (phase, ending): a window's mark
# ML.ENERGY's thresholds (the benchmark's run validation, as its leaderboard applies it)
DEFAULT_MIN_STEADY_S = 20.0
DEFAULT_MIN_BATCH_FILL = 0.85
# How far (a share of the concurrency) the gauge's mean may fall outside the client's two
# counts before it is judged to measure something else: the counts lag the server's by a
# token's delivery at each end, and the gauge's readings are samples of a step function.
GAUGE_SLACK = 0.25


@dataclass(frozen=True)
class Steadiness:
    """What a burst's steady window was: its length, the output tokens streamed in it,
    its mean batch, and why it is not worth measuring ("" when it is)."""

    seconds: float
    tokens: int
    unstable: str
    batch: float = 0.0  # requests generating, averaged over the window (0: no window)
    batch_source: str = ""  # SERVER_GAUGE, ENGINE_TIMES or CLIENT_COUNT
    # "": no gauge, or none that strayed; else how the gauge strayed from what the batch
    # rests on (the engine's timings, or the client's counts)
    batch_note: str = ""


SERVER_GAUGE = "the server's running-requests gauge"
CLIENT_COUNT = "requests past their first token, as the client sees them"
ENGINE_TIMES = "the client's requests in flight x the share of their time the engine ran them"


def gauge_disagreement(gauge: float, streaming: float, in_flight: float, concurrency: int) -> str:
    """How the gauge's mean over a window strays from the client's counts over it ("":
    within ``GAUGE_SLACK`` of the concurrency of [streaming, in flight])."""
    slack = GAUGE_SLACK * concurrency
    if gauge < streaming - slack:
        return (
            f"the server's running-requests gauge read {gauge:.3g}, under the {streaming:.3g} "
            "requests the client was streaming tokens from"
        )
    if gauge > in_flight + slack:
        return (
            f"the server's running-requests gauge read {gauge:.3g}, over the {in_flight:.3g} "
            "requests the client had in flight (another client's requests?)"
        )
    return ""


def engine_disagreement(gauge: float, engine: float, concurrency: int) -> str:
    """How the gauge's mean over a window strays from the batch the engine's own request
    timings give ("": within ``GAUGE_SLACK`` of the concurrency)."""
    if abs(gauge - engine) <= GAUGE_SLACK * concurrency:
        return ""
    return (
        f"the server's running-requests gauge read {gauge:.3g}, where the engine's own "
        f"request timings put {engine:.3g} requests in its batch (a gauge its API server "
        "sets as it passes tokens on: it lags the engine when that server falls behind)"
    )


def close_at(requests: int, concurrency: int) -> int:
    """How many requests have finished when the window closes (ML.ENERGY's rule)."""
    return max(requests - concurrency - 1, 1)


class BurstWatch:
    """Sees a burst's requests start generating, stream tokens and finish (from their
    threads), and marks the meter's window where the steady window opens and closes."""

    def __init__(
        self,
        concurrency: int,
        mark: Mark | None = None,
        clock: Callable[[], float] = time.perf_counter,
        requests: int | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.requests = max(requests or concurrency, concurrency)
        self._close_at = close_at(self.requests, concurrency)
        self._mark = mark
        self._clock = clock
        self._lock = threading.Lock()
        self._sent = 0  # requests sent (in flight until finished)
        self._started = 0  # requests past their first token
        self._finished = 0
        self._opened: float | None = None  # the steady window, on ``clock``
        self._closed: float | None = None
        self._tokens = 0
        self._area = 0.0  # requests generating x seconds, inside the window
        self._flight_area = 0.0  # requests in flight x seconds, inside the window
        self._since = 0.0  # when the count of requests generating last changed

    @property
    def _generating(self) -> int:
        return self._started - self._finished

    def _count_area(self, now: float) -> None:
        """Add the stretch since the last change to the window's request-seconds."""
        if self._opened is not None and self._closed is None:
            self._area += self._generating * (now - self._since)
            self._flight_area += (self._sent - self._finished) * (now - self._since)
        self._since = now

    def sent(self) -> None:
        """A request about to be sent (counted in flight until it finishes)."""
        with self._lock:
            self._count_area(self._clock())
            self._sent += 1

    def first_token(self) -> None:
        with self._lock:
            now = self._clock()
            self._count_area(now)
            self._started += 1
            if self._started == self.concurrency and self._finished < self._close_at:
                self._opened = self._since = now
                if self._mark is not None:
                    self._mark(STEADY, RAMP_UP)

    def token(self) -> None:
        """A streamed chunk after a request's first: one token, as engines stream them."""
        with self._lock:
            if self._opened is not None and self._closed is None:
                self._tokens += 1

    def finished(self) -> None:
        with self._lock:
            now = self._clock()
            self._count_area(now)
            self._finished += 1
            if self._finished != self._close_at or self._opened is None:
                return
            self._closed = now
            if self._mark is not None:
                self._mark(DRAIN, STEADY)

    @property
    def window(self) -> tuple[float, float] | None:
        """The steady window's two moments on the watch's clock (None: it had none)."""
        if self._opened is None or self._closed is None:
            return None
        return self._opened, self._closed

    def result(
        self,
        min_steady_s: float,
        streamed: bool = True,
        min_batch_fill: float = DEFAULT_MIN_BATCH_FILL,
        server_batch: float | None = None,
        engine_share: float | None = None,
    ) -> Steadiness:
        """``server_batch``: the server's own mean batch over the window, where it
        publishes one; ``engine_share``: the share of the burst's request time that the
        server's engine ran them, by its own clock, where it publishes that; else the
        client's count is used."""
        n = self.concurrency
        if not streamed:
            return Steadiness(
                0.0, 0, "no steady window can be seen: the server's responses are not "
                "streamed, so no request's first token is seen",
            )  # fmt: skip
        if self._opened is None or self._closed is None:
            return Steadiness(
                0.0,
                0,
                f"the batch never held all {n} requests: one finished before the last "
                "began generating (the server runs fewer at once: raise its batch limit, "
                "e.g. vLLM's --max-num-seqs, or lower --llm-concurrency)",
            )
        seconds = self._closed - self._opened
        batch, source, disagreement = self._batch(seconds, server_batch, engine_share)
        note = f"{disagreement}: the batch is {_WHOSE[source]}, {batch:.3g}" if disagreement else ""
        why = []
        if seconds < min_steady_s:
            why.append(
                f"its steady window ({n} requests at once) lasted {seconds:.3g} s, less than "
                f"--llm-min-steady={min_steady_s:g} s: send more requests a burst "
                "(--llm-requests) or more output tokens each"
            )
        if batch < min_batch_fill * n:
            why.append(
                f"its mean batch was {batch:.3g} of {n} requests ({batch / n:.0%}; {source}"
                + (f"; {disagreement}" if disagreement else "")
                + "), "
                f"under --llm-min-batch-fill={min_batch_fill:.0%}: the server holds fewer at "
                "once (its batch limit, e.g. vLLM's --max-num-seqs, or its KV cache), so "
                "this concurrency is out of its reach"
            )
        return Steadiness(seconds, self._tokens, "; and ".join(why), batch, source, note)

    def _batch(
        self, seconds: float, gauge: float | None, engine_share: float | None
    ) -> tuple[float, str, str]:
        """The window's mean batch, what it rests on, and how the gauge strayed ("").

        The engine's own timings where the server publishes them (a gauge set by a
        frontend that fell behind its engine reads low while the engine runs: it is only
        their check); else the gauge, where it agrees with the client's counts of requests
        streaming and in flight; else those counts."""
        n = self.concurrency
        counted = self._area / seconds if seconds > 0 else float(n)
        # a watch told of no sends (``sent``) takes every request as sent at once
        flight = self._flight_area / seconds if self._sent and seconds > 0 else float(n)
        if engine_share is not None:
            engine = flight * engine_share
            strayed = engine_disagreement(gauge, engine, n) if gauge is not None else ""
            return engine, ENGINE_TIMES, strayed
        if gauge is None:
            return counted, CLIENT_COUNT, ""
        disagreement = gauge_disagreement(gauge, counted, flight, n)
        return (counted, CLIENT_COUNT, disagreement) if disagreement else (gauge, SERVER_GAUGE, "")


_WHOSE = {CLIENT_COUNT: "the client's count", ENGINE_TIMES: "the engine timings'"}


class BatchSampler:
    """Reads the server's running-requests gauge (``read``) every ``interval_s`` from a
    thread while a burst runs; ``mean(start, end)`` is its time-weighted mean over a
    window.  A reading stands at the midpoint of its HTTP request (the gauge was read at
    some moment of it) and holds until the next, as the gauge itself holds between the
    engine steps that set it."""

    def __init__(
        self,
        read: Callable[[], float | None],
        interval_s: float = 0.1,  # a /metrics page costs the server's frontend ~20 ms
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._read = read
        self._interval_s = interval_s
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmenergy-batch", daemon=True)
        self.samples: list[tuple[float, float]] = []  # (when, requests running)

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = self._clock()
            value = self._read()
            if value is not None:
                self.samples.append(((asked + self._clock()) / 2, value))
            self._stop.wait(self._interval_s)

    def __enter__(self) -> BatchSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def mean(self, start: float, end: float) -> float | None:
        """The gauge's time-weighted mean over [start, end]: each reading holds until the
        next (the last one before ``start`` from ``start``); None with fewer than two
        readings inside, too few to say what the gauge did there."""
        readings = sorted(self.samples)
        inside = [(t, v) for t, v in readings if start <= t <= end]
        if len(inside) < 2:
            return None
        before = [(start, v) for t, v in readings if t < start][-1:]
        steps = before + inside
        edges = [t for t, _ in steps[1:]] + [end]
        span = end - steps[0][0]
        if span <= 0:
            return sum(v for _, v in inside) / len(inside)
        return sum(v * (e - t) for (t, v), e in zip(steps, edges)) / span
