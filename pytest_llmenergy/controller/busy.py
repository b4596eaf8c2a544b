"""A busy machine: found once per session, said once, and measured anyway.

A trial during which other processes used more than ``--energy-max-background`` of the
CPUs is disturbed, and left out and repeated: right for a neighbour that comes and goes.
A neighbour that stays (a shared CI runner, a build beside the session) disturbs every
trial, and repeating them only multiplies the session's time by the trial limit to
measure nothing.  So after ``BUSY_STREAK`` disturbed trials in a row, anywhere in the
session, the machine is *busy*, and the session says so once; under the ``measure``
policy its disturbed trials then count, marked busy (``Trial.busy``: their case is never
gated, and says how far its figures may be off), until ``QUIET_STREAK`` quiet trials in a
row end the busy stretch.  Under ``repeat`` they are still left out, each case within its
trial limit and time budget, and a case that measured nothing says so (not a pass).

How far a busy trial may be off is not bounded by the share others used: a case whose
threads wait for each other waits for the slowest, and one descheduled thread stalls
them all.  Beside one CPU-bound process on a 2-core VM (others: 42 % of the CPUs), the
quick grid's cases read 1.8-5.6x their quiet time and 1.2-3.5x their quiet energy
(docs/evidence.md), so the line says "several times", not a bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# Disturbed trials in a row (across cases) that make the machine busy.
BUSY_STREAK = 3
# Quiet trials in a row that end a busy stretch.
QUIET_STREAK = 3
# What a busy trial's figures may be, as the session says it: measured, not a bound
# (see above).
BUSY_EFFECT = "may read several times high for CPU work"


@dataclass
class BusyWatch:
    """The session's judgement of the machine, trial by trial: quiet, or busy since
    ``BUSY_STREAK`` disturbed trials in a row.  ``announce`` hears the first time the
    machine turns busy (once a session: later busy stretches are in the summary)."""

    policy: str = "measure"  # controller.rule.BUSY_POLICIES
    announce: Callable[[str], None] | None = None
    busy: bool = False
    stretches: int = 0  # how often the machine turned busy
    _disturbed_run: list[float] = field(default_factory=list)  # their shares
    _quiet_run: int = 0

    @property
    def measuring_anyway(self) -> bool:
        """Disturbed trials count now (marked busy), rather than being repeated."""
        return self.busy and self.policy == "measure"

    def observe(self, share: float | None, disturbed: bool) -> None:
        """One trial's share of the CPUs others used, and whether it was too much."""
        if disturbed:
            self._quiet_run = 0
            self._disturbed_run.append(share or 0.0)
            if not self.busy and len(self._disturbed_run) >= BUSY_STREAK:
                self._turn_busy()
            return
        self._disturbed_run.clear()
        self._quiet_run += 1
        if self.busy and self._quiet_run >= QUIET_STREAK:
            self.busy = False

    def _turn_busy(self) -> None:
        self.busy = True
        self.stretches += 1
        if self.stretches == 1 and self.announce is not None:
            share, trials = max(self._disturbed_run), len(self._disturbed_run)
            self.announce(busy_announcement(share, trials, self.policy))


def busy_announcement(share: float, trials: int, policy: str) -> str:
    """The one line a session says when it finds the machine busy."""
    head = (
        f"the machine is busy: other processes used up to {share:.0%} of the CPUs "
        f"in {trials} trials in a row; "
    )
    if policy == "measure":
        return head + (
            f"trials are now measured anyway, marked busy, never gated (their figures "
            f"{BUSY_EFFECT}); --energy-busy=repeat repeats them instead"
        )
    return head + (
        "they are repeated within each case's trial limit and time budget, and a case "
        "that measures nothing is skipped; --energy-busy=measure measures them anyway"
    )
