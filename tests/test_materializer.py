"""The materializer with an injected clock: each occurrence becomes one task, whoever races."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.conftest import START_MS
from tests.support.waiting import wait_until
from timewheel.clock import FakeClock
from timewheel.engine.materializer import Materializer
from timewheel.engine.occurrences import next_after
from timewheel.errors import StoreUnavailable
from timewheel.models import ScheduleCreate, TaskStatus
from timewheel.operations.prepare import template_task
from timewheel.operations.schedules import schedule_store, spec_of
from timewheel.store import ScheduleReply, Store
from timewheel.store.record import NewTask
from timewheel.store.schedule_store import ScheduleStore, occurrence_task, spec_json

NOW = START_MS  # a minute boundary
TICK = 1000
URL = "http://127.0.0.1:9/cb"


def bare_template() -> NewTask:
    """The prepared template of a schedule whose task names only its callback."""
    return template_task({"callback_url": URL}, default_timeout=10.0)


def spec(**fields: Any) -> ScheduleCreate:
    return ScheduleCreate.model_validate({"task": {"callback_url": URL}, **fields})


def schedules_of(store: Store) -> ScheduleStore:
    return schedule_store(store, default_timeout=10.0)


def materializer(store: Store, schedules: ScheduleStore | None = None,
                 **kwargs: Any) -> Materializer:
    return Materializer(store, schedules or schedules_of(store), clock=None,  # type: ignore[arg-type]
                        tick_ms=TICK, **kwargs)


async def put(schedules: ScheduleStore, schedule_id: str, now: int = NOW, **fields: Any) -> None:
    body = spec(**fields)
    await schedules.put(schedule_id, spec_of(body), paused=body.paused, now_ms=now,
                        next_after=next_after)


async def task_keys(redis: Redis) -> list[str]:
    """Keys of every task record in Redis, sorted."""
    return sorted([raw.decode().partition("}:t:")[2] async for raw in redis.scan_iter("*}:t:*")])


async def statuses(store: Store, keys: list[str]) -> dict[str, TaskStatus | None]:
    views = await asyncio.gather(*(store.get(k) for k in keys))
    return {k: (v.status if v else None) for k, v in zip(keys, views, strict=True)}


class DyingStore:
    """A Store whose process dies between reserving an occurrence and creating its task."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def schedule_args(self, task: NewTask, *args: Any) -> list[Any]:
        raise StoreUnavailable("the process died")  # before its create reached Redis


# -- materializing ------------------------------------------------------------------------------

async def test_every_second_is_materialized_two_ticks_ahead(store: Store, redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "hb", every=1)
    m = materializer(store, schedules)
    assert await m.tick(NOW) == 1
    assert await task_keys(redis) == [f"hb.{NOW + 1000}", f"hb.{NOW + 2000}"]
    view = await store.get(f"hb.{NOW + 1000}")
    assert view is not None and view.execute_at_ms == NOW + 1000
    assert view.status == TaskStatus.SCHEDULED and view.callback_url == URL
    await m.tick(NOW + 1000)
    await m.tick(NOW + 1000)  # a second pass in the same tick finds nothing new
    assert await task_keys(redis) == [f"hb.{NOW + s * 1000}" for s in (1, 2, 3)]
    assert m.created == 3
    record = await schedules.get("hb")
    assert record is not None and record.next_ms == NOW + 4000 and record.hi_ms == NOW + 3000


async def test_two_materializers_racing_create_each_occurrence_once(store: Store,
                                                                    redis: Redis) -> None:
    schedules = schedules_of(store)
    ids = [f"s{i}" for i in range(40)]
    for i in ids:
        await put(schedules, i, every=1)
    await put(schedules, "cron", cron="*/2 * * * * *")
    first, second = materializer(store), materializer(store)
    for step in range(8):
        now = NOW + step * TICK
        await asyncio.gather(first.tick(now), second.tick(now + 1), first.tick(now + 2))
    keys = await task_keys(redis)
    expected = {f"{i}.{NOW + s * 1000}" for i in ids for s in range(1, 10)}
    expected |= {f"cron.{NOW + s * 1000}" for s in range(2, 10, 2)}
    assert set(keys) == expected
    assert first.created + second.created == len(expected)  # every create was the first one


async def test_a_cron_schedule_fires_on_its_seconds_only(store: Store, redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "c", cron="*/2 * * * * *")
    m = materializer(store, schedules)
    for step in range(5):
        await m.tick(NOW + 1 + step * TICK)
    occurrences = [int(k.rpartition(".")[2]) for k in await task_keys(redis)]
    assert occurrences == [NOW + 2000, NOW + 4000, NOW + 6000]
    assert all(o % 2000 == 0 for o in occurrences)


async def test_a_reservation_whose_creator_died_is_created_by_another(store: Store,
                                                                      redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "a", every=60)
    dying = materializer(DyingStore(store))  # type: ignore[arg-type]
    await dying.tick(NOW + 58_500)  # reserves NOW+60s, dies before creating it
    assert await task_keys(redis) == []
    other = materializer(store)
    await other.tick(NOW + 59_000)  # the lease has not run out yet: nothing to do
    assert await task_keys(redis) == []
    await other.tick(NOW + 58_500 + other.lease_ms)
    assert await task_keys(redis) == [f"a.{NOW + 60_000}"]
    assert other.recovered == 1 and other.created == 1


async def test_after_an_outage_only_the_latest_missed_occurrence_fires(store: Store,
                                                                       redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "a", every=10)
    m = materializer(store)
    await m.tick(NOW + 9000)  # materializes NOW+10s
    # Every process is down for a minute and a half. The process that comes back cannot tell
    # whether others ran meanwhile: it waits three ticks for one that can, then judges.
    for second in range(3):
        await m.tick(NOW + 100_500 + second * 1000)
        assert await task_keys(redis) == [f"a.{NOW + 10_000}"] and m.skipped == 0
    await m.tick(NOW + 103_500)
    assert await task_keys(redis) == [f"a.{NOW + 10_000}", f"a.{NOW + 100_000}"]
    assert m.skipped == 1
    await m.tick(NOW + 108_500)
    assert (await task_keys(redis))[-1] == f"a.{NOW + 110_000}"


async def test_a_late_tick_within_grace_skips_nothing(store: Store, redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "a", every=1)
    m = materializer(store)
    await m.tick(NOW)
    await m.tick(NOW + 3500)  # one tick missed: a hiccup, not an outage
    assert await task_keys(redis) == [f"a.{NOW + s * 1000}" for s in range(1, 6)]
    assert m.skipped == 0


async def test_a_slow_pass_while_another_process_runs_skips_nothing(store: Store,
                                                                   redis: Redis) -> None:
    """One process's pass comes 5 s late (a stall, a Redis blip) while another process kept
    passing: the wheel was up, so no occurrence is skipped (only a wheel that was down as a
    whole skips to the latest missed one)."""
    schedules = schedules_of(store)
    await put(schedules, "a", every=1)
    slow, other = materializer(store), materializer(store)
    await slow.tick(NOW)
    await schedules.mark_pass(NOW + 5000)  # the other process's passes went on meanwhile
    await slow.tick(NOW + 5500)
    await slow.tick(NOW + 5600)  # four made up a pass (CATCH_UP_PER_PASS), then the rest
    assert await task_keys(redis) == [f"a.{NOW + s * 1000}" for s in range(1, 8)]
    assert slow.skipped == 0 and other.skipped == 0


async def test_an_outage_of_redis_alone_skips_nothing_for_a_process_that_ran_through_it(
        store: Store, redis: Redis) -> None:
    """Redis away for 8 s (stopped, full, a Redis Cluster master failing over) while the
    process runs: its loop tried every tick, so not every process was down, and every
    occurrence fires once (docs/api.md), late, a few at a time (CATCH_UP_PER_PASS). Before,
    any outage longer than two ticks skipped: an outside audit saw a cluster's failover skip
    occurrences of every schedule while both processes ran."""
    schedules = schedules_of(store)
    await put(schedules, "a", every=1)
    await put(schedules, "b", every=1)
    away, mark = False, schedules.mark_pass

    async def mark_pass(now_ms: int) -> int | None:
        if away:
            raise StoreUnavailable("mark pass: ConnectionError: Connection refused")
        return await mark(now_ms)

    schedules.mark_pass = mark_pass  # type: ignore[method-assign]
    running = materializer(store, schedules)
    await running.tick(NOW)
    away = True
    for second in range(1, 9):
        with pytest.raises(StoreUnavailable):
            await running.tick(NOW + second * 1000)
    away = False
    for second in range(9, 12):
        await running.tick(NOW + second * 1000)
    assert running.skipped == 0
    # Made up four at a time, then two ticks ahead again.
    assert await task_keys(redis) == sorted(f"{i}.{NOW + s * 1000}" for i in "ab"
                                            for s in range(1, 14))


async def test_a_process_started_while_redis_was_away_waits_for_one_that_ran_through(
        store: Store, redis: Redis) -> None:
    """A process started during an outage of Redis (a deploy during a failover) cannot tell
    whether every process was down. Its pass comes first once Redis is back: it waits for a
    process that ran through the outage, whose pass makes up every missed occurrence, and then
    goes on as up. Before, it judged the wheel down at once and skipped what it reserved first
    (occurrences a running process would have made up): the contract skips them only when
    every process was down."""
    schedules = schedules_of(store)
    await put(schedules, "a", every=1)
    away, mark, last = False, schedules.mark_pass, schedules.last_pass

    async def mark_pass(now_ms: int) -> int | None:
        if away:
            raise StoreUnavailable("mark pass: ConnectionError: Connection refused")
        return await mark(now_ms)

    async def last_pass() -> int | None:
        if away:
            raise StoreUnavailable("read last pass: ConnectionError: Connection refused")
        return await last()

    schedules.mark_pass = mark_pass  # type: ignore[method-assign]
    schedules.last_pass = last_pass  # type: ignore[method-assign]
    running, started = materializer(store, schedules), materializer(store, schedules)
    await running.tick(NOW)
    away = True
    for second in range(1, 9):
        with pytest.raises(StoreUnavailable):
            await running.tick(NOW + second * 1000)
        if second >= 5:  # started while Redis was away
            with pytest.raises(StoreUnavailable):
                await started.tick(NOW + second * 1000 + 500)
    away = False
    await started.tick(NOW + 8600)  # first: it waits
    assert await task_keys(redis) == [f"a.{NOW + 1000}", f"a.{NOW + 2000}"]
    for second in range(9, 13):
        await running.tick(NOW + second * 1000)
        await started.tick(NOW + second * 1000 + 500)
    assert running.skipped == 0 and started.skipped == 0
    assert await task_keys(redis) == sorted(f"a.{NOW + s * 1000}" for s in range(1, 15))


async def test_a_schedule_that_is_not_behind_fires_on_time_during_the_wait(
        store: Store, redis: Redis) -> None:
    """While a process waits for a witness (the wheel was away, it cannot tell why), the
    schedules that are not behind are materialized as usual: no judgement touches them."""
    schedules = schedules_of(store)
    m = materializer(store)
    await m.tick(NOW)
    await put(schedules, "b", now=NOW + 60_000, every=1)  # put while every process was down
    await m.tick(NOW + 60_500)  # waits
    assert await task_keys(redis) == [f"b.{NOW + s * 1000}" for s in (61, 62)]
    assert await schedules.last_pass() == NOW  # a waiting process marks nothing


async def test_ten_thousand_schedules_are_bounded_per_tick(store: Store, redis: Redis) -> None:
    schedules = schedules_of(store)
    # Seeded through one pipeline of sched_put calls, as PUT /schedules would store them.
    text, script = spec_json(spec_of(spec(every=60))), schedules.scripts["sched_put"]
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(10_000):
            await script(keys=[schedules.prefix(schedules.bucket_of(f"n{i}"))],
                         args=[f"n{i}", "", text, "0", NOW + 60_000, NOW, f"r{i}"], client=pipe)
        await pipe.execute()
    m = materializer(store, schedules, max_per_tick=2500, batch=250)
    per_tick = []
    for step in range(8):
        per_tick.append(await m.tick(NOW + 58_500 + step))
    assert all(n <= 2500 for n in per_tick), per_tick  # the bound of one tick
    assert per_tick[0] > 0 and per_tick[-1] == 0 and sum(per_tick) == 10_000
    assert m.created == 10_000
    assert len(await task_keys(redis)) == 10_000


# -- settling outstanding occurrences -----------------------------------------------------------

async def test_finished_occurrences_are_forgotten(store: Store, redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "a", every=60)
    m = materializer(store, schedules)
    await m.tick(NOW + 59_000)
    occ = NOW + 60_000
    socc, soccl = (schedules.prefix(schedules.bucket_of("a")) + name for name in ("socc", "soccl"))
    assert await redis.zrange(socc, 0, -1) == [
        f"a {occ}".encode()]
    await m.tick(occ + m.settle_ms)  # still scheduled: looked at again later
    assert await redis.zcard(socc) == 1
    await store.cancel(f"a.{occ}", now_ms=occ)
    await m.tick(occ + m.settle_ms + m.recheck_ms)
    assert await redis.zcard(socc) == 0
    assert await redis.zcard(soccl) == 0


# -- pause, delete, resume ----------------------------------------------------------------------

async def test_pause_with_a_reservation_in_progress_leaves_nothing_to_start(
        store: Store, redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "a", every=1)
    await materializer(store).tick(NOW)  # NOW+1s and NOW+2s created
    await materializer(DyingStore(store)).tick(NOW + 1000)  # NOW+3s reserved, not created
    outstanding = await schedules.pause("a")
    assert outstanding == [NOW + 1000, NOW + 2000, NOW + 3000]
    await schedules.cancel_occurrences("a", outstanding, {"callback_url": URL}, now_ms=NOW + 1001)
    # The stalled creator wakes up and creates its occurrence: refused.
    late = occurrence_task("a", NOW + 3000, bare_template())
    assert await store.schedule(late, replace=False, now_ms=NOW + 1002) == ScheduleReply.CONFLICT
    keys = await task_keys(redis)
    assert set((await statuses(store, keys)).values()) == {TaskStatus.CANCELLED}
    # No process materializes or recovers anything of a paused schedule.
    m = materializer(store)
    for step in range(2, 12):
        await m.tick(NOW + step * TICK)
    assert await task_keys(redis) == keys and m.created == 0 and m.recovered == 0
    _, claimed = await store.claim(schedules.bucket_of("x"), now_ms=NOW + 20_000,
                                   horizon_ms=NOW + 20_000, limit=100, token="t")
    assert claimed == []


async def test_delete_cancels_created_and_tombstones_reserved(store: Store, redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "a", every=1)
    await materializer(store).tick(NOW)
    await materializer(DyingStore(store)).tick(NOW + 1000)
    found = await schedules.delete("a")
    assert found is not None
    outstanding, template = found
    assert template == {"callback_url": URL}
    await schedules.cancel_occurrences("a", outstanding, template, now_ms=NOW + 1001)
    keys = await task_keys(redis)
    assert keys == [f"a.{NOW + s * 1000}" for s in (1, 2, 3)]
    assert set((await statuses(store, keys)).values()) == {TaskStatus.CANCELLED}
    # The reserved one is a tombstone: its creator's late create is refused.
    late = occurrence_task("a", NOW + 3000, bare_template())
    assert await store.schedule(late, replace=False, now_ms=NOW + 1002) == ScheduleReply.CONFLICT
    view = await store.get(f"a.{NOW + 3000}")
    assert view is not None and view.callback_url == URL and view.execute_at_ms == NOW + 3000
    m = materializer(store)
    await m.tick(NOW + 10_000)
    assert await task_keys(redis) == keys and await schedules.get("a") is None


async def test_a_pause_whose_caller_died_is_finished_by_the_materializer(
        store: Store, redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "a", every=60)
    m = materializer(store, schedules)
    await m.tick(NOW + 59_000)
    assert await schedules.pause("a") == [NOW + 60_000]  # ... and the caller dies here
    await m.tick(NOW + 59_000 + m.settle_ms + 1000)
    await m.tick(NOW + 60_000 + m.settle_ms)
    assert m.cancelled == 1
    assert (await statuses(store, [f"a.{NOW + 60_000}"])) == {
        f"a.{NOW + 60_000}": TaskStatus.CANCELLED}


async def test_resume_starts_from_now_without_backlog(store: Store, redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "a", every=10)
    await schedules.pause("a")
    assert await schedules.resume("a", now_ms=NOW + 95_000, next_after=next_after)
    m = materializer(store, schedules)
    await m.tick(NOW + 99_000)
    assert await task_keys(redis) == [f"a.{NOW + 100_000}"] and m.skipped == 0


async def test_replace_never_reuses_an_occurrence_time(store: Store, redis: Redis) -> None:
    schedules = schedules_of(store)
    await put(schedules, "a", every=1)
    m = materializer(store, schedules)
    await m.tick(NOW)  # NOW+1s, NOW+2s
    await put(schedules, "a", now=NOW + 10, every=1, task={"callback_url": URL + "?v=2"})
    await m.tick(NOW + 1000)
    keys = await task_keys(redis)
    assert keys == [f"a.{NOW + s * 1000}" for s in (1, 2, 3)]
    view = await store.get(f"a.{NOW + 3000}")
    assert view is not None and view.callback_url == URL + "?v=2"


async def test_occurrences_carry_the_templates_result_callbacks(store: Store,
                                                                redis: Redis) -> None:
    """A template's on_success / on_failure go to each occurrence's task (stored beside it)."""
    schedules = schedules_of(store)
    body = ScheduleCreate.model_validate({"every": 1, "task": {
        "callback_url": URL, "on_failure": "http://127.0.0.1:9/failed"}})
    await schedules.put("rs", spec_of(body), paused=False, now_ms=NOW, next_after=next_after)
    await materializer(store, schedules).tick(NOW)
    view = await store.get(f"rs.{NOW + 1000}")
    assert view is not None
    assert (view.on_success, view.on_failure) == (None, "http://127.0.0.1:9/failed")


# -- materialize_soon: a schedule put with an occurrence before the next pass ---------------

LONG_TICK = 60_000  # run() passes once at its start, then not again within a test


def soon_passes() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "timewheel-materialize-soon"]


async def has_task(redis: Redis, key: str) -> bool:
    return key in await task_keys(redis)


async def test_an_occurrence_before_the_next_pass_is_materialized_as_the_schedule_is_put(
        store: Store, redis: Redis) -> None:
    """A pass materializes only what falls due before the pass after it (plus a tick), so a
    schedule put with an occurrence sooner would have it made a task at the next pass, up to
    a tick after it is due. While run() runs, the put tells the materializer, which passes
    over the schedule's bucket at once; so does a resume. An occurrence after the next pass
    starts nothing. After stop(), nobody is told."""
    clock = FakeClock(NOW)
    schedules = schedules_of(store)
    m = Materializer(store, schedules, clock, tick_ms=LONG_TICK)
    m.start()
    try:
        await wait_until(lambda: m.downtime.passed_ms == NOW, "the first pass")
        await put(schedules, "soon", every=1)
        await wait_until(lambda: has_task(redis, f"soon.{NOW + 1000}"), "the occurrence's task")
        await wait_until(lambda: soon_passes() == [], "that pass to end")
        await put(schedules, "later", every=LONG_TICK * 10 // 1000)
        later = await schedules.get("later")
        assert later is not None and later.next_ms == NOW + LONG_TICK * 10
        assert soon_passes() == []
        await schedules.pause("soon")
        clock.advance(40_000)
        assert await schedules.resume("soon", now_ms=clock.now_ms(), next_after=next_after)
        resumed = await schedules.get("soon")
        assert resumed is not None and resumed.next_ms is not None
        assert resumed.next_ms < clock.now_ms() + LONG_TICK
        await wait_until(lambda: has_task(redis, f"soon.{resumed.next_ms}"), "resumed")
    finally:
        await m.stop()
    assert schedules.next_soon.__name__ == "_nobody_listens"
    await put(schedules, "after-stop", now=clock.now_ms(), every=1)
    assert soon_passes() == []
    assert not [k for k in await task_keys(redis) if k.startswith(("later.", "after-stop."))]


async def test_no_pass_yet_no_materializing_soon(store: Store, redis: Redis) -> None:
    """Before this process has passed (within grace), it cannot tell whether the wheel was
    down (which decides what a pass fires of missed occurrences): a put leaves the schedule to
    the first pass."""
    clock = FakeClock(NOW)
    schedules = schedules_of(store)
    m = Materializer(store, schedules, clock, tick_ms=LONG_TICK)
    schedules.next_soon = m.materialize_soon  # as run() does, before its first pass
    await put(schedules, "early", every=1)
    assert soon_passes() == []
    assert await task_keys(redis) == []


async def test_no_materializing_soon_during_the_pass_after_an_outage(store: Store,
                                                                     redis: Redis) -> None:
    """The first pass after an outage fires only the latest missed occurrence. A schedule put
    in the same bucket while that pass is under way must not pass the bucket as if the wheel
    had been up (it would fire every missed occurrence): a pass counts once it is whole."""
    clock = FakeClock(NOW + 9000)
    schedules = schedules_of(store)
    m = Materializer(store, schedules, clock, tick_ms=TICK)
    schedules.next_soon = m.materialize_soon  # as run() does
    await put(schedules, "a", every=10)
    await m.tick(NOW + 9000)  # materializes NOW + 10 s
    clock.advance(91_500)  # every process down for a minute and a half
    for _ in range(3):  # it waits for a process that can tell whether it was (none comes)
        await m.tick(clock.now_ms())
        clock.advance(1000)
    bucket = schedules.bucket_of("a")
    other = next(f"b{i}" for i in range(10_000) if schedules.bucket_of(f"b{i}") == bucket)
    reading, go_on = asyncio.Event(), asyncio.Event()
    due = schedules.due

    async def slow_due(b: int, **kwargs: Any) -> Any:
        if b == bucket and not go_on.is_set():
            reading.set()
            await go_on.wait()  # the pass's read of this bucket, a little slow
        return await due(b, **kwargs)

    schedules.due = slow_due  # type: ignore[method-assign]
    passing = asyncio.create_task(m.tick(clock.now_ms()))
    await wait_until(reading.is_set, "the pass to be reading the bucket")
    await put(schedules, other, now=clock.now_ms(), every=1)  # an occurrence within the tick
    assert soon_passes() == []
    go_on.set()
    await passing
    assert [k for k in await task_keys(redis) if k.startswith("a.")] == [
        f"a.{NOW + 10_000}", f"a.{NOW + 100_000}"]
    assert m.skipped == 1


async def test_a_wait_for_a_witness_that_redis_interrupts_starts_again(
        store: Store, redis: Redis) -> None:
    """The three ticks a process waits for a witness are ticks in which it reads Redis. A
    wait that another outage interrupts starts again when Redis is back: counted from its
    first tick, it ended at once then, and the process skipped what a witness that ran
    through both outages would have made up."""
    schedules = schedules_of(store)
    await put(schedules, "a", every=1)
    away, last = False, schedules.last_pass

    async def last_pass() -> int | None:
        if away:
            raise StoreUnavailable("read last pass: ConnectionError: Connection refused")
        return await last()

    schedules.last_pass = last_pass  # type: ignore[method-assign]
    await schedules.mark_pass(NOW)  # the last pass before the first outage
    started = materializer(store, schedules)
    await started.tick(NOW + 5000)  # started during the outage; Redis answers: it waits
    away = True
    for second in range(6, 20):  # Redis away again
        with pytest.raises(StoreUnavailable):
            await started.tick(NOW + second * 1000)
    away = False
    await started.tick(NOW + 20_000)  # back: it waits again, and judges nothing yet
    assert started.skipped == 0 and await task_keys(redis) == []
    assert await schedules.last_pass() == NOW
