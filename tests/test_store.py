"""Store scenarios on a real Redis with a FakeClock: cancel, reschedule, lateness, outages,
racing claimers, leases, stale tokens, retention, dead letters and retries.

Claims go through ``claim_all``, which loops over every bucket as timewheel/engine/ticker.py
does.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Iterable
from typing import Literal

import pytest
from redis.asyncio import Redis

from tests.support.redis_server import RedisServer
from timewheel.clock import FakeClock
from timewheel.models import TaskStatus
from timewheel.store import Outcome, ScheduleReply, Store
from timewheel.store.listing import list_tasks
from timewheel.store.record import NOT_STARTED, ClaimedTask, NewTask

MIN = 60_000
LEASE = 10_000 + 5000  # the tasks' timeout + the store fixture's lease margin
_tokens = itertools.count()


def task(key: str, due_ms: int) -> NewTask:
    return NewTask(key=key, url="http://127.0.0.1:9/cb", method="POST", headers=[], body=None,
                   due_ms=due_ms, timeout_ms=10_000, max_attempts=5, backoff_ms=1000,
                   fingerprint=f"fp-{due_ms}", flow="127.0.0.1:9")


async def claim_all(store: Store, now: int, horizon: int | None = None, *, limit: int = 50,
                    prefix: str = "test") -> list[ClaimedTask]:
    """One ticker pass: claim every bucket, again while any says ``more``."""
    horizon = now if horizon is None else horizon
    buckets = list(range(store.keys.buckets))
    claimed: list[ClaimedTask] = []
    for _ in range(10_000):
        if not buckets:
            return claimed
        results = await asyncio.gather(*(
            store.claim(b, now_ms=now, horizon_ms=horizon, limit=limit,
                        token=f"{prefix}.{next(_tokens)}") for b in buckets))
        for _, tasks in results:
            claimed.extend(tasks)
        buckets = [b for b, (more, _) in zip(buckets, results, strict=True) if more]
    raise AssertionError("claim never ran out of `more`")


async def schedule_all(store: Store, tasks: Iterable[NewTask], now: int) -> None:
    todo = list(tasks)
    for i in range(0, len(todo), 50):  # stay within the client's connection pool
        replies = await asyncio.gather(*(store.schedule(t, replace=False, now_ms=now)
                                         for t in todo[i:i + 50]))
        assert set(replies) == {ScheduleReply.CREATED}


async def keys_of(redis: Redis, kind: str) -> list[str]:
    """Names of every ``ms:`` (slice) or ``md:`` (delete-set) key in any bucket."""
    return sorted([k.decode() async for k in redis.scan_iter(match=f"{{tw:*}}:{kind}:*")])


async def test_cancelled_task_never_fires_and_drains(store: Store, redis: Redis,
                                                     fake_clock: FakeClock) -> None:
    """A task due in 10 minutes, cancelled now, is never claimed; its slice and delete-set
    are gone once its minute has passed."""
    now = fake_clock.now_ms()
    await schedule_all(store, [task("doomed", now + 10 * MIN)], now)
    assert await store.cancel("doomed", now_ms=now) == 1
    assert len(await keys_of(redis, "md")) == 1
    while fake_clock.now_ms() <= now + 12 * MIN:
        fake_clock.advance(20_000)
        t = fake_clock.now_ms()
        assert await claim_all(store, t, t + 1250) == []
    assert await keys_of(redis, "ms") == []
    assert await keys_of(redis, "md") == []
    view = await store.get("doomed")
    assert view is not None and view.status is TaskStatus.CANCELLED and view.attempts == 0


async def test_reschedule_across_minutes_fires_once_at_new_time(
        store: Store, fake_clock: FakeClock) -> None:
    """A replace from minute +2 to minute +5 is claimed once, at the new time, not the old."""
    now = fake_clock.now_ms()
    old, new = now + 2 * MIN + 300, now + 5 * MIN + 500
    await schedule_all(store, [task("moved", old)], now)
    assert await store.schedule(task("moved", new), replace=True,
            now_ms=now + 10_000) == ScheduleReply.REPLACED
    steps = sorted({*range(now, now + 7 * MIN, 15_000), old, old + 1, new - 1, new, new + 1})
    seen = []
    for t in steps:
        fake_clock.set(t)
        for c in await claim_all(store, t):
            seen.append((t, c.key, c.due_ms))
            assert await store.complete(c.bucket, now_ms=t, outcomes=[
                Outcome(c.key, c.token, "ok", status_code=200, started_ms=t)]) == [1]
    assert seen == [(new, "moved", new)]


async def test_past_task_is_claimed_at_once(store: Store, fake_clock: FakeClock) -> None:
    """A task whose time has passed is claimed by the very next claim, even in a bucket whose
    cursor is older than now, and a future task beside it is not."""
    now = fake_clock.now_ms()
    later = next(f"later-{i}" for i in range(100) if store.keys.bucket_of(f"later-{i}") == 0)
    late = [k for k in (f"late-{i}" for i in range(100)) if store.keys.bucket_of(k) == 0][:2]
    await schedule_all(store, [task(later, now + 3600_000)], now)
    fake_clock.advance(5 * MIN + 123)
    t = fake_clock.now_ms()
    await schedule_all(store, [task(late[0], now - 30 * MIN), task(late[1], t - 1),
                               task("elsewhere", now - 3 * MIN)], t)
    claimed = await claim_all(store, t)
    assert sorted(c.key for c in claimed) == sorted([*late, "elsewhere"])


async def test_one_hour_outage_claims_everything_once(store: Store, redis: Redis,
                                                      fake_clock: FakeClock) -> None:
    """After 66 minutes without claims, every overdue task is claimed exactly once; no slice or
    delete-set of a drained minute is left and every cursor is at the current minute."""
    now = fake_clock.now_ms()
    tasks = [task(f"t-{i}", now + i * 30_000) for i in range(130)]  # 65 minutes of slices
    assert {store.keys.bucket_of(t.key) for t in tasks} == set(range(16))
    await schedule_all(store, tasks, now)
    for i in range(0, 130, 13):  # moves and cancels leave delete-sets behind
        assert await store.schedule(task(f"t-{i}", now + i * 30_000 + 90_000), replace=True,
                                    now_ms=now) == ScheduleReply.REPLACED
    cancelled = {f"t-{i}" for i in range(5, 130, 13)}
    for key in cancelled:
        assert await store.cancel(key, now_ms=now) == 1
    assert await keys_of(redis, "md") != []
    fake_clock.advance(66 * MIN + 700)
    t = fake_clock.now_ms()
    claimed = await claim_all(store, t, t + 1250, limit=7)
    counts = Counter(c.key for c in claimed)
    assert set(counts.values()) == {1}
    assert set(counts) == {x.key for x in tasks} - cancelled
    assert await claim_all(store, t, t + 1250) == []
    assert await keys_of(redis, "ms") == []
    assert await keys_of(redis, "md") == []
    assert [await redis.zcard(store.keys.minutes(b)) for b in range(16)] == [0] * 16
    cursors = [await redis.get(store.keys.cursor(b)) for b in range(16)]
    assert cursors == [str(t // MIN).encode()] * 16


async def test_two_racing_claimers_split_the_work(store: Store, redis_server: RedisServer,
                                                  fake_clock: FakeClock) -> None:
    """Two claimers with their own clients over 1,000 due tasks: disjoint, and complete."""
    now = fake_clock.now_ms()
    for chunk in range(0, 1000, 250):
        await schedule_all(store, [task(f"r-{i}", now - 5000 + i)
                                   for i in range(chunk, chunk + 250)], now)
    clients = [Redis.from_url(redis_server.url) for _ in range(2)]
    try:
        stores = [Store(c, "tw", retention_ms=store.retention_ms, lease_margin_ms=5000)
                  for c in clients]
        for s in stores:
            await s.init()
        got = await asyncio.gather(*(claim_all(s, now, limit=5, prefix=f"p{n}")
                                     for n, s in enumerate(stores)))
    finally:
        for c in clients:
            await c.aclose()
    first, second = ({c.key for c in g} for g in got)
    assert len(got[0]) == len(first) and len(got[1]) == len(second)
    assert first.isdisjoint(second)
    assert first | second == {f"r-{i}" for i in range(1000)}
    assert first and second  # both did take part


async def claimed_started_and_reclaimed(store: Store, clock: FakeClock
                                        ) -> tuple[ClaimedTask, ClaimedTask]:
    """Claim and start "crash", let its lease run out, and claim it again."""
    now = clock.now_ms()
    await schedule_all(store, [task("crash", now)], now)
    [first] = await claim_all(store, now)
    started = await store.start(first.bucket, claims=[("crash", first.token)])
    assert [s.attempt for s in started] == [1]
    clock.advance(LEASE - 1)
    assert await claim_all(store, clock.now_ms()) == []
    clock.advance(1)
    [second] = await claim_all(store, clock.now_ms())
    return first, second


async def test_expired_lease_is_reclaimed(store: Store, fake_clock: FakeClock) -> None:
    """An attempt that never completes is claimed again by another token once its lease ends;
    the attempts counter remembers the earlier attempt."""
    first, second = await claimed_started_and_reclaimed(store, fake_clock)
    assert (second.key, second.attempts) == ("crash", 1)
    assert second.token != first.token
    assert await store.start(second.bucket, claims=[("crash", first.token)]) == [NOT_STARTED]
    [started] = await store.start(second.bucket, claims=[("crash", second.token)])
    assert started.attempt == 2
    view = await store.get("crash")
    assert view is not None and (view.status, view.attempts) == (TaskStatus.DELIVERING, 2)


async def test_stale_token_cannot_complete(store: Store, redis: Redis,
                                           fake_clock: FakeClock) -> None:
    """After a re-claim the first holder's outcome is refused and writes nothing; the
    re-claimer's outcome stands."""
    first, second = await claimed_started_and_reclaimed(store, fake_clock)
    now = fake_clock.now_ms()
    tkey = store.keys.task("crash")
    before = await redis.get(tkey), await redis.zrange(store.keys.lease(first.bucket), 0, -1)
    stale = Outcome("crash", first.token, "fail", status_code=404, started_ms=now - LEASE)
    assert await store.complete(first.bucket, now_ms=now, outcomes=[stale]) == [0]
    after = await redis.get(tkey), await redis.zrange(store.keys.lease(first.bucket), 0, -1)
    assert after == before
    assert await store.complete(second.bucket, now_ms=now + 50, outcomes=[
        Outcome("crash", second.token, "ok", status_code=204, started_ms=now)]) == [1]
    assert await store.complete(first.bucket, now_ms=now + 60, outcomes=[stale]) == [0]
    view = await store.get("crash")
    assert view is not None
    assert (view.status, view.last_status_code, view.attempts) == (TaskStatus.SUCCEEDED, 204, 1)
    assert await redis.zcard(store.keys.dead(first.bucket)) == 0


async def finish(store: Store, keys: list[str], now: int,
                 kind: Literal["ok", "fail"] = "ok", step: int = 0) -> None:
    """Schedule, claim, start and complete each key; the i-th finishes at now + i * step."""
    await schedule_all(store, [task(k, now) for k in keys], now)
    claimed = {c.key: c for c in await claim_all(store, now)}
    for i, key in enumerate(keys):
        c = claimed[key]
        [started] = await store.start(c.bucket, claims=[(key, c.token)])
        assert started.attempt == 1
        outcome = Outcome(key, c.token, kind, status_code=410, started_ms=now)
        assert await store.complete(c.bucket, now_ms=now + i * step, outcomes=[outcome]) == [1]


async def test_finished_record_expires_after_retention(store: Store, redis: Redis,
                                                       fake_clock: FakeClock) -> None:
    """A finished record carries the retention TTL; with a 200 ms retention it really goes."""
    now = fake_clock.now_ms()
    await finish(store, ["kept"], now)
    assert store.retention_ms - 60_000 < await redis.pttl(store.keys.task("kept")) <= (
        store.retention_ms)
    short = Store(redis, "tw", retention_ms=200, lease_margin_ms=5000)
    await short.init()
    await finish(short, ["brief"], now)
    assert 0 < await redis.pttl(short.keys.task("brief")) <= 200
    assert await short.get("brief") is not None
    for _ in range(500):
        if await short.get("brief") is None:
            break
        await asyncio.sleep(0.02)
    assert await short.get("brief") is None
    assert await redis.exists(short.keys.task("brief")) == 0
    assert await store.get("kept") is not None


@pytest.mark.parametrize("step", [7, 0])
async def test_dead_letters_newest_first_paginated(store: Store, fake_clock: FakeClock,
                                                   step: int) -> None:
    """25 failed tasks over every bucket page out 10, 10, 5, newest first (ties: key
    descending), each exactly once; step 0 puts them all on one millisecond."""
    now = fake_clock.now_ms()
    keys = [f"dead-{i:02d}" for i in range(25)]
    await finish(store, keys, now, kind="fail", step=step)
    await finish(store, ["fine"], now, kind="ok")
    expected = sorted(keys, key=lambda k: (int(k[5:]) * step, k), reverse=True)
    pages, cursor = [], None
    for _ in range(10):
        views, cursor = await list_tasks(store, TaskStatus.FAILED, key_prefix="", limit=10,
                                         cursor=cursor)
        pages.append([v.key for v in views])
        assert all(v.status is TaskStatus.FAILED and v.last_status_code == 410 for v in views)
        if cursor is None:
            break
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [k for p in pages for k in p] == expected


async def test_retry_is_claimed_again_at_next_due(store: Store, fake_clock: FakeClock) -> None:
    """After a retry outcome the task is claimed again only once the clock reaches next_due_ms."""
    now = fake_clock.now_ms()
    await schedule_all(store, [task("again", now)], now)
    [c] = await claim_all(store, now)
    [started] = await store.start(c.bucket, claims=[("again", c.token)])
    assert started.attempt == 1
    nxt = now + 95_000
    assert await store.complete(c.bucket, now_ms=now + 1000, outcomes=[
        Outcome("again", c.token, "retry", status_code=503, next_due_ms=nxt,
                started_ms=now)]) == [1]
    view = await store.get("again")
    assert view is not None and view.status is TaskStatus.RETRYING
    for t in (now + 1000, now + MIN, nxt - 1):
        fake_clock.set(t)
        assert await claim_all(store, t) == []
    fake_clock.set(nxt)
    [again] = await claim_all(store, nxt)
    assert (again.key, again.due_ms, again.attempts) == ("again", nxt, 1)
    assert await claim_all(store, nxt + LEASE - 1) == []
