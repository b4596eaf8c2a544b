"""Serving: a server as the suite's target (``--llm-endpoint``), or an engine started
for the session (``--llm-serve``) and stopped at its end, whatever happens.

Which energy is the server's: GPU meters measure the devices, whoever uses them; CPU
meters charge this process tree, and an engine started here is part of it (a child).
A running server's process tree is added to it (``--llm-server-pid``, or the process
listening on the URL's port when that is on this machine) before the meter opens, and
the header says what is attributed to what.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from .. import values
from ..errors import ConfigError, LLMEnergyError, one_line
from ..serving.engine import ENGINES
from ..serving.serve_settings import ServeSettings, engine_choice, parse_args
from ..serving.steady import DEFAULT_MIN_BATCH_FILL, DEFAULT_MIN_STEADY_S
from ..serving.workload_plan import EXAMPLE, WorkloadSpec, parse_workload
from .models import LLMSettings
from .option_rows import Option, Section

if TYPE_CHECKING:
    from ..controller.benchmark import EnergyBenchmark
    from ..meters import MeterSettings
    from ..pairing.marginal import MarginalEnergy
    from ..serving.engine import RunningEngine
    from ..serving.replay import WorkloadRun
    from ..serving.target import ServerTarget
    from ..serving.workload_plan import WorkloadPlan
    from .meter import MeasureSettings


def check_settings(serve: ServeSettings, llm: LLMSettings, measure: MeasureSettings) -> None:
    """Combinations that cannot work stop the session at start, in one line."""
    grid = llm.grid
    if grid.concurrency != (1,) and not serve.active:
        raise pytest.UsageError(
            "--llm-concurrency: concurrent requests need a server: add --llm-endpoint=URL "
            "or --llm-serve=vllm (a local model takes batches: --llm-batch-sizes)"
        )
    if serve.active and grid.batch_sizes != (1,):
        raise pytest.UsageError(
            "--llm-batch-sizes: a server batches requests itself; send them at once with "
            "--llm-concurrency instead"
        )
    if serve.active and measure.profile_ops:
        raise pytest.UsageError(
            "--energy-profile-ops: the model runs in the server, so torch.profiler would "
            "trace this client; profile a local model (without --llm-endpoint/--llm-serve)"
        )
    if serve.active and len(grid.models) != 1:
        raise pytest.UsageError(
            f"--llm-endpoint/--llm-serve measure one model, the grid has {len(grid.models)} "
            f"({', '.join(grid.models)}): give one --llm-model (for vLLM's CPU build a "
            "built-in model with heads of 32 dimensions: --llm-model=tiny-llama-h32)"
        )


def attribute_server(serve: ServeSettings, meter: MeterSettings) -> MeterSettings:
    """Add a running server's process tree to what the CPU meters charge."""
    if not serve.endpoint:
        return meter
    pid = serve.server_pid
    if pid is None:
        from ..serving.client import Endpoint
        from ..serving.engine import find_server_pid

        endpoint = Endpoint(serve.endpoint)
        if endpoint.host in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
            pid = find_server_pid(endpoint.port)
    if pid is None:
        return meter
    return dataclasses.replace(meter, attributed_pids=(pid,))


class Serving:
    """Owns the server: the engine's process (when started here), the endpoint, the
    target the benchmark cases send their bursts to, and its lines in the header."""

    def __init__(
        self,
        config: pytest.Config,
        settings: ServeSettings,
        llm: LLMSettings,
        record: dict[str, Any],
        attributed_pids: tuple[int, ...] = (),
    ) -> None:
        self.config = config
        self.settings = settings
        self.llm = llm
        self.record = record  # the run file's options: the engine's version and flags go in
        self.attributed_pids = attributed_pids
        self.engine: RunningEngine | None = None
        self.target: ServerTarget | None = None
        self._model = ""
        self.session: pytest.Session | None = None
        # one more request's marginal joules, as tests asked for (llm_workload.marginal)
        self.marginals: list[MarginalEnergy] = []

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session
        if not self.settings.active or self.config.option.collectonly:
            return
        try:
            self._start()
        except LLMEnergyError as exc:
            self.stop()
            flag = "--llm-serve" if self.settings.engine else "--llm-endpoint"
            raise pytest.UsageError(f"{flag}: {exc}") from None

    def _start(self) -> None:
        from ..llm.grid import split_model
        from ..llm.loader import load_prompts, model_source
        from ..llm.tiny import is_tiny
        from ..serving.client import Endpoint
        from ..serving.engine import default_python, start_engine
        from ..serving.target import ServerTarget

        _, source = split_model(self.llm.grid.models[0])
        self._model = source
        s = self.settings
        if s.endpoint and not Endpoint(s.endpoint).healthy(timeout_s=5.0):
            raise ConfigError(
                f"no OpenAI-compatible server answers at {s.endpoint} (GET /v1/models); "
                "start it first, or let the session start one with --llm-serve=vllm"
            )
        prompts = load_prompts(source, trust_remote_code=self.llm.trust_remote_code)
        if s.engine:
            folder = model_source(source)
            self.engine = start_engine(
                s.engine,
                folder,
                python=s.python or default_python(),
                extra_args=s.args,
                timeout_s=s.timeout_s,
                converter=s.converter,
                builtin=is_tiny(source),
            )
            endpoint = Endpoint(self.engine.url, s.served_model or self.engine.model or folder)
            self.record["serve_engine"] = self.engine.record()
        else:
            assert s.endpoint is not None
            endpoint = Endpoint(s.endpoint, s.served_model or "")
            if not endpoint.model:
                served = endpoint.served_models()
                if len(served) != 1:
                    # the server's ids, escaped: text from it never reaches the terminal raw
                    shown = ", ".join(one_line(m, 80) for m in served[:10])
                    more = f", and {len(served) - 10} more" if len(served) > 10 else ""
                    raise ConfigError(
                        f"the server serves {len(served)} models ({shown}{more}): name "
                        "one with --llm-served-model"
                    )
                endpoint = dataclasses.replace(endpoint, model=served[0])
            self.record["serve_endpoint"] = {"url": s.endpoint, "model": endpoint.model}
        engine = self.engine
        self.target = ServerTarget(
            endpoint,
            prompts,
            prompts.tokenizer,
            gone=engine.exited if engine else None,
            min_steady_s=s.min_steady_s,
            requests=s.requests,
            min_batch_fill=s.min_batch_fill,
        )
        try:
            self.target.probe()
        except LLMEnergyError as exc:  # refused, failed, or counted otherwise
            log = ""
            if engine is not None:
                log = f"; {engine.log_excerpt()}"
            raise ConfigError(
                f"{endpoint.url} could not complete a first request for "
                f"{one_line(endpoint.model, 80)}: {exc}{log}"
            ) from None
        key = "serve_engine" if engine is not None else "serve_endpoint"
        self.record[key]["prompt"] = self.target.prompt_kind
        self.record[key]["streamed"] = self.target.endpoint.stream
        self.record[key]["batch_gauge"] = self.target.batch_gauge
        self.record[key]["engine_timed"] = self.target.engine_timed

    def header(self) -> list[str]:
        if self.target is None:
            return []
        endpoint = self.target.endpoint
        if self.engine is not None:
            e = self.engine
            started = f", answered after {e.started_s:.0f} s" if e.started_s else ""
            lines = [
                f"server: {e.version} started here (pid {e.pid}) at {e.url}{started}, serving "
                f"{endpoint.model}; log {e.log_path}",
                "  energy: GPU meters measure the GPUs; CPU meters charge this process tree, "
                "which holds the engine and its workers (children of this process)",
            ]
        else:
            model = one_line(endpoint.model, 80)
            lines = [f"server: {endpoint.url} serving {model} (not started here)"]
            if self.attributed_pids:
                lines.append(
                    "  energy: GPU meters measure the GPUs; CPU meters charge this process "
                    f"tree (the client) + the server's (pid "
                    f"{', '.join(map(str, self.attributed_pids))}, with its live children)"
                )
            else:
                lines.append(
                    "  energy: GPU meters measure the GPUs; CPU meters charge this process "
                    "(the client) alone: the server's process is not visible on this machine "
                    "(give --llm-server-pid=PID if it runs here)"
                )
        lines.append(
            f"  every request asks for exactly the case's tokens (prompt as "
            f"{self.target.prompt_kind}, ignore_eos, min_tokens = max_tokens), checked against "
            "each response's usage: another count rejects the trial (kept, left out, repeated)"
        )
        s = self.settings
        if any(self.target.requests_for(c) > 1 for c in self.llm.grid.concurrency):
            sent = f"{s.requests} requests a burst, " if s.requests else ""
            lines.append(
                f"  bursts ({sent}the concurrency at once) are also measured in their steady "
                "window, as ML.ENERGY measures servers: from the batch's first fill to the "
                "drain; a window shorter than "
                f"{s.min_steady_s:g} s or a mean batch under {s.min_batch_fill:.0%} of the "
                "concurrency rejects the configuration (and its group's larger ones): "
                f"shown, never gated; the batch is {self._batch_source()}"
            )
        if not self.target.endpoint.stream:
            lines.append(
                "  the server's streams carry no usage counts, so requests are not streamed: "
                "latency is measured, time to first token and per output token are not"
            )
        return lines

    def _batch_source(self) -> str:
        """What a burst's mean batch rests on, for the header (serving/steady.py)."""
        target = self.target
        assert target is not None
        if target.batch_gauge and target.engine_timed:
            return (
                "the server's own, from its engine's request timings (vLLM's inference-time "
                "totals) x the requests in flight, checked against its running-requests "
                "gauge (the notes name a gauge that strays)"
            )
        if target.batch_gauge:
            return (
                "the server's own (its running-requests gauge on /metrics), checked "
                "against the client's counts: where it strays from them, the client's "
                "count (the notes say where)"
            )
        if target.engine_timed:
            return (
                "the requests in flight x the share of their time the server's engine ran "
                "them (its inference-time totals on /metrics)"
            )
        return (
            "counted by the client (the server publishes no running-requests gauge): "
            "requests past their first token, so prefill is left out"
        )

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """An engine that died takes every later case with it: stop at the first."""
        if report.failed and self.engine is not None and self.session is not None:
            why = self.engine.exited()
            if why is not None:
                self.session.shouldstop = why

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Also after a failure or Ctrl-C: pytest unconfigures on every way out."""
        self.stop()

    # -- a served workload (the llm_workload fixture) ----------------------------------------------
    @pytest.fixture
    def llm_workload(self, energy_benchmark: EnergyBenchmark) -> ServedWorkload:
        """``llm_workload("alpaca:rate=4,requests=200")`` replays that workload against the
        server (--llm-endpoint, --llm-serve), measured as one trial, each request's joules
        kept in the run file."""
        return ServedWorkload(self, energy_benchmark)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """J per request by input length, for the cases that replayed a workload."""
        from ..export import request_tables
        from ..tables import render
        from .session_tables import CASE_RESULTS

        results = self.config.stash.get(CASE_RESULTS, None)
        tables = request_tables(results.results) if results is not None else []
        if self.marginals:
            from ..pairing.marginal import marginal_table

            tables.append(marginal_table(self.marginals))
        if not tables:
            return
        terminalreporter.section("llmenergy: each request's joules (served workload)")
        width = terminalreporter.config.get_terminal_writer().fullwidth
        for line in render(tables, "table", width=width).splitlines():
            terminalreporter.write_line(line)


class ServedWorkload:
    """The ``llm_workload`` fixture: the session's workload, replayed on call."""

    def __init__(self, serving: Serving, benchmark: EnergyBenchmark) -> None:
        self.serving, self.benchmark = serving, benchmark
        self.last: WorkloadRun | None = None

    def __call__(self, spec: str | WorkloadSpec = EXAMPLE, rounds: int = 1) -> Any:
        """Replay ``spec`` (``serving/workload_plan.py``) ``rounds`` times, a trial each."""
        from ..serving.replay import WorkloadTarget

        target, plan = self._planned(spec)
        workload = WorkloadTarget(self.benchmark.meter, target.endpoint, plan, _prompts(target))
        try:
            return self.benchmark.pedantic(workload.run, rounds=rounds, **workload.case())
        finally:
            self.last = workload.last

    def marginal(
        self,
        input_tokens: int,
        output_tokens: int,
        spec: str | WorkloadSpec = EXAMPLE,
        pairs: int = 8,
    ) -> MarginalEnergy:
        """What one more request of these lengths costs the workload's batch: ``spec``
        replayed with it, arriving halfway, and without it, in paired ABBA bursts; beside
        its attributed share.  Outside the case's trials; shown at the session's end."""
        from ..pairing.marginal import measure_marginal, served_bursts
        from ..serving.workload_plan import PlannedRequest

        target, plan = self._planned(spec)
        request = PlannedRequest(len(plan.requests), plan.span_s / 2, input_tokens, output_tokens)
        meter = self.benchmark.meter
        bursts = served_bursts(meter, target.endpoint, plan, request, _prompts(target))
        found = measure_marginal(bursts, request, pairs=pairs)
        self.serving.marginals.append(found)
        return found

    def _planned(self, spec: str | WorkloadSpec) -> tuple[ServerTarget, WorkloadPlan]:
        """The session's server and the requests ``spec`` draws; a skip without a server,
        a one-line failure for a bad spec."""
        from ..serving.workload_plan import WorkloadError, draw

        target = self.serving.target
        if target is None:
            pytest.skip("no server to replay a workload against: --llm-endpoint or --llm-serve")
        try:
            plan = draw(parse_workload(spec) if isinstance(spec, str) else spec)
        except WorkloadError as exc:
            pytest.fail(f"llm_workload: {exc}", pytrace=False)
        return target, plan


def _prompts(target: ServerTarget) -> Callable[[int, int], Any]:
    """A workload's prompts, from rows of the text apart from the bursts'."""
    return lambda n, row: target.prompt(n, WORKLOAD_ROWS + row)


# Prompts of a workload start this far into the text: apart from the bursts' rows.
WORKLOAD_ROWS = 100_000


SERVING = pytest.StashKey[Serving]()


# -- options -----------------------------------------------------------------------------
SERVE_OPTIONS = Section(
    "serve",
    "Servers and engines",
    ServeSettings,
    (
        Option(
            "--llm-endpoint",
            "endpoint",
            values.text,
            "URL",
            "measure a running OpenAI-compatible server (vLLM, llama.cpp, ...) at URL, e.g. "
            "http://127.0.0.1:8000, serving the one --llm-model (its tokenizer makes the prompts)",
        ),
        Option(
            "--llm-served-model",
            "served_model",
            values.text,
            "NAME",
            "the model's name on the server (the request's model field)",
            default_text="the one model the server lists",
        ),
        Option(
            "--llm-serve",
            "engine",
            engine_choice,
            "ENGINE",
            "start this engine for the session on a free port, serving the one --llm-model, "
            "and stop it and its children at the end: {choices}",
            choices=lambda: list(ENGINES),
        ),
        Option(
            "--llm-serve-python",
            "python",
            values.text,
            "PATH",
            "the engine's Python interpreter (engines live in their own venv), e.g. "
            "/work/venvs/vllm/bin/python",
            default_text="$LLMENERGY_SERVE_PYTHON, else this Python",
        ),
        Option(
            "--llm-serve-args",
            "args",
            parse_args,
            "FLAGS",
            "extra flags for the engine, e.g. '--max-num-seqs 16' (never run through a shell)",
        ),
        Option(
            "--llm-serve-timeout",
            "timeout_s",
            values.seconds,
            "SECONDS",
            "how long the engine may take to answer after starting",
        ),
        Option(
            "--llm-server-pid",
            "server_pid",
            values.integer(1),
            "PID",
            "the --llm-endpoint server's process: the CPU meters charge its process tree too",
            default_text="the process listening on the URL's port, when it is on this machine",
        ),
        Option(
            "--llm-requests",
            "requests",
            values.integer(1),
            "N",
            "requests a burst sends, the case's concurrency of them at once (the next as "
            "one finishes), as ML.ENERGY sends many more requests than its batch: a longer "
            "steady window",
            default_text="the concurrency (one wave)",
        ),
        Option(
            "--llm-min-steady",
            "min_steady_s",
            values.seconds,
            "SECONDS",
            "a burst is measured in its steady window too (from the batch's first fill to "
            "the drain, ML.ENERGY's window); a configuration whose window is shorter is "
            "rejected (ML.ENERGY's rule): shown, never gated",
            default_text=f"{DEFAULT_MIN_STEADY_S:g} s, ML.ENERGY's",
        ),
        Option(
            "--llm-min-batch-fill",
            "min_batch_fill",
            lambda text: values.fraction(text, "a share of the batch"),
            "SHARE",
            "a configuration whose steady window held fewer requests than this share of its "
            "concurrency, on average, is rejected (ML.ENERGY's rule), and so are the larger "
            "concurrencies of its group: shown, never gated",
            default_text=f"{DEFAULT_MIN_BATCH_FILL:.0%}, ML.ENERGY's",
        ),
        Option(
            "--llm-gguf-converter",
            "converter",
            values.text,
            "PATH",
            "llama.cpp's convert_hf_to_gguf.py (in llama-cpp-python's sdist under "
            "vendor/llama.cpp, or a llama.cpp checkout): --llm-serve=llama.cpp converts the "
            "model to GGUF with it once (cached)",
            default_text="$LLMENERGY_GGUF_CONVERTER, else one in the engine's venv",
        ),
    ),
)
