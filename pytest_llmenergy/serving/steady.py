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
``--llm-min-steady`` (ML.ENERGY: 20 s), or its mean batch (the requests past their first
token and not finished, averaged over the window's time) stayed under
``--llm-min-batch-fill`` of the concurrency (ML.ENERGY: 85 %): the server holds fewer at
once (its batch limit, its KV cache), or the responses were not streamed.
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

    def result(
        self,
        min_steady_s: float,
        streamed: bool = True,
        min_batch_fill: float = DEFAULT_MIN_BATCH_FILL,
    ) -> Steadiness:
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
        why = []
        if seconds < min_steady_s:
            why.append(
                f"its steady window ({n} requests at once) lasted {seconds:.3g} s, less than "
                f"--llm-min-steady={min_steady_s:g} s: send more requests a burst "
                "(--llm-requests) or more output tokens each"
            )
        if batch < min_batch_fill * n:
            why.append(
                f"its mean batch was {batch:.3g} of {n} requests ({batch / n:.0%}), under "
                f"--llm-min-batch-fill={min_batch_fill:.0%}: the server holds fewer at once "
                "(its batch limit, e.g. vLLM's --max-num-seqs, or its KV cache), so this "
                "concurrency is out of its reach"
            )
        return Steadiness(seconds, self._tokens, "; and ".join(why), batch)
