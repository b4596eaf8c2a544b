"""One side of a paired run (``llmenergy ab``), inside its pytest session.

``llmenergy ab`` starts one session per checkout with ``LLMENERGY_AB`` set; this feature
then asks its coordinator (``pairing/coordinator.py``) before everything that matters:
it sends the collected energy cases and runs them in the common order it gets back
(cases of one side only are deselected and listed by the command); before each measured
trial it waits for its turn; after each case it sends the finished case and waits until
the other side has caught up.  While it waits it does nothing, so the two sessions never
run at once.  Its run file records the pairing, so ``llmenergy compare`` of the two runs
pairs their trials again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pytest

from ..controller.benchmark import PacerStop
from ..figures import PASS_WINDOW_MULTIPLE
from ..pairing.channel import Channel, ChannelClosed, connect
from ..results import CaseResult, Trial
from ..storage.runfile import case_dict, trial_dict
from .cases import case_labels, uses_energy_benchmark
from .keeping import Keeper

# A turn measures at least this long (and PASS_WINDOW_MULTIPLE x the meter's resolution):
# trials shorter than that come several to a turn, so that a pair is not the meter's
# rounding or the scheduler's jitter.
MIN_TURN_S = 0.05
# A side told to stop by the coordinator (the machine is too busy) exits with pytest's
# "interrupted": the command says why, once, for both sides.
EXIT_ABORTED = int(pytest.ExitCode.INTERRUPTED)


def _ask(channel: Channel, message: dict[str, Any]) -> dict[str, Any]:
    """Ask the coordinator; if it went away (``llmenergy ab`` was killed), this session
    stops now, keeping its finished cases, instead of running on unpaired."""
    try:
        return channel.ask(message)
    except ChannelClosed as exc:
        pytest.exit(f"llmenergy ab: {exc}; stopping this side", returncode=2)


class CasePacer:
    """The ``energy_benchmark``'s pacer for one case (``controller.benchmark.Pacer``):
    waits for each turn, then runs trials until the turn has measured ``turn_s``."""

    def __init__(self, channel: Channel, nodeid: str, turn_s: float) -> None:
        self.channel = channel
        self.nodeid = nodeid
        self.turn_s = turn_s
        self._in_turn_s: float | None = None  # measured in this turn so far; None: waiting
        self._last_trial_s = 0.0
        self.began = self.warm_up = False

    def turn(self, meta: Mapping[str, Any]) -> PacerStop | None:
        self.began = self.warm_up = False
        if self._in_turn_s is not None and self._in_turn_s < self.turn_s:
            return None  # the turn goes on
        self._in_turn_s = None
        reply = _ask(self.channel, {"op": "turn", "case": self.nodeid, "meta": dict(meta)})
        if reply.get("abort"):  # the whole run stops; finished cases are kept
            pytest.exit(f"llmenergy ab: {reply['abort']}", returncode=EXIT_ABORTED)
        if reply.get("go"):
            self._in_turn_s = 0.0
            self.began = True
            # a trial shorter than a turn: a cold first call would weigh in the turn's
            # mean (a trial as long as a turn warms up within itself); the case's own
            # warm-up served its first turn
            self.warm_up = 0.0 < self._last_trial_s < self.turn_s
            return None
        pairs = reply.get("pairs")
        return PacerStop(
            status=str(reply.get("status") or "limit"),
            why=str(reply.get("why") or ""),
            pairs={int(k): int(v) for k, v in pairs.items()} if isinstance(pairs, dict) else {},
        )

    def trial(self, trial: Trial, counted: Mapping[str, bool], disturbed: bool) -> None:
        window_s = trial.seconds * trial.passes  # a trial of several calls: its window
        if self._in_turn_s is not None:
            self._in_turn_s += window_s
        self._last_trial_s = window_s
        _ask(
            self.channel,
            {
                "op": "trial",
                "case": self.nodeid,
                "trial": trial_dict(trial),
                "counted": dict(counted),
                "disturbed": disturbed,
            },
        )


class PairedSide:
    """This session as one side of a paired run: the order, the turns, the case ends."""

    def __init__(self, socket_path: str, side: str, pairing_id: str, keeper: Keeper) -> None:
        self.side = side
        self.pairing_id = pairing_id
        self.keeper = keeper
        try:
            self.channel = connect(socket_path)
            self.channel.ask({"side": side, "id": pairing_id})
        except ChannelClosed as exc:
            raise pytest.UsageError(f"llmenergy ab: {exc}") from None
        self.skipped: list[str] = []
        self._finished: dict[str, CaseResult] = {}
        self._paired: set[str] = set()

    def pacer_for(self, nodeid: str, resolution_s: float | None) -> CasePacer | None:
        if nodeid not in self._paired:
            return None
        turn_s = max(MIN_TURN_S, PASS_WINDOW_MULTIPLE * (resolution_s or 0.0))
        return CasePacer(self.channel, nodeid, turn_s)

    def on_case(self, result: CaseResult) -> None:
        self._finished[result.nodeid] = result

    def header(self) -> list[str]:
        return [f"paired run (llmenergy ab): the {self.side} side, taking turns with the other"]

    # -- hooks ---------------------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """After the keeper made its run record: the record says which side this is."""
        pairing = {"id": self.pairing_id, "side": self.side}
        if self.keeper.recorder is not None:
            self.keeper.recorder.amend(pairing=pairing)
        if self.keeper.header_run is not None:
            self.keeper.header_run = dataclasses.replace(self.keeper.header_run, pairing=pairing)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Last of all (after the case plan's order): the coordinator's order."""
        energy = [item for item in items if uses_energy_benchmark(item)]
        cases = [{"id": i.nodeid, "group": case_labels(i).get("model", "")} for i in energy]
        reply = _ask(self.channel, {"op": "hello", "cases": cases})
        if reply.get("abort"):
            raise pytest.UsageError(f"llmenergy ab: {reply['abort']}")
        order = [str(i) for i in reply.get("order") or []]
        by_id = {item.nodeid: item for item in energy}
        self._paired = set(order) & set(by_id)
        skipped = [by_id[i] for i in reply.get("skip") or [] if i in by_id]
        self.skipped = [item.nodeid for item in skipped]
        if skipped:
            config.hook.pytest_deselected(items=skipped)
        others = [item for item in items if not uses_energy_benchmark(item)]
        # the energy cases first, in the common order; the other tests after them, once
        # neither side measures any more
        items[:] = [by_id[i] for i in order if i in by_id] + others

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        yield
        if item.nodeid not in self._paired:
            return
        result = self._finished.pop(item.nodeid, None)
        text = json.dumps(case_dict(result), allow_nan=False) if result is not None else ""
        _ask(self.channel, {"op": "case_end", "case": item.nodeid, "result": text})

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        saved = self.keeper.saved_paths
        # the coordinator may be gone already: then nothing is waiting for this side
        with contextlib.suppress(ChannelClosed):
            self.channel.ask({"op": "bye", "run": str(saved[0]) if saved else ""})
        self.channel.close()


PAIRED_SIDE = pytest.StashKey[PairedSide]()
