"""A fake OpenAI-compatible completion server (stdlib ``http.server``) with real semantics.

What the exactness check and the request metrics depend on behaves as in real engines:

* ``usage`` counts what was really processed and produced: prompt tokens are the ids
  sent (or the text's tokens, counted by ``count_text``), output tokens the tokens
  streamed;
* generation stops at a "natural" EOS after ``natural_tokens`` unless the request's
  ``ignore_eos`` is honoured (vLLM) or ``min_tokens`` is (vLLM, llama.cpp);
  ``honour_ignore_eos=False`` is llama.cpp, which ignores that field;
* ``extra_token_every=N`` returns ``max_tokens + 1`` tokens in every N-th response, as
  llama.cpp's server does about one time in ten (a token split at a UTF-8 boundary);
* ``accept_ids=False`` answers token-id prompts with HTTP 400, as text-only servers do
  (llama-cpp-python's server answers 500 with its validation errors: its prompt field
  is text);
* ``stream_usage=False`` never puts usage in a stream, ``include_usage`` or not, as
  llama-cpp-python's server does (its non-streamed responses carry usage);
  ``Behaviour.llama_cpp()`` is that server: all of its quirks at once;
* responses stream as server-sent events, a chunk per token after ``prefill_s`` and
  then every ``token_s``, the usage in a last chunk when ``stream_options.include_usage``
  asks for it, then ``data: [DONE]``; requests run concurrently (one thread each) and the
  server records how many were in flight at most;
* a batch fills and drains as an engine's does: ``serial_prefill`` prefills one request
  at a time (so a burst's requests start generating one after another), and
  ``max_num_seqs`` (vLLM's flag) lets at most that many generate at once, the others
  waiting for a slot;
* ``running_gauge`` publishes vLLM's running-requests gauge on ``/metrics``;
  ``StaleGauge(period_s)`` is one that refreshes only every ``period_s`` (reading 0 until
  its first refresh), as a gauge that lags the batch or is read between its updates;
* ``engine_timings`` publishes vLLM's inference-time histogram's ``_sum`` and ``_count``
  (each finished request's seconds from its prefill to its last token), as vLLM's engine
  clocks them; ``whole_every=N`` delivers every N-th response in one piece at its end, as
  vLLM's API server does when it falls behind its engine (short of CPU), and
  ``frontend_gauge`` is the gauge that API server sets as it passes tokens on: it never
  counts a response delivered whole;
* with ``power`` (a ``SwitchTrace``), the server's GPU draws ``idle_w`` plus
  ``w_per_request`` for every request generating, switched the moment that number
  changes: the true energy of any stretch of a burst is known;
* with ``engine`` (a ``tests.fakes.batch_engine.BatchEngine``), streamed requests run in
  one loop of engine steps instead, batched, each step of known energy: the truth of
  every request's joules (``engine.truth``, keyed by the prompt's first token id);
  ``fail_every=N`` answers every N-th completion request with HTTP 500, and
  ``cut_every=N`` closes every N-th stream after half its tokens, without usage or
  ``[DONE]``: the failed and cut requests of a workload.

``ScriptedServer`` is the other kind: a hostile or broken server that answers each path
with scripted bytes, HTTP or not, at any pace (``Reply``), for the client's robustness.

Run in a thread (``FakeServer(...).start()``) or as a process:
``python -m tests.fakes.fake_openai_server --port N [--extra-token-every 10] [--spawn-child]``
(``--spawn-child`` starts a child process that busy-loops, like an engine's worker, and
ends it on SIGTERM, as engines do).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Behaviour:
    model: str = "fake-model"
    natural_tokens: int = 5  # tokens before the model "chooses" EOS
    honour_ignore_eos: bool = True
    honour_min_tokens: bool = True
    extra_token_every: int = 0  # every N-th completion gets max_tokens + 1 (0: never)
    accept_ids: bool = True
    ids_status: int = 400  # the refusal's status (llama-cpp-python: 500, with its
    # validation errors as the message)
    stream_usage: bool = True
    prefill_s: float = 0.01
    token_s: float = 0.002
    serial_prefill: bool = False
    max_num_seqs: int = 0  # 0: no limit
    power: Any = None  # a tests.fakes.trace.SwitchTrace the server's load switches
    idle_w: float = 50.0
    w_per_request: float = 25.0
    count_text: Callable[[str], int] = field(default=lambda text: len(text.split()))
    # vLLM's /metrics: what its vllm:num_requests_running gauge says, given the server
    # (None: no /metrics page, as llama.cpp's server)
    running_gauge: Callable[[Any], float] | None = None
    engine_timings: bool = False  # vllm:request_inference_time_seconds on /metrics
    whole_every: int = 0  # every N-th response delivered in one piece (0: never)
    engine: Any = None  # a tests.fakes.batch_engine.BatchEngine: batched steps, known energy
    fail_every: int = 0  # every N-th completion request answered HTTP 500 (0: never)
    cut_every: int = 0  # every N-th stream closed after half its tokens (0: never)

    @classmethod
    def llama_cpp(cls, **kwargs: Any) -> Behaviour:
        """llama-cpp-python's server: text prompts only, ``ignore_eos`` ignored,
        ``min_tokens`` honoured, no usage in streams, one token more now and then."""
        quirks: dict[str, Any] = {
            "honour_ignore_eos": False,
            "accept_ids": False,
            "ids_status": 500,
            "stream_usage": False,
            "extra_token_every": 10,
        }
        return cls(**{**quirks, **kwargs})


class StaleGauge:
    """A running-requests gauge that takes the server's count only every ``period_s`` and
    reads its last value between (0 before its first refresh, a period after it starts)."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._value = 0.0
        self._at = time.monotonic()

    def __call__(self, server: Any) -> float:
        now = time.monotonic()
        if now - self._at >= self.period_s:
            self._value, self._at = float(server.generating), now
        return self._value


def frontend_gauge(server: Any) -> float:
    """vLLM's gauge as its API server sets it: the requests whose tokens it is passing on."""
    return float(server.passing)


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # a real server's backlog, not http.server's 5
    daemon_threads = True


class FakeServer:
    def __init__(self, behaviour: Behaviour | None = None, port: int = 0) -> None:
        self.behaviour = behaviour or Behaviour()
        self.completions = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests: list[dict[str, Any]] = []
        self.generating = 0  # requests past their prefill, not yet finished
        self.passing = 0  # requests whose tokens are being passed on, not yet finished
        self.engine_s = 0.0  # finished requests' seconds from prefill to last token
        self.engine_requests = 0
        self._lock = threading.Lock()
        self._prefill_lock = threading.Lock()
        b = self.behaviour
        self._slots = threading.Semaphore(b.max_num_seqs) if b.max_num_seqs else None
        handler = _handler_for(self)
        self.httpd = _Server(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- generation ------------------------------------------------------------------
    @contextlib.contextmanager
    def slot(self) -> Any:
        """A place in the batch (``max_num_seqs``), held from prefill to the last token."""
        if self._slots is None:
            yield
            return
        with self._slots:
            yield

    def prefill(self) -> None:
        """``prefill_s``, one request at a time with ``serial_prefill``."""
        if not self.behaviour.serial_prefill:
            time.sleep(self.behaviour.prefill_s)
            return
        with self._prefill_lock:
            time.sleep(self.behaviour.prefill_s)

    def _generating(self, change: int) -> None:
        with self._lock:
            self.generating += change
            b = self.behaviour
            if b.power is not None:
                b.power.set(b.idle_w + b.w_per_request * self.generating, time.perf_counter())

    @contextlib.contextmanager
    def decoding(self) -> Any:
        """One request generating: the power steps up for it, and down when it is done."""
        self._generating(+1)
        try:
            yield
        finally:
            self._generating(-1)

    def passing_changes(self, change: int) -> None:
        with self._lock:
            self.passing += change

    def engine_finished(self, seconds: float) -> None:
        """A request's last token: its engine time joins the histogram's totals."""
        with self._lock:
            self.engine_s += seconds
            self.engine_requests += 1

    def output_count(self, body: dict[str, Any]) -> int:
        """How many tokens this request really gets, as an engine would decide."""
        b = self.behaviour
        max_tokens = int(body.get("max_tokens", 16))
        min_tokens = int(body.get("min_tokens", 0)) if b.honour_min_tokens else 0
        ignore_eos = bool(body.get("ignore_eos")) and b.honour_ignore_eos
        n = max_tokens if ignore_eos else min(max_tokens, max(b.natural_tokens, min_tokens))
        with self._lock:
            self.completions += 1
            nth = self.completions
        if b.extra_token_every and nth % b.extra_token_every == 0:
            n += 1  # the UTF-8 boundary case
        return n


def _handler_for(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, status: int, data: Any) -> None:
            blob = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(blob)))
            self.end_headers()
            self.wfile.write(blob)

        def do_GET(self) -> None:
            if self.path in ("/v1/models", "/models"):
                self._json(200, {"object": "list", "data": [{"id": server.behaviour.model}]})
            elif self.path == "/health":
                self._json(200, {})
            elif self.path == "/metrics" and server.behaviour.running_gauge is not None:
                page = _metrics_page(server).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
            else:
                self._json(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError:
                self._json(400, {"error": "body is not JSON"})
                return
            if self.path != "/v1/completions":
                self._json(404, {"error": f"no route {self.path}"})
                return
            b = server.behaviour
            if body.get("model") != b.model:
                self._json(404, {"error": f"model {body.get('model')!r} does not exist"})
                return
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                if not b.accept_ids:
                    message = (
                        "1 validation errors: {'type': 'string_type', 'loc': ('body', "
                        "'prompt', 'str'), 'msg': 'Input should be a valid string'}"
                    )
                    self._json(b.ids_status, {"error": {"message": message}})
                    return
                prompt_tokens = len(prompt)
            elif isinstance(prompt, str):
                prompt_tokens = b.count_text(prompt)
            else:
                self._json(400, {"error": "prompt missing"})
                return
            server.requests.append(body)
            if b.fail_every and len(server.requests) % b.fail_every == 0:
                self._json(500, {"error": {"message": "the engine failed this request"}})
                return
            with server._lock:
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                n = server.output_count(body)
                if body.get("stream"):
                    self._stream(body, prompt_tokens, n)
                else:
                    time.sleep(b.prefill_s + b.token_s * max(n - 1, 0))
                    self._json(200, _completion(b.model, prompt_tokens, n))
            finally:
                with server._lock:
                    server.in_flight -= 1

        def _stream(self, body: dict[str, Any], prompt_tokens: int, n: int) -> None:
            b = server.behaviour
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            if b.engine is not None:
                self._stream_engine(body, prompt_tokens, n)
                return
            with server._lock:
                whole = b.whole_every and server.completions % b.whole_every == 0
            held: list[dict[str, Any]] = []  # a response delivered whole waits here
            with server.slot():
                started = time.perf_counter()
                server.prefill()
                with server.decoding():
                    for i in range(n):
                        if i:
                            time.sleep(b.token_s)
                        chunk = {
                            "object": "text_completion",
                            "model": b.model,
                            "choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}],
                        }
                        if whole:
                            held.append(chunk)
                            continue
                        if i == 0:
                            server.passing_changes(+1)
                        self._event(chunk)
                server.engine_finished(time.perf_counter() - started)
            if held:
                server.passing_changes(+1)
                for chunk in held:
                    self._event(chunk)
            server.passing_changes(-1 if n else 0)
            if b.stream_usage and (body.get("stream_options") or {}).get("include_usage"):
                self._event(
                    {"object": "text_completion", "choices": [], "usage": _usage(prompt_tokens, n)}
                )
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _stream_engine(self, body: dict[str, Any], prompt_tokens: int, n: int) -> None:
            """The request's tokens as the batching engine makes them, a chunk each."""
            b = server.behaviour
            prompt = body.get("prompt")
            key = prompt[0] if isinstance(prompt, list) and prompt else prompt
            cut = b.cut_every and len(server.requests) % b.cut_every == 0
            tokens = b.engine.submit(key, prompt_tokens, n)
            sent = 0
            while tokens.get() is not None:
                if cut and sent >= n // 2:
                    self.close_connection = True
                    return  # the rest is made, never sent: no usage, no [DONE]
                chunk = {"choices": [{"index": 0, "text": f" w{sent}", "finish_reason": None}]}
                self._event({"object": "text_completion", "model": b.model, **chunk})
                sent += 1
            if (body.get("stream_options") or {}).get("include_usage"):
                self._event(
                    {"object": "text_completion", "choices": [], "usage": _usage(prompt_tokens, n)}
                )
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _event(self, data: dict[str, Any]) -> None:
            self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
            self.wfile.flush()

    return Handler


def _metrics_page(server: FakeServer) -> str:
    """vLLM's Prometheus page: its running-requests gauge, and its inference-time
    histogram's totals where the behaviour publishes them."""
    labels = '{engine="0",model_name="m"}'
    page = (
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{labels} {server.behaviour.running_gauge(server)}\n"
    )
    if server.behaviour.engine_timings:
        with server._lock:
            seconds, count = server.engine_s, server.engine_requests
        page += (
            "# TYPE vllm:request_inference_time_seconds histogram\n"
            f"vllm:request_inference_time_seconds_sum{labels} {seconds}\n"
            f"vllm:request_inference_time_seconds_count{labels} {count}.0\n"
        )
    return page


def _usage(prompt_tokens: int, n: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n,
        "total_tokens": prompt_tokens + n,
    }


def _completion(model: str, prompt_tokens: int, n: int) -> dict[str, Any]:
    return {
        "object": "text_completion",
        "model": model,
        "choices": [{"index": 0, "text": " w" * n, "finish_reason": "length"}],
        "usage": _usage(prompt_tokens, n),
    }


# -- a hostile server: any bytes, at any pace -------------------------------------------
@dataclass(frozen=True)
class Reply:
    """What ``ScriptedServer`` sends for one request: ``parts`` in order, ``pause_s``
    before each (a server that trickles its answer), then it closes the connection, or
    with ``hold`` keeps it open, silent, until the server stops."""

    parts: tuple[bytes, ...]
    pause_s: float = 0.0
    hold: bool = False


def http_reply(
    body: bytes | str | Any,
    status: str = "200 OK",
    headers: tuple[str, ...] = ("Content-Type: application/json",),
    *,
    length: bool = True,
) -> bytes:
    """A whole HTTP/1.1 answer: ``body`` (bytes, text, or an object sent as JSON) after
    the status line and ``headers``, its Content-Length added with ``length``."""
    if not isinstance(body, bytes):
        body = (body if isinstance(body, str) else json.dumps(body)).encode()
    head = [f"HTTP/1.1 {status}", *headers]
    if length:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join([*head, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + body


def chunked(body: bytes, sizes: tuple[int, ...] = (7,), *, end: bool = True) -> bytes:
    """``body`` in HTTP/1.1 chunks of ``sizes`` (the last size repeats), closed by the
    zero chunk unless ``end`` is off (a stream cut between chunks)."""
    out, i, n = b"", 0, 0
    while i < len(body):
        size = max(1, sizes[min(n, len(sizes) - 1)])
        piece = body[i : i + size]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        i, n = i + size, n + 1
    return out + (b"0\r\n\r\n" if end else b"")


def sse(*events: Any, done: bool = True) -> bytes:
    """Server-sent events, one ``data:`` line each (objects as JSON), then ``[DONE]``."""
    lines = [e if isinstance(e, bytes) else f"data: {json.dumps(e)}".encode() for e in events]
    return b"".join(line + b"\n\n" for line in lines) + (b"data: [DONE]\n\n" if done else b"")


def models_reply(*ids: Any) -> Reply:
    """``/v1/models`` listing ``ids`` (default: the fake model)."""
    data = [{"id": i, "object": "model"} for i in (ids or ("fake-model",))]
    return Reply((http_reply({"object": "list", "data": data}),))


def good_completion(prompt_tokens: int, completion_tokens: int) -> Reply:
    """A streamed completion that a real server sends: a chunk per token, the usage."""
    chunks = [{"choices": [{"index": 0, "text": f" w{i}"}]} for i in range(completion_tokens)]
    usage = {"choices": [], "usage": _usage(prompt_tokens, completion_tokens)}
    body = sse(*chunks, usage)
    return Reply((http_reply(body, headers=("Content-Type: text/event-stream",)),))


Route = Reply | list[Reply] | Callable[[dict[str, Any]], Reply]


def echo(request: dict[str, Any]) -> Reply:
    """What an honest server answers a completion request: the prompt's tokens (its ids
    counted), exactly ``max_tokens`` more."""
    prompt = request.get("prompt")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
    return good_completion(prompt_tokens, int(request.get("max_tokens", 1)))


class ScriptedServer:
    """A raw TCP server that answers each request path with scripted bytes, valid HTTP or
    not: the server a hostile or broken one can be.  ``routes`` maps a path to its
    replies, the n-th request to that path getting the n-th (the last one repeats), or
    to a function of the request's JSON body; ``/v1/models`` lists the fake model
    unless a route says otherwise, any other path is a 404.  ``requests`` counts the
    requests by path."""

    def __init__(self, routes: dict[str, Route] | None = None) -> None:
        self.routes: dict[str, Route] = {"/v1/models": models_reply(), **(routes or {})}
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)  # before the thread runs: a quick stop closes it
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _reply_for(self, path: str, body: bytes) -> Reply:
        with self._lock:
            n = self.requests.get(path, 0)
            self.requests[path] = n + 1
        route = self.routes.get(path)
        if route is None:
            return Reply((http_reply({"error": f"no route {path}"}, "404 Not Found"),))
        if isinstance(route, Reply):
            return route
        if isinstance(route, list):
            return route[min(n, len(route) - 1)]
        return route(json.loads(body or b"{}"))

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5)
            reply = self._reply_for(*_read_request(conn))
            for part in reply.parts:
                if reply.pause_s and self._stop.wait(reply.pause_s):
                    return
                conn.sendall(part)
            if reply.hold:
                self._stop.wait()
            conn.shutdown(socket.SHUT_RDWR)


def _read_request(conn: socket.socket) -> tuple[str, bytes]:
    """One request's path and body (its head, then what its Content-Length announces)."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            break
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip() or 0)
    while len(body) < length:
        got = conn.recv(65536)
        if not got:
            break
        body += got
    words = lines[0].split()
    return (words[1] if len(words) > 1 else ""), body


def worker_code(port: int) -> str:
    """The ``--spawn-child`` worker's program: a busy loop that names its server's port,
    so a test finds this server's worker and not another busy loop on the machine."""
    return f"while True: pass  # the fake engine's worker, port {port}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--extra-token-every", type=int, default=0)
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--llama-cpp", action="store_true", help="llama-cpp-python's quirks")
    parser.add_argument("--tokenizer", default="", help="count text prompts with this HF one")
    parser.add_argument("--fail", default="", help="print this and exit 3 at once")
    parser.add_argument("--prefill-s", type=float, default=Behaviour.prefill_s)
    parser.add_argument("--token-s", type=float, default=Behaviour.token_s)
    parser.add_argument("--serial-prefill", action="store_true", help="one prefill at a time")
    parser.add_argument("--max-num-seqs", type=int, default=0, help="as vLLM's (0: no limit)")
    args, _ = parser.parse_known_args(argv)
    if args.fail:
        for i in range(8):
            print(f"starting step {i}", flush=True)
        print(args.fail, flush=True)
        sys.exit(3)
    if args.spawn_child:  # an engine's worker: a child that keeps a CPU busy
        worker = subprocess.Popen(
            [sys.executable, "-c", worker_code(args.port)],
            stdin=subprocess.DEVNULL,
        )

        stopping: list[bool] = []

        def shut_down(signum: int, frame: object) -> None:  # as vLLM ends its workers
            # Once: a second SIGTERM arriving inside the first handler must not wait on
            # Popen's lock the first one holds (that deadlocked, leaving this server alive)
            if stopping:
                return
            stopping.append(True)
            worker.terminate()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(worker.pid, 0)
            os._exit(0)

        signal.signal(signal.SIGTERM, shut_down)
    behaviour = Behaviour(
        model=args.model,
        extra_token_every=args.extra_token_every,
        prefill_s=args.prefill_s,
        token_s=args.token_s,
        serial_prefill=args.serial_prefill,
        max_num_seqs=args.max_num_seqs,
    )
    if args.llama_cpp:
        behaviour = Behaviour.llama_cpp(model=args.model)
        if args.extra_token_every:
            behaviour.extra_token_every = args.extra_token_every
    if args.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        behaviour.count_text = lambda text: len(tok(text)["input_ids"])
    server = FakeServer(behaviour, args.port)
    print(f"fake server listening on {server.url}", flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
