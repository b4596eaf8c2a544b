"""One measurement across the ranks of a torchrun job: lockstep windows, energy counted once.

torchrun (or srun + torchrun) starts the processes and sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK``; this module reads them, joins
torch.distributed's process group, and wraps each rank's own meter in a
:class:`DistributedMeter`:

* every window opens after a barrier and closes after another, so every node measures
  the same stretch of time (the slowest rank's trial), then gathers what every rank
  measured, so every rank holds the same merged measurement (the stopping rule then
  decides the same on every rank, and no rank waits for another's decision);
* each node's CPU/DRAM meter is read by one rank of that node (local rank 0) and each GPU
  by the rank that owns it, so nothing is counted twice; across nodes, domain names get
  the node: ``cpu:package-0@node1``;
* a rank that dies does not leave the others hanging: collectives time out
  (``init_process_group(timeout=...)``), every rank beats a heartbeat into the job's
  store, and the error names the ranks that stopped beating.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, LLMEnergyError
from .meters.base import Meter
from .meters.marks import MeasuredShortcuts
from .meters.readings import PROCESS_DOMAIN, Domain, Measurement, Method, Phase, Reading

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
DEFAULT_TIMEOUT_S = 300.0
HEARTBEAT_S = 0.5
_HEARTBEAT_KEY = "llmenergy/alive/"
_DONE_KEY = "llmenergy/done/"


class RankLost(LLMEnergyError):
    """A collective failed or timed out because a rank stopped answering."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job, from torchrun's environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int

    @property
    def nnodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def reads_host(self) -> bool:
        """Local rank 0 reads its node's CPU and DRAM meter; the others none of it."""
        return self.local_rank == 0

    def node_of(self, rank: int) -> int:
        return rank // max(1, self.local_world_size)

    def describe(self) -> str:
        return (
            f"rank {self.rank} of {self.world_size} (node {self.node_rank} of {self.nnodes}, "
            f"local rank {self.local_rank} of {self.local_world_size})"
        )


def detect(environ: Mapping[str, str] | None = None) -> DistEnv | None:
    """The job this process is part of, or None outside torchrun (or with one process)."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return None
    values: dict[str, int] = {}
    for name in ENV_VARS:
        text = env.get(name)
        if text is None:
            continue
        try:
            values[name] = int(text)
        except ValueError:
            raise ConfigError(
                f"environment variable {name}={text!r} is not a number; start the job with "
                "torchrun, which sets it"
            ) from None
    world = values["WORLD_SIZE"]
    if world <= 1:
        return None
    local_world = values.get("LOCAL_WORLD_SIZE", world)
    rank = values["RANK"]
    if not 0 <= rank < world or local_world < 1 or world % local_world:
        raise ConfigError(
            f"RANK={rank}, WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local_world} do not fit "
            "together (every node runs the same number of ranks); start the job with torchrun"
        )
    return DistEnv(
        rank=rank,
        world_size=world,
        local_rank=values.get("LOCAL_RANK", rank % local_world),
        local_world_size=local_world,
        node_rank=values.get("GROUP_RANK", rank // local_world),
    )


# -- the process group -------------------------------------------------------------------
class Group:
    """The job's process group with the few collectives measuring needs, each bounded by
    ``timeout_s`` and translated into :class:`RankLost` naming the silent ranks."""

    def __init__(self, env: DistEnv, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import torch
        import torch.distributed as dist

        self.env = env
        self.timeout_s = timeout_s
        self.lost: str | None = None  # the first fault's message; later calls fail at once
        self._dist = dist
        timeout = datetime.timedelta(seconds=timeout_s)
        gpu = torch.cuda.is_available()
        if not dist.is_initialized():
            if gpu:
                torch.cuda.set_device(env.local_rank % max(1, torch.cuda.device_count()))
            # gloo carries this module's small messages, nccl the model's tensors on GPUs
            backend = "cpu:gloo,cuda:nccl" if gpu else "gloo"
            dist.init_process_group(backend, timeout=timeout)
        self.backend = str(dist.get_backend())
        # this module's collectives go over gloo: small objects, CPU-side barriers
        self._pg = dist.new_group(backend="gloo", timeout=timeout) if gpu else None
        self._heartbeat = Heartbeat(env, _job_store(dist))

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.env.world_size
        self._call(lambda: self._dist.all_gather_object(out, obj, group=self._pg))
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        self._call(lambda: self._dist.broadcast_object_list(box, src=0, group=self._pg))
        return box[0]

    def barrier(self) -> None:
        self._call(lambda: self._dist.barrier(group=self._pg))

    def _call(self, fn: Callable[[], None]) -> None:
        if self.lost is not None:
            raise RankLost(self.lost)
        try:
            fn()
        except Exception as exc:  # gloo's and nccl's errors are RuntimeError subclasses
            self.lost = self.fault_message(exc)
            raise RankLost(self.lost) from exc

    def silent_ranks(self) -> list[int]:
        """The ranks whose heartbeat stopped (waiting a few beats for a fresh death)."""
        return self._heartbeat.silent_ranks()

    def fault_message(self, exc: BaseException | None = None) -> str:
        silent = self._heartbeat.silent_ranks()
        if silent:
            who = ", ".join(f"rank {r} (node {self.env.node_of(r)})" for r in silent)
            what = f"{who} stopped answering"
        else:
            what = "another rank stopped answering"
        if exc is None:
            return what
        reason = _first_line(exc)
        if "timed out" in reason.lower() or "timeout" in reason.lower():
            reason += f" (after {self.timeout_s:g} s: --energy-dist-timeout)"
        return f"{what}; rank {self.env.rank} saw: {reason}"

    def close(self) -> None:
        """Say this rank finished (not died), and leave the group."""
        self._heartbeat.stop()
        if self._dist.is_initialized() and self.lost is None:
            with contextlib.suppress(Exception):
                self._dist.destroy_process_group()


def _job_store(dist: Any) -> Any:
    """The job's key-value store (torchrun's), or None where torch does not expose it."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def _first_line(exc: BaseException) -> str:
    """gloo's message without its source location and advice: ``Read error [addr]:port:
    Connection reset by peer``."""
    lines = str(exc).strip().splitlines()
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h)(:\d+)?\]\s*", "", lines[0] if lines else "")
    text = text.split(". ", 1)[0].rstrip(".")
    return (text or type(exc).__name__)[:160]


class Heartbeat:
    """Every rank writes the time into the job's store every ``HEARTBEAT_S``; a rank whose
    time is old (and that did not say it finished) is the one that died."""

    def __init__(self, env: DistEnv, store: Any, period_s: float = HEARTBEAT_S) -> None:
        self.env = env
        self.period_s = period_s
        self._store = store
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if store is None:
            return
        self._beat()
        self._thread = threading.Thread(target=self._run, name="llmenergy-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        with contextlib.suppress(Exception):
            self._store.set(f"{_HEARTBEAT_KEY}{self.env.rank}", repr(time.time()))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._beat()

    def silent_ranks(self, wait_s: float | None = None) -> list[int]:
        """The ranks whose heartbeat stopped; waits up to ``wait_s`` (a few periods) for
        a rank that just died to go stale."""
        if self._store is None:
            return []
        wait_s = 6 * self.period_s if wait_s is None else wait_s
        deadline = time.monotonic() + wait_s
        while True:
            silent = self._stale()
            if silent or time.monotonic() >= deadline:
                return silent
            time.sleep(self.period_s / 2)

    def _stale(self, stale_s: float | None = None) -> list[int]:
        stale_s = stale_s if stale_s is not None else 4 * self.period_s
        now = time.time()
        silent = []
        for rank in range(self.env.world_size):
            if rank == self.env.rank:
                continue
            try:
                if self._store.check([f"{_DONE_KEY}{rank}"]):
                    continue
                key = f"{_HEARTBEAT_KEY}{rank}"
                last = float(self._store.get(key)) if self._store.check([key]) else 0.0
            except Exception:
                return []  # the store itself is gone: nobody can be named
            if now - last > stale_s:
                silent.append(rank)
        return silent

    def stop(self) -> None:
        self._stop.set()
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.set(f"{_DONE_KEY}{self.env.rank}", "1")


# -- the meter ---------------------------------------------------------------------------
class NullMeter(Meter):
    """A rank that reads no sensor still times its windows and takes part in them."""

    backend = "none"

    @property
    def domains(self) -> Mapping[str, Domain]:
        return {}

    def _read(self) -> Reading:
        return Reading(time.perf_counter())

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:
        return {}


def qualified(domain: str, env: DistEnv) -> str:
    """``cpu:package-0@node1`` across nodes; the plain name on one node (names stay
    those of a single process there, so single-node runs line up with one-process runs).
    A process's own share (the estimate's ``cpu:process``) is every rank's: ``@rankN``."""
    if domain == PROCESS_DOMAIN:
        return f"{domain}@rank{env.rank}"
    return f"{domain}@node{env.node_rank}" if env.nnodes > 1 else domain


def node_of_domain(domain: str) -> int | None:
    _, sep, node = domain.rpartition("@node")
    return int(node) if sep and node.isdigit() else None


def per_process(kind: str) -> bool:
    """A meter of this process's own CPU time (the estimate) runs on every rank; a meter
    of the whole node (RAPL, powermetrics) on one rank per node."""
    return kind == "estimate"


@dataclass(frozen=True)
class RankMeter:
    """What one rank's meter reads, as every rank learns it when the meter opens."""

    rank: int
    node: int
    backend: str
    kind: str
    domains: tuple[tuple[str, str, bool], ...]  # (qualified name, method, counted)
    resolution_s: float | None
    idle_power_w: tuple[tuple[str, float], ...]
    notes: tuple[str, ...]
    settings: tuple[tuple[str, str], ...]


class DistributedMeter(Meter):
    """Every rank's meter as one: windows in lockstep, the job's energy in each of them."""

    def __init__(self, local: Meter, group: Group) -> None:
        super().__init__()
        self.local = local
        self.group = group
        env = group.env
        mine = RankMeter(
            rank=env.rank,
            node=env.node_rank,
            backend=local.backend,
            kind=local.kind,
            domains=tuple(
                (qualified(n, env), str(d.method), d.counted) for n, d in local.domains.items()
            ),
            resolution_s=local.resolution_s,
            idle_power_w=tuple((qualified(n, env), w) for n, w in local.idle_power_w.items()),
            notes=tuple(local.notes),
            settings=tuple(local.settings().items()),
        )
        self.ranks: list[RankMeter] = group.all_gather(mine)
        self._check_estimate()
        self._domains: dict[str, Domain] = {}
        self.owner: dict[str, int] = {}  # domain -> the rank that reads it
        for rm in self.ranks:
            for name, method, counted in rm.domains:
                if name in self._domains:
                    raise ConfigError(
                        f"ranks {self.owner[name]} and {rm.rank} both measure {name}; give each "
                        "rank its own GPU (one per local rank) so nothing is counted twice"
                    )
                self._domains[name] = Domain(name, Method(method), counted)
                self.owner[name] = rm.rank
        self.idle_power_w = {n: w for rm in self.ranks for n, w in rm.idle_power_w}
        readers = [rm for rm in self.ranks if rm.domains]
        self.backend = "+".join(dict.fromkeys(rm.backend for rm in readers)) or "none"
        self._kind = "+".join(dict.fromkeys(rm.kind for rm in readers)) or "none"
        resolutions = [rm.resolution_s for rm in readers if rm.resolution_s is not None]
        self._resolution_s = max(resolutions) if resolutions else None
        self.notes = tuple(dict.fromkeys(n for rm in readers for n in rm.notes))
        self._settings = {k: v for rm in readers for k, v in rm.settings}
        # what each node's meter measured, over every window (its own stretch of time)
        self.window_s_by_node: dict[int, float] = {}

    def _check_estimate(self) -> None:
        kinds = {rm.kind for rm in self.ranks if rm.domains}
        if "estimate" in kinds and any(not rm.domains for rm in self.ranks):
            raise ConfigError("the estimate must run on every rank (open_rank_meter)")

    @property
    def domains(self) -> Mapping[str, Domain]:
        return self._domains

    @property
    def kind(self) -> str:
        return self._kind

    def settings(self) -> dict[str, str]:
        return dict(self._settings)

    def describe(self) -> str:
        env = self.group.env
        parts = []
        for rm in self.ranks:
            if rm.domains:
                names = ", ".join(f"{n} ({m})" for n, m, _ in rm.domains)
                parts.append(f"rank {rm.rank}: {names}")
        head = f"{env.world_size} ranks on {env.nnodes} node(s)"
        return f"{head}; " + "; ".join(parts) if parts else f"{head}; nothing measured"

    def measure(self, phase: str = "main", *, aligned: bool = False) -> Any:
        return DistributedWindow(self, phase, aligned)

    def measure_idle(self, seconds: float) -> dict[str, float]:
        raise ConfigError("measure idle power before the meter is shared between ranks")

    def close(self) -> None:
        self.local.close()

    # Windows are DistributedWindow's own business; these are never called.
    def _read(self) -> Reading:  # pragma: no cover - see DistributedWindow
        raise NotImplementedError

    def _energy_j(self, a: Reading, b: Reading) -> dict[str, float]:  # pragma: no cover
        raise NotImplementedError


class DistributedWindow(MeasuredShortcuts):
    """A barrier, this rank's own window, then every rank's result gathered and merged.

    Marks (``mark_phase`` at the first output token) go to the local window, which is the
    innermost one while the block runs."""

    def __init__(self, meter: DistributedMeter, phase: str, aligned: bool = False) -> None:
        self._meter = meter
        # Not aligned on the counters' refreshes (meters/edges.py): each rank would wait
        # for its own GPU's after the barrier, and the first to start would wait for the
        # others in its first collective, inside its window.  ``aligned`` is accepted and
        # left aside: under torchrun a trial is one call, its edges read as they come.
        del aligned
        self._local = meter.local.measure(phase)
        self._result: Measurement | None = None

    def __enter__(self) -> DistributedWindow:
        self._meter.group.barrier()
        self._local.__enter__()
        return self

    def mark(self, phase: str, *, ending: str | None = None) -> None:
        self._local.mark(phase, ending=ending)

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:
            self._local.__exit__(*exc)
            return  # the block failed on this rank; the others learn it by timeout
        try:
            # every node's window ends when the last rank is done: the job's time is
            # the slowest rank's, and the others' wait for it is part of its energy
            self._meter.group.barrier()
        finally:
            self._local.__exit__(None, None, None)
        meter = self._meter
        env = meter.group.env
        m = self._local.measurement
        q = lambda name: qualified(name, env)  # noqa: E731
        mine = (
            m.seconds,
            {q(n): j for n, j in m.by_domain.items()},
            [
                (p, m.phases[p].seconds, {q(n): j for n, j in m.phases[p].by_domain.items()})
                for p in m.phases
            ],
        )
        gathered = meter.group.all_gather(mine)
        for rm, window in zip(meter.ranks, gathered):
            if rm.domains and rm.rank % env.local_world_size == 0:
                node_s = meter.window_s_by_node.get(rm.node, 0.0)
                meter.window_s_by_node[rm.node] = node_s + window[0]
        self._result = merge(meter, gathered)

    @property
    def measurement(self) -> Measurement:
        if self._result is None:
            raise RuntimeError("the window is still open: read the result after the with block")
        return self._result


RankWindow = tuple[float, dict[str, float], list[tuple[str, float, dict[str, float]]]]


def merge(meter: DistributedMeter, windows: list[RankWindow]) -> Measurement:
    """The job's window: the slowest rank's time (the job waits for it), every rank's
    joules; each phase likewise.  The same on every rank, since all hold the same input."""
    domains = dict(meter.domains)
    idle = dict(meter.idle_power_w)
    seconds = max(w[0] for w in windows)
    by_domain = {name: 0.0 for name in domains}
    for _, joules, _ in windows:
        for name, j in joules.items():
            by_domain[name] = by_domain.get(name, 0.0) + j
    phase_names = list(dict.fromkeys(p for w in windows for p, _, _ in w[2]))
    phases: dict[str, Phase] = {}
    offset = 0.0
    for name in phase_names:
        spans = [(s, j) for w in windows for p, s, j in w[2] if p == name]
        phase_s = max(s for s, _ in spans)
        phase_j = {d: 0.0 for d in domains}
        for _, joules in spans:
            for d, j in joules.items():
                phase_j[d] = phase_j.get(d, 0.0) + j
        phases[name] = Phase(
            seconds=phase_s,
            by_domain=phase_j,
            domains=domains,
            idle_power_w=idle,
            name=name,
            offset_s=offset,
        )
        offset += phase_s
    return Measurement(
        seconds=seconds,
        by_domain=by_domain,
        domains=domains,
        idle_power_w=idle,
        phases=phases,
        t_start=0.0,
        t_end=seconds,
        backend=meter.backend,
    )
