"""RedisClock: its "now" never runs ahead of Redis's clock (invariant 2: never fire early).

Most tests drive the clock with a simulated ``TIME`` source and a simulated local monotonic
clock that share one simulated real time, so hours of drift take milliseconds and the true
offset is known exactly. One test uses the real redis-server with a drifting monotonic clock.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError

from timewheel.clock import DEFAULT_MAX_DRIFT_PPM, RedisClock
from timewheel.errors import StoreUnavailable

EPOCH_MS = 1_800_000_000_000.0
EPS_MS = 0.002  # float rounding at epoch-ms magnitudes, plus TIME's whole microseconds


class SimulatedRedis:
    """A ``TIME`` source and a local monotonic clock on one simulated real time (ms).

    Redis's clock is real time plus ``step_ms``; the monotonic clock runs ``1 + drift`` times as
    fast as real time. Each ``TIME`` call takes ``out_ms`` to reach Redis and ``back_ms`` to
    return (drawn by ``delays``), so the sample's round trip is known to the test too.
    """

    def __init__(self, *, drift: float, delays: Iterator[tuple[float, float]]) -> None:
        self.t = 0.0
        self.drift = drift
        self.step_ms = 0.0
        self.delays = delays
        self.down = False

    def redis_ms(self) -> float:
        return EPOCH_MS + self.t + self.step_ms

    def monotonic(self) -> float:
        return (5_000_000.0 + self.t * (1 + self.drift)) / 1000.0

    async def time(self) -> tuple[int, int]:
        if self.down:
            raise ConnectionError("Connection refused (simulated)")
        out_ms, back_ms = next(self.delays)
        self.t += out_ms
        micros = int(self.redis_ms() * 1000)  # Redis truncates to whole microseconds
        self.t += back_ms
        return micros // 1_000_000, micros % 1_000_000


def random_delays(seed: int, low_ms: float, high_ms: float) -> Iterator[tuple[float, float]]:
    """Round trips spread log-uniformly over [low, high], split at random between out and back."""
    rng = random.Random(seed)
    while True:
        rtt = low_ms * (high_ms / low_ms) ** rng.random()
        out = rtt * rng.random()
        yield out, rtt - out


def clock_on(sim: SimulatedRedis, **kwargs: float) -> RedisClock:
    return RedisClock(sim, monotonic=sim.monotonic, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("drift_ppm", [DEFAULT_MAX_DRIFT_PPM * 0.9, -DEFAULT_MAX_DRIFT_PPM * 0.9])
async def test_never_ahead_of_redis_while_drift_is_within_the_allowance(drift_ppm: float) -> None:
    """Two simulated hours of 1 s ticks with round trips of 0.05-20 ms: at every refresh and at
    random instants between them, the clock's "now" is at or behind Redis's.

    With the local clock running fast, the true offset shrinks by 0.09 ms a second; keeping the
    largest offset seen (the old estimate) ran up to 5 ms ahead of Redis."""
    sim = SimulatedRedis(drift=drift_ppm / 1e6, delays=random_delays(1, 0.05, 20.0))
    clock = clock_on(sim)
    rng = random.Random(2)
    worst = -float("inf")
    for _ in range(7200):
        await clock.refresh()
        worst = max(worst, clock.wall_ms() - sim.redis_ms())
        for _ in range(3):
            sim.t += rng.uniform(0, 333)
            worst = max(worst, clock.wall_ms() - sim.redis_ms())
    assert worst <= EPS_MS


async def test_faster_drift_is_bounded_by_the_round_trip_at_each_refresh() -> None:
    """Drift far beyond the allowance (1 %, a time daemon slewing hard): right after each
    refresh the clock is never ahead of Redis by more than that sample's round trip."""
    sim = SimulatedRedis(drift=0.01, delays=random_delays(3, 0.05, 1.0))
    clock = clock_on(sim)
    excess = []
    for _ in range(2000):
        await clock.refresh()
        sample = clock.last_sample
        assert sample is not None
        excess.append(clock.wall_ms() - sim.redis_ms() - sample.received_ms + sample.sent_ms)
        sim.t += 50
    assert max(excess) <= EPS_MS


async def test_redis_clock_stepped_back_a_little_is_followed_at_once() -> None:
    """Redis's clock stepped back by 3 ms (its host's time daemon, or a failover to another
    host): the very next refresh follows it. The old estimate ignored jumps under 5 ms."""
    sim = SimulatedRedis(drift=0.0, delays=iter(lambda: (0.1, 0.1), None))
    clock = clock_on(sim)
    await clock.refresh()
    sim.t += 1000
    sim.step_ms = -3.0
    await clock.refresh()
    assert clock.wall_ms() - sim.redis_ms() <= EPS_MS
    assert clock.wall_ms() - sim.redis_ms() > -0.3  # it did follow: behind by about a round trip


async def test_a_tight_sample_outlives_fresher_loose_ones_until_its_age_costs_more() -> None:
    """A sample over a quiet connection (0.1 ms round trip) stays the estimate while later
    samples come back slowly (10 ms); once its drift allowance has grown past what the slow
    samples lose, a fresher sample takes over. The estimate stays behind Redis throughout."""
    slow = False

    def delays() -> Iterator[tuple[float, float]]:
        while True:
            yield (5.0, 5.0) if slow else (0.05, 0.05)

    sim = SimulatedRedis(drift=0.0, delays=delays())
    clock = clock_on(sim)
    await clock.refresh()
    slow = True
    for _ in range(10):
        sim.t += 1000
        await clock.refresh()
        # Still the tight sample's estimate (behind by 0.05 ms + 0.1 ms a second of its age),
        # not the slow samples' (behind by their 5 ms return trip).
        assert sim.redis_ms() - clock.wall_ms() < 1.2
        assert clock.wall_ms() <= sim.redis_ms() + EPS_MS
    sim.t += 200_000  # 200 s: the tight sample's allowance (20 ms) now exceeds a slow one's
    await clock.refresh()
    lag = sim.redis_ms() - clock.wall_ms()
    assert 4.0 < lag <= 5.1 + EPS_MS  # the fresh slow sample: behind by its return trip


async def test_keeps_its_estimate_through_a_short_outage_then_gives_up() -> None:
    """A failed TIME (the clock's node failing over) keeps the aged estimate for up to
    ``stale_ms``; after that, and before any first reading, the clock raises."""
    sim = SimulatedRedis(drift=0.0, delays=iter(lambda: (0.1, 0.1), None))
    clock = clock_on(sim, stale_ms=30_000)
    sim.down = True
    with pytest.raises(StoreUnavailable):
        await clock.refresh()
    with pytest.raises(StoreUnavailable):
        clock.wall_ms()
    sim.down = False
    await clock.refresh()
    sim.down = True
    sim.t += 20_000
    await clock.refresh()
    assert clock.wall_ms() <= sim.redis_ms() + EPS_MS
    sim.t += 20_000
    with pytest.raises(StoreUnavailable):
        await clock.refresh()


async def test_real_redis_with_a_fast_monotonic_clock(redis: Redis) -> None:
    """The real redis-server's TIME, a local monotonic clock running 10 % fast: right after each
    refresh the clock is at most one round trip ahead of a TIME read afterwards, plus the 10 %
    it gains from the sample's reply to the reading (a preempted test process reads later:
    under a loaded CI host that alone was 0.1 ms)."""
    import time

    base = time.monotonic()

    def fast() -> float:
        return base + (time.monotonic() - base) * 1.10

    clock = RedisClock(redis, monotonic=fast)
    excess = []
    for _ in range(300):
        await clock.refresh()
        now = clock.wall_ms()
        read_at = fast() * 1000
        seconds, micros = await redis.time()
        sample = clock.last_sample
        assert sample is not None
        gained = 0.10 * (read_at - sample.received_ms) / 1.10  # 10 % of the real time since
        excess.append(now - (seconds * 1000 + micros / 1000)
                      - (sample.received_ms - sample.sent_ms) - gained)
    assert max(excess) <= 0.05, sorted(excess)[-5:]


@pytest.mark.parametrize("drift_ppm", [DEFAULT_MAX_DRIFT_PPM * 0.9, -DEFAULT_MAX_DRIFT_PPM * 0.9])
async def test_wall_ms_is_exactly_the_kept_samples_aged_lower_bound(drift_ppm: float) -> None:
    """``wall_ms`` reads the kept sample's bound from plain floats: to the last bit it is
    ``now + kept.lower_at(now)``, whether the newest sample replaced the kept one or not, and
    also when the monotonic clock reads before the kept sample's send (no negative age)."""
    sim = SimulatedRedis(drift=drift_ppm / 1e6, delays=random_delays(4, 0.05, 20.0))
    clock = clock_on(sim)
    rng = random.Random(5)
    kept = replaced = before_sent = 0
    for _ in range(3000):
        await clock.refresh()
        best = clock._best
        assert best is not None
        if best is clock.last_sample:
            replaced += 1
        else:
            kept += 1
        after = sim.t
        for step in (-rng.uniform(0, 40), rng.uniform(0, 333), rng.uniform(0, 333)):
            sim.t = max(after, sim.t) + step  # the first probe may precede the kept sample
            now = sim.monotonic() * 1000.0
            before_sent += now < best.sent_ms
            assert clock.wall_ms() == now + best.lower_at(now, clock._drift)
    assert kept > 100 and replaced > 100 and before_sent > 100  # every path ran
