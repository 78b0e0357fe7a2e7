"""Each ``lua/sched_*.lua`` on its own: seed raw state, run it once, assert the whole state after.

State is a dict of the bucket's keys (prefix stripped): a hash is a dict, a zset
{member: score}.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from tests.conftest import START_MS
from timewheel.models import TaskStatus
from timewheel.operations.prepare import template_task
from timewheel.operations.schedules import schedule_store
from timewheel.store import ScheduleReply, Store
from timewheel.store.record import NewTask
from timewheel.store.schedule_store import occurrence_task
from timewheel.store.scripts import source

NOW = START_MS
URL = "http://127.0.0.1:9/cb"


def bare_template() -> NewTask:
    """The prepared template of a schedule whose task names only its callback."""
    return template_task({"callback_url": URL}, default_timeout=10.0)


P = "{tw:3}:"
LEASE = 2000
RET = 7 * 86_400_000
SPEC = '{"cron":null,"every":60,"task":{"callback_url":"http://127.0.0.1:9/cb"},"timezone":"UTC"}'


def record(**extra: Any) -> dict[str, str]:
    """A live, running schedule record as sched_put writes it, plus ``extra``."""
    row: dict[str, Any] = {"spec": SPEC, "paused": "0", "ver": 3, "created": NOW - 600_000,
                           "next": NOW + 60_000, "hi": NOW, "op": "put1", "opc": 0}
    row.update(extra)
    return {k: str(v) for k, v in row.items() if v is not None}


async def seed(redis: Redis, state: dict[str, Any]) -> None:
    for short, value in state.items():
        if short.startswith(("s:", "t:")):
            await redis.hset(P + short, mapping=value)
        else:
            await redis.zadd(P + short, value)


async def dump(redis: Redis, records: bool = True) -> dict[str, Any]:
    """Every key in Redis (without task records: ``records=False``); all in bucket 3."""
    out: dict[str, Any] = {}
    async for raw in redis.scan_iter(match="*"):
        name = raw.decode()
        assert name.startswith(P), f"key outside the bucket: {name}"
        if not records and name.startswith(P + "t:"):
            continue
        if (await redis.type(raw)).decode() == "hash":
            value: Any = {k.decode(): v.decode() for k, v in (await redis.hgetall(raw)).items()}
        else:
            value = {m.decode(): int(s) for m, s in await redis.zrange(raw, 0, -1, withscores=True)}
        out[name[len(P):]] = value
    return out


async def run(redis: Redis, name: str, *args: Any) -> Any:
    return await redis.register_script(source(name))(keys=[P], args=list(args))


def outstanding(*occs: int, schedule: str = "a", at: int = NOW + LEASE,
                also: tuple[str, ...] = ()) -> dict[str, Any]:
    """The socc/soccl entries of ``schedule``'s occurrences, plus members ``also``."""
    members = [f"{schedule} {o}" for o in occs] + list(also)
    return {"socc": dict.fromkeys(members, at), "soccl": dict.fromkeys(members, 0)}


# -- sched_put ----------------------------------------------------------------------------------

async def test_put_creates_a_running_schedule(redis: Redis) -> None:
    assert await run(redis, "sched_put", "a", "", SPEC, "0", NOW + 60_000, NOW, "r1") == [0]
    assert await dump(redis) == {
        "s:a": {"spec": SPEC, "paused": "0", "ver": str(NOW), "created": str(NOW),
                "next": str(NOW + 60_000), "op": "r1", "opc": "0"},
        "sdue": {"a": NOW + 60_000}, "sids": {"a": 0}}


async def test_put_replaces_keeping_created_hi_and_outstanding(redis: Redis) -> None:
    await seed(redis, {"s:a": record(), "sdue": {"a": NOW + 60_000}, "sids": {"a": 0},
                       **outstanding(NOW)})
    assert await run(redis, "sched_put", "a", "3", "{}", "0", NOW + 120_000, NOW, "r2") == [1]
    assert await dump(redis) == {
        "s:a": {"spec": "{}", "paused": "0", "ver": str(NOW), "created": str(NOW - 600_000),
                "next": str(NOW + 120_000), "hi": str(NOW), "op": "r2", "opc": "1"},
        "sdue": {"a": NOW + 120_000}, "sids": {"a": 0}, **outstanding(NOW)}


async def test_put_paused_hands_back_outstanding_occurrences(redis: Redis) -> None:
    await seed(redis, {"s:a": record(), "sdue": {"a": NOW + 60_000}, "sids": {"a": 0},
                       **outstanding(NOW, NOW + 1000, also=(f"a.b {NOW}",))})
    reply = await run(redis, "sched_put", "a", "3", SPEC, "1", "", NOW, "r2")
    assert reply == [1, NOW, NOW + 1000]  # not a.b's
    state = await dump(redis)
    assert state["s:a"] == {"spec": SPEC, "paused": "1", "ver": str(NOW),
                            "created": str(NOW - 600_000), "hi": str(NOW), "op": "r2",
                            "opc": "1"}
    assert "sdue" not in state  # left for the caller to cancel, then drop
    assert state["socc"] == {f"a {NOW}": NOW + LEASE, f"a {NOW + 1000}": NOW + LEASE,
                             f"a.b {NOW}": NOW + LEASE}


async def test_put_stale_version_writes_nothing(redis: Redis) -> None:
    seeded = {"s:a": record(), "sdue": {"a": NOW + 60_000}, "sids": {"a": 0}}
    await seed(redis, seeded)
    assert await run(redis, "sched_put", "a", "2", "{}", "0", NOW, NOW, "r2") == [-3]
    assert await run(redis, "sched_put", "a", "", "{}", "0", NOW, NOW, "r3") == [-3]
    assert await dump(redis) == seeded


async def test_put_resent_answers_as_the_first_call(redis: Redis) -> None:
    seeded = {"s:a": record(op="r1", opc=0), "sdue": {"a": NOW + 60_000}, "sids": {"a": 0}}
    await seed(redis, seeded)
    # The first call created it (ver 3 now); redis-py re-sends it with its old expectation.
    assert await run(redis, "sched_put", "a", "", SPEC, "0", NOW + 60_000, NOW, "r1") == [0]
    assert await dump(redis) == seeded


async def test_put_over_a_deleted_record_creates_and_keeps_hi(redis: Redis) -> None:
    """A schedule created again over its deleted record gets a version never used before
    (at least now_ms): a process holding the old spec cached by (id, version) must not
    take the new schedule for the old one, as it could if the record had expired and the
    version started again at 1."""
    await seed(redis, {"s:a": record(state="deleted", paused="1", next=None, op="d1"),
                       **outstanding(NOW)})
    assert await run(redis, "sched_put", "a", "", SPEC, "0", NOW + 60_000, NOW + 5, "r2") == [
        0, NOW]
    state = await dump(redis)
    assert state["s:a"] == {"spec": SPEC, "paused": "0", "ver": str(NOW + 5),
                            "created": str(NOW + 5),
                            "next": str(NOW + 60_000), "hi": str(NOW), "op": "r2", "opc": "0"}
    assert state["sdue"] == {"a": NOW + 60_000} and state["sids"] == {"a": 0}
    assert await redis.pttl(P + "s:a") == -1


# -- sched_reserve ------------------------------------------------------------------------------

async def test_reserve_advances_next_and_records_outstanding(redis: Redis) -> None:
    await seed(redis, {"s:a": record(), "sdue": {"a": NOW + 60_000}, "sids": {"a": 0}})
    nxt, occ = NOW + 120_000, NOW + 60_000
    assert await run(redis, "sched_reserve", NOW, LEASE, "a", "3", str(occ), nxt, 1, occ) == [1]
    assert await dump(redis) == {
        "s:a": record(next=nxt, hi=occ), "sdue": {"a": nxt}, "sids": {"a": 0},
        **outstanding(occ)}


async def test_reserve_several_occurrences_and_groups(redis: Redis) -> None:
    await seed(redis, {"s:a": record(next=NOW + 1000), "s:b": record(ver=7),
                       "sdue": {"a": NOW + 1000, "b": NOW + 60_000}})
    reply = await run(redis, "sched_reserve", NOW, LEASE,
                      "a", "3", str(NOW + 1000), NOW + 3000, 2, NOW + 1000, NOW + 2000,
                      "b", "6", str(NOW + 60_000), NOW + 120_000, 1, NOW + 60_000)  # b: stale
    assert reply == [1, 0]
    assert await dump(redis) == {
        "s:a": record(next=NOW + 3000, hi=NOW + 2000), "s:b": record(ver=7),
        "sdue": {"a": NOW + 3000, "b": NOW + 60_000}, **outstanding(NOW + 1000, NOW + 2000)}


@pytest.mark.parametrize("change", [
    {"paused": "1"}, {"ver": "4"}, {"next": str(NOW + 1)}, {"state": "deleted"}])
async def test_reserve_refuses_what_changed_since_the_read(redis: Redis,
                                                           change: dict[str, str]) -> None:
    seeded = {"s:a": {**record(), **change}, "sdue": {"a": NOW + 60_000}}
    await seed(redis, seeded)
    assert await run(redis, "sched_reserve", NOW, LEASE, "a", "3", str(NOW + 60_000),
                     NOW + 120_000, 1, NOW + 60_000) == [0]
    assert await dump(redis) == seeded


async def test_reserve_of_a_missing_schedule_writes_nothing(redis: Redis) -> None:
    assert await run(redis, "sched_reserve", NOW, LEASE, "a", "3", str(NOW), NOW + 1000, 1,
                     NOW) == [0]
    assert await dump(redis) == {}


async def test_reserve_resent_answers_reserved_without_writing(redis: Redis) -> None:
    occ, nxt = NOW + 60_000, NOW + 120_000
    seeded = {"s:a": record(next=nxt, hi=occ), "sdue": {"a": nxt}, **outstanding(occ)}
    await seed(redis, seeded)
    assert await run(redis, "sched_reserve", NOW + 5, LEASE, "a", "3", str(occ), nxt, 1,
                     occ) == [1]
    assert await dump(redis) == seeded


# -- sched_drop, sched_pause, sched_resume, sched_delete -------------------------------------

async def test_drop_forgets_outstanding_occurrences(redis: Redis) -> None:
    await seed(redis, outstanding(NOW, NOW + 1000))
    assert await run(redis, "sched_drop", f"a {NOW}", "a 5") == 1
    assert await dump(redis) == outstanding(NOW + 1000)


async def test_pause_hands_back_outstanding_and_bumps_the_version(redis: Redis) -> None:
    await seed(redis, {"s:a": record(), "sdue": {"a": NOW + 60_000}, "sids": {"a": 0},
                       **outstanding(NOW)})
    assert await run(redis, "sched_pause", "a") == [1, NOW]
    assert await dump(redis) == {"s:a": record(paused="1", ver=4, next=None), "sids": {"a": 0},
                                 **outstanding(NOW)}


async def test_pause_again_writes_nothing_and_hands_back_what_is_left(redis: Redis) -> None:
    seeded = {"s:a": record(paused="1", next=None), **outstanding(NOW)}
    await seed(redis, seeded)
    assert await run(redis, "sched_pause", "a") == [0, NOW]
    assert await dump(redis) == seeded


@pytest.mark.parametrize("name", ["sched_pause", "sched_delete"])
async def test_pause_or_delete_unknown(redis: Redis, name: str) -> None:
    await seed(redis, {"s:b": record(state="deleted", op="d0")})
    assert await run(redis, name, "a", "d1", 1000) == [-1]
    assert await run(redis, name, "b", "d1", 1000) == [-1]
    assert await dump(redis) == {"s:b": record(state="deleted", op="d0")}


async def test_resume_sets_next_and_bumps_the_version(redis: Redis) -> None:
    await seed(redis, {"s:a": record(paused="1", next=None), "sids": {"a": 0}})
    assert await run(redis, "sched_resume", "a", "3", NOW + 60_000) == 1
    assert await dump(redis) == {"s:a": record(ver=4), "sdue": {"a": NOW + 60_000},
                                 "sids": {"a": 0}}


@pytest.mark.parametrize(("seeded", "version", "code"), [
    ({"s:a": record()}, "3", 0),  # running: nothing to do
    ({"s:a": record(paused="1", next=None)}, "2", -3),  # changed since read
    ({"s:a": record(paused="1", state="deleted")}, "3", -1),
    ({}, "3", -1),
])
async def test_resume_refusals_write_nothing(redis: Redis, seeded: dict[str, Any],
                                             version: str, code: int) -> None:
    await seed(redis, seeded)
    assert await run(redis, "sched_resume", "a", version, NOW + 60_000) == code
    assert await dump(redis) == seeded


async def test_delete_marks_deleted_keeps_hi_and_hands_back_outstanding(redis: Redis) -> None:
    await seed(redis, {"s:a": record(), "sdue": {"a": NOW + 60_000}, "sids": {"a": 0, "b": 0},
                       **outstanding(NOW)})
    assert await run(redis, "sched_delete", "a", "d1", 3_600_000) == [1, NOW]
    assert await dump(redis) == {
        "s:a": record(state="deleted", op="d1", paused="1", ver=4, next=None),
        "sids": {"b": 0}, **outstanding(NOW)}
    assert 3_590_000 < await redis.pttl(P + "s:a") <= 3_600_000
    # The same call re-sent answers the same; another DELETE finds nothing.
    assert await run(redis, "sched_delete", "a", "d1", 3_600_000) == [1, NOW]
    assert await run(redis, "sched_delete", "a", "d2", 3_600_000) == [-1]


# -- sched_tombstone ----------------------------------------------------------------------------
# Through ScheduleStore.tombstone and the task store's own reader: the task record's layout is
# the task store's business, the tombstone's contract is what a reader and a create see.

async def test_tombstone_writes_a_cancelled_record_when_the_task_is_missing(
        store: Store, redis: Redis) -> None:
    schedules = schedule_store(store, default_timeout=10.0)
    task = occurrence_task("a", NOW, bare_template())
    assert await schedules.tombstone(task, now_ms=NOW + 5) is True
    view = await store.get(task.key)
    assert view is not None
    assert (view.status, view.callback_url, view.attempts) == (TaskStatus.CANCELLED, URL, 0)
    assert (view.execute_at_ms, view.finished_ms) == (NOW, NOW + 5)
    assert RET - 60_000 < await redis.pttl(store.keys.task(task.key)) <= RET
    # The late create of the same occurrence is refused; so is a second tombstone.
    assert await store.schedule(task, replace=False, now_ms=NOW + 6) == ScheduleReply.CONFLICT
    assert await schedules.tombstone(task, now_ms=NOW + 7) is False
    assert await store.get(task.key) == view


async def test_tombstone_leaves_an_existing_task_alone(store: Store, redis: Redis) -> None:
    schedules = schedule_store(store, default_timeout=10.0)
    task = occurrence_task("a", NOW, bare_template())
    assert await store.schedule(task, replace=False, now_ms=NOW) == ScheduleReply.CREATED
    before = await store.get(task.key)
    assert await schedules.tombstone(task, now_ms=NOW + 5) is False
    assert await store.get(task.key) == before
    assert before is not None and before.status == TaskStatus.SCHEDULED
    assert await redis.pttl(store.keys.task(task.key)) == -1


# -- the read-only ones -------------------------------------------------------------------------

async def test_due_returns_live_running_schedules_up_to_until(redis: Redis) -> None:
    seeded = {"s:a": record(next=NOW), "s:b": record(next=NOW + 500, ver=9),
              "s:c": record(next=NOW + 5000), "s:p": record(paused="1"),
              "sdue": {"a": NOW, "b": NOW + 500, "c": NOW + 5000, "p": NOW, "x": NOW}}
    await seed(redis, seeded)
    reply = await run(redis, "sched_due", NOW + 1000, 10)
    assert reply == [4, b"a", b"3", str(NOW).encode(), b"b", b"9", str(NOW + 500).encode()]
    assert (await run(redis, "sched_due", NOW + 1000, 1))[0] == 1
    # From a time on: what is behind it is left out (a process that waits for a witness).
    reply = await run(redis, "sched_due", NOW + 1000, 10, NOW + 1)
    assert reply == [1, b"b", b"9", str(NOW + 500).encode()]
    assert await dump(redis) == seeded


async def test_checks_return_due_members_with_their_schedule_state(redis: Redis) -> None:
    seeded = {"s:a": record(), "s:p": record(paused="1"), "s:d": record(state="deleted"),
              "socc": {f"a {NOW}": NOW, f"p {NOW}": NOW - 5, f"d {NOW}": NOW - 1,
                       f"x {NOW}": NOW - 2, f"a {NOW + 1}": NOW + 1}}
    await seed(redis, seeded)
    reply = await run(redis, "sched_checks", NOW, 10)
    assert reply[0] == 4
    assert dict(zip(reply[1::2], reply[2::2], strict=True)) == {
        f"p {NOW}".encode(): b"paused", f"d {NOW}".encode(): b"gone",
        f"x {NOW}".encode(): b"gone", f"a {NOW}".encode(): b"active"}
    assert await dump(redis) == seeded
