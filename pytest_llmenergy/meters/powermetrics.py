"""Apple silicon power through macOS ``powermetrics``, as the research measured its M1 Pro.

``powermetrics`` runs as a root subprocess for as long as any window is open and prints
one sample per interval: the *mean* power of the CPU, GPU and SoC over the elapsed
interval, and every task's "energy impact".  A reader thread turns each sample into a
:class:`PowerSample` with ``span_s`` = the sample's elapsed time, stamped on arrival,
and windows integrate those interval averages exactly at their edges.

Domains:

* ``cpu:process`` - CPU power x this process's share (with its children) of the
  energy impact of all tasks: the research's attribution of CPU energy to a process;
* ``gpu:0`` - the whole GPU's power (macOS gives no per-process GPU power);
* ``cpu:all`` and ``cpu:package`` - all of the CPU, and the SoC's combined
  CPU + GPU + ANE power: reported for reference, never counted in totals (they
  contain the counted domains).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import plistlib
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from ..errors import MeterError, MeterUnavailable
from .base import Meter
from .meter_settings import MeterSettings
from .readings import PROCESS_DOMAIN, Domain, Method, PowerSample, Reading
from .sampling import SampleBuffer, integrate_intervals

backend = "powermetrics"

DEFAULT_INTERVAL_S = 0.2
SAMPLERS = ("cpu_power", "gpu_power", "tasks")
START_TIMEOUT_S = 15.0  # sudo + powermetrics start-up, then the first sample
END_WAIT_INTERVALS = 3  # a window's end waits this many intervals (+ 1 s) for its sample
MAX_FRAME_BYTES = 64 * 1024 * 1024  # one sample is ~50-500 kB; more means a broken stream
STDERR_TAIL_BYTES = 8192

CPU_PROCESS = PROCESS_DOMAIN
GPU = "gpu:0"
CPU_ALL = "cpu:all"
PACKAGE = "cpu:package"

DOMAINS: dict[str, Domain] = {
    CPU_PROCESS: Domain(CPU_PROCESS, Method.SAMPLED),
    GPU: Domain(GPU, Method.SAMPLED),
    CPU_ALL: Domain(CPU_ALL, Method.SAMPLED, counted=False),
    PACKAGE: Domain(PACKAGE, Method.SAMPLED, counted=False),
}


# -- parsing -------------------------------------------------------------------------


class PlistStreamDecoder:
    """Cuts powermetrics' ``-f plist`` stream into one XML document per sample.

    The documents are NUL-separated; depending on the macOS version the NUL follows
    or precedes each document.  A document is therefore complete at its closing
    ``</plist>`` tag, so each sample is used the moment it is printed instead of
    one interval later, when the next NUL would arrive.
    """

    _END = b"</plist>"
    _SEPARATORS = b"\0 \t\r\n"

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max_frame_bytes = max_frame_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add bytes read from the pipe; return the documents they complete."""
        self._buf += chunk
        frames: list[bytes] = []
        while True:
            start = 0
            while start < len(self._buf) and self._buf[start] in self._SEPARATORS:
                start += 1
            if start:
                del self._buf[:start]
            end = self._buf.find(self._END)
            nul = self._buf.find(b"\0")
            if nul != -1 and (end == -1 or nul < end):
                # A NUL before any end tag: whatever precedes it is a frame (or garbage).
                cut, skip = nul, nul + 1
            elif end != -1:
                cut = skip = end + len(self._END)
            else:
                if len(self._buf) > self._max_frame_bytes:
                    raise MeterError(
                        f"powermetrics printed over {self._max_frame_bytes} bytes without "
                        "ending a plist document; is it running with -f plist?"
                    )
                return frames
            frame = bytes(self._buf[:cut]).strip()
            del self._buf[:skip]
            if frame:
                frames.append(frame)


@dataclass(frozen=True)
class ParsedSample:
    """What the meter uses of one powermetrics sample (watts, seconds, energy impact)."""

    elapsed_s: float
    cpu_w: float
    gpu_w: float
    package_w: float
    energy_impact: Mapping[int, float]  # pid -> energy impact over the sample

    def process_share(self, pids: Collection[int]) -> float:
        """Fraction of all tasks' energy impact that ``pids`` account for."""
        total = sum(self.energy_impact.values())
        if total <= 0:
            return 0.0
        ours = sum(ei for pid, ei in self.energy_impact.items() if pid in pids)
        return ours / total

    def power_w(self, pids: Collection[int]) -> dict[str, float]:
        """Power per domain; ``cpu:process`` attributes CPU power by energy-impact share."""
        return {
            CPU_PROCESS: self.cpu_w * self.process_share(pids),
            GPU: self.gpu_w,
            CPU_ALL: self.cpu_w,
            PACKAGE: self.package_w,
        }


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is {value!r}, not a number")
    return float(value)


def _subsystem_power_w(
    sections: Sequence[Mapping[str, Any]], name: str, elapsed_s: float
) -> float | None:
    """``<name>_power`` (mW) or, failing that, ``<name>_energy`` (mJ) over the interval.

    Some macOS versions print a zero power next to a non-zero energy, so the energy
    wins then.
    """
    for section in sections:
        power = section.get(f"{name}_power")
        energy = section.get(f"{name}_energy")
        if power is not None:
            power_w = _number(power, f"{name}_power") / 1000.0
            if power_w == 0 and energy is not None and _number(energy, f"{name}_energy") > 0:
                return _number(energy, f"{name}_energy") / 1000.0 / elapsed_s
            return power_w
        if energy is not None:
            return _number(energy, f"{name}_energy") / 1000.0 / elapsed_s
    return None


def parse_sample(doc: Mapping[str, Any]) -> ParsedSample:
    """Read one decoded powermetrics plist; ValueError says what is missing."""
    if not isinstance(doc, Mapping):
        raise ValueError("a powermetrics sample must be a plist dictionary")
    elapsed_s = _number(doc.get("elapsed_ns"), "elapsed_ns") / 1e9
    if not elapsed_s > 0:
        raise ValueError(f"elapsed_ns must be positive, got {doc.get('elapsed_ns')!r}")
    processor = doc.get("processor")
    if not isinstance(processor, Mapping):
        raise ValueError("the sample has no 'processor' section (sampler cpu_power missing?)")
    gpu_section = doc.get("gpu")
    gpu_sections = [processor, gpu_section] if isinstance(gpu_section, Mapping) else [processor]
    cpu_w = _subsystem_power_w([processor], "cpu", elapsed_s)
    if cpu_w is None:
        raise ValueError(
            "the sample has no CPU power (processor/cpu_power); powermetrics prints it "
            "on Apple silicon only"
        )
    gpu_w = _subsystem_power_w(gpu_sections, "gpu", elapsed_s)
    if gpu_w is None:
        raise ValueError("the sample has no GPU power (sampler gpu_power missing?)")
    combined = processor.get("combined_power")
    if combined is not None:
        package_w = _number(combined, "combined_power") / 1000.0
    else:
        package_w = cpu_w + gpu_w + (_subsystem_power_w([processor], "ane", elapsed_s) or 0.0)
    return ParsedSample(
        elapsed_s=elapsed_s,
        cpu_w=cpu_w,
        gpu_w=gpu_w,
        package_w=package_w,
        energy_impact=_energy_impact_by_pid(doc.get("tasks")),
    )


def _energy_impact_by_pid(tasks: Any) -> dict[int, float]:
    if not isinstance(tasks, list):
        raise ValueError("the sample has no 'tasks' list (sampler tasks missing?)")
    out: dict[int, float] = {}
    seen_energy = False
    for task in tasks:
        if not isinstance(task, Mapping) or task.get("name") == "ALL_TASKS":
            continue  # a summary row, if a version prints one, would count everything twice
        pid = task.get("pid")
        # The total over the sample is what a share needs; the rate is the fallback.
        ei = task.get("energy_impact", task.get("energy_impact_per_s"))
        if not isinstance(pid, int) or ei is None:
            continue
        seen_energy = True
        out[pid] = out.get(pid, 0.0) + max(_number(ei, "energy_impact"), 0.0)
    if tasks and not seen_energy:
        raise ValueError("the tasks carry no energy_impact (--show-process-energy missing?)")
    return out


def decode_sample(frame: bytes) -> ParsedSample:
    """Parse one document from the stream (plistlib: data only, entities refused)."""
    try:
        doc = plistlib.loads(frame, fmt=plistlib.FMT_XML)
    except Exception as exc:  # plistlib raises several types for malformed input
        raise ValueError(f"not a valid plist ({exc})") from exc
    return parse_sample(doc)


# -- the command ---------------------------------------------------------------------


def default_command(
    platform: str | None = None,
    which: Callable[[str], str | None] = shutil.which,
    euid: int | None = None,
) -> list[str]:
    """argv prefix that runs the real powermetrics as root without ever prompting.

    Parameters exist so that tests can pretend to be another machine.
    """
    platform = sys.platform if platform is None else platform
    if platform != "darwin":
        raise MeterUnavailable(
            backend,
            f"powermetrics exists only on macOS (this is {platform}); "
            "use nvml, rapl or estimate here",
        )
    path = which("powermetrics") or (
        "/usr/bin/powermetrics" if os.path.exists("/usr/bin/powermetrics") else None
    )
    if path is None:
        raise MeterUnavailable(backend, "the powermetrics binary was not found on PATH")
    if (os.geteuid() if euid is None else euid) == 0:
        return [path]
    sudo = which("sudo")
    if sudo is None:
        raise MeterUnavailable(backend, "powermetrics needs root and sudo was not found")
    return [sudo, "-n", path]  # -n: fail instead of prompting for a password


def powermetrics_args(interval_s: float) -> list[str]:
    """Options for plist samples of CPU/GPU power and per-task energy impact."""
    interval_ms = max(1, round(interval_s * 1000))
    return [
        "-i",
        str(interval_ms),
        "-f",
        "plist",
        "-s",
        ",".join(SAMPLERS),
        "--show-process-energy",
        "-b",
        "0",  # unbuffered: a sample must not wait in a pipe buffer for the next one
    ]


def _permission_hint(powermetrics_path: str) -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "YOUR_USER"
    return (
        "powermetrics must run as root and sudo would ask for a password. Allow it "
        "without one: run `sudo visudo -f /etc/sudoers.d/powermetrics` and add the line "
        f"`{user} ALL=(root) NOPASSWD: {powermetrics_path}`, or run the tests as root"
    )


def _startup_failure(command: Sequence[str], status: int | None, stderr: str) -> MeterUnavailable:
    """Turn powermetrics (or sudo) failing before its first sample into a fix-it message."""
    text = stderr.strip()
    lowered = text.lower()
    refused = (
        "password is required" in lowered
        or lowered.startswith("sudo:")
        or "superuser" in lowered
        or "must be run as root" in lowered
    )
    if refused:
        path = next(
            (arg for arg in command if arg.endswith("powermetrics")), "/usr/bin/powermetrics"
        )
        return MeterUnavailable(backend, f"{_permission_hint(path)} ({text})")
    detail = text or "it printed nothing on stderr"
    return MeterUnavailable(
        backend, f"powermetrics exited with status {status} before its first sample: {detail}"
    )


def _signal(send: Callable[[], None]) -> None:
    """Send a signal to the subprocess, tolerating a sudo that runs as root."""
    with contextlib.suppress(PermissionError):
        send()


# -- the meter -----------------------------------------------------------------------


class PowermetricsMeter(Meter):
    """Runs powermetrics while any window is open and integrates its interval averages."""

    backend = backend

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        command: Sequence[str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        """``command`` is the argv prefix (tests run a replay script); None: the real one."""
        super().__init__()
        if not interval_s > 0:
            raise ValueError(f"sample interval must be > 0 s, got {interval_s}")
        self.interval_s = interval_s
        self._resolution_s = interval_s  # one mean power per interval: nothing finer
        self.command = list(command) if command is not None else default_command()
        self.start_timeout_s = start_timeout_s
        self._cond = threading.Condition()
        self._buffer = SampleBuffer()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._failure: str | None = None
        self._exited = False
        self._stderr_tail = b""

    @property
    def argv(self) -> list[str]:
        return [*self.command, *powermetrics_args(self.interval_s)]

    @property
    def domains(self) -> Mapping[str, Domain]:
        return DOMAINS

    def describe(self) -> str:
        return (
            f"{self.backend} every {self.interval_s * 1000:.0f} ms: "
            f"{CPU_PROCESS} (sampled; CPU power x this process's energy-impact share), "
            f"{GPU} (sampled, whole GPU); {CPU_ALL} and {PACKAGE} (CPU+GPU+ANE) not counted"
        )

    def probe(self) -> None:
        """Take one sample now so that a missing sudo rule fails at open, not mid-test."""
        argv = [*self.argv, "-n", "1"]
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.start_timeout_s + self.interval_s,
                check=False,
            )
        except FileNotFoundError as exc:
            raise MeterUnavailable(backend, f"cannot run {argv[0]!r}: {exc}") from exc
        except (subprocess.TimeoutExpired, PermissionError) as exc:
            raise MeterUnavailable(
                backend, f"powermetrics printed no sample within {self.start_timeout_s:.0f} s"
            ) from exc
        stderr = done.stderr.decode(errors="replace")
        frames = PlistStreamDecoder().feed(done.stdout)
        if done.returncode != 0 or not frames:
            raise _startup_failure(self.command, done.returncode, stderr)
        try:
            decode_sample(frames[0])
        except ValueError as exc:
            raise MeterUnavailable(backend, f"cannot read powermetrics' output: {exc}") from exc

    # -- subprocess lifecycle --------------------------------------------------------
    def _start(self) -> None:
        self._stop_event.clear()
        self._buffer.clear()
        with self._cond:
            self._failure = None
            self._exited = False
            self._stderr_tail = b""
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
            )
        except OSError as exc:
            raise MeterUnavailable(backend, f"cannot run {self.argv[0]!r}: {exc}") from exc
        self._proc = proc
        self._reader = threading.Thread(
            target=self._read_output, args=(proc,), name="powermetrics-reader", daemon=True
        )
        self._reader.start()
        # Wait for the first sample: a window opened before it would start uncovered.
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._buffer.last_t() is not None or self._exited or self._failure is not None
                ),
                timeout=self.start_timeout_s,
            )
            got_sample = self._buffer.last_t() is not None
            failure = self._failure
        if got_sample and failure is None:
            return
        status = proc.poll()
        self._stop()
        if failure is not None and (got_sample or status is None):
            raise MeterError(failure)
        if status is not None:
            raise _startup_failure(self.command, status, self._stderr_text())
        raise MeterError(f"powermetrics printed no sample within {self.start_timeout_s:.0f} s")

    def _stop(self) -> None:
        """Stop powermetrics and forget the samples.

        sudo relays SIGTERM to powermetrics, but a root-owned sudo may refuse a
        signal from this user; closing the pipe ends powermetrics anyway, by SIGPIPE at
        its next sample.
        """
        proc, self._proc = self._proc, None
        self._stop_event.set()
        if self._reader is not None:
            self._reader.join(timeout=2.0)  # it polls the stop event every 0.1 s
            self._reader = None
        if proc is not None:
            _signal(proc.terminate)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            try:
                proc.wait(timeout=3.0 + 2 * self.interval_s)
            except subprocess.TimeoutExpired:
                _signal(proc.kill)
                # If even that fails, nothing more a non-root process can do; SIGPIPE will.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=3.0)
        self._buffer.clear()

    def close(self) -> None:
        if self._proc is not None:
            self._stop()

    def _read_output(self, proc: subprocess.Popen[bytes]) -> None:
        """Reader thread: stdout samples into the buffer, stderr into a tail for messages."""
        assert proc.stdout is not None and proc.stderr is not None
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        open_fds = [out_fd, err_fd]
        decoder = PlistStreamDecoder()
        failure: str | None = None
        try:
            while open_fds and not self._stop_event.is_set():
                ready, _, _ = select.select(open_fds, [], [], 0.1)
                for fd in ready:
                    chunk = os.read(fd, 1 << 16)
                    arrival_t = time.perf_counter()
                    if not chunk:
                        open_fds.remove(fd)
                    elif fd == err_fd:
                        self._stderr_tail = (self._stderr_tail + chunk)[-STDERR_TAIL_BYTES:]
                    else:
                        frames = decoder.feed(chunk)
                        if frames:
                            self.ingest(frames, arrival_t, self._own_pids(proc.pid))
        except Exception as exc:  # the window's close reports it; the thread must not die mute
            failure = f"cannot read powermetrics' output: {exc}"
        if failure is None and not self._stop_event.is_set():
            try:
                status: int | None = proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                status = None
            detail = self._stderr_text() or "nothing on stderr"
            failure = f"powermetrics stopped while measuring (exit status {status}): {detail}"
        with self._cond:
            if not self._stop_event.is_set():
                self._failure = failure
            self._exited = True
            self._cond.notify_all()

    def _stderr_text(self) -> str:
        return self._stderr_tail.decode(errors="replace").strip()

    def _own_pids(self, powermetrics_pid: int | None) -> frozenset[int]:
        """This process and its children, minus powermetrics (and sudo) themselves."""
        me = psutil.Process()
        try:
            children = {p.pid for p in me.children(recursive=True)}
        except psutil.Error:
            children = set()
        if powermetrics_pid is not None:
            children.discard(powermetrics_pid)
            try:
                tree = psutil.Process(powermetrics_pid).children(recursive=True)
                children -= {p.pid for p in tree}
            except psutil.Error:
                pass
        return frozenset({me.pid, *children})

    def ingest(self, frames: Sequence[bytes], arrival_t: float, pids: Collection[int]) -> None:
        """Add complete samples that arrived at ``arrival_t`` (perf_counter seconds).

        When several arrive at once (a delayed pipe), each earlier one ended where the
        next began, so they are stamped backwards from the arrival time.
        """
        parsed = [decode_sample(frame) for frame in frames]
        new: list[PowerSample] = []
        end_t = arrival_t
        for sample in reversed(parsed):
            new.append(PowerSample(t=end_t, power_w=sample.power_w(pids), span_s=sample.elapsed_s))
            end_t -= sample.elapsed_s
        for s in reversed(new):
            self._buffer.add(s)
        with self._cond:
            self._cond.notify_all()

    # -- readings --------------------------------------------------------------------
    def _check(self) -> None:
        if self._failure is not None:
            raise MeterError(self._failure)

    def _read(self) -> Reading:
        self._check()
        return Reading(t=time.perf_counter())

    def _wait_for_sample_after(self, t: float) -> None:
        """Block until a sample ending at or after ``t`` arrived (it covers ``t``)."""
        timeout_s = END_WAIT_INTERVALS * self.interval_s + 1.0
        deadline = t + timeout_s
        with self._cond:
            while (last_t := self._buffer.last_t()) is None or last_t < t:
                if self._failure is not None:
                    raise MeterError(self._failure)
                if self._exited:
                    raise MeterError(f"powermetrics stopped before {t:.3f}: no sample covers it")
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    raise MeterError(
                        f"powermetrics printed no sample within {timeout_s:.1f} s after the "
                        f"window closed (interval {self.interval_s * 1000:.0f} ms); "
                        "it may be stalled or overloaded"
                    )
                self._cond.wait(remaining)

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        self._wait_for_sample_after(b.t)
        return integrate_intervals(self._buffer.covering(a.t, b.t), a.t, b.t, list(DOMAINS))

    def _samples(self, t0: float, t1: float) -> tuple[PowerSample, ...]:
        return self._buffer.covering(t0, t1)


def create(options: MeterSettings) -> PowermetricsMeter:
    """Open the real powermetrics; MeterUnavailable says why it can't run here."""
    meter = PowermetricsMeter(options.interval_s(DEFAULT_INTERVAL_S))
    meter.probe()
    return meter
