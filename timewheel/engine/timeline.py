"""Timeline: holds items until their millisecond, on one coroutine for all of them.

A tick may claim a thousand tasks at once; giving each its own sleeping coroutine right away
costs ~20 us per task in one go, enough to stall the event loop for tens of milliseconds, and
so to make other tasks late. A heap and one waiter cost a push per task.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from timewheel.clock import Clock

Item = TypeVar("Item")
log = logging.getLogger(__name__)


class Timeline(Generic[Item]):
    def __init__(self, clock: Clock, fire: Callable[[Item], None]) -> None:
        self._clock = clock
        self._fire = fire
        self._heap: list[tuple[float, int, Item]] = []
        self._order = itertools.count()  # ties keep their arrival order; items never compare
        self._wake = asyncio.Event()  # set by an item earlier than the runner sleeps for, or
        # when that sleep is over
        self._runner: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, when_ms: float, item: Item) -> None:
        """Call ``fire(item)`` once the clock reaches ``when_ms``."""
        entry = (when_ms, next(self._order), item)
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:
            self._wake.set()  # the waiter sleeps for a later time: wake it
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name="timewheel-timeline")

    def drain(self) -> list[Item]:
        """Take every item out, unfired (shutdown)."""
        items = [item for _, _, item in self._heap]
        self._heap.clear()
        return items

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
            self._runner = None

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            if not self._heap:
                await self._wake.wait()
                continue
            when = self._heap[0][0]
            if when <= self._clock.wall_ms():
                while self._heap and self._heap[0][0] <= self._clock.wall_ms():
                    item = heapq.heappop(self._heap)[2]
                    try:
                        self._fire(item)
                    except Exception:  # one bad item must not stop the line for the others
                        log.exception("timeline: an item failed to fire; the others go on")
                continue
            # One task a wake, which sets the same event as an earlier item does (a task for
            # each of the two, asyncio.wait and a gather cost 60-75 us more a wake, at 200
            # wakes a second at the 5 ms grid; bench/README.md, "Permits given back together").
            sleeper = asyncio.ensure_future(self._wake_at(when))
            try:
                await self._wake.wait()
            finally:
                sleeper.cancel()  # woken by an earlier item (or closed): that sleep is moot

    async def _wake_at(self, when_ms: float) -> None:
        """Wake the runner at ``when_ms``; also if the clock fails (the runner reads it again
        and sees the error itself)."""
        with contextlib.suppress(Exception):
            await self._clock.sleep_until(when_ms)
        self._wake.set()
