"""A server as the benchmark's target: one trial is a burst of concurrent requests.

Prompts are the same natural text the local models get (``LoadedModel.prompt_list``),
exactly the case's input tokens each, sent as token ids where the server takes them;
a server that refuses ids gets the text they decode to, checked to tokenize back to the
same count.  Each request of a burst starts at another place in the text, and so does
each trial, so a server's prefix cache cannot skip prefills it was asked to measure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, LLMEnergyError
from ..meters.marks import current_window, mark_phase
from ..results import RequestRecord
from .client import (
    Completion,
    Endpoint,
    EngineTime,
    NoStreamUsage,
    ServerError,
    burst,
    check,
)
from .steady import DEFAULT_MIN_BATCH_FILL, DEFAULT_MIN_STEADY_S, BatchSampler, BurstWatch

IDS, TEXT = "token ids", "text"
# how long a burst's last requests may take to reach the engine's totals on /metrics (vLLM
# adds a request as its API server passes its last tokens on, before the client sees them)
ENGINE_TOTALS_WAIT_S = 1.0
# the engine's clock and the client's measure the same stretch a little differently
ENGINE_CLOCK_SLACK = 0.02


class ServerGone(LLMEnergyError):
    """The server stopped (an engine started for the session exited)."""


@dataclass(frozen=True)
class Burst:
    """What one trial did, in the shape ``energy_benchmark`` checks: counts per query
    (verified from every response's usage), the number of queries, their timings."""

    input_tokens: int
    output_tokens: int
    queries: int
    requests: tuple[RequestRecord, ...]
    # More than one request: the output tokens streamed in the steady window, why the
    # burst had none worth measuring ("": it had), and the window's mean batch (0: no
    # window); see serving/steady.py.
    steady_tokens: int = 0
    unstable: str = ""
    steady_batch: float = 0.0
    # "": no gauge, or none that strayed; else how the gauge strayed from what the batch
    # rests on (Steadiness.batch_note)
    steady_batch_note: str = ""


class ServerTarget:
    """``run(input_tokens, output_tokens, concurrency)``: one burst, counts verified.

    ``prompts`` builds the prompts (``LoadedModel.prompt_list`` of a model loaded for
    its tokenizer alone); ``tokenizer`` turns ids into text for servers that take text.
    ``requests`` is how many requests a burst sends (``--llm-requests``; at least the
    concurrency, which is how many are in flight at once); ``min_steady_s`` and
    ``min_batch_fill`` judge its steady window (serving/steady.py).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        prompts: Any,
        tokenizer: Any = None,
        gone: Callable[[], str | None] | None = None,
        min_steady_s: float = DEFAULT_MIN_STEADY_S,
        requests: int | None = None,
        min_batch_fill: float = DEFAULT_MIN_BATCH_FILL,
    ) -> None:
        self.endpoint = endpoint
        self.min_steady_s = min_steady_s  # a shorter steady window makes a burst unstable
        self.min_batch_fill = min_batch_fill  # so does a batch filled less, on average
        self.requests = requests  # None: one request per concurrent slot
        self.prompts = prompts
        self.tokenizer = tokenizer
        # why the server is gone (an engine started here that exited), else None
        self.gone = gone or (lambda: None)
        self.prompt_kind: str | None = None  # IDS or TEXT, found by the first request
        # whether the server publishes its running batch (/metrics), and its requests'
        # time in its engine (vLLM's inference-time histogram), found by the probe
        self.batch_gauge = False
        self.engine_timed = False
        self._row = 0
        self._text_cache: dict[tuple[int, int], str] = {}

    def requests_for(self, concurrency: int) -> int:
        """How many requests a burst at this concurrency sends: its queries."""
        return max(self.requests or concurrency, concurrency)

    def run(self, input_tokens: int, output_tokens: int, concurrency: int = 1) -> Burst:
        """Send ``requests_for(concurrency)`` requests, ``concurrency`` at once; a count
        other than the case's raises ``CountMismatch`` for this trial.  A single request's
        first streamed token splits the measurement window into prefill | decode; with
        more requests their phases overlap, and the window is split into ramp-up | steady
        | drain instead (serving/steady.py)."""
        try:
            return self._run(input_tokens, output_tokens, concurrency)
        except ServerError as exc:
            why = self.gone()
            if why is not None:
                raise ServerGone(why) from exc
            raise

    def _run(self, input_tokens: int, output_tokens: int, concurrency: int) -> Burst:
        n = self.requests_for(concurrency)
        rows = [self._row + i for i in range(n)]
        self._row += n
        if self.prompt_kind is None:
            self.probe(input_tokens)

        window = current_window()  # marked from the requests' threads
        mark = (lambda phase, ending: window.mark(phase, ending=ending)) if window else None
        watch = BurstWatch(concurrency, mark, requests=n) if n > 1 else None

        def send(i: int, hook: Any) -> Completion:
            prompt = self._prompt(input_tokens, rows[i])
            if watch is None:
                return self.endpoint.complete(prompt, output_tokens, on_first_token=hook)
            watch.sent()
            done = self.endpoint.complete(
                prompt, output_tokens, on_first_token=watch.first_token, on_token=watch.token
            )
            watch.finished()
            return done

        def first_token() -> None:
            # ValueError: the window was split already (not the first generate in it)
            with contextlib.suppress(ValueError):
                mark_phase("decode", ending="prefill")

        # the server's own batch, where it publishes it (ML.ENERGY reads vLLM's gauge)
        sampler = None
        if watch is not None and self.batch_gauge:
            sampler = BatchSampler(self.endpoint.running_requests)
        before = self.endpoint.engine_time() if watch is not None and self.engine_timed else None
        with sampler or contextlib.nullcontext():
            done = burst(send, concurrency, first_token, requests=n)
        for i, completion in enumerate(done):
            check(completion, input_tokens, output_tokens, f"request {i + 1} of {n}")
        steady = None
        if watch is not None:
            moments = watch.window
            server = sampler.mean(*moments) if sampler is not None and moments else None
            share = self._engine_share(before, done) if before is not None else None
            steady = watch.result(
                self.min_steady_s, self.endpoint.stream, self.min_batch_fill, server, share
            )
        return Burst(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            queries=n,
            requests=tuple(RequestRecord(c.ttft_s, c.latency_s, c.completion_tokens) for c in done),
            steady_tokens=steady.tokens if steady is not None else 0,
            unstable=steady.unstable if steady is not None else "",
            steady_batch=steady.batch if steady is not None else 0.0,
            steady_batch_note=steady.batch_note if steady is not None else "",
        )

    def _engine_share(self, before: EngineTime, done: list[Completion]) -> float | None:
        """The share of the burst's request time (sent to last byte, as the client saw
        it) that the server's engine ran them, by the engine's own clock: its inference
        seconds over their latencies.  None where its totals hold other requests too
        (another client), or this burst's have not all reached them in time."""
        deadline = time.monotonic() + ENGINE_TOTALS_WAIT_S
        while (after := self.endpoint.engine_time()) is not None:
            if after.requests - before.requests >= len(done) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        client_s = sum(c.latency_s for c in done)
        if after is None or after.requests - before.requests != len(done) or client_s <= 0:
            return None
        share = (after.seconds - before.seconds) / client_s
        # the engine runs a request inside the client's wait for it: more is not this burst's
        return share if 0 <= share <= 1 + ENGINE_CLOCK_SLACK else None

    # -- prompts ---------------------------------------------------------------------
    def probe(self, input_tokens: int = 8) -> None:
        """One unmeasured request, which finds how the server takes prompts (token ids
        if it can, else text), whether its streams carry usage counts (else requests
        are not streamed), and that it completes one at all."""
        try:
            self._probe(input_tokens)
        except NoStreamUsage:
            self.endpoint = dataclasses.replace(self.endpoint, stream=False)
            self._probe(input_tokens)
        self.batch_gauge = self.endpoint.running_requests() is not None
        self.engine_timed = self.endpoint.engine_time() is not None

    def _probe(self, input_tokens: int) -> None:
        try:
            self.prompt_kind = IDS
            done = self.endpoint.complete(self._prompt(input_tokens, 0), 1)
        except ServerError as exc:
            if not _refuses_ids(exc) or self.tokenizer is None:
                raise
            self.prompt_kind = TEXT
            done = self.endpoint.complete(self._prompt(input_tokens, 0), 1)
        check(done, input_tokens, 1, f"the first request ({self.prompt_kind} prompt)")

    def prompt(self, input_tokens: int, row: int) -> list[int] | str:
        """A prompt of exactly ``input_tokens`` from row ``row`` of the text, as the server
        takes prompts (a served workload's requests: serving/replay.py)."""
        return self._prompt(input_tokens, row)

    def _prompt(self, input_tokens: int, row: int) -> list[int] | str:
        ids = self.prompts.prompt_list(input_tokens, row)
        if self.prompt_kind != TEXT:
            return ids
        key = (input_tokens, row)
        if key not in self._text_cache:
            self._text_cache[key] = self._as_text(ids)
        return self._text_cache[key]

    def _as_text(self, ids: list[int]) -> str:
        """The text of ``ids`` (the BOS the server adds itself left out), checked to
        tokenize back to as many tokens as ``ids`` has."""
        tok = self.tokenizer
        bos = tok.bos_token_id
        body = ids[1:] if bos is not None and ids and ids[0] == bos else ids
        text = tok.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        again = tok(text, add_special_tokens=True)["input_ids"]
        if len(again) != len(ids):
            raise ConfigError(
                f"the server takes text prompts only, and this prompt's {len(ids)} tokens "
                f"tokenize back to {len(again)}: the exact input count cannot be ensured; "
                "use a server that takes token-id prompts (vLLM, llama.cpp's server)"
            )
        return text


def _refuses_ids(exc: ServerError) -> bool:
    """A refusal of token-id prompts: 400 or 422, or llama-cpp-python's 500 that holds
    its validation errors for the prompt field."""
    if exc.status in (400, 422):
        return True
    return exc.status == 500 and "validation error" in str(exc) and "prompt" in str(exc)
