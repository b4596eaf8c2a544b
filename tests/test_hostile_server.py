"""A hostile or broken server never breaks a session (issue 62, items 1 to 3).

Whatever bytes a server sends (any status line, headers, body or stream, cut anywhere,
sent slowly), the serving client gives a completion, or one escaped line: at a session's
start ``ERROR: --llm-endpoint: ...`` and exit 4, mid-run a rejected trial with its reason;
and every wait ends at its request's deadline.  The property tests feed the client such
bytes through ``ScriptedServer``; the sessions below run the issue's examples whole.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 - before any session in this process (see ``session``)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers import AutoConfig, AutoTokenizer  # noqa: F401 - as torch above

from pytest_llmenergy.errors import LLMEnergyError, TrialRejected
from pytest_llmenergy.serving import engine as engine_module
from pytest_llmenergy.serving.client import (
    MAX_BODY_BYTES,
    MAX_LINE_BYTES,
    BadResponse,
    Completion,
    Endpoint,
    EngineTime,
    ServerError,
)
from pytest_llmenergy.serving.engine import EngineFailed, EngineSpec, start_engine
from pytest_llmenergy.serving.target import Burst, ServerTarget
from tests.fakes.fake_openai_server import (
    Reply,
    ScriptedServer,
    chunked,
    echo,
    good_completion,
    http_reply,
    models_reply,
    sse,
)
from tests.test_plugin import assert_one_line_usage_error
from tests.test_serving import Prompts, served  # noqa: F401 - a fixture

# Each example is one local connection (milliseconds); the slow ones wait out a deadline.
QUICK = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
FEW = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
DEADLINE_S = 2.0  # each request's here; a hostile answer ends well within it
SLACK_S = 2.0  # a busy machine schedules a thread late; a hang takes minutes

# -- what a server may send ----------------------------------------------------------------
OK = b"HTTP/1.1 200 OK\r\n"
STATUS_LINES = st.one_of(
    st.just(OK),
    st.just(OK),
    st.just(OK),
    st.sampled_from(
        [
            b"HTTP/1.0 200 OK\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\n",
            b"HTTP/1.1 400 \x1b[2J\x1b]0;pwn\x07\r\n",
            b"HTTP/1.1 200\r\n",
            b"HTTP/2 200\r\n",
            b"HTTP/1.1 99 Low\r\n",
            b"HTTP/1.1 1000 High\r\n",
            b"HTTP/1.1 abc\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\n" * 3 + OK,
            b"SSH-2.0-OpenSSH_9.6\r\n",
            b"\r\n",
            b"",
        ]
    ),
    st.binary(max_size=24).map(lambda b: b + b"\r\n"),
)
HEADER_LINES = st.one_of(
    st.sampled_from(
        [
            b"Content-Type: application/json",
            b"Content-Type: text/event-stream",
            b"Content-Length: -5",
            b"Content-Length: abc",
            b"Content-Length: " + b"9" * 5000,
            b"Transfer-Encoding: gzip",
            b"Connection: keep-alive",
            b"X-\x1b[2J: \x00\xff",
            b"no colon here",
        ]
    ),
    st.binary(max_size=20).filter(lambda b: b"\n" not in b and b"\r" not in b),
)
TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["\x1b[2J\x1b]0;pwn\x07AAA", "\u202eevil", "a\r\nb", "\x00", "\x9b31m"]),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),  # NaN and the infinities too: Python's json writes and reads them
    TEXT,
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
COUNTS = st.one_of(st.integers(0, 64), JSON)
USAGE = st.one_of(
    st.fixed_dictionaries({"prompt_tokens": COUNTS, "completion_tokens": COUNTS}),
    st.fixed_dictionaries({"prompt_tokens": st.integers(0, 64)}),
    JSON,
)
CHOICES = st.one_of(
    st.lists(st.fixed_dictionaries({"index": st.just(0), "text": TEXT | JSON}), max_size=3),
    JSON,
)
EVENTS = st.one_of(
    st.fixed_dictionaries({"choices": CHOICES}),
    st.fixed_dictionaries({"choices": CHOICES, "usage": USAGE}),
    st.fixed_dictionaries({"error": JSON | st.fixed_dictionaries({"message": TEXT})}),
    JSON,
)
RAW_LINES = st.sampled_from(
    [
        b"data: [DONE]",
        b": a comment",
        b"event: ping",
        b"data: {not json",
        b"data: " + b"[" * 50_000,  # nested past Python's stack
        b"data: \xff\xfe",
        b"data:",
    ]
)
STREAM_BODIES = st.lists(
    st.one_of(
        EVENTS.map(lambda e: b"data: " + json.dumps(e).encode()), RAW_LINES, st.binary(max_size=16)
    ),
    max_size=6,
).map(lambda lines: b"".join(line + b"\n\n" for line in lines))
WHOLE_BODIES = st.one_of(
    st.fixed_dictionaries({"choices": CHOICES, "usage": USAGE}).map(
        lambda d: json.dumps(d).encode()
    ),
    JSON.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=40),
    st.just(b"[" * 50_000),
)
FRAMINGS = ("length", "length", "chunked", "close", "longer", "bad chunk")


@st.composite
def answers(draw: st.DrawFn, bodies: st.SearchStrategy[bytes]) -> bytes:
    """A server's whole answer: a status line, headers, a body framed one way or another
    (announced length, chunks, the connection's close, a length or chunk it never
    sends), and cut anywhere."""
    head = [draw(STATUS_LINES), *(h + b"\r\n" for h in draw(st.lists(HEADER_LINES, max_size=3)))]
    body = draw(bodies)
    framing = draw(st.sampled_from(FRAMINGS))
    if framing in ("length", "longer"):
        more = draw(st.integers(1, 100)) if framing == "longer" else 0
        head.append(f"Content-Length: {len(body) + more}\r\n".encode())
    elif framing in ("chunked", "bad chunk"):
        head.append(b"Transfer-Encoding: chunked\r\n")
        sizes = tuple(draw(st.lists(st.integers(1, 64), min_size=1, max_size=3)))
        body = chunked(body, sizes)
        if framing == "bad chunk":
            body = draw(st.sampled_from([b"zz\r\n", b"fffffffffff\r\n", b"-1\r\n"])) + body
    raw = b"".join(head) + b"\r\n" + body
    cut = draw(st.none() | st.integers(0, len(raw)))
    return raw if cut is None else raw[:cut]


# -- what the client must make of it --------------------------------------------------------
def one_line(message: str) -> None:
    """A message fit for a terminal: one line, no control character from the server."""
    assert message, "an empty message"
    assert message.isprintable(), repr(message)  # no \n, no escape sequence, no bidi control


def within_deadline(call: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    """``call()``'s result, or the LLMEnergyError it raised, checked to say one line; in
    time either way.  Anything else it raises fails the test."""
    start = time.monotonic()
    try:
        result: Any = call()
    except LLMEnergyError as exc:
        one_line(str(exc))
        result = exc
    took = time.monotonic() - start
    assert took < deadline_s + SLACK_S, f"took {took:.1f} s"
    return result


@pytest.fixture(scope="module")
def hostile() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


def answer_with(server: ScriptedServer, path: str, *replies: Reply) -> Endpoint:
    server.routes[path] = list(replies)
    server.requests.clear()
    return Endpoint(server.url, "fake-model", timeout_s=DEADLINE_S)


def sane(done: Completion) -> None:
    """A completion that passed: counts the server said, as whole numbers."""
    assert isinstance(done.prompt_tokens, int) and done.prompt_tokens >= 0
    assert isinstance(done.completion_tokens, int) and done.completion_tokens >= 0


# -- the client's reads and parses, fed anything ----------------------------------------------
@QUICK
@given(answers(STREAM_BODIES))
@example(b"garbage\r\n\r\n")  # the BadStatusLine
@example(http_reply(sse({"choices": [], "usage": {"prompt_tokens": None}})))
@example(http_reply(sse({"choices": [], "usage": {"prompt_tokens": "abc"}})))
@example(http_reply(sse({"choices": 5})))
@example(
    http_reply(
        chunked(sse({"choices": [{"text": "a"}]}))[:30],
        ("Transfer-Encoding: chunked",),
        length=False,
    )
)
def test_any_answer_to_a_streamed_completion_is_one_or_one_line(
    hostile: ScriptedServer, raw: bytes
) -> None:
    endpoint = answer_with(hostile, "/v1/completions", Reply((raw,)))
    done = within_deadline(lambda: endpoint.complete([1, 2, 3], 2))
    if isinstance(done, Completion):
        sane(done)
    else:
        assert isinstance(done, ServerError)  # refused, or a BadResponse


@QUICK
@given(answers(WHOLE_BODIES))
def test_any_answer_to_a_whole_completion_is_one_or_one_line(
    hostile: ScriptedServer, raw: bytes
) -> None:
    endpoint = answer_with(hostile, "/v1/completions", Reply((raw,)))
    endpoint = Endpoint(endpoint.url, endpoint.model, endpoint.timeout_s, stream=False)
    done = within_deadline(lambda: endpoint.complete([1, 2, 3], 2))
    if isinstance(done, Completion):
        sane(done)
    else:
        assert isinstance(done, ServerError)


@QUICK
@given(answers(WHOLE_BODIES | STREAM_BODIES))
def test_any_answer_to_a_get_is_read_or_one_line(hostile: ScriptedServer, raw: bytes) -> None:
    """The model list (the health check, the served models) and ``/metrics``."""
    endpoint = answer_with(hostile, "/v1/models", Reply((raw,)))
    hostile.routes["/metrics"] = [Reply((raw,))]
    healthy = within_deadline(lambda: endpoint.healthy(timeout_s=DEADLINE_S))
    assert isinstance(healthy, bool)
    models = within_deadline(lambda: endpoint.served_models(timeout_s=DEADLINE_S))
    if not isinstance(models, LLMEnergyError):
        assert all(isinstance(m, str) for m in models)
    running = within_deadline(lambda: endpoint.running_requests(timeout_s=DEADLINE_S))
    assert running is None or running >= 0
    engine = within_deadline(lambda: endpoint.engine_time(timeout_s=DEADLINE_S))
    assert engine is None or isinstance(engine, EngineTime)


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 " + b"x" * 70_000 + b"\r\n\r\n",  # a status line past http.client's limit
        OK + b"X-A: b\r\n" * 101 + b"\r\n",  # more headers than it takes
        OK + b"X-Long: " + b"y" * 70_000 + b"\r\n\r\n",
        OK + b"\r\n" + b"data: " + b"z" * (MAX_LINE_BYTES + 10) + b"\n",  # one endless line
        OK + b"\r\n" + (b"data: {}\n\n" * (MAX_BODY_BYTES // 8)),  # a body too large
    ],
    ids=["status line", "101 headers", "long header", "long line", "large body"],
)
def test_answers_past_every_bound_are_one_line(hostile: ScriptedServer, raw: bytes) -> None:
    endpoint = answer_with(hostile, "/v1/completions", Reply((raw,)))
    hostile.routes["/v1/models"] = [Reply((raw,))]
    for call in (
        lambda: endpoint.complete([1], 1),
        lambda: Endpoint(endpoint.url, "fake-model", DEADLINE_S, stream=False).complete([1], 1),
        lambda: endpoint.get_json("/v1/models"),
    ):
        assert isinstance(within_deadline(call, 2 * DEADLINE_S), BadResponse)


@SLOW
@given(
    raw=answers(STREAM_BODIES),
    piece=st.integers(1, 40),
    pause_s=st.floats(0.05, 0.4),
    hold=st.booleans(),
)
def test_a_server_that_trickles_or_stalls_is_cut_off_at_the_deadline(
    hostile: ScriptedServer, raw: bytes, piece: int, pause_s: float, hold: bool
) -> None:
    """Bytes a few at a time, a pause before each, then perhaps silence with the
    connection open: every request ends by its deadline (a socket's own timeout is per
    read, and would wait on for as long as the server keeps sending)."""
    parts = tuple(raw[i : i + piece] for i in range(0, len(raw), piece))
    reply = Reply(parts, pause_s=pause_s, hold=hold)
    endpoint = answer_with(hostile, "/v1/completions", reply)
    endpoint = Endpoint(endpoint.url, "fake-model", timeout_s=0.5)
    hostile.routes["/v1/models"] = [reply]
    within_deadline(lambda: endpoint.complete([1, 2], 1), 0.5)
    within_deadline(lambda: endpoint.healthy(timeout_s=0.5), 0.5)
    within_deadline(lambda: endpoint.running_requests(timeout_s=0.5), 0.5)


# -- as a target: exit 4 at the start, a rejected trial mid-run ---------------------------------
@FEW
@given(answers(STREAM_BODIES | WHOLE_BODIES))
def test_a_first_request_answered_anyhow_is_one_line_for_the_session(
    hostile: ScriptedServer, raw: bytes
) -> None:
    """The probe (the session's first request): what fails is an LLMEnergyError, which
    the session turns into its one ``--llm-endpoint`` line and exit 4."""
    endpoint = answer_with(hostile, "/v1/completions", Reply((raw,)))
    hostile.routes["/v1/models"] = [models_reply()]
    within_deadline(lambda: ServerTarget(endpoint, Prompts()).probe(8), 2 * DEADLINE_S)


@FEW
@given(answers(STREAM_BODIES | WHOLE_BODIES), st.integers(1, 2))
def test_a_request_answered_anyhow_mid_run_rejects_the_trial(
    hostile: ScriptedServer, raw: bytes, concurrency: int
) -> None:
    """After a good first request, whatever the server answers is a burst or a rejected
    trial (``TrialRejected``: kept, left out, repeated), never another error."""
    endpoint = answer_with(hostile, "/v1/completions", good_completion(8, 1), Reply((raw,)))
    hostile.routes["/v1/models"] = [models_reply()]
    target = ServerTarget(endpoint, Prompts())
    target.probe(8)
    ran = within_deadline(lambda: target.run(8, 2, concurrency), 2 * DEADLINE_S)
    assert isinstance(ran, Burst | TrialRejected), ran


# -- whole sessions: the servers -----------------------------------------------------
def streamed(*events: Any, length: bool = True) -> Reply:
    return Reply(
        (http_reply(sse(*events), headers=("Content-Type: text/event-stream",), length=length),)
    )


ESCAPES = "\x1b[2J\x1b]0;pwn\x07AAA"
CUT_STREAM = http_reply(
    chunked(sse({"choices": [{"text": " a"}]}, {"choices": [], "usage": {"prompt_tokens": 8}})),
    headers=("Content-Type: text/event-stream", "Transfer-Encoding: chunked"),
    length=False,
)


def session(project: pytest.Pytester, server: ScriptedServer, *args: str) -> pytest.RunResult:
    """The suite's one case against ``server``, in this process (pytest's own exit code;
    the tokenizer's libraries are imported at the top of this file: pytester's run would
    unload any it loaded, and numpy cannot be loaded twice in one process)."""
    return project.runpytest(
        f"--llm-endpoint={server.url}",
        "--llm-model=tiny-llama",
        "--llm-input-tokens=8",
        "--llm-output-tokens=4",
        "--energy-backend=estimate",
        "-p",
        "no:randomly",
        *args,
    )


@pytest.mark.parametrize(
    ("routes", "needles"),
    [
        (
            {"/v1/completions": Reply((b"garbage line\r\n\r\n",))},
            ["not an HTTP answer (its first line: 'garbage line\\r\\n')"],
        ),
        (
            {"/v1/completions": streamed({"choices": [], "usage": {"prompt_tokens": None}})},
            ["usage.prompt_tokens is null, not a count of tokens"],
        ),
        (
            {"/v1/completions": streamed({"choices": [], "usage": {"prompt_tokens": "abc"}})},
            ["usage.prompt_tokens is 'abc', not a count of tokens"],
        ),
        ({"/v1/completions": streamed({"choices": 5})}, ["choices are 5, not a list"]),
        ({"/v1/completions": Reply((CUT_STREAM[:-20],))}, ["stopped short"]),
        (
            {"/v1/completions": Reply((http_reply(ESCAPES.encode(), "500 Oops"),))},
            ["HTTP 500: \\x1b[2J\\x1b]0;pwn\\x07AAA"],
        ),
        (
            {"/v1/completions": streamed({"error": {"message": ESCAPES}})},
            ["error mid-stream: \\x1b[2J\\x1b]0;pwn\\x07AAA"],
        ),
        (
            {"/v1/models": [models_reply(), Reply((http_reply(b"<html>not json"),))]},
            ["GET /v1/models: the answer is not JSON: '<html>not json'"],
        ),
        (
            {"/v1/models": models_reply(ESCAPES, "m2")},
            ["serves 2 models (\\x1b[2J\\x1b]0;pwn\\x07AAA, m2)"],
        ),
    ],
    ids=[
        "bad status line",
        "null count",
        "text count",
        "choices 5",
        "stream cut mid-chunk",
        "escapes in an error body",
        "escapes in a mid-stream error",
        "models turn to non-json",
        "escapes in two model ids",
    ],
)
def test_a_hostile_server_stops_the_start_in_one_escaped_line(
    served: pytest.Pytester,  # noqa: F811 - the fixture
    routes: dict[str, Any],
    needles: list[str],
) -> None:
    with ScriptedServer(routes) as server:
        result = session(served, server)
    assert_one_line_usage_error(result, "--llm-endpoint: ", *needles)
    assert "\x1b" not in result.stderr.str() + result.stdout.str()


def test_a_trickling_model_list_fails_the_health_check_at_its_deadline(
    served: pytest.Pytester,  # noqa: F811 - the fixture
) -> None:
    """One byte a second: each read is quick, the whole answer never comes in 5 s."""
    raw = models_reply().parts[0]
    trickle = Reply(tuple(raw[i : i + 1] for i in range(len(raw))), pause_s=1.0)
    with ScriptedServer({"/v1/models": trickle}) as server:
        start = time.monotonic()
        result = session(served, server)
        took = time.monotonic() - start
    assert_one_line_usage_error(result, "--llm-endpoint: ", "no OpenAI-compatible server answers")
    assert took < 15, f"took {took:.0f} s"  # the 5 s health check, and the session's start


def test_a_metrics_page_without_http_leaves_the_session_running(
    served: pytest.Pytester,  # noqa: F811 - the fixture
) -> None:
    """``/metrics`` is optional: one that answers no HTTP is one the server lacks."""
    with ScriptedServer({"/v1/completions": echo, "/metrics": Reply((b"SSH-2.0\r\n",))}) as server:
        result = session(served, server, "--energy-max-trials=3", "--energy-json=run.json")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1)
    record = json.loads((served.path / "run.json").read_text())["options"]["serve_endpoint"]
    assert record["batch_gauge"] is False and record["engine_timed"] is False


def test_a_server_that_misbehaves_mid_run_costs_a_trial_not_the_session(
    served: pytest.Pytester,  # noqa: F811 - the fixture
) -> None:
    """The second measured request is answered with no HTTP: that trial is rejected with
    its reason (kept in the run, repeated), the case still measured."""
    count = [0]

    def second_fails(request: dict[str, Any]) -> Reply:
        count[0] += 1
        return Reply((b"\x1b[2Jgarbage\r\n",)) if count[0] == 3 else echo(request)

    with ScriptedServer({"/v1/completions": second_fails}) as server:
        result = session(
            served, server, "--energy-max-trials=4", "--energy-warmup=0", "--energy-json=run.json"
        )
    result.assert_outcomes(passed=1)
    (case,) = json.loads((served.path / "run.json").read_text())["cases"]
    rejected = [t["rejected"] for t in case["disturbed_trials"] if t.get("rejected")]
    assert len(rejected) == 1 and "not an HTTP answer" in rejected[0]
    assert "\\x1b[2Jgarbage" in rejected[0] and "\x1b" not in result.stdout.str()


def test_an_engine_log_with_escape_codes_is_shown_escaped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An engine started here fails with its log's lines in the message; an engine's
    coloured log holds escape codes, which reached the terminal as they were."""
    code = f"print({ESCAPES!r} + ' boom', flush=True); raise SystemExit(3)"
    spec = EngineSpec(
        "fake", lambda python, model, port: [python, "-c", code], distributions=("pytest",)
    )
    monkeypatch.setitem(engine_module.ENGINES, "fake", spec)
    with pytest.raises(EngineFailed) as info:
        start_engine("fake", "m", python=sys.executable, timeout_s=30, log_dir=str(tmp_path))
    one_line(str(info.value))
    assert "\\x1b[2J\\x1b]0;pwn\\x07AAA boom" in str(info.value)
