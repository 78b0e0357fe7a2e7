"""Tick phases (timewheel/engine/tick_phase.py): processes of one wheel spread their ticks over
the period, only ever by ticking earlier; what they note in Redis, and the ticker's use of it."""

from __future__ import annotations

import itertools
import logging
import random

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tests.conftest import START_MS
from tests.support.ports import refused_port
from tests.test_ticker import FakeDispatcher, make_ticker
from timewheel.clock import FakeClock
from timewheel.engine.tick_phase import DEAD_BAND_MS, MAX_SHIFT_MS, TickPhases, shift_ms
from timewheel.store import Store

PERIOD = 1000


def test_alone_it_keeps_its_period() -> None:
    assert shift_ms("a", 123_456, {}, PERIOD) == 0.0


def test_of_two_close_together_the_one_after_the_long_gap_moves() -> None:
    """b ticks 100 ms after a: b's gap (100) is short, a's (900, since b) is long. a moves
    earlier, by half its excess over an even share but at most MAX_SHIFT_MS; b stays."""
    assert shift_ms("a", 5_000, {"b": 5_100}, PERIOD) == MAX_SHIFT_MS
    assert shift_ms("b", 5_100, {"a": 5_000}, PERIOD) == 0.0
    assert shift_ms("a", 5_000, {"b": 5_440}, PERIOD) == (560 - 500) / 2


def test_the_same_phase_is_broken_by_the_ids() -> None:
    """Started together: the lower id moves, the other stays (both moving would keep them
    together)."""
    assert shift_ms("a", 7_000, {"b": 9_000}, PERIOD) == MAX_SHIFT_MS
    assert shift_ms("b", 9_000, {"a": 7_000}, PERIOD) == 0.0


def test_spread_ticks_stay_where_they_are() -> None:
    """Even shares, or off by less than the dead band: no move."""
    assert shift_ms("a", 0, {"b": 500}, PERIOD) == 0.0
    assert shift_ms("a", 0, {"b": 500 + DEAD_BAND_MS}, PERIOD) == 0.0
    assert shift_ms("a", 0, {"b": 333, "c": 667}, PERIOD) == 0.0


@pytest.mark.parametrize("processes", [2, 3, 5])
def test_processes_settle_evenly_spread_and_never_tick_late(processes: int) -> None:
    """Processes started at random phases, each ticking at its period minus its shift: within
    a minute of ticks no gap between neighbours is longer than an even share plus the dead band
    (nobody moves within it), so none is shorter than the share less the others' dead bands
    (a ms for rounding either way); no tick ever comes later than a period after the one
    before."""
    rng = random.Random(processes)
    ids = [f"p{i}" for i in range(processes)]
    last = {p: rng.randrange(PERIOD) for p in ids}  # each one's latest tick
    for _ in range(60 * processes):
        p = min(ids, key=lambda q: last[q] + PERIOD)  # who ticks next
        now = last[p] + PERIOD
        shift = shift_ms(p, now, {q: last[q] for q in ids if q != p}, PERIOD)
        assert 0.0 <= shift <= MAX_SHIFT_MS
        last[p] = now - round(shift)
    phases = sorted(t % PERIOD for t in last.values())
    gaps = [b - a for a, b in itertools.pairwise(phases)]
    gaps.append(phases[0] + PERIOD - phases[-1])
    share = PERIOD / processes
    low, high = share - (processes - 1) * DEAD_BAND_MS - 1, share + DEAD_BAND_MS + 1
    assert all(low <= gap <= high for gap in gaps), gaps


async def test_processes_see_each_others_ticks_and_forget_the_stale(store: Store,
                                                                   redis: Redis) -> None:
    """Each process notes its tick in one key; a process silent for three periods is no
    longer counted, and the key expires once every process is gone."""
    a, b = TickPhases(store, PERIOD), TickPhases(store, PERIOD)
    assert await a.note(START_MS) == 0.0  # alone
    assert await b.note(START_MS + 100) == 0.0  # 100 ms after a: a short gap, it stays
    assert await a.note(START_MS + PERIOD) == MAX_SHIFT_MS  # 900 ms after b: it moves
    ticks = await store.note_tick(a.me, START_MS + 2 * PERIOD, stale_ms=3 * PERIOD)
    assert ticks == {a.me: START_MS + 2 * PERIOD, b.me: START_MS + 100}
    ticks = await store.note_tick(a.me, START_MS + 3 * PERIOD + 101, stale_ms=3 * PERIOD)
    assert ticks == {a.me: START_MS + 3 * PERIOD + 101}  # b last ticked over 3 periods ago
    assert 0 < await redis.pttl(store.keys.ticks) <= 3 * PERIOD


class Noting:
    """A TickPhases that answers a fixed shift and remembers the ticks it was told of."""

    def __init__(self, shift: float) -> None:
        self.shift, self.ticks = shift, list[int]()

    async def note(self, tick_ms: int) -> float:
        self.ticks.append(tick_ms)
        return self.shift


async def test_the_ticker_notes_each_pass_and_takes_its_shift(store: Store,
                                                              fake_clock: FakeClock) -> None:
    ticker, _ = make_ticker(store, fake_clock, FakeDispatcher())
    phases = Noting(shift=42.0)
    ticker._phases = phases  # type: ignore[assignment]
    assert await ticker._pass() == 42.0
    fake_clock.advance(PERIOD)
    assert await ticker._pass() == 42.0
    assert phases.ticks == [START_MS, START_MS + PERIOD]


async def test_without_redis_it_ticks_on_its_own_period(
        caplog: pytest.LogCaptureFixture) -> None:
    """Noting the tick fails (nothing listens where Redis should be): no shift, no error for
    the ticker, and one warning however many ticks fail."""
    # A port the test holds, bound and never listening: another worker's Redis cannot take it.
    with refused_port() as port:
        redis = Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))  # fail at once
        store = Store(redis, "tw", retention_ms=60_000, lease_margin_ms=5000)
        phases = TickPhases(store, PERIOD)
        caplog.set_level(logging.WARNING, logger="timewheel.engine.tick_phase")
        assert await phases.note(START_MS) == 0.0
        assert await phases.note(START_MS + PERIOD) == 0.0
    assert [r.getMessage()[:16] for r in caplog.records] == ["tick not noted ("]
    await redis.aclose()
