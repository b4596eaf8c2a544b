"""The processes of a paired pass: both sides started in sessions of their own, pinned to
their CPUs, served by the coordinator until both end, and stopped whatever happens.

A side that dies, fails to start or never reaches the coordinator stops the other; Ctrl-C
and SIGTERM reach both sides, which save the cases they finished.  The command
(``cli/ab_cli.py``) decides what to pass and reads the outcome; this module owns the
processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .channel import ENV, SIDES
from .coordinator import Coordinator, accept_sides, listen
from .cpus import pin

# How long a side may take from its start to its first word (importing torch, collecting).
CONNECT_TIMEOUT_S = 600.0
EXIT_SIDE_FAILED = 3
# How long sides told to stop (the machine is too busy) may take to save and exit.
ABORT_GRACE_S = 60.0
LAST_LINES = 15


@dataclass
class Side:
    name: str
    folder: Path
    python: str
    args: list[str]
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def last_output(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(f"  {line}" for line in lines[-LAST_LINES:])


class PassEnded(Exception):
    """The command ends with this exit code and one line (a side failed, Ctrl-C)."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code = code


def run_pass(
    sides: list[Side],
    coordinator: Coordinator,
    pairing_id: str,
    workdir: Path,
    cpus: frozenset[int] | None,
) -> None:
    """Start both sides, serve them until they end, stop them; raise ``PassEnded`` where
    a side failed or a signal interrupted the pass (finished cases are kept)."""
    socket_path = str(workdir / "coordinator.sock")
    server = listen(socket_path)
    interrupted: list[int] = []
    previous = _forward_signals(sides, interrupted)
    try:
        for side in sides:
            _start(side, socket_path, pairing_id, workdir, cpus)
        failure = _serve(server, coordinator, sides, pairing_id)
    finally:
        _restore_signals(previous)
        for side in sides:
            _stop(side)
        server.close()
    if interrupted:
        raise PassEnded(
            128 + interrupted[0], "interrupted: both sides stopped; finished cases kept"
        )
    if failure:
        raise PassEnded(EXIT_SIDE_FAILED, failure)


def _start(
    side: Side, socket_path: str, pairing_id: str, workdir: Path, cpus: frozenset[int] | None
) -> None:
    side.log = workdir / f"{side.name}.log"
    env = dict(os.environ)
    env[ENV] = f"{socket_path}|{side.name}|{pairing_id}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    with open(side.log, "wb") as log:
        side.process = subprocess.Popen(
            [side.python, "-m", "pytest", *side.args],
            cwd=side.folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # signals reach it from this command only
        )
    pin(side.process.pid, cpus)


def _serve(server: Any, coordinator: Coordinator, sides: list[Side], pairing_id: str) -> str:
    """Serve both sides until both exit; a side that dies or fails to start stops the
    other.  Returns why it failed ('' when both sides finished)."""
    accepted: list[threading.Thread] = []
    errors: list[BaseException] = []

    def accept() -> None:
        try:
            accepted.extend(accept_sides(server, coordinator, dict.fromkeys(SIDES, pairing_id)))
        except OSError as exc:  # the server closed: a side died first
            errors.append(exc)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    started = time.monotonic()
    busy_since = 0.0
    while True:
        time.sleep(0.2)
        codes = {s.name: s.process.poll() for s in sides if s.process is not None}
        failed = failed_sides(sides, codes, coordinator)
        if coordinator.too_busy:
            # both sides were told to stop: let them save their finished cases themselves
            busy_since = busy_since or time.monotonic()
            done = all(code is not None for code in codes.values())
            if done or time.monotonic() - busy_since > ABORT_GRACE_S:
                finished = min(len(coordinator.results[s]) for s in SIDES)
                kept = f"{finished} finished cases kept" if finished else "no case had finished"
                return f"{coordinator.too_busy}; {kept}"
            continue
        if failed:
            side = failed[0]
            code = codes.get(side.name)
            how = f"exit {code}" if code is not None else coordinator.failed.get(side.name, "")
            return (
                f"the {side.name} side failed ({how}); the other side was stopped, finished "
                f"cases kept. Its last output ({side.log}):\n{side.last_output()}"
            )
        if all(code is not None for code in codes.values()):
            return ""
        if acceptor.is_alive() and time.monotonic() - started > CONNECT_TIMEOUT_S:
            return (
                f"a side did not reach the coordinator within {CONNECT_TIMEOUT_S:g} s: does "
                "its checkout's pytest-llmenergy know llmenergy ab (0.2 or newer)?"
            )


def failed_sides(
    sides: list[Side], codes: dict[str, int | None], coordinator: Coordinator
) -> list[Side]:
    """The sides that failed, the first to leave the coordinator first: a side told to
    stop because the other had gone (it then exits with an error too, often before the
    next poll) is never named before the side that went.  A side that never reached the
    coordinator comes last, named by its exit code."""
    with coordinator.lock:
        left, went = list(coordinator.finished), set(coordinator.failed)
    failed = [
        s
        for s in sides
        if s.name in went
        or (codes.get(s.name) is not None and codes[s.name] not in (0, 1))
        or (codes.get(s.name) is not None and s.name not in left)
    ]
    return sorted(failed, key=lambda s: left.index(s.name) if s.name in left else len(left))


def _stop(side: Side) -> None:
    """End a side that still runs: SIGTERM (it keeps its finished cases), then SIGKILL."""
    process = side.process
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _forward_signals(sides: list[Side], interrupted: list[int]) -> dict[int, Any]:
    """Ctrl-C and SIGTERM reach both sides (in sessions of their own), which save what
    they finished; this command then exits 128 + the signal."""

    def forward(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        for side in sides:
            if side.process is not None and side.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(side.process.pid, signum)

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, forward)
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
