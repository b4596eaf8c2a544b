"""A batching engine with a known energy per prefill token and per decode step.

The stand-in server's requests sleep each on its own thread; a real engine runs them in
one loop of steps, and each step's energy is shared by the batch it ran.  This engine
does that (``Behaviour(engine=BatchEngine(...))`` in ``fake_openai_server``):

- a **prefill step** takes every request that arrived since the last step, lasts
  ``prefill_base_s + prefill_s_per_token`` x their prompt tokens and costs
  ``prefill_j_per_token`` x those tokens; it makes each request's first token;
- a **decode step** of a batch of b requests lasts ``step_s`` and costs ``step_j``
  (the weights' reads, whatever the batch) + b x ``step_j_per_request``; each request
  gets a token, and leaves the batch with its last one;
- the GPU draws ``idle_w`` besides, all the time.

Each step's energy is drawn evenly over its stretch of ``trace`` (an ``EnergyTrace``),
registered before the stretch begins, so a counter that reads the trace
(``tests.fakes.scripted.TraceMeter``) is exact at any moment.  ``truth`` holds what each
request cost: its prefill tokens' joules, and its share of every decode step it ran in
(``step_j`` / b + ``step_j_per_request``): the joules above idle, to the microjoule.
"""

from __future__ import annotations

import bisect
import math
import queue
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

DONE = None  # what a request's queue gets after its last token


@dataclass(frozen=True)
class StepCosts:
    idle_w: float = 60.0
    prefill_j_per_token: float = 0.03
    prefill_base_s: float = 0.001
    prefill_s_per_token: float = 2e-5
    step_j: float = 0.8
    step_j_per_request: float = 0.05
    step_s: float = 0.004


class EnergyTrace:
    """Idle power plus stretches of known energy, each spread evenly over its time: the
    PowerTrace interface (``origin``, ``energy_until``, ``power_at``...)."""

    LEAD_S = 2e-4  # a stretch is registered this long before it begins

    def __init__(self, idle_w: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.idle_w, self.clock = idle_w, clock
        self.origin = clock()
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._joules: list[float] = []
        self._before: list[float] = [0.0]  # energy of the stretches before stretch k
        self._lock = threading.Lock()

    @property
    def steps(self) -> list[tuple[float, float]]:
        return [(math.inf, self.idle_w)]

    def add(self, seconds: float, joules: float) -> tuple[float, float]:
        """A stretch of ``seconds`` drawing ``joules`` above idle, beginning after the
        last one and a moment from now; its (start, end)."""
        with self._lock:
            start = max(self.clock() + self.LEAD_S, self._ends[-1] if self._ends else 0.0)
            self._starts.append(start)
            self._ends.append(start + seconds)
            self._joules.append(joules)
            self._before.append(self._before[-1] + joules)
            return start, start + seconds

    def _dynamic_until(self, t: float) -> float:
        k = bisect.bisect_right(self._starts, t) - 1
        if k < 0:
            return 0.0
        start, end = self._starts[k], self._ends[k]
        part = 1.0 if end <= start else min(max((t - start) / (end - start), 0.0), 1.0)
        return self._before[k] + self._joules[k] * part

    def energy_until(self, t: float) -> float:
        if t <= self.origin:
            return 0.0
        with self._lock:
            return self.idle_w * (t - self.origin) + self._dynamic_until(t)

    def energy_between(self, t0: float, t1: float) -> float:
        return self.energy_until(t1) - self.energy_until(t0)

    def power_at(self, t: float) -> float:
        with self._lock:
            k = bisect.bisect_right(self._starts, t) - 1
            if k < 0 or t >= self._ends[k] or self._ends[k] <= self._starts[k]:
                return self.idle_w
            return self.idle_w + self._joules[k] / (self._ends[k] - self._starts[k])

    def mean_power(self, t0: float, t1: float) -> float:
        return self.energy_between(t0, t1) / (t1 - t0) if t1 > t0 else self.power_at(t1)

    def max_power(self) -> float:
        with self._lock:
            dynamic = [
                j / (e - s) for s, e, j in zip(self._starts, self._ends, self._joules) if e > s
            ]
        return self.idle_w + max(dynamic, default=0.0)


@dataclass
class _Job:
    key: Hashable
    input_tokens: int
    output_tokens: int
    tokens: queue.Queue[int | None] = field(default_factory=queue.Queue)
    produced: int = 0

    def emit(self) -> None:
        self.tokens.put(self.produced)
        self.produced += 1


@dataclass
class Truth:
    """What one request cost above idle: its prefill and its decode steps' shares."""

    prefill_j: float = 0.0
    decode_j: float = 0.0
    steps: int = 0
    batch_sum: int = 0  # the batch of each of its decode steps, summed

    @property
    def energy_j(self) -> float:
        return self.prefill_j + self.decode_j


class BatchEngine:
    """The loop of steps; ``submit`` adds a request and gives the queue of its tokens."""

    def __init__(self, costs: StepCosts | None = None) -> None:
        self.costs = costs or StepCosts()
        self.trace = EnergyTrace(self.costs.idle_w)
        self.truth: dict[Hashable, Truth] = {}
        self.steps = 0
        self._pending: list[_Job] = []
        self._active: list[_Job] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    def submit(self, key: Hashable, input_tokens: int, output_tokens: int) -> queue.Queue:
        job = _Job(key, input_tokens, output_tokens)
        with self._cond:
            self.truth[key] = Truth()
            self._pending.append(job)
            self._cond.notify()
        return job.tokens

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not (self._pending or self._active or self._stop.is_set()):
                    self._cond.wait(0.1)
                admitted, self._pending = self._pending, []
            if admitted:
                self._prefill(admitted)
            elif self._active:
                self._decode()

    def _run_step(self, seconds: float, joules: float) -> None:
        """Draw ``joules`` over a stretch of ``seconds`` and wait for its end."""
        _, end = self.trace.add(seconds, joules)
        self.steps += 1
        left = end - time.perf_counter()
        if left > 0:
            time.sleep(left)

    def _prefill(self, jobs: list[_Job]) -> None:
        c = self.costs
        tokens = sum(j.input_tokens for j in jobs)
        self._run_step(
            c.prefill_base_s + c.prefill_s_per_token * tokens, c.prefill_j_per_token * tokens
        )
        for job in jobs:
            self.truth[job.key].prefill_j += c.prefill_j_per_token * job.input_tokens
            if job.output_tokens:
                job.emit()
            self._finish_or_keep(job)

    def _decode(self) -> None:
        c = self.costs
        batch = len(self._active)
        self._run_step(c.step_s, c.step_j + batch * c.step_j_per_request)
        share = c.step_j / batch + c.step_j_per_request
        for job in list(self._active):
            truth = self.truth[job.key]
            truth.decode_j += share
            truth.steps += 1
            truth.batch_sum += batch
            job.emit()
        finished = [j for j in self._active if j.produced >= j.output_tokens]
        self._active = [j for j in self._active if j.produced < j.output_tokens]
        for job in finished:
            job.tokens.put(DONE)

    def _finish_or_keep(self, job: _Job) -> None:
        if job.produced >= job.output_tokens:
            job.tokens.put(DONE)
        else:
            self._active.append(job)
