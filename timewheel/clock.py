"""The wheel's one clock: Redis's ``TIME``, read through a local monotonic offset.

Every process derives "now" from the same Redis, so skew between hosts cannot make one process
fire early or steal another's claims. ``now_ms()`` is cheap (no round trip): the offset between
the local monotonic clock and Redis's clock is refreshed once per tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from timewheel.errors import StoreUnavailable

log = logging.getLogger(__name__)

# Any fixed key will do, as long as every process uses the same one: it only picks the node.
CLOCK_ROUTE_KEY = "timewheel:clock"
# Quartz is specified to +-20..100 ppm and NTP keeps a host within a few ppm; 100 ppm between
# two hosts costs at most 0.1 ms of lateness per 1 s tick. Faster drift stays bounded by the
# round trip of each refresh (see RedisClock).
DEFAULT_MAX_DRIFT_PPM = 100.0
DEFAULT_STALE_MS = 30_000.0  # a Redis Cluster failover takes cluster-node-timeout (15 s) + a vote


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


@dataclass(frozen=True, slots=True)
class Sample:
    """One ``TIME`` read: the local monotonic clock (ms) when it was sent and when its reply
    came, and Redis's time (epoch ms) in the reply."""

    sent_ms: float
    received_ms: float
    redis_ms: float

    @property
    def lower(self) -> float:
        """The smallest possible offset (Redis minus monotonic) when Redis read its clock."""
        return self.redis_ms - self.received_ms

    @property
    def upper(self) -> float:
        """The largest possible offset then; ``upper - lower`` is the round trip."""
        return self.redis_ms - self.sent_ms

    def lower_at(self, monotonic_ms: float, drift: float) -> float:
        """A lower bound of the offset at ``monotonic_ms``, if the clocks drift apart by at most
        ``drift`` (a fraction: 1e-4 is 100 ppm). Redis read its clock at or after ``sent_ms``."""
        return self.lower - drift * max(0.0, monotonic_ms - self.sent_ms)


class RedisClock:
    """Redis ``TIME`` read through the local monotonic clock: a lower bound that never runs
    ahead of Redis (invariant 2: never fire early).

    **One sample.** A ``TIME`` call sent when the local monotonic clock read ``sent`` and answered
    when it read ``received`` carries Redis's time ``T``, read at some instant in between. The
    true offset (Redis minus monotonic) at that instant therefore lies in
    ``[T - received, T - sent]``: the reply's round trip is the sample's own error bound.

    **Drift.** Two clocks do not tick at the same rate: quartz is off by tens of ppm, and a
    host's time daemon slews. A lower bound taken ``age`` ms ago is still a lower bound now only
    after subtracting ``max_drift_ppm * age``. The estimate is the best *aged* lower bound
    (``Sample.lower_at``), recomputed at every read of the clock, so it also decays between
    refreshes and "now" can only fall behind Redis, by at most the drift allowance: 0.1 ms per
    1 s tick at the default 100 ppm. This is how old samples age out: a tight sample taken over
    a quiet connection keeps winning over fresh ones with slow round trips, until its age costs
    more than their extra round trip, then a fresher one takes over (Cristian's method with
    NTP's growing dispersion).

    **Faster drift or a stepped clock.** If the kept sample's aged lower bound is above the
    new sample's upper bound, the two contradict each other: the clocks drifted faster than the
    allowance, or Redis's clock was stepped back (or failed over to another host). The kept
    sample is dropped. So right after every refresh the estimate is at most the newest sample's
    upper bound: never ahead of the true offset by more than that sample's round trip, whatever
    the drift.

    **Cluster.** Every node has its own clock. Every process reads ``TIME`` from the same node,
    the primary serving the slot of ``route_key`` (nothing is stored under that key), so node
    clocks never skew one process against another. While that node is unreachable (a failover),
    ``refresh`` keeps the aged estimate for up to ``stale_ms``; after that it raises
    ``StoreUnavailable``. (A primary down for good leaves its slots uncovered, and a cluster with
    the default ``cluster-require-full-coverage yes`` refuses every command then anyway.)

    ``monotonic`` (seconds, like ``time.monotonic``) is injectable so tests can drift it.
    """

    def __init__(self, redis: Redis | RedisCluster, *, route_key: str = CLOCK_ROUTE_KEY,
                 monotonic: Callable[[], float] = time.monotonic,
                 max_drift_ppm: float = DEFAULT_MAX_DRIFT_PPM,
                 stale_ms: float = DEFAULT_STALE_MS) -> None:
        self._redis = redis
        self._route_key = route_key
        self._monotonic = monotonic
        self._drift = max_drift_ppm / 1e6
        self._stale_ms = stale_ms
        self._best: Sample | None = None
        # The kept sample's lower bound and send time, read by every wall_ms (dozens of times a
        # callback): plain floats, not the sample's methods (0.34 against 0.51 us a read).
        self._lower: float | None = None
        self._sent_ms = 0.0
        self.last_sample: Sample | None = None  # the newest sample, for tests and diagnostics
        self._failing = False

    async def refresh(self) -> None:
        try:
            sample = await self._read()
        except (RedisError, RedisClusterException) as exc:
            best = self._best
            if best is None or self._monotonic_ms() - best.sent_ms > self._stale_ms:
                raise StoreUnavailable(f"TIME: {type(exc).__name__}: {exc}") from exc
            if not self._failing:
                log.warning("TIME: %s: %s; keeping the clock's estimate for up to %.0f s",
                            type(exc).__name__, exc, self._stale_ms / 1000)
            self._failing = True
            return
        self._failing = False
        self.last_sample = sample
        best = self._best
        # Keep the old sample only while it is the better lower bound and still consistent
        # with the new one; otherwise the new sample replaces it.
        if best is None or not sample.lower < best.lower_at(sample.sent_ms,
                                                             self._drift) <= sample.upper:
            self._best = sample
            self._lower, self._sent_ms = sample.lower, sample.sent_ms

    async def _read(self) -> Sample:
        redis = self._redis
        if isinstance(redis, RedisCluster):
            await redis.initialize()  # a no-op unless a failure asked for a new slot map
            node = redis.get_node_from_key(self._route_key)
            sent = self._monotonic_ms()
            seconds, micros = await redis.time(target_nodes=node)
        else:
            sent = self._monotonic_ms()
            seconds, micros = await redis.time()
        received = self._monotonic_ms()
        return Sample(sent, received, int(seconds) * 1000.0 + int(micros) / 1000.0)

    def _monotonic_ms(self) -> float:
        return self._monotonic() * 1000.0

    def wall_ms(self) -> float:
        lower = self._lower
        if lower is None:
            # Never fall back to the host's clock: that is how a skewed host fires early.
            raise StoreUnavailable("the wheel's clock has not been read from Redis yet")
        now = self._monotonic() * 1000.0
        age = now - self._sent_ms  # the kept sample's lower_at(now), inline
        return now + (lower - self._drift * age if age > 0.0 else lower)

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
