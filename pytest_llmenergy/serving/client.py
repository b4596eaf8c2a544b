"""A client of OpenAI-compatible completion servers (vLLM, llama.cpp, ...), stdlib only.

Energy per token only means something when the counts are exact, so every request asks
for exactly ``max_tokens`` output tokens (``ignore_eos`` and ``min_tokens`` =
``max_tokens``: engines honour one or the other) and the counts the server reports in
its ``usage`` are checked against the case: a request that processed or produced
another number of tokens is an error, never a silently different measurement.
Responses are streamed (server-sent events), so each request's time to first token
and latency are known.

A server is read as a hostile one could answer: every request has a whole-request
deadline (each read gets what is left of it, so a server that trickles bytes cannot
stretch it), every read is bounded in size, and whatever comes back that is not a
completion (no HTTP, a cut stream, a field of the wrong kind) is a ``BadResponse``: one
line, its server text escaped, that stops a session at its start and rejects a trial
mid-run (``errors.TrialRejected``).
"""

from __future__ import annotations

import functools
import http.client
import io
import json
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, LLMEnergyError, TrialRejected, one_line

Prompt = str | Sequence[int]  # text, or token ids where the server takes them
DEFAULT_TIMEOUT_S = 600.0
# The most a server's answer may hold: a whole answer (a model list, a completion, a
# /metrics page), one line of a stream, and a whole stream.  Real servers send kilobytes
# (vLLM's /metrics page: some hundreds); past these a server sends something else, and
# reading it on would only fill this process's memory.
MAX_BODY_BYTES = 8 * 2**20
MAX_LINE_BYTES = 2**20
MAX_STREAM_BYTES = 64 * 2**20


class ServerError(LLMEnergyError):
    """No server answers (the connection is refused: it is gone), or what it answered is
    no completion (``BadResponse``); the message is one line, its server text escaped."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BadResponse(ServerError, TrialRejected):
    """The server answered, but not a completion: an HTTP error, no HTTP at all, a
    stream cut short or too slow, a field of the wrong kind.  At a session's start it
    stops the session in one line; mid-run it rejects the trial (kept, repeated)."""


class NoStreamUsage(BadResponse):
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


class Deadline:
    """A whole request's time limit.  A socket's timeout bounds each read alone, so a
    server sending a byte every few seconds would keep a 5 s wait going for hours;
    here connecting, sending and every read get what is left of one deadline."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        """The seconds left; TimeoutError once there are none."""
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no whole answer within {self.seconds:g} s")
        return left


class _DeadlineReads(io.RawIOBase):
    """A response's socket reads, each given what is left of the request's deadline."""

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, deadline: Deadline) -> None:
        super().__init__()
        self._raw, self._sock, self._deadline = raw, sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(self._deadline.left())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()  # the socket's own reader: it holds the socket open till now
        super().close()


class _Response(http.client.HTTPResponse):
    """http.client's response, reading under a whole-request deadline."""

    def __init__(
        self,
        sock: socket.socket,
        debuglevel: int = 0,
        method: str | None = None,
        url: str | None = None,
        *,
        deadline: Deadline,
    ) -> None:
        super().__init__(sock, debuglevel, method, url)
        raw = self.fp.detach()  # nothing read yet: the socket's reader, unbuffered
        self.fp = io.BufferedReader(_DeadlineReads(raw, sock, deadline))


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

    def _connection(self, deadline: Deadline) -> http.client.HTTPConnection:
        cls = (
            http.client.HTTPSConnection
            if self.base.scheme == "https"
            else http.client.HTTPConnection
        )
        conn = cls(self.host, self.port, timeout=deadline.left())
        conn.response_class = functools.partial(_Response, deadline=deadline)
        return conn

    def _failed(self, what: str, exc: BaseException, seconds: float) -> ServerError:
        """What a request that broke off says: nobody listening (the server is gone), or
        how the server's answer failed (a ``BadResponse``)."""
        if isinstance(exc, ConnectionRefusedError):
            return ServerError(f"{self.url}: {exc}")
        if isinstance(exc, TimeoutError):
            return BadResponse(
                f"{what}: no whole answer within {seconds:g} s (the server is stuck, or "
                "sends its answer too slowly)"
            )
        return BadResponse(f"{what}: {_transport_problem(exc)}")

    # -- plain requests --------------------------------------------------------------
    def get(self, tail: str, timeout_s: float = 5.0) -> bytes:
        """The body of a GET, within ``timeout_s`` in all; any failure a ServerError."""
        deadline = Deadline(timeout_s)
        try:
            conn = self._connection(deadline)
            try:
                conn.request("GET", self._path(tail))
                response = conn.getresponse()
                body = _read_body(response, f"GET {tail}")
            finally:
                conn.close()
        except (OSError, http.client.HTTPException) as exc:
            raise self._failed(f"GET {tail}", exc, timeout_s) from None
        if response.status != 200:
            raise BadResponse(f"GET {tail}: HTTP {response.status}", response.status)
        return body

    def get_json(self, tail: str, timeout_s: float = 5.0) -> object:
        body = self.get(tail, timeout_s)
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise BadResponse(f"GET {tail}: the answer is not JSON: {_shown(body)}") from None

    def running_requests(self, timeout_s: float = 2.0) -> float | None:
        """The server's own count of requests in its running batch, from its Prometheus
        ``/metrics`` (vLLM's ``vllm:num_requests_running``, SGLang's
        ``sglang:num_running_reqs``), summed over engines; None where it has none."""
        try:
            text = self.get("/metrics", timeout_s).decode("utf-8", "replace")
        except ServerError:
            return None
        return running_from_metrics(text)

    def engine_time(self, timeout_s: float = 2.0) -> EngineTime | None:
        """What the server's engine says its finished requests spent running, from its
        ``/metrics`` (vLLM's ``vllm:request_inference_time_seconds``); None where it
        publishes none."""
        try:
            text = self.get("/metrics", timeout_s).decode("utf-8", "replace")
        except ServerError:
            return None
        return engine_time_from_metrics(text)

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """The server answers its model list (every OpenAI-compatible server has it)."""
        try:
            self.get_json("/v1/models", timeout_s)
        except ServerError:
            return False
        return True

    def served_models(self, timeout_s: float = 5.0) -> list[str]:
        """The ids the server lists (a row without a text id is no model)."""
        data = self.get_json("/v1/models", timeout_s)
        rows = data.get("data") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            return []
        return [
            row["id"] for row in rows if isinstance(row, dict) and isinstance(row.get("id"), str)
        ]

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
        start = time.perf_counter()
        try:
            conn = self._connection(Deadline(self.timeout_s))
            try:
                return self._post(conn, body, start, on_first_token, on_token)
            finally:
                conn.close()
        # refused: the server is gone; reset, cut, timed out, no HTTP: it failed the request
        except (OSError, http.client.HTTPException) as exc:
            raise self._failed("POST /v1/completions", exc, self.timeout_s) from None

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
            raise BadResponse(
                f"POST /v1/completions: HTTP {response.status}: {one_line(detail)}",
                response.status,
            )
        if not body.get("stream"):
            return _read_whole(response, start)
        return _read_stream(response, start, on_first_token, on_token)


def _read_body(response: http.client.HTTPResponse, what: str) -> bytes:
    """A whole response body, refused past ``MAX_BODY_BYTES``."""
    body = response.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise BadResponse(f"{what}: the answer runs past {MAX_BODY_BYTES // 2**20} MiB")
    return body


def _read_whole(response: http.client.HTTPResponse, start: float) -> Completion:
    """A non-streamed completion: counts from its usage, no time to first token."""
    raw = _read_body(response, "POST /v1/completions")
    latency_s = time.perf_counter() - start
    # no first token is seen apart: the window is not split into prefill | decode
    data = _json(raw, "the response")
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        raise BadResponse(
            "the response carries no usage counts: without them the token counts cannot "
            "be checked: use a server that reports them"
        )
    choices = _choices(data, "the response")
    text = "".join(
        c["text"] for c in choices if isinstance(c, dict) and isinstance(c.get("text"), str)
    )
    return Completion(
        prompt_tokens=_count(usage, "prompt_tokens"),
        completion_tokens=_count(usage, "completion_tokens"),
        ttft_s=None,
        latency_s=latency_s,
        text=text,
    )


_DONE = "[DONE]"


def _read_stream(
    response: http.client.HTTPResponse,
    start: float,
    on_first_token: Callable[[], None] | None,
    on_token: Callable[[], None] | None = None,
) -> Completion:
    first_s: float | None = None
    usage: dict[str, Any] | None = None
    text: list[str] = []
    for line in _stream_lines(response):
        event = _event(line)
        if event == _DONE:
            break
        if not isinstance(event, dict):
            continue  # blank separators, comments, event names, other JSON
        if "error" in event:
            raise BadResponse(
                f"the server reported an error mid-stream: {_error_text(event['error'])}"
            )
        choices = _choices(event, "a streamed event")
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
    else:  # no [DONE] (llama.cpp's servers may send none): the framing says if it is whole
        _check_whole(response)
    latency_s = time.perf_counter() - start
    if usage is None:
        raise NoStreamUsage(
            "the streamed response carries no usage counts (stream_options.include_usage); "
            "without them the token counts cannot be checked: use a server that reports them"
        )
    return Completion(
        prompt_tokens=_count(usage, "prompt_tokens"),
        completion_tokens=_count(usage, "completion_tokens"),
        ttft_s=first_s if first_s is not None else latency_s,
        latency_s=latency_s,
        text="".join(text),
    )


def _check_whole(response: http.client.HTTPResponse) -> None:
    """A stream that ended before the length it announced, or before its last chunk (a
    chunked response's zero-size chunk closes it), was cut off."""
    chunked_open = response.chunked and response.fp is not None
    if chunked_open or (response.length is not None and response.length > 0):
        raise BadResponse("the stream stopped short (the connection closed in the middle of it)")


def _stream_lines(response: http.client.HTTPResponse) -> Iterator[bytes]:
    """A stream's lines, each at most ``MAX_LINE_BYTES``, all at most ``MAX_STREAM_BYTES``."""
    total = 0
    while line := response.readline(MAX_LINE_BYTES + 1):
        if len(line) > MAX_LINE_BYTES:
            raise BadResponse(f"a streamed line runs past {MAX_LINE_BYTES // 2**20} MiB")
        total += len(line)
        if total > MAX_STREAM_BYTES:
            raise BadResponse(f"the stream runs past {MAX_STREAM_BYTES // 2**20} MiB")
        yield line


def _event(line: bytes) -> object:
    """A ``data:`` line's JSON, ``_DONE`` at its end, None for any other line."""
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith("data:"):
        return None
    payload = text[len("data:") :].strip()
    if payload == _DONE:
        return _DONE
    return _json(payload, "a streamed event")


def _json(raw: str | bytes, what: str) -> object:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
        raise BadResponse(f"{what} is not JSON: {_shown(raw)}") from None


def _choices(data: Mapping[str, Any], what: str) -> list[Any]:
    """A completion's ``choices``: a list (absent or empty: none)."""
    choices = data.get("choices") or []
    if not isinstance(choices, list):
        raise BadResponse(f"{what}'s choices are {_shown(choices)}, not a list")
    return choices


def _count(usage: Mapping[str, Any], key: str) -> int:
    """A token count of the server's usage: a whole number >= 0, nothing else."""
    value = usage.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadResponse(f"the server's usage.{key} is {_shown(value)}, not a count of tokens")
    return value


def _shown(value: object, limit: int = 80) -> str:
    """Something a server sent, for a message: short, one line, escaped; text quoted, a
    number or null as JSON writes it, anything else by its kind."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return f"'{one_line(value, limit)}'" if value else "empty"
    if value is None or isinstance(value, bool | int | float):
        return one_line(json.dumps(value), limit)
    return "a list" if isinstance(value, list) else "an object"


def _error_text(error: object) -> str:
    """What a server's ``{"error": ...}`` says: its message, or its text, escaped."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        error = error["message"]
    return one_line(error if isinstance(error, str) else _shown(error))


def _transport_problem(exc: BaseException) -> str:
    """What broke in an answer, for a one-line message (the server's text escaped)."""
    if isinstance(exc, http.client.BadStatusLine) and not isinstance(exc, ConnectionError):
        return f"not an HTTP answer (its first line: {_shown(exc.line)})"
    if isinstance(exc, http.client.IncompleteRead):
        return "the answer stopped short (the connection closed in the middle of it)"
    if isinstance(exc, http.client.LineTooLong):
        return "not an HTTP answer (a line of its head runs past 64 KiB)"
    if isinstance(exc, http.client.RemoteDisconnected | ConnectionError):
        return "the server closed the connection without a whole answer"
    if isinstance(exc, http.client.HTTPException):
        return f"not an HTTP answer ({one_line(str(exc) or type(exc).__name__)})"
    return one_line(str(exc) or type(exc).__name__)


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
