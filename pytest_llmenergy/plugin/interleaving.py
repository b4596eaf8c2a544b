"""Interleaving: ``--energy-interleave=N`` visits every energy case N times per session.

A machine's speed drifts over seconds (on a shared VM, by tens of per cent), and a case
whose trials run back to back takes the speed of its one stretch: its trials agree, and
its mean differs from the next session's.  Visiting every case several times, in a new
random order each time, spreads each case's trials over the whole session (randomized
multiple interleaved trials, Abedi & Brecht, ICPE 2017).

The session runs the collected tests once, then the energy cases again, visit after
visit; each visit of a case runs a share of its trials (``controller.benchmark.CaseVisits``)
and the last keeps the whole case.  Tests without ``energy_benchmark`` run once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import pytest

from ..controller.benchmark import CaseVisits
from ..controller.order import shuffled_in_groups
from .cases import uses_energy_benchmark


class Interleaving:
    """Owns the visits: the order of every visit and what each case measured so far."""

    def __init__(self, count: int, seed: int, group: Callable[[pytest.Item], Hashable]) -> None:
        self.count = count
        self.seed = seed
        self._group = group
        self._visits: dict[str, CaseVisits] = {}
        self.visit = 0  # the visit running now, from 1

    def visits_for(self, item: pytest.Item) -> CaseVisits:
        visits = self._visits.setdefault(item.nodeid, CaseVisits(self.count))
        visits.visit = self.visit
        return visits

    def header(self) -> list[str]:
        return [
            f"interleaved: every energy case visited {self.count} times, in a new random "
            "order each time (--energy-interleave)"
        ]

    def schedule(self, items: list[pytest.Item]) -> list[tuple[int, pytest.Item]]:
        """(visit, item) in running order: everything once, then the energy cases again,
        each visit in its own order (cases of one model together, as in the first)."""
        out = [(1, item) for item in items]
        cases = [item for item in items if uses_energy_benchmark(item)]
        if not cases:  # nothing to visit again, however many visits were asked for
            return out
        for visit in range(2, self.count + 1):
            order = shuffled_in_groups(cases, self.seed + visit, self._group)
            out.extend((visit, item) for item in order)
        return out

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if session.testsfailed or session.config.option.collectonly:
            return None  # pytest's own loop stops or lists, as without this option
        schedule = self.schedule(list(session.items))
        for i, (visit, item) in enumerate(schedule):
            nextitem = schedule[i + 1][1] if i + 1 < len(schedule) else None
            if nextitem is item:  # the same test next: tear it down wholly first
                nextitem = None
            if visit > 1 and isinstance(item, pytest.Function):
                item._initrequest()  # a fresh fixture request, as for a first run
            self.visit = visit
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        return True


INTERLEAVING = pytest.StashKey[Interleaving]()
