"""The steady window of a burst: every request generating, none finished yet.

A server's energy per token depends on how many requests it batches.  A burst of N
concurrent requests fills its batch one prefill at a time (ramp-up) and empties it one
finished request at a time (drain); only between the two does it run the N it was asked
to, so only that window says what the server costs at concurrency N.  ML.ENERGY's
benchmark measures that window alone; so does this, from what a client can see of it:
the window opens at the last request's first streamed token and closes when the first
request's stream ends.  The meter's window is marked at both moments (phases
``ramp-up`` | ``steady`` | ``drain``), so the steady window's joules are the meter's own
readings over it, never a share of the burst's.

A burst is unstable when that window is missing or too short: a request finished before
the last one began generating (the server never held all N at once: its batch is
smaller, e.g. vLLM's ``--max-num-seqs``), or the window lasted less than the minimum
(``--llm-min-steady``), or the responses were not streamed (no first token is seen).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..results import DRAIN, RAMP_UP, STEADY

Mark = Callable[[str, str], None]  # (phase, ending): a window's mark
DEFAULT_MIN_STEADY_S = 1.0


@dataclass(frozen=True)
class Steadiness:
    """What a burst's steady window was: its length, the output tokens streamed in it,
    and why it is not worth measuring ("" when it is)."""

    seconds: float
    tokens: int
    unstable: str


class BurstWatch:
    """Sees a burst's requests start generating, stream tokens and finish (from their
    threads), and marks the meter's window where the steady window opens and closes."""

    def __init__(
        self,
        concurrency: int,
        mark: Mark | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.concurrency = concurrency
        self._mark = mark
        self._clock = clock
        self._lock = threading.Lock()
        self._generating = 0  # requests past their first token
        self._finished = 0
        self._opened: float | None = None  # the steady window, on ``clock``
        self._closed: float | None = None
        self._tokens = 0
        self._overlapped = False  # a request finished before the last one began

    def first_token(self) -> None:
        with self._lock:
            self._generating += 1
            if self._generating == self.concurrency and not self._finished:
                self._opened = self._clock()
                if self._mark is not None:
                    self._mark(STEADY, RAMP_UP)

    def token(self) -> None:
        """A streamed chunk after a request's first: one token, as engines stream them."""
        with self._lock:
            if self._opened is not None and self._closed is None:
                self._tokens += 1

    def finished(self) -> None:
        with self._lock:
            self._finished += 1
            if self._finished > 1:
                return
            if self._opened is None:
                self._overlapped = True
                return
            self._closed = self._clock()
            if self._mark is not None:
                self._mark(DRAIN, STEADY)

    def result(self, min_steady_s: float, streamed: bool = True) -> Steadiness:
        n = self.concurrency
        if not streamed:
            return Steadiness(
                0.0, 0, "no steady window can be seen: the server's responses are not "
                "streamed, so no request's first token is seen",
            )  # fmt: skip
        if self._overlapped or self._opened is None or self._closed is None:
            return Steadiness(
                0.0,
                0,
                f"the batch never held all {n} requests: one finished before the last "
                "began generating (the server runs fewer at once: raise its batch limit, "
                "e.g. vLLM's --max-num-seqs, or lower --llm-concurrency)",
            )
        seconds = self._closed - self._opened
        if seconds < min_steady_s:
            return Steadiness(
                seconds,
                self._tokens,
                f"its steady window ({n} requests generating) lasted {seconds:.3g} s, less "
                f"than --llm-min-steady={min_steady_s:g} s: ask for more output tokens",
            )
        return Steadiness(seconds, self._tokens, "")
