"""Tick phases: the processes of one wheel spread their ticks evenly over the tick period.

At its tick a process claims everything due before its next tick plus a margin
(timewheel/engine/ticker.py). Two processes that tick close together split the work as
unevenly as their ticks fall: the first claims nearly a whole period's tasks, the second what
falls due in the few milliseconds between them (bench/README.md: 17,069 against 2,931 of
20,000 at 2,000 callbacks/s). So each process notes its tick time in Redis, and one that
ticks longer after the process before it than an even share of the period brings its next
tick forward, by half the excess and at most MAX_SHIFT_MS. Ticks only ever come earlier: a
claim's horizon (the next tick plus its margin) still covers what falls due before the next
claim, so the shifts cannot make a task late.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Mapping

from timewheel.store import Store

log = logging.getLogger(__name__)

MAX_SHIFT_MS = 100.0  # per tick: the spreading takes a few ticks, never a jump
DEAD_BAND_MS = 5.0  # ticks wander by a ms or two with the event loop: not worth a move
STALE_TICKS = 3  # a process that has not ticked for this many periods counts no more


def shift_ms(me: str, mine_ms: int, others: Mapping[str, int], period_ms: int) -> float:
    """How much earlier this process's next tick should come (0 to MAX_SHIFT_MS).

    ``mine_ms`` and ``others`` (process id -> its last tick) are tick times: only their
    phases, modulo the period, count. Processes that tick at the same phase are told apart by
    their ids: the lower one moves."""
    if not others:
        return 0.0

    def after(proc: str, tick_ms: int) -> int:
        """How long after that process's tick this one comes, within a period."""
        gap = (mine_ms - tick_ms) % period_ms
        return period_ms if gap == 0 and proc > me else gap

    gap = min(after(proc, tick_ms) for proc, tick_ms in others.items())
    excess = gap - period_ms / (len(others) + 1)
    if excess <= DEAD_BAND_MS:
        return 0.0
    return min(excess / 2, MAX_SHIFT_MS)


class TickPhases:
    def __init__(self, store: Store, period_ms: int) -> None:
        self._store = store
        self._period_ms = period_ms
        # This process among the wheel's tickers (unique per process start).
        self.me = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._failing = False

    async def note(self, tick_ms: int) -> float:
        """Note this process's tick at ``tick_ms``; how much earlier its next should come.
        Without Redis it ticks on its own period: spreading is an optimisation only."""
        try:
            ticks = await self._store.note_tick(self.me, tick_ms,
                                                stale_ms=STALE_TICKS * self._period_ms)
        except Exception as exc:  # noted after a tick that worked: rare, so said once
            if not self._failing:
                log.warning("tick not noted (%s: %s): this process ticks on its own period, "
                            "not spread from the others', until it is", type(exc).__name__, exc)
            self._failing = True
            return 0.0
        self._failing = False
        ticks.pop(self.me, None)
        return shift_ms(self.me, tick_ms, ticks, self._period_ms)
