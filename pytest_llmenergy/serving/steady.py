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
through the burst (``BatchSampler``) and averaged over the window.  Elsewhere the client
counts the requests past their first token and not finished, averaged over the window's
time: that leaves out each request's prefill, so it reads low where prefill is a large
part of a request (on vLLM's CPU build at concurrency 1, well under the gauge in a busy
session: docs/evidence.md).
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


@dataclass(frozen=True)
class Steadiness:
    """What a burst's steady window was: its length, the output tokens streamed in it,
    its mean batch, and why it is not worth measuring ("" when it is)."""

    seconds: float
    tokens: int
    unstable: str
    batch: float = 0.0  # requests generating, averaged over the window (0: no window)
    batch_source: str = ""  # SERVER_GAUGE or CLIENT_COUNT


SERVER_GAUGE = "the server's running-requests gauge"
CLIENT_COUNT = "requests past their first token, as the client sees them"


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
        self._started = 0  # requests past their first token
        self._finished = 0
        self._opened: float | None = None  # the steady window, on ``clock``
        self._closed: float | None = None
        self._tokens = 0
        self._area = 0.0  # requests generating x seconds, inside the window
        self._since = 0.0  # when the count of requests generating last changed

    @property
    def _generating(self) -> int:
        return self._started - self._finished

    def _count_area(self, now: float) -> None:
        """Add the stretch since the last change to the window's request-seconds."""
        if self._opened is not None and self._closed is None:
            self._area += self._generating * (now - self._since)
        self._since = now

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
    ) -> Steadiness:
        """``server_batch``: the server's own mean batch over the window, where it
        publishes one; else the client's count is used."""
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
        batch = self._area / seconds if seconds > 0 else float(n)
        source = CLIENT_COUNT
        if server_batch is not None:
            batch, source = server_batch, SERVER_GAUGE
        why = []
        if seconds < min_steady_s:
            why.append(
                f"its steady window ({n} requests at once) lasted {seconds:.3g} s, less than "
                f"--llm-min-steady={min_steady_s:g} s: send more requests a burst "
                "(--llm-requests) or more output tokens each"
            )
        if batch < min_batch_fill * n:
            why.append(
                f"its mean batch was {batch:.3g} of {n} requests ({batch / n:.0%}; {source}), "
                f"under --llm-min-batch-fill={min_batch_fill:.0%}: the server holds fewer at "
                "once (its batch limit, e.g. vLLM's --max-num-seqs, or its KV cache), so "
                "this concurrency is out of its reach"
            )
        return Steadiness(seconds, self._tokens, "; and ".join(why), batch, source)


class BatchSampler:
    """Reads the server's running-requests gauge (``read``) every ``interval_s`` from a
    thread while a burst runs; ``mean(start, end)`` averages the readings in a window."""

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
            value = self._read()
            if value is not None:
                self.samples.append((self._clock(), value))
            self._stop.wait(self._interval_s)

    def __enter__(self) -> BatchSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def mean(self, start: float, end: float) -> float | None:
        """The readings' mean within [start, end]; None with fewer than two there."""
        inside = [v for t, v in self.samples if start <= t <= end]
        return sum(inside) / len(inside) if len(inside) >= 2 else None
