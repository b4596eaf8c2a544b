"""CPU time of a process tree, and of the machine around it.

Two counters the CPU-based meters and the busy-machine check share:

* :class:`ProcessTreeCpu` counts the CPU seconds of a process *and its descendants*,
  live or finished, so that a model run in a worker process is charged, and charged
  only for CPU time inside a window.  A live descendant counts with its own CPU time
  plus what it collected from its children; when a process is collected, its whole
  lifetime moves into its parent's "children" times at the moment the process leaves
  the list of live ones, so the sum stays continuous: a child that ran before a window
  and is collected inside it adds only its CPU time since the window opened.
* :func:`machine_busy_cpu_seconds` is the machine-wide non-idle CPU time; minus the
  tree's, it is what the rest of the machine did (see ``probes/background.py``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import psutil


def _read_proc(path: str) -> bytes:
    """A /proc file's content through the bare descriptor: this runs for every thread at
    every meter reading, several times a trial, and a Python file object costs as much
    again as the read itself."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _proc_children(pid: int) -> list[int] | None:
    """Direct children from /proc/PID/task/*/children (Linux): far cheaper than scanning
    every process; None where the kernel has no such files."""
    tasks_dir = f"/proc/{pid}/task"
    try:
        tasks = os.listdir(tasks_dir)
    except OSError:
        return None
    found: list[int] = []
    for i, tid in enumerate(tasks):
        try:
            text = _read_proc(f"{tasks_dir}/{tid}/children")
        except FileNotFoundError:
            if i == 0 and not os.path.exists(f"{tasks_dir}/{tid}"):
                continue  # the thread ended meanwhile
            if i == 0:
                return None  # CONFIG_PROC_CHILDREN is off
            continue
        except OSError:
            continue
        if text:
            found.extend(int(p) for p in text.split())
    return found


def _has_no_children() -> bool:
    """True when this process has no child at all, live or not yet collected: one
    ``waitid`` that neither waits nor reaps (``WNOHANG | WNOWAIT``) and fails with ECHILD.
    Any thread's children count (Linux since 2.4).  A meter reads its tree several
    times a trial, and a model run in-process has no children: this skips the scan of
    every thread's ``children`` file.  False where the call is missing or says anything
    else, so the full scan decides."""
    waitid = getattr(os, "waitid", None)
    flags = getattr(os, "WNOWAIT", None)
    if waitid is None or flags is None:
        return False
    try:
        waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | flags)
    except ChildProcessError:
        return True
    except OSError:
        return False
    return False


def _descendants(root: psutil.Process) -> list[int]:
    """PIDs of every live (or not yet collected) descendant of ``root``."""
    if root.pid == os.getpid() and _has_no_children():
        return []
    first = _proc_children(root.pid)
    if first is None:
        try:
            return [p.pid for p in root.children(recursive=True)]
        except psutil.Error:
            return []
    out: list[int] = []
    todo = first
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(_proc_children(pid) or ())
    return out


def _total_cpu_s(times: Any) -> float:
    """Own plus collected children's user and system time of one psutil process."""
    return float(
        times.user
        + times.system
        + getattr(times, "children_user", 0.0)
        + getattr(times, "children_system", 0.0)
    )


class ProcessTreeCpu:
    """``read()`` gives CPU seconds of a process and all its descendants, as a counter.

    ``pid=None`` is this process, whose own time comes from ``time.process_time``
    (nanoseconds; /proc has 10 ms ticks, too coarse for a 30 ms trial).  Another PID
    (a serving engine) is read through psutil.  The counter never goes back: a process
    that leaves the tree without being collected (re-parented) keeps what it used.
    """

    def __init__(
        self,
        pid: int | None = None,
        *,
        own_cpu_s: Callable[[], float] = time.process_time,
        waited_cpu_s: Callable[[], float] | None = None,
    ) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._self = pid is None or pid == os.getpid()
        self._root = psutil.Process(self.pid)
        self._own_cpu_s = own_cpu_s
        self._waited_cpu_s = waited_cpu_s or _os_children_cpu_s
        self._procs: dict[int, psutil.Process] = {}
        self._last_s = 0.0

    def _root_cpu_s(self) -> tuple[float, float]:
        """(own, collected children's) CPU seconds of the root."""
        if self._self:
            return self._own_cpu_s(), self._waited_cpu_s()
        t = self._root.cpu_times()
        return t.user + t.system, t.children_user + t.children_system

    def _live_cpu_s(self) -> float:
        total = 0.0
        pids = _descendants(self._root)
        for pid in pids:
            proc = self._procs.get(pid)
            try:
                if proc is None or not proc.is_running():  # new, or the PID was reused
                    proc = self._procs[pid] = psutil.Process(pid)
                total += _total_cpu_s(proc.cpu_times())
            except psutil.Error:  # gone meanwhile: its time is in its parent's by now
                self._procs.pop(pid, None)
        for pid in set(self._procs) - set(pids):
            del self._procs[pid]
        return total

    def read(self) -> float:
        """Root plus live descendants.  A child collected during the scan would count
        twice (live, and in the root's collected time), so the scan is repeated until
        the collected time did not change across it."""
        value = 0.0
        for _ in range(3):
            _, waited_before = self._root_cpu_s()
            live = self._live_cpu_s()
            own, waited = self._root_cpu_s()
            value = own + waited + live
            if waited == waited_before:
                break
        self._last_s = max(self._last_s, value)
        return self._last_s


class ProcessTrees:
    """Several process trees as one counter: this process's and a server's it talks to.

    A tree that is part of another (a server started by this process) would count twice,
    so such roots are dropped; a root that ends keeps what it used (its counter never
    goes back)."""

    def __init__(self, pids: tuple[int, ...] = ()) -> None:
        own = ProcessTreeCpu()
        inside = set(_descendants(own._root))
        self.pids = tuple(p for p in dict.fromkeys(pids) if p != own.pid and p not in inside)
        # this process inside a given tree (a server that started it): that tree holds it
        holders = [p for p in self.pids if _holds(p, own.pid)]
        self.trees = [] if holders else [own]
        for pid in self.pids:
            try:
                self.trees.append(ProcessTreeCpu(pid))
            except psutil.Error as exc:
                raise ValueError(f"cannot read process {pid}: {exc}") from None
        self._last = [0.0] * len(self.trees)

    def read(self) -> float:
        for i, tree in enumerate(self.trees):
            # a server that ended keeps what it used
            with contextlib.suppress(psutil.Error):
                self._last[i] = tree.read()
        return sum(self._last)


def _holds(root: int, pid: int) -> bool:
    try:
        return pid in _descendants(psutil.Process(root))
    except psutil.Error:
        return False


def attributed_note(pids: tuple[int, ...]) -> str:
    """The header's words for what the CPU meter charges, beyond this process tree."""
    roots = ", ".join(str(p) for p in pids)
    return (
        f"CPU time attributed: this process tree (the client) + the server's process "
        f"tree (pid {roots}, with its live children)"
    )


def cpu_reader(pids: tuple[int, ...] = ()) -> Callable[[], float]:
    """The CPU-seconds counter of this process tree, plus those of ``pids``."""
    return ProcessTrees(pids).read if pids else ProcessTreeCpu().read


def _os_children_cpu_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


def machine_busy_cpu_seconds(cpu_times: Callable[[], Any] = psutil.cpu_times) -> float:
    """Non-idle CPU seconds of the whole machine, summed over all CPUs (10 ms ticks on
    Linux).  Guest time is already part of user time, and I/O wait is idle."""
    t = cpu_times()
    idle = float(t.idle) + float(getattr(t, "iowait", 0.0))
    total = sum(float(getattr(t, f)) for f in t._fields if f not in ("guest", "guest_nice"))
    return total - idle


def tree_pids(roots: tuple[int, ...]) -> set[int]:
    """Every live process in the trees of ``roots`` (the roots included): whose GPU use
    is this session's own (conditions/isolation.py)."""
    out: set[int] = set()
    for pid in roots:
        try:
            root = psutil.Process(pid)
        except psutil.Error:
            continue
        out.add(pid)
        out.update(_descendants(root))
    return out
