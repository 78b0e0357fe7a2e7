"""The wheel's one clock: Redis's ``TIME``, read through a local monotonic offset.

Every process derives "now" from the same Redis, so skew between hosts cannot make one process
fire early or steal another's claims. ``now_ms()`` is cheap (no round trip): the offset between
the local monotonic clock and Redis's clock is refreshed once per tick.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel.errors import StoreUnavailable


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch, on the wheel's clock."""

    def wall_ms(self) -> float:
        """The same as ``now_ms`` with sub-millisecond precision."""

    async def sleep_until(self, when_ms: float) -> None:
        """Return at or after ``when_ms`` on this clock, never before."""

    async def refresh(self) -> None:
        """Re-read the reference clock (once per tick)."""


class SystemClock:
    """The host's clock. For tests and tools that have no Redis at hand."""

    def wall_ms(self) -> float:
        return time.time() * 1000.0

    def now_ms(self) -> int:
        return int(self.wall_ms())

    async def sleep_until(self, when_ms: float) -> None:
        while (delay := when_ms - self.wall_ms()) > 0:
            await asyncio.sleep(delay / 1000.0)

    async def refresh(self) -> None:
        return None


class RedisClock:
    """Redis ``TIME`` plus the local monotonic clock.

    The offset is taken with the reply's arrival time, so the estimate lags Redis by at most
    one round trip: the wheel's "now" can only be late, never early (invariant 2).
    """

    def __init__(self, redis: Redis | RedisCluster) -> None:
        self._redis = redis
        self._offset_ms: float | None = None

    async def refresh(self) -> None:
        try:
            seconds, micros = await self._redis.time()
        except RedisError as exc:
            raise StoreUnavailable(f"TIME: {exc}") from exc
        received = time.monotonic() * 1000.0
        offset = seconds * 1000.0 + micros / 1000.0 - received
        # Every sample is a lower bound of the true offset (TIME was read before the reply
        # arrived), so the larger of two close samples is the better one. A jump (Redis's clock
        # was stepped, or failover to another host) replaces the estimate.
        if self._offset_ms is not None and abs(offset - self._offset_ms) < 5:
            offset = max(offset, self._offset_ms)
        self._offset_ms = offset

    def wall_ms(self) -> float:
        if self._offset_ms is None:
            # Never fall back to the host's clock: that is how a skewed host fires early.
            raise StoreUnavailable("the wheel's clock has not been read from Redis yet")
        return time.monotonic() * 1000.0 + self._offset_ms

    def now_ms(self) -> int:
        return int(self.wall_ms())

    async def sleep_until(self, when_ms: float) -> None:
        # The event loop's timers may wake a little early; loop until the clock agrees.
        while (delay := when_ms - self.wall_ms()) > 0:
            await asyncio.sleep(delay / 1000.0)


class FakeClock:
    """A clock that moves only when told to (tests). ``sleep_until`` waits for ``advance``."""

    def __init__(self, now_ms: int = 1_800_000_000_000) -> None:
        self._now = float(now_ms)
        self._moved = asyncio.Event()

    def wall_ms(self) -> float:
        return self._now

    def now_ms(self) -> int:
        return int(self._now)

    def advance(self, ms: float) -> None:
        self._now += ms
        self._moved.set()

    def set(self, now_ms: float) -> None:
        self._now = float(now_ms)
        self._moved.set()

    async def sleep_until(self, when_ms: float) -> None:
        while self._now < when_ms:
            self._moved.clear()
            await self._moved.wait()

    async def refresh(self) -> None:
        return None
