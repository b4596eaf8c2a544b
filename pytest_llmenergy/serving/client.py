"""A client of OpenAI-compatible completion servers (vLLM, llama.cpp, ...), stdlib only.

Energy per token only means something when the counts are exact, so every request asks
for exactly ``max_tokens`` output tokens (``ignore_eos`` and ``min_tokens`` =
``max_tokens``: engines honour one or the other) and the counts the server reports in
its ``usage`` are checked against the case: a request that processed or produced
another number of tokens is an error, never a silently different measurement.
Responses are streamed (server-sent events), so each request's time to first token
and latency are known.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..errors import ConfigError, LLMEnergyError, TrialRejected

Prompt = str | Sequence[int]  # text, or token ids where the server takes them
DEFAULT_TIMEOUT_S = 600.0


class ServerError(LLMEnergyError):
    """The server refused a request or answered something that is not a completion."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NoStreamUsage(ServerError):
    """A streamed response without usage counts (llama-cpp-python's server streams none):
    the counts cannot be checked from it, a non-streamed request's can."""


class CountMismatch(TrialRejected):
    """A response's usage says other token counts than the request asked for."""


@dataclass(frozen=True)
class Completion:
    """One streamed completion: the server's usage counts and when its tokens came."""

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None  # send -> first streamed token (None: not streamed)
    latency_s: float  # send -> end of the response
    text: str


@dataclass(frozen=True)
class Endpoint:
    """``http://host:port`` (a trailing ``/v1`` is accepted) and the served model's name."""

    url: str
    model: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    # False for servers whose streams carry no usage: then the response comes whole,
    # its counts are checked, and time to first token is not known
    stream: bool = True

    @property
    def base(self) -> urllib.parse.SplitResult:
        return urllib.parse.urlsplit(self.url)

    @property
    def host(self) -> str:
        return self.base.hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        return self.base.port or (443 if self.base.scheme == "https" else 80)

    def _path(self, tail: str) -> str:
        root = self.base.path.rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        return f"{root}{tail}"

    def _connection(self, timeout_s: float | None = None) -> http.client.HTTPConnection:
        cls = (
            http.client.HTTPSConnection
            if self.base.scheme == "https"
            else http.client.HTTPConnection
        )
        return cls(self.host, self.port, timeout=timeout_s or self.timeout_s)

    # -- plain requests --------------------------------------------------------------
    def get(self, tail: str, timeout_s: float = 5.0) -> bytes:
        conn = self._connection(timeout_s)
        try:
            conn.request("GET", self._path(tail))
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise ServerError(f"GET {tail}: HTTP {response.status}", response.status)
        return body

    def get_json(self, tail: str, timeout_s: float = 5.0) -> object:
        return json.loads(self.get(tail, timeout_s))

    def running_requests(self, timeout_s: float = 2.0) -> float | None:
        """The server's own count of requests in its running batch, from its Prometheus
        ``/metrics`` (vLLM's ``vllm:num_requests_running``, SGLang's
        ``sglang:num_running_reqs``), summed over engines; None where it has none."""
        try:
            text = self.get("/metrics", timeout_s).decode("utf-8", "replace")
        except (OSError, ServerError):
            return None
        return running_from_metrics(text)

    def engine_time(self, timeout_s: float = 2.0) -> EngineTime | None:
        """What the server's engine says its finished requests spent running, from its
        ``/metrics`` (vLLM's ``vllm:request_inference_time_seconds``); None where it
        publishes none."""
        try:
            text = self.get("/metrics", timeout_s).decode("utf-8", "replace")
        except (OSError, ServerError):
            return None
        return engine_time_from_metrics(text)

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """The server answers its model list (every OpenAI-compatible server has it)."""
        try:
            self.get_json("/v1/models", timeout_s)
        except (OSError, ServerError, ValueError):
            return False
        return True

    def served_models(self) -> list[str]:
        data = self.get_json("/v1/models")
        rows = data.get("data", []) if isinstance(data, dict) else []
        return [str(row["id"]) for row in rows if isinstance(row, dict) and "id" in row]

    # -- completions -----------------------------------------------------------------
    def complete(
        self,
        prompt: Prompt,
        max_tokens: int,
        *,
        on_first_token: Callable[[], None] | None = None,
        on_token: Callable[[], None] | None = None,
    ) -> Completion:
        """Stream one greedy completion of exactly ``max_tokens`` tokens (if the server
        honours ``ignore_eos`` / ``min_tokens``: ``check`` finds out); ``on_token`` hears
        every streamed chunk of tokens after the first."""
        body: dict[str, object] = {
            "model": self.model,
            "prompt": prompt if isinstance(prompt, str) else list(prompt),
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": self.stream,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        conn = self._connection()
        start = time.perf_counter()
        try:
            return self._post(conn, body, start, on_first_token, on_token)
        except OSError as exc:  # refused, reset, timed out: the server is gone or stuck
            raise ServerError(f"{self.url}: {exc}") from exc
        finally:
            conn.close()

    def _post(
        self,
        conn: http.client.HTTPConnection,
        body: dict[str, object],
        start: float,
        on_first_token: Callable[[], None] | None,
        on_token: Callable[[], None] | None = None,
    ) -> Completion:
        conn.request(
            "POST",
            self._path("/v1/completions"),
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        response = conn.getresponse()
        if response.status != 200:
            detail = " ".join(response.read(2000).decode("utf-8", "replace").split())
            detail = detail if len(detail) <= 300 else detail[:297] + "..."
            raise ServerError(
                f"POST /v1/completions: HTTP {response.status}: {detail}", response.status
            )
        if not body.get("stream"):
            return _read_whole(response, start)
        return _read_stream(response, start, on_first_token, on_token)


def _read_whole(response: http.client.HTTPResponse, start: float) -> Completion:
    """A non-streamed completion: counts from its usage, no time to first token."""
    raw = response.read()
    latency_s = time.perf_counter() - start
    # no first token is seen apart: the window is not split into prefill | decode
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ServerError(f"the response is not JSON: {raw[:80]!r}") from exc
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        raise ServerError(
            "the response carries no usage counts: without them the token counts cannot "
            "be checked: use a server that reports them"
        )
    choices = data.get("choices") or []
    text = "".join(
        c["text"] for c in choices if isinstance(c, dict) and isinstance(c.get("text"), str)
    )
    return Completion(
        prompt_tokens=int(usage.get("prompt_tokens", -1)),
        completion_tokens=int(usage.get("completion_tokens", -1)),
        ttft_s=None,
        latency_s=latency_s,
        text=text,
    )


def _read_stream(
    response: http.client.HTTPResponse,
    start: float,
    on_first_token: Callable[[], None] | None,
    on_token: Callable[[], None] | None = None,
) -> Completion:
    first_s: float | None = None
    usage: dict[str, int] | None = None
    text: list[str] = []
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue  # blank separators, comments, event names
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            break
        try:
            event = json.loads(payload)
        except ValueError as exc:
            raise ServerError(f"a streamed event is not JSON: {payload[:80]!r}") from exc
        if not isinstance(event, dict):
            continue
        if "error" in event:
            raise ServerError(f"the server reported an error mid-stream: {event['error']}")
        choices = event.get("choices") or []
        if choices and first_s is None:
            first_s = time.perf_counter() - start
            if on_first_token is not None:
                on_first_token()
        elif choices and on_token is not None:
            on_token()
        for choice in choices:
            if isinstance(choice, dict) and isinstance(choice.get("text"), str):
                text.append(choice["text"])
        if isinstance(event.get("usage"), dict):
            usage = event["usage"]
    latency_s = time.perf_counter() - start
    if usage is None:
        raise NoStreamUsage(
            "the streamed response carries no usage counts (stream_options.include_usage); "
            "without them the token counts cannot be checked: use a server that reports them"
        )
    return Completion(
        prompt_tokens=int(usage.get("prompt_tokens", -1)),
        completion_tokens=int(usage.get("completion_tokens", -1)),
        ttft_s=first_s if first_s is not None else latency_s,
        latency_s=latency_s,
        text="".join(text),
    )


def check(completion: Completion, input_tokens: int, output_tokens: int, where: str) -> None:
    """Insist on the case's counts, from the server's own usage."""
    got = (completion.prompt_tokens, completion.completion_tokens)
    if got == (input_tokens, output_tokens):
        return
    raise CountMismatch(
        f"{where}: the server counted {got[0]} input and {got[1]} output tokens (usage), the "
        f"case needs exactly {input_tokens} and {output_tokens}: the trial is not measured "
        "as asked. The server must honour ignore_eos or min_tokens (vLLM does; llama.cpp's "
        "server sometimes returns a token or two more, finishing a character split across "
        "tokens), and take the prompt as token ids or tokenize text as the model's "
        "tokenizer does"
    )


def burst(
    send: Callable[[int, Callable[[], None] | None], Completion],
    concurrency: int,
    on_first_token: Callable[[], None] | None = None,
    requests: int | None = None,
) -> list[Completion]:
    """``requests`` requests (default: ``concurrency``), ``concurrency`` of them in flight
    at once: the first ``concurrency`` are released together (a barrier), each from its
    own thread, and each thread sends the next request as soon as its last one finished,
    as a server's queue refills its batch.  ``send(i, hook)`` sends request ``i``; the
    first token of any request calls ``on_first_token`` once, from the request's thread.
    The completions come back in request order."""
    total = max(requests or concurrency, concurrency)
    if total == 1:
        return [send(0, on_first_token)]
    gate = threading.Barrier(concurrency)
    lock = threading.Lock()
    fired = [False]
    taken = [0]  # requests handed out so far
    done: list[Completion | None] = [None] * total

    def first() -> None:
        with lock:
            if fired[0]:
                return
            fired[0] = True
        if on_first_token is not None:
            on_first_token()

    def next_request() -> int | None:
        with lock:
            if taken[0] == total:
                return None
            taken[0] += 1
            return taken[0] - 1

    def worker() -> None:
        gate.wait()
        while (i := next_request()) is not None:
            done[i] = send(i, first)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="llmenergy-req") as pool:
        futures = [pool.submit(worker) for _ in range(concurrency)]
        for f in futures:
            f.result()
    return [c for c in done if c is not None]


RUNNING_GAUGES = ("vllm:num_requests_running", "sglang:num_running_reqs")


# vLLM's histogram of each finished request's time in its engine, from the step that first
# scheduled it to the step that made its last token, on the engine's own clock
INFERENCE_SECONDS = "vllm:request_inference_time_seconds"


@dataclass(frozen=True)
class EngineTime:
    """A server's running totals over the requests it has finished: their seconds in its
    engine (each from its first scheduled step to its last token) and their number."""

    seconds: float
    requests: int


def _metric_total(text: str, names: Sequence[str]) -> float | None:
    """The sum of a Prometheus text page's samples named ``names`` over their label sets
    (one per engine); None when the page has none.  Hostile lines are skipped."""
    total, seen = 0.0, False
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in names:
            continue
        rest = line[line.find("}") + 1 :] if "{" in line else line[len(name) :]
        try:
            value = float(rest.split()[0])  # then an optional timestamp
        except (IndexError, ValueError):
            continue
        if math.isfinite(value) and value >= 0:
            total, seen = total + value, True
    return total if seen and math.isfinite(total) else None


def running_from_metrics(text: str) -> float | None:
    """The running-requests gauge of a Prometheus text page, summed over engines."""
    return _metric_total(text, RUNNING_GAUGES)


def engine_time_from_metrics(text: str) -> EngineTime | None:
    """vLLM's engine seconds and finished requests so far (its inference-time
    histogram's ``_sum`` and ``_count``), summed over engines; None without both."""
    seconds = _metric_total(text, (INFERENCE_SECONDS + "_sum",))
    count = _metric_total(text, (INFERENCE_SECONDS + "_count",))
    if seconds is None or count is None or count != int(count):
        return None
    return EngineTime(seconds, int(count))


def parse_endpoint_url(text: str) -> str:
    """``http://127.0.0.1:8000`` or ``.../v1``; checked now, so a typo stops at start."""
    url = text.strip()
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"expected the server's URL such as http://127.0.0.1:8000, got {text!r}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"bad port in {text!r}") from None
    return url
