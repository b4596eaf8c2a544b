"""The coordinator of a paired run: one side runs at a time, trials alternate in blocks.

Each side (a pytest session, ``plugin/ab_side.py``) holds one connection and asks
before anything that matters: at collection (``hello``: its cases), before each
measured trial (``turn``), and after each case (``case_end``, with the finished case).
It waits for the answer; while it waits, it does nothing.  The coordinator answers one
side at a time and only once the other is waiting too, so the two never run at once:
not while measuring, and not while one loads a model or builds prompts either, which
would disturb the other's trials.  Inside a case, the waiting sides are let through in
the order of ``turns.block``; between cases, whichever is behind catches up first.
"""

from __future__ import annotations

import collections
import random
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..controller.order import shuffled_in_groups
from ..errors import LLMEnergyError
from ..figures import FIGURES
from ..results import CaseResult, Trial
from ..storage.runfile import decode_case, decode_trial
from .channel import BASE, HEAD, SIDES, Channel, ChannelClosed
from .turns import (
    MIN_PAIRS,
    PASS_LEVEL,
    Decision,
    GateRule,
    Pool,
    block,
    block_pairs,
    case_level,
    decide,
    pooled,
)

# A run stops, saying why, once the trials of the last BUSY_SPAN_S seconds (at least
# BUSY_MIN_TRIALS of them, however long they take) were nearly all (BUSY_SHARE)
# disturbed by other work: beside a process burning one of a 2-core machine's cores
# every trial is, no case pairs, and a run would go on without a verdict (measured:
# docs/evidence.md).  A burst of others' work shorter than the span only costs a case some
# repeated trials.
BUSY_SPAN_S = 30.0
BUSY_MIN_TRIALS = 6
BUSY_SHARE = 0.8


def other(side: str) -> str:
    return HEAD if side == BASE else BASE


@dataclass
class Slot:
    """One granted turn and the trials the side measured in it (a turn lasts at least
    a few times the meter's resolution, so short trials come several to a turn)."""

    side: str
    indices: list[int] = field(default_factory=list)  # the side's usable trials
    sums: dict[str, float] = field(default_factory=dict)  # of each gated figure
    seconds: float = 0.0  # measured by the usable trials

    @property
    def usable(self) -> bool:
        return bool(self.indices)

    def mean(self, metric: str) -> float:
        return self.sums[metric] / len(self.indices)


@dataclass
class PairedCase:
    """One case on both sides: its blocks, its pairs, and whether it is decided."""

    nodeid: str
    number: int  # its place in the order, from 1
    blocks: list[list[Slot]] = field(default_factory=list)
    queue: list[str] = field(default_factory=list)  # the current block's turns to come
    diffs: dict[str, list[float]] = field(default_factory=dict)
    pairs: dict[str, dict[int, int]] = field(default_factory=lambda: {BASE: {}, HEAD: {}})
    attempted: int = 0  # pairs begun
    meta: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    decision: Decision | None = None
    ended: set[str] = field(default_factory=set)

    @property
    def stopped(self) -> bool:
        return self.decision is not None and self.decision.stop


@dataclass
class Waiting:
    op: str
    case: str = ""
    message: Mapping[str, Any] = field(default_factory=dict)


class Coordinator:
    """The state of a paired run, shared by one thread per side's connection."""

    def __init__(
        self,
        rules: Sequence[GateRule],
        *,
        confidence: float,
        seed: int,
        log: Callable[[str], None] = lambda line: None,
        only_cases: Collection[str] | None = None,
        pair_limit: int | None = None,
        min_pairs: int = MIN_PAIRS,
    ) -> None:
        self.rules = tuple(rules)
        self.confidence = confidence
        self.seed = seed
        self.rng = random.Random(seed)
        self.log = log
        self.lock = threading.Condition()
        self.waiting: dict[str, Waiting] = {}
        self.replies: dict[str, dict[str, Any]] = {}
        self.active: set[str] = set()  # released and not yet asking again
        self.finished: list[str] = []  # said goodbye or went away, in the order they left
        self.failed: dict[str, str] = {}  # a side that went away without goodbye: why
        self.collected: dict[str, list[Mapping[str, Any]]] = {}
        self.order: list[str] = []
        self.only: dict[str, list[str]] = {BASE: [], HEAD: []}
        # a second pass measures these cases alone (None: every common case)
        self.only_cases = frozenset(only_cases) if only_cases is not None else None
        # a process pair of several (``llmenergy ab --processes``) measures a case up to
        # this many pairs: beyond them the processes' own offsets dominate its mean
        self.pair_limit = pair_limit
        self.min_pairs = min_pairs  # a confirming pass asks more (turns.MIN_CONFIRM_PAIRS)
        self.skip: dict[str, list[str]] = {BASE: [], HEAD: []}  # deselected by each side
        self.cases: dict[str, PairedCase] = {}
        self.results: dict[str, dict[str, CaseResult]] = {BASE: {}, HEAD: {}}
        self.runs: dict[str, str] = {}  # side -> the run file it saved, as it said
        self.clock = time.monotonic
        self.recent: collections.deque[tuple[float, bool]] = collections.deque()  # trials
        self.too_busy = ""  # why the run stopped because the machine was busy

    # -- one side's connection ----------------------------------------------------------
    def serve(self, side: str, channel: Channel) -> None:
        """Answer one side until it says goodbye or goes away."""
        try:
            while True:
                message = channel.receive()
                op = str(message.get("op", ""))
                if op == "trial":
                    self._on_trial(side, message)
                    channel.send({})
                    continue
                if op == "bye":
                    with self.lock:
                        self.runs[side] = str(message.get("run") or "")
                        self._leave(side)
                    channel.send({})
                    return
                channel.send(self._ask(side, Waiting(op, str(message.get("case", "")), message)))
        except (ChannelClosed, LLMEnergyError, ValueError) as exc:
            with self.lock:
                if side not in self.finished:
                    self.failed[side] = str(exc)
                    self._leave(side)
        finally:
            channel.close()

    def _ask(self, side: str, wait: Waiting) -> dict[str, Any]:
        with self.lock:
            self.active.discard(side)
            self._record(side, wait)
            self.waiting[side] = wait
            self._release()
            while side not in self.replies:
                self.lock.wait()
            return self.replies.pop(side)

    def _leave(self, side: str) -> None:
        if side not in self.finished:
            self.finished.append(side)
        self.active.discard(side)
        self.waiting.pop(side, None)
        self._release()

    # -- what a side tells ------------------------------------------------------------
    def _record(self, side: str, wait: Waiting) -> None:
        message = wait.message
        if wait.op == "hello":
            cases = message.get("cases")
            self.collected[side] = [c for c in cases if isinstance(c, Mapping)] if cases else []
        elif wait.op == "turn":
            case = self.cases.get(wait.case)
            meta = message.get("meta")
            if case is not None and isinstance(meta, Mapping) and side not in case.meta:
                case.meta[side] = meta
        elif wait.op == "case_end":
            case = self.cases.get(wait.case)
            if case is not None:
                case.ended.add(side)
                if case.decision is None or not case.decision.stop:
                    why = f"{side} ended the case first" if side in SIDES else ""
                    case.decision = Decision(True, False, why, {})
            result = message.get("result")
            if isinstance(result, str) and result:
                found = decode_case(result, f"the {side} side's case")
                self.results[side][found.nodeid] = found

    def _on_trial(self, side: str, message: Mapping[str, Any]) -> None:
        with self.lock:
            case = self.cases.get(str(message.get("case", "")))
            if case is None or not case.blocks:
                return
            slot = next((s for s in reversed(case.blocks[-1]) if s.side == side), None)
            if slot is None:
                return
            trial = decode_trial(message.get("trial"), f"the {side} side's trial")
            self._watch_busy(bool(message.get("disturbed")))
            counted = message.get("counted")
            values = self._values(case, side, trial, counted if isinstance(counted, dict) else {})
            if message.get("disturbed") or len(values) != len(self.rules):
                return  # kept by the side, left out of the pairs
            slot.indices.append(trial.index)
            slot.seconds += trial.seconds * trial.passes  # its whole window
            for metric, value in values.items():
                slot.sums[metric] = slot.sums.get(metric, 0.0) + value

    def _watch_busy(self, disturbed: bool) -> None:
        """Keep the trials of the last ``BUSY_SPAN_S`` (and at least ``BUSY_MIN_TRIALS``);
        decide that the machine is too busy for a paired run when nearly all of them
        were disturbed."""
        now = self.clock()
        recent = self.recent
        recent.append((now, disturbed))
        while len(recent) > BUSY_MIN_TRIALS and now - recent[1][0] >= BUSY_SPAN_S:
            recent.popleft()
        if self.too_busy or len(recent) < BUSY_MIN_TRIALS or now - recent[0][0] < BUSY_SPAN_S:
            return
        busy = sum(1 for _, d in recent if d)
        if busy >= BUSY_SHARE * len(recent):
            self.too_busy = (
                f"the machine is too busy for a paired run: other work used more than "
                f"--energy-max-background of the CPUs in {busy} of the {len(recent)} "
                f"trials of the last {now - recent[0][0]:.0f} s, so the cases could not "
                "pair; stop the other work (or run on a machine of its own) and run again"
            )

    def _values(
        self, case: PairedCase, side: str, trial: Trial, counted: Mapping[str, Any]
    ) -> dict[str, float]:
        """The gated figures of one trial, as the figure registry computes them: the
        trial carries its size, the side's ``turn`` said its session's conversions
        (gCO2e and price per kWh, for co2_g and cost)."""
        found = case.meta.get(side, {}).get("conversions")
        conversions = (
            {str(k): float(v) for k, v in found.items() if isinstance(v, int | float)}
            if isinstance(found, Mapping)
            else {}
        )
        domains = {str(k): bool(v) for k, v in counted.items()}
        out = {}
        for rule in self.rules:
            values = FIGURES[rule.metric].values_of(
                (trial,), counted=domains, conversions=conversions
            )
            if values:
                out[rule.metric] = values[0]
        return out

    # -- who goes next ------------------------------------------------------------------
    def _release(self) -> None:
        """Let one waiting side go on, if none is running; called under the lock."""
        if self.active:
            return
        alive = [s for s in SIDES if s not in self.finished]
        if any(s not in self.waiting for s in alive):
            return  # a side is starting up (before hello): it runs alone, unsynchronized
        choice = self._choose(alive)
        if choice is None:
            return
        side, reply = choice
        del self.waiting[side]
        self.replies[side] = reply
        self.active.add(side)
        self.lock.notify_all()

    def _choose(self, alive: list[str]) -> tuple[str, dict[str, Any]] | None:
        if not alive:
            return None
        waits = {s: self.waiting[s] for s in alive}
        hellos = [s for s, w in waits.items() if w.op == "hello"]
        if hellos:
            if len(hellos) < len(SIDES) and not self.order and len(alive) == len(SIDES):
                return None  # the other side has not collected yet
            if not self.order and not self.cases:
                if len(alive) < len(SIDES):
                    side = hellos[0]
                    return side, {"abort": f"the {other(side)} side stopped before it collected"}
                self._plan()
            side = self.rng.choice(hellos)
            return side, {"order": self.order, "skip": self.skip[side], "seed": self.seed}
        # a side still finishing an earlier case, or released from a stopped one, goes first
        first = min(alive, key=lambda s: self._position(waits[s]))
        wait = waits[first]
        if wait.op != "turn":
            return first, {}
        if self.too_busy:
            return first, {"go": False, "abort": self.too_busy}
        case = self.cases.get(wait.case)
        if case is None:
            return first, {"go": False, "why": "not a case of this paired run"}
        if not case.stopped:
            here = self._position(wait)
            together = len(alive) == len(SIDES) and all(
                self._position(waits[s]) == here for s in alive
            )
            if together:
                return self._next_turn(case)
            case.decision = Decision(True, False, "the other side left the case", {})
        return first, self._stop_reply(case, first)

    def _position(self, wait: Waiting) -> tuple[int, int]:
        """Where a waiting side is: (case number, 0 at a turn / 1 after the case)."""
        case = self.cases.get(wait.case)
        number = case.number if case is not None else 0
        return (number, 1 if wait.op == "case_end" else 0) if wait.op != "hello" else (-1, 0)

    def _next_turn(self, case: PairedCase) -> tuple[str, dict[str, Any]]:
        """Both sides wait at a turn of ``case``: the block's next side goes."""
        if not case.queue:
            if case.blocks:
                self._close_block(case)
                if case.stopped:
                    side = self.rng.choice(list(SIDES))
                    return side, self._stop_reply(case, side)
            pattern = block(self.rng)
            case.queue = list(pattern)
            case.blocks.append([])
            case.attempted += len(block_pairs(pattern))
        side = case.queue.pop(0)
        case.blocks[-1].append(Slot(side))
        return side, {"go": True}

    def _close_block(self, case: PairedCase) -> None:
        """Pair the last block's trials, then ask the stopping rule."""
        self._pair_block(case)
        case.decision = self._decide(case)
        if case.decision.stop:
            self.log(self._progress(case))

    def _pair_block(self, case: PairedCase) -> None:
        """Pair the last block's turns as its pattern says (``turns.block_pairs``); a
        pair whose turns both measured usable trials numbers them and adds each gate's
        difference."""
        slots = case.blocks[-1]
        for first, second in block_pairs([s.side for s in slots]):
            a, b = slots[first], slots[second]
            if not (a.usable and b.usable):
                continue
            base, head = (a, b) if a.side == BASE else (b, a)
            diffs = {
                r.metric: r.difference(base.mean(r.metric), head.mean(r.metric)) for r in self.rules
            }
            if any(d is None for d in diffs.values()):
                continue
            number = 1 + max(case.pairs[BASE].values(), default=0)
            for slot in (base, head):
                for index in slot.indices:
                    case.pairs[slot.side][index] = number
            for metric, d in diffs.items():
                assert d is not None
                case.diffs.setdefault(metric, []).append(d)

    def _decide(self, case: PairedCase) -> Decision:
        """The stopping rule on the case's pairs so far, within its limits."""
        return decide(
            case.diffs,
            self.rules,
            pass_level=min(self.confidence, PASS_LEVEL),
            fail_level=case_level(self.confidence, max(1, len(self.order))),
            attempted_pairs=case.attempted,
            max_pairs=self._max_pairs(case),
            measured_s=min(self._measured_s(case, s) for s in SIDES),
            min_time_s=float(self._limit(case, "min_time_s", 0.0)),
            max_time_s=float(self._limit(case, "max_time_s", 0.0)),
            pools=self._pools(case),
            min_pairs=self.min_pairs,
        )

    def _max_pairs(self, case: PairedCase) -> int:
        limit = int(self._limit(case, "max_trials", 25))
        return min(limit, self.pair_limit) if self.pair_limit else limit

    def too_wide(self) -> set[tuple[str, str]]:
        """(node id, figure) of the cases that stopped at a limit with their own pairs
        too wide to pass on (``turns.OWN_SPAN_GATES``): undecided, not passed."""
        return {
            (case.nodeid, metric)
            for case in self.cases.values()
            if case.decision is not None and not case.decision.decided
            for metric in case.decision.too_wide
        }

    def _pools(self, case: PairedCase) -> dict[str, Pool]:
        """Each figure's variance of a pair's difference, over the cases already stopped."""
        done = [c for c in self.cases.values() if c is not case and c.stopped]
        out = {}
        for rule in self.rules:
            found = pooled([c.diffs.get(rule.metric, []) for c in done])
            if found is not None:
                out[rule.metric] = found
        return out

    def _limit(self, case: PairedCase, key: str, default: float) -> Any:
        found = [m.get(key) for m in case.meta.values() if isinstance(m.get(key), int | float)]
        return min(found) if found else default

    @staticmethod
    def _measured_s(case: PairedCase, side: str) -> float:
        return sum(s.seconds for b in case.blocks for s in b if s.side == side and s.usable)

    def _stop_reply(self, case: PairedCase, side: str) -> dict[str, Any]:
        decision = case.decision
        converged = decision is not None and decision.decided
        return {
            "go": False,
            "status": "converged" if converged else "limit",
            "why": "" if decision is None or converged else decision.why,
            "pairs": {str(k): v for k, v in case.pairs[side].items()},
        }

    def _progress(self, case: PairedCase) -> str:
        decision = case.decision
        assert decision is not None
        pairs = len(case.diffs.get(self.rules[0].metric, []))
        parts = [f"[{case.number}/{len(self.order)}] {case.nodeid}: {pairs} pairs"]
        for rule in self.rules:
            interval = decision.intervals.get(rule.metric)
            if interval is not None:
                parts.append(f"{rule.metric} {interval.ratio_text(rule.relative)}")
        parts.append(decision.why)
        return ", ".join(parts)

    # -- the plan -----------------------------------------------------------------------
    def _plan(self) -> None:
        """The common cases in one random order (each model's cases together, so each
        side loads each model once); cases of one side only are listed, not run.  A
        second pass runs only its cases; the sides deselect the others."""
        ids = {s: [str(c.get("id")) for c in self.collected.get(s, [])] for s in SIDES}
        groups = {
            str(c.get("id")): str(c.get("group", ""))
            for s in SIDES
            for c in self.collected.get(s, [])
        }
        common = [i for i in ids[BASE] if i in set(ids[HEAD])]
        for s in SIDES:
            self.only[s] = [i for i in ids[s] if i not in set(ids[other(s)])]
        if self.only_cases is not None:
            common = [i for i in common if i in self.only_cases]
            self.only = {BASE: [], HEAD: []}  # listed by the first pass already
        for s in SIDES:
            self.skip[s] = [i for i in ids[s] if i not in set(common)]
        self.order = shuffled_in_groups(common, self.seed, lambda i: groups.get(i, ""))
        self.cases = {i: PairedCase(i, n) for n, i in enumerate(self.order, start=1)}


def listen(path: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    return server


def accept_sides(
    server: socket.socket, coordinator: Coordinator, expected: Mapping[str, str]
) -> list[threading.Thread]:
    """Accept connections until both sides have said who they are; serve each in a
    thread.  ``expected`` maps each side to its pairing id (a stranger is turned away)."""
    threads = []
    seen: set[str] = set()
    while len(seen) < len(SIDES):
        sock, _ = server.accept()
        channel = Channel(sock)
        try:
            first = channel.receive()
        except ChannelClosed:
            channel.close()
            continue
        side = str(first.get("side", ""))
        if side not in SIDES or side in seen or first.get("id") != expected.get(side):
            channel.close()
            continue
        seen.add(side)
        channel.send({})
        thread = threading.Thread(target=coordinator.serve, args=(side, channel), daemon=True)
        thread.start()
        threads.append(thread)
    return threads


__all__ = ["Coordinator", "accept_sides", "listen"]
