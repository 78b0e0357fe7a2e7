"""SoonClaims: claims, between two ticks, the tasks made due before the next one.

A tick claims what falls due up to the next tick (plus a margin). A task made due sooner than
that after its bucket was claimed (a ``POST`` with a short delay, a reschedule, a replay, one
or in bulk, a short retry, a result task, a topic's fan-out, an occurrence materialized just
now) would wait for the next tick: up to a tick late. The store tells the ticker of each task
it makes due (``Store.due_soon``); this claims the task's bucket shortly before the task is
due.

- **When.** ``SOON_LEAD_MS`` before the earliest such task of the bucket, and at least
  ``SOON_LINGER_MS`` after being told: creates close together, or a steady stream of them with
  the same delay, share a claim (the claim takes every task of the bucket due up to the next
  tick, not only the one told of). A task due more than ``SOON_LEAD_MS`` after the next
  tick is left to that tick.
- **Bounded work.** One claim at a time here, over all buckets, each within the room the
  tick's own claims leave (``Ticker._claim_within_room`` reserves a claim's room while it is
  out, and leaves one not answered in a second to finish on its own); a claim that answers
  "more" goes on while there is room.
- **Never in the way.** A failed claim only leaves the task to the next tick, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from timewheel.clock import Clock

log = logging.getLogger(__name__)

# A claim this long before the earliest task told of: the dispatcher takes a task off its
# timeline START_LEAD_MS (20 ms) before it is due, on a 5 ms grid, after the claim's round trip.
SOON_LEAD_MS = 50
# And at least this long after being told, so that creates close together share one claim.
SOON_LINGER_MS = 5


class SoonClaims:
    def __init__(self, clock: Clock, *, tick_ms: int,
                 claim: Callable[[int], Awaitable[tuple[bool, int] | None]]) -> None:
        self._clock = clock
        self._tick_ms = tick_ms
        # The ticker's claim of a bucket within the room left: (more, claimed), None for no
        # room. One at a time with the tick's own claims (Ticker._claim_within_room).
        self._claim = claim
        self._due: dict[int, float] = {}  # bucket -> when to claim it (the wheel's ms)
        self._changed = asyncio.Event()
        self._stopping = False

    def told(self, bucket: int, due_ms: int) -> None:
        """``Store.due_soon``: a task of ``bucket`` is now due at ``due_ms``. Never raises
        (it runs inside the write that told it, after that write succeeded)."""
        if self._stopping:
            return
        try:
            now = self._clock.now_ms()
        except Exception:  # the clock not read yet: leave it to the next tick
            return
        if due_ms >= now + self._tick_ms + SOON_LEAD_MS:  # the next tick claims it in time
            return
        at = max(now + SOON_LINGER_MS, due_ms - SOON_LEAD_MS)
        if self._due.get(bucket, float("inf")) > at:
            self._due[bucket] = at
            self._changed.set()

    @property
    def pending(self) -> dict[int, float]:
        """The buckets to claim, each with when (the wheel's ms)."""
        return dict(self._due)

    def stop(self) -> None:
        self._stopping = True
        self._changed.set()

    async def run(self) -> None:
        """Claim each bucket told of at its time, one claim at a time, until ``stop()``."""
        while not self._stopping:
            if not self._due:
                self._changed.clear()
                await self._changed.wait()
                continue
            bucket, at = min(self._due.items(), key=lambda item: item[1])
            if at > self._clock.wall_ms():
                await self._sleep_until(at)
                continue
            del self._due[bucket]  # a task told of from here on gets a claim of its own
            more = True
            try:
                while more and not self._stopping:
                    within = await self._claim(bucket)
                    more = within is not None and within[0]  # no room: left to a tick
            except Exception as exc:  # the task waits for the next tick, as without this
                log.debug("claim of bucket %d for a task due soon failed: %s", bucket, exc)

    async def _sleep_until(self, at: float) -> None:
        """Until ``at`` or until ``told`` sets an earlier time (or ``stop``)."""
        self._changed.clear()
        sleeper = asyncio.ensure_future(self._clock.sleep_until(at))
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({sleeper, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            changed.cancel()
