"""Each Lua script on its own: seed raw state, run it once, assert the whole bucket afterwards
(tests/support/bucket_state.py: a record is its decoded layout-2 fields)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from tests.support.bucket_state import (
    M0,
    MARGIN,
    MIN,
    NOW,
    RET,
    B,
    P,
    assert_ttls,
    cancelled,
    claim,
    delivering,
    dump,
    minutes,
    rec,
    run,
    schedule,
    seed,
)
from timewheel.store import Store, layout
from timewheel.store.keys import Keyspace

FINISHED = ["succeeded", "failed", "cancelled"]
KEPT = 20  # attempts kept per task
LOST = "no outcome within its lease: its process died or stalled"
INDEX = {"succeeded": "fs", "failed": "ff", "cancelled": "fc"}


# -- schedule ------------------------------------------------------------------------------------

async def test_schedule_creates_task_slice_and_cursor(store: Store, redis: Redis) -> None:
    """A new task: its record, its minute's slice entry and index, the cursor at now's minute."""
    due = NOW + 90_000
    assert await schedule(store, "a", due) == 0
    assert await dump(redis) == {"t:a": rec(due=due, op="r1"), f"ms:{M0 + 1}": {"a": due},
                                 **minutes(M0 + 1), "cur": str(M0)}
    await assert_ttls(redis, {})


async def test_schedule_create_repeat_and_conflict(store: Store, redis: Redis) -> None:
    """Create over an existing key: 2 with the same fingerprint, -1 with another; no writes."""
    await seed(redis, {"t:a": rec(), f"ms:{M0}": {"a": NOW}, **minutes(M0), "cur": str(M0)})
    before = await dump(redis)
    assert await schedule(store, "a", NOW + 5, fp="fp") == 2
    assert await schedule(store, "a", NOW + 5, fp="other") == -1
    assert await dump(redis) == before


async def test_schedule_replace_scheduled(store: Store, redis: Redis) -> None:
    """Replace moves the task: the old minute's delete-set gets the key, the new slice the entry."""
    old, new = NOW + 61_000, NOW + 3 * MIN + 7
    await seed(redis, {"t:a": rec(due=old), f"ms:{M0 + 1}": {"a": old}, **minutes(M0 + 1),
                       "cur": str(M0), f"md:{M0 + 3}": {"a", "z"}})
    assert await schedule(store, "a", new, mode="replace", now=NOW + 1000) == 1
    assert await dump(redis) == {
        "t:a": rec(due=new, created=NOW + 1000, op="r1", opr=1), f"ms:{M0 + 1}": {"a": old},
        f"md:{M0 + 1}": {"a"}, f"ms:{M0 + 3}": {"a": new}, f"md:{M0 + 3}": {"z"},
        **minutes(M0 + 1, M0 + 3), "cur": str(M0)}


async def test_schedule_replace_clamped_task_marks_the_cursor_minute(store: Store,
                                                                     redis: Redis) -> None:
    """A task whose due time is before the cursor sits in the cursor's slice: a replace marks
    that minute's delete-set (the record keeps no minute: it is max(due minute, cursor))."""
    late = NOW - 5 * MIN
    await seed(redis, {"t:a": rec(due=late), f"ms:{M0}": {"a": late}, **minutes(M0),
                       "cur": str(M0)})
    assert await schedule(store, "a", NOW + MIN, mode="replace") == 1
    assert await dump(redis) == {
        "t:a": rec(due=NOW + MIN, op="r1", opr=1), f"ms:{M0}": {"a": late}, f"md:{M0}": {"a"},
        f"ms:{M0 + 1}": {"a": NOW + MIN}, **minutes(M0, M0 + 1), "cur": str(M0)}


async def test_schedule_replace_delivering_drops_lease(store: Store, redis: Redis) -> None:
    """Replacing a claimed task removes its lease and claim token; no delete-set is touched."""
    await seed(redis, {"t:a": delivering(started=True, attempts=1), "ls": {"a": NOW + 15_000},
                       "cl:tok": ["a"], "cur": str(M0)})
    assert await schedule(store, "a", NOW + 2 * MIN, mode="replace") == 1
    assert await dump(redis) == {"t:a": rec(due=NOW + 2 * MIN, op="r1", opr=1),
                                 f"ms:{M0 + 2}": {"a": NOW + 2 * MIN}, **minutes(M0 + 2),
                                 "cl:tok": ["a"], "cur": str(M0)}


@pytest.mark.parametrize("status", FINISHED)
async def test_schedule_replace_finished_creates(store: Store, redis: Redis, status: str) -> None:
    """A finished task is created afresh: reply 0, TTL and finished-index entry gone."""
    await seed(redis, {"t:a": rec(status, finished=NOW - 5, last_code=500),
                       INDEX[status]: {"a": NOW - 5, "b": NOW - 6}, "cur": str(M0)})
    await redis.pexpire(P + "t:a", RET)
    assert await schedule(store, "a", NOW + 10, mode="replace") == 0
    assert await dump(redis) == {"t:a": rec(due=NOW + 10, op="r1"), f"ms:{M0}": {"a": NOW + 10},
                                 **minutes(M0), INDEX[status]: {"b": NOW - 6}, "cur": str(M0)}
    await assert_ttls(redis, {})


@pytest.mark.parametrize("cursor", [M0, None])
async def test_schedule_past_due_is_clamped_to_cursor(store: Store, redis: Redis,
                                                      cursor: int | None) -> None:
    """A due time before the cursor's minute lands in the cursor's slice, keeping its due_ms;
    with no cursor yet, one is created at now's minute and the task lands there."""
    now, due = NOW + 5 * MIN + 1, NOW - 10 * MIN
    if cursor is not None:
        await seed(redis, {"cur": str(cursor)})
    minute = M0 + 5 if cursor is None else cursor
    assert await schedule(store, "a", due, now=now) == 0
    assert await dump(redis) == {"t:a": rec(due=due, created=now, op="r1"),
                                 f"ms:{minute}": {"a": due}, **minutes(minute),
                                 "cur": str(minute)}


async def test_schedule_refuses_a_record_of_the_v1_layout(store: Store, redis: Redis) -> None:
    """A key that still holds a v1 hash is refused with OLDLAYOUT before anything is written."""
    await redis.hset(P + "t:a", mapping={"status": "scheduled"})
    with pytest.raises(ResponseError, match="OLDLAYOUT"):
        await schedule(store, "a", NOW + 10, mode="replace")
    assert sorted(await redis.keys("*")) == [b"tw:buckets", (P + "t:a").encode()]


async def test_schedule_refuses_a_malformed_record(store: Store, redis: Redis) -> None:
    with pytest.raises(ResponseError, match="malformed"):
        await run(store, "schedule", "a", "create", NOW, "r1", b"\x02" + bytes(90))
    assert await redis.keys("*") == [b"tw:buckets"]


# -- cancel --------------------------------------------------------------------------------------

async def test_cancel_scheduled(store: Store, redis: Redis) -> None:
    """Lazy cancel: key into the minute's delete-set, slice entry left, record expires, the
    task joins the cancelled index."""
    due = NOW + 10 * MIN
    await seed(redis, {"t:a": rec(due=due), f"ms:{M0 + 10}": {"a": due}, **minutes(M0 + 10),
                       "cur": str(M0)})
    assert await run(store, "cancel", "a", NOW + 3, RET, "r1", KEPT) == 1
    assert await dump(redis) == {"t:a": rec("cancelled", due=due, finished=NOW + 3, op="r1"),
                                 f"ms:{M0 + 10}": {"a": due}, f"md:{M0 + 10}": {"a"},
                                 **minutes(M0 + 10), **cancelled({"a": NOW + 3}), "cur": str(M0)}
    await assert_ttls(redis, {"t:a": RET})


async def test_cancel_delivering_not_started(store: Store, redis: Redis) -> None:
    """Cancelling a claimed task not yet started removes its lease and its claim: the holder
    cannot start; the attempt it stopped is in the history as cancelled."""
    await seed(redis, {"t:a": delivering(attempts=1), "ls": {"a": NOW + 15_000, "b": NOW + 9},
                       "cl:tok": ["a"], "cur": str(M0)})
    assert await run(store, "cancel", "a", NOW + 3, RET, "r1", KEPT) == 1
    assert history_parsed(await dump(redis)) == {
        "t:a": rec("cancelled", finished=NOW + 3, op="r1", attempts=1),
        "ls": {"b": NOW + 9}, **cancelled({"a": NOW + 3}), "cl:tok": ["a"], "cur": str(M0),
        "a:a": [{"e": "stopped by a DELETE before it was sent", "o": "cancelled", "n": 2}]}
    await assert_ttls(redis, {"t:a": RET, "a:a": RET})
    assert await run(store, "start", "a", "tok") == [0, b"", b"", b""]


@pytest.mark.parametrize(("kind", "code", "err", "shown"), [
    ("ok", 200, "", "ok"), ("retry", 503, "HTTP 503", "failed"), ("fail", 404, "HTTP 404", "fail")])
async def test_cancel_delivering_in_flight_keeps_the_claim_for_the_history(
        store: Store, redis: Redis, kind: str, code: int, err: str, shown: str) -> None:
    """Cancelling a task whose attempt started keeps that claim, so the attempt's answer goes
    into the history (complete answers 2 and drops the lease), and its lease, so that no
    answer at all goes in as lost (claim.lua); the task stays cancelled, and nothing starts
    on the claim again. The answer is the task's last status, as the history says (they
    disagreed: an outside audit), and one that would have been retried is failed there: no
    attempt follows."""
    await seed(redis, {"t:a": delivering(started=True, attempts=1),
                       "ls": {"a": NOW + 15_000}, "cur": str(M0)})
    assert await run(store, "cancel", "a", NOW + 3, RET, "r1", KEPT) == 1
    record = rec("cancelled", finished=NOW + 3, op="r1", attempts=1)
    assert await dump(redis) == {"t:a": {**record, "claim": layout.digest("tok"),
                                         "started": 1}, "ls": {"a": NOW + 15_000},
                                 **cancelled({"a": NOW + 3}), "cur": str(M0)}
    assert await run(store, "start", "a", "tok") == [0, b"", b"", b""]
    answer = outcome("a", kind, code, err, due=NOW + 9000 if kind == "retry" else "")
    assert await run(store, "complete", NOW + 300, RET, KEPT, *answer) == [2]
    assert history_parsed(await dump(redis)) == {
        "t:a": rec("cancelled", finished=NOW + 3, op="r1", attempts=1, last_at=NOW + 100,
                   last_code=code, last_err=err),
        **cancelled({"a": NOW + 3}), "cur": str(M0),
        "a:a": [{**json.loads(entry("a", kind)), "o": shown}]}
    await assert_ttls(redis, {"t:a": RET, "a:a": RET})
    assert await run(store, "complete", NOW + 301, RET, KEPT, *answer) == [0]


async def test_an_answer_for_a_cancelled_record_without_a_ttl_keeps_its_history(
        store: Store, redis: Redis) -> None:
    """(A review's doubt.) The history entry takes the record's PTTL; a record without one (a
    PERSIST by hand) answered -1, and PEXPIRE with -1 deletes the list it was just added to."""
    await seed(redis, {"t:a": delivering(started=True, attempts=1), "cur": str(M0)})
    assert await run(store, "cancel", "a", NOW + 3, RET, "r1", KEPT) == 1
    await redis.persist(P + "t:a")
    assert await run(store, "complete", NOW + 300, RET, KEPT, *outcome("a", "ok", 200)) == [2]
    assert (await dump(redis))["a:a"] == [entry("a", "ok")]


async def test_history_keeps_the_newest_entries(store: Store, redis: Redis) -> None:
    """At most `kept` entries stay, the newest; 0 keeps none."""
    for n in range(4):
        await seed(redis, {"t:a": delivering(attempts=n, started=True)})
        args = [*outcome("a", "retry", 503, due=NOW + 5)[:-2], json.dumps({"n": n}), ""]
        assert await run(store, "complete", NOW, RET, 3, *args) == [1]
    assert (await dump(redis))["a:a"] == [json.dumps({"n": n}) for n in (1, 2, 3)]
    await redis.delete(f"{P}a:a")
    await seed(redis, {"t:a": delivering(started=True)})
    assert await run(store, "complete", NOW, RET, 0, *outcome("a", "ok", 200)) == [1]
    assert "a:a" not in await dump(redis)


async def test_cancel_repeated_by_a_client_retry_answers_the_same(store: Store,
                                                                  redis: Redis) -> None:
    """redis-py re-sends a call whose reply was lost with the same arguments (request id
    included): the repeat answers 1 again (the API's 204), not -2 (409), and writes nothing;
    another request is refused."""
    await seed(redis, {"t:a": rec(due=NOW + MIN), f"ms:{M0 + 1}": {"a": NOW + MIN},
                       **minutes(M0 + 1), "cur": str(M0)})
    assert await run(store, "cancel", "a", NOW + 3, RET, "r1", KEPT) == 1
    state = await dump(redis)
    assert await run(store, "cancel", "a", NOW + 4, RET, "r1") == 1
    assert await dump(redis) == state
    assert await run(store, "cancel", "a", NOW + 3, RET, "r2") == -2


@pytest.mark.parametrize("status", FINISHED)
async def test_cancel_finished_or_missing_is_refused(store: Store, redis: Redis,
                                                     status: str) -> None:
    """A finished task cannot be cancelled (-2), an unknown one neither (-1); no writes."""
    await seed(redis, {"t:a": rec(status, finished=NOW - 1), "cur": str(M0)})
    assert await run(store, "cancel", "a", NOW, RET, "r1") == -2
    assert await run(store, "cancel", "nope", NOW, RET, "r1") == -1
    assert await dump(redis) == {"t:a": rec(status, finished=NOW - 1), "cur": str(M0)}
    await assert_ttls(redis, {})


# -- claim ---------------------------------------------------------------------------------------

async def test_claim_due_horizon_and_not_yet_due(store: Store, redis: Redis) -> None:
    """Entries due by the horizon are leased (from max(due, now)); later ones stay put."""
    now = NOW + 30_000
    a, b, c = NOW + 10_000, now + 1250, now + 1251
    await seed(redis, {"t:a": rec(due=a), "t:b": rec(due=b), "t:c": rec(due=c),
                       f"ms:{M0}": {"a": a, "b": b, "c": c}, **minutes(M0), "cur": str(M0)})
    assert await claim(store, now, horizon=now + 1250) == (False, ["a", "b"])
    assert await dump(redis) == {
        "t:a": delivering(due=a), "t:b": delivering(due=b), "t:c": rec(due=c),
        f"ms:{M0}": {"c": c}, **minutes(M0),
        "ls": {"a": now + 10_000 + MARGIN, "b": b + 10_000 + MARGIN},
        "cl:tok": ["a", "b"], "cur": str(M0)}
    await assert_ttls(redis, {"cl:tok": 300_000})
    # the name the soak's injector reads a claim's process from (bench/soak_faults.py)
    assert Keyspace("tw").claim_call(B, "tok") == P + "cl:tok"


async def test_claim_drops_deleted_moved_and_expired_entries(store: Store, redis: Redis) -> None:
    """Entries in the delete-set (whatever their record says), moved to another minute, or
    without a record are dropped; the drained past slice and its delete-set are deleted, with
    its minute's index entry, and the cursor moves on."""
    now = NOW + 61_000
    await seed(redis, {
        "t:a": rec("cancelled", finished=NOW), "t:b": rec(due=NOW + 2 * MIN), "t:c": rec(),
        "t:e": rec(), f"md:{M0}": {"a", "e"},
        f"ms:{M0}": {"a": NOW, "b": NOW + 1, "c": NOW + 2, "gone": NOW + 3, "e": NOW + 4},
        f"ms:{M0 + 2}": {"b": NOW + 2 * MIN}, **minutes(M0, M0 + 2), "cur": str(M0)})
    assert await claim(store, now) == (False, ["c"])
    assert await dump(redis) == {
        "t:a": rec("cancelled", finished=NOW), "t:b": rec(due=NOW + 2 * MIN),
        "t:c": delivering(), "t:e": rec(), f"ms:{M0 + 2}": {"b": NOW + 2 * MIN},
        **minutes(M0 + 2), "ls": {"c": now + 10_000 + MARGIN}, "cl:tok": ["c"],
        "cur": str(M0 + 1)}


async def test_claim_deletes_drained_past_minutes_keeps_current(store: Store,
                                                                redis: Redis) -> None:
    """Past minutes that drain lose their slice, delete-set and index entry; the current
    minute's delete-set and index entry stay, and the cursor stops at the current minute."""
    now = NOW + 3 * MIN + 10_000
    due = NOW + 3 * MIN + 5000
    await seed(redis, {"t:a": rec(), "t:b": rec(due=due), f"ms:{M0}": {"a": NOW},
                       f"md:{M0}": {"x"}, f"md:{M0 + 3}": {"z"}, f"ms:{M0 + 3}": {"b": due},
                       **minutes(M0, M0 + 3), "cur": str(M0)})
    assert await claim(store, now, horizon=now + 1250) == (False, ["a", "b"])
    assert await dump(redis) == {
        "t:a": delivering(), "t:b": delivering(due=due), f"md:{M0 + 3}": {"z"},
        **minutes(M0 + 3), "ls": {"a": now + 10_000 + MARGIN, "b": now + 10_000 + MARGIN},
        "cl:tok": ["a", "b"], "cur": str(M0 + 3)}


async def test_claim_cursor_jumps_empty_minutes_and_never_passes_now(store: Store,
                                                                     redis: Redis) -> None:
    """With every slice drained, the cursor moves to now's minute (empty minutes are never
    visited); with a future slice left, it still stops at now's minute."""
    await seed(redis, {"t:a": rec(due=NOW + 90 * MIN), f"ms:{M0 + 90}": {"a": NOW + 90 * MIN},
                       **minutes(M0 + 90), "cur": str(M0)})
    now = NOW + 30 * MIN
    assert await claim(store, now) == (False, [])
    assert (await dump(redis))["cur"] == str(M0 + 30)


async def test_claim_limit_and_more(store: Store, redis: Redis) -> None:
    """At most ``limit`` per call, earliest first; ``more`` until the slices are drained."""
    keys = ["k0", "k1", "k2", "k3", "k4"]
    await seed(redis, {**{f"t:{k}": rec(due=NOW + i) for i, k in enumerate(keys)},
                       f"ms:{M0}": {k: NOW + i for i, k in enumerate(keys)}, **minutes(M0),
                       "cur": str(M0)})
    now = NOW + MIN
    assert await claim(store, now, limit=2, token="t1") == (True, ["k0", "k1"])
    assert await dump(redis) == {
        "t:k0": delivering("t1", due=NOW), "t:k1": delivering("t1", due=NOW + 1),
        **{f"t:{k}": rec(due=NOW + i) for i, k in enumerate(keys) if i > 1},
        f"ms:{M0}": {"k2": NOW + 2, "k3": NOW + 3, "k4": NOW + 4}, **minutes(M0),
        "ls": {"k0": now + 10_000 + MARGIN, "k1": now + 10_000 + MARGIN},
        "cl:t1": ["k0", "k1"], "cur": str(M0)}
    assert await claim(store, now, limit=2, token="t2") == (True, ["k2", "k3"])
    assert await claim(store, now, limit=2, token="t3") == (False, ["k4"])
    assert (await dump(redis))["cur"] == str(M0 + 1)
    assert "mn" not in await dump(redis)
    assert await claim(store, now, limit=2, token="t4") == (False, [])


async def test_claim_of_more_tasks_than_one_piece_of_its_writes(store: Store,
                                                                 redis: Redis) -> None:
    """1,200 due tasks in one call: their leases and the call's record list are written in
    pieces of 500 and 1,000 (lua/lib/claiming.lua write_claims); every one is leased and
    listed, in order, and the slice keeps only the task not yet due."""
    keys = [f"k{i:04d}" for i in range(1200)]
    later = NOW + 50_000
    await seed(redis, {**{f"t:{k}": rec(due=NOW + i) for i, k in enumerate(keys)},
                       "t:later": rec(due=later),
                       f"ms:{M0}": {**{k: NOW + i for i, k in enumerate(keys)}, "later": later},
                       **minutes(M0), "cur": str(M0)})
    now = NOW + 2000
    assert await claim(store, now, limit=1500) == (False, keys)
    state = await dump(redis)
    assert state[f"ms:{M0}"] == {"later": later}
    assert state["ls"] == {k: max(NOW + i, now) + 10_000 + MARGIN for i, k in enumerate(keys)}
    assert state["cl:tok"] == keys
    assert all(state[f"t:{k}"] == delivering(due=NOW + i) for i, k in enumerate(keys))


async def test_claim_dropped_entries_do_not_hide_due_tasks(store: Store, redis: Redis) -> None:
    """Three cancelled entries ahead of two due ones, limit 3: the caller must either get the
    due tasks or be told to call again (more=1)."""
    await seed(redis, {**{f"t:x{i}": rec("cancelled", finished=NOW) for i in range(3)},
                       "t:a": rec(due=NOW + 10), "t:b": rec(due=NOW + 11),
                       f"ms:{M0}": {"x0": NOW, "x1": NOW + 1, "x2": NOW + 2, "a": NOW + 10,
                                    "b": NOW + 11},
                       f"md:{M0}": {"x0", "x1", "x2"}, **minutes(M0), "cur": str(M0)})
    more, keys = await claim(store, NOW + 1000, limit=3)
    assert keys == ["a", "b"] or more


async def test_claim_max_minutes_budget(store: Store, redis: Redis) -> None:
    """After an outage one call reads at most ``max_minutes`` slices and asks to be called
    again; minutes without a slice cost nothing."""
    state: dict[str, Any] = {"cur": str(M0), **minutes(*(M0 + 2 * i for i in range(5)))}
    for i in range(5):
        state[f"t:k{i}"] = rec(due=NOW + 2 * i * MIN)
        state[f"ms:{M0 + 2 * i}"] = {f"k{i}": NOW + 2 * i * MIN}
    await seed(redis, state)
    now = NOW + 20 * MIN
    assert await claim(store, now, max_minutes=2, token="t1") == (True, ["k0", "k1"])
    lease = now + 10_000 + MARGIN
    assert await dump(redis) == {
        "t:k0": delivering("t1"), "t:k1": delivering("t1", due=NOW + 2 * MIN),
        **{f"t:k{i}": rec(due=NOW + 2 * i * MIN) for i in (2, 3, 4)},
        **{f"ms:{M0 + 2 * i}": {f"k{i}": NOW + 2 * i * MIN} for i in (2, 3, 4)},
        **minutes(M0 + 4, M0 + 6, M0 + 8),
        "ls": {"k0": lease, "k1": lease}, "cl:t1": ["k0", "k1"], "cur": str(M0 + 4)}
    assert await claim(store, now, max_minutes=2, token="t2") == (True, ["k2", "k3"])
    assert await claim(store, now, max_minutes=2, token="t3") == (False, ["k4"])
    assert (await dump(redis))["cur"] == str(M0 + 20)


async def test_claim_expired_lease_reclaimed(store: Store, redis: Redis) -> None:
    """An expired lease is claimed again under the new token (start mark cleared, attempts
    kept); a stale lease entry is dropped; a live lease stays. A started attempt goes into the
    history as lost, with the time its lease says it was to be sent (max(due, its claim's
    now): the lease less the task's timeout and the margin) as started_at, and the claim's
    time as its next_attempt_at."""
    late = NOW - 15_000  # a's claim came 900 ms after its due time; e was claimed ahead of it
    await seed(redis, {"t:a": delivering("old", started=True, attempts=1, due=late - 900),
                       "t:b": rec("succeeded", finished=NOW - 9), "t:c": delivering("other"),
                       "t:e": delivering("old", started=True, attempts=2, due=late - 1),
                       "ls": {"a": late + 10_000 + MARGIN, "b": NOW - 5, "c": NOW + 1,
                              "e": late - 1 + 10_000 + MARGIN},
                       "cl:old": ["a", "e"], "cur": str(M0)})
    more, tasks = await store.claim(B, now_ms=NOW, horizon_ms=NOW, limit=10, token="new")
    assert (more, [(t.key, t.attempts) for t in tasks]) == (False, [("e", 2), ("a", 1)])
    lost = "no outcome within its lease: its process died or stalled"
    assert history_parsed(await dump(redis)) == {
        "t:a": delivering("new", attempts=1, due=late - 900),
        "t:b": rec("succeeded", finished=NOW - 9),
        "t:c": delivering("other"), "t:e": delivering("new", attempts=2, due=late - 1),
        "ls": {"a": NOW + 10_000 + MARGIN, "c": NOW + 1, "e": NOW + 10_000 + MARGIN},
        "cl:old": ["a", "e"], "cl:new": ["e", "a"], "cur": str(M0),
        "a:a": [{"e": lost, "o": "lost", "n": 1, "s": late, "na": NOW}],
        "a:e": [{"e": lost, "o": "lost", "n": 2, "s": late - 1, "na": NOW}]}


async def test_a_lost_attempts_started_at_is_never_before_its_due_time(
        store: Store, redis: Redis) -> None:
    """(A review's case.) The lease was written with the margin of the process that claimed
    the task, the lost entry read it with the margin of the one that finds it lost: with a
    margin 25 s larger (a rolling update changing TIMEWHEEL_LEASE_MARGIN_SECONDS), started_at
    came 25 s before the task's due time. It is kept between the due time and now."""
    due = NOW + 1000
    assert await schedule(store, "a", due) == 0
    assert (await claim(store, NOW, horizon=due))[1] == ["a"]
    assert (await run(store, "start", "a", "tok"))[0] == 1
    lease = int(await redis.zscore(P + "ls", "a") or 0)
    other = Store(redis, "tw", retention_ms=RET, lease_margin_ms=MARGIN + 25_000)
    await other.init()
    _, tasks = await other.claim(B, now_ms=lease + 1, horizon_ms=lease + 1, limit=10,
                                 token="t2")
    assert [t.key for t in tasks] == ["a"]
    assert history_parsed(await dump(redis))["a:a"] == [
        {"e": LOST, "o": "lost", "n": 1, "s": due, "na": lease + 1}]


@pytest.mark.parametrize("steps", [("patch",), ("patch", "delete"), ("delete",)])
async def test_an_attempt_lost_after_a_patch_or_a_cancel_in_flight_is_recorded(
        store: Store, redis: Redis, steps: tuple[str, ...]) -> None:
    """A PATCH or a DELETE (or both) while the attempt is out keeps its claim and lease for its
    answer; its process dies. The claim that finds the lease run out records the attempt as
    lost and clears the claim; the task stays at the PATCH's time, retrying (or cancelled, its
    entry expiring with it). Before, the lease was dropped with no entry at all (a plain DELETE
    until session 23: the attempt may have reached the receiver, and its history said nothing)."""
    due = NOW + 1000
    assert await schedule(store, "a", due) == 0
    assert (await claim(store, NOW, horizon=due))[1] == ["a"]
    assert (await run(store, "start", "a", "tok"))[0] == 1
    lease = int(await redis.zscore(P + "ls", "a") or 0)
    moved = lease + 60_000
    if "patch" in steps:
        assert await run(store, "reschedule", "a", NOW + 10, "req-patch", moved, "") == 1
    if "delete" in steps:
        assert await run(store, "cancel", "a", NOW + 20, RET, "req-del", KEPT) == 1
    # Found by a process whose lease margin is 25 s larger (a rolling update changing it):
    # started_at stays after the task's creation, not 25 s before its due time.
    other = Store(redis, "tw", retention_ms=RET, lease_margin_ms=MARGIN + 25_000)
    await other.init()
    _, tasks = await other.claim(B, now_ms=lease + 1, horizon_ms=lease + 1, limit=10,
                                 token="t2")
    assert tasks == []  # not due again before the PATCH's time
    after = history_parsed(await dump(redis))
    assert "ls" not in after
    record = after["t:a"]
    assert (record["claim"], record["started"], record["att"]) == (layout.NONE, 0, 1)
    entry = {"e": LOST, "o": "lost", "n": 1, "s": NOW}  # its creation: the floor
    if "delete" in steps:
        assert record["st"] == "c" and after["a:a"] == [entry]
        assert await redis.pttl(P + "a:a") > 0  # it expires with the cancelled record
    else:
        assert record["st"] == "r" and after["a:a"] == [{**entry, "na": moved}]
        assert await redis.pttl(P + "a:a") == -1


async def test_a_started_attempt_parked_after_a_delete_is_not_recorded_lost(
        store: Store, redis: Redis) -> None:
    """(A review's case.) A rated flow's started attempt that asks its flow again (the
    dispatcher's _late_for_its_rate, NotWritten) is parked; a DELETE came in between. park.lua
    answered 0 and left the claim and the lease that cancel keeps, and the claim that found
    the lease run out wrote 'lost' for an attempt no process sent. It is recorded as
    release.lua records it: cancelled, not sent, its claim and lease gone."""
    due = NOW + 1000
    assert await schedule(store, "a", due) == 0
    assert (await claim(store, NOW, horizon=due))[1] == ["a"]
    assert (await run(store, "start", "a", "tok"))[0] == 1
    lease = int(await redis.zscore(P + "ls", "a") or 0)
    assert await run(store, "cancel", "a", NOW + 20, RET, "req-del", KEPT) == 1
    assert await run(store, "park", KEPT, "a", "tok") == [0]
    # The holder is done with it: nothing of its claim should be left.
    assert await redis.zscore(P + "ls", "a") is None
    await claim(store, lease + 1, token="t2")
    state = await dump(redis)
    history = [json.loads(e) for e in state["a:a"]]
    assert [e["o"] for e in history] == ["cancelled"]
    assert (state["t:a"]["claim"], state["t:a"]["started"]) == (layout.NONE, 0)


async def test_an_attempt_patched_in_flight_and_taken_before_its_lease_ends_is_recorded_lost(
        store: Store, redis: Redis) -> None:
    """(A review's case.) PATCHed while out to before its lease's end, the task is due when
    the lease ends (reschedule.lua), so a tick up to 1.25 s before takes it from its slice:
    step 1 never sees the lease run out. The attempt that got no answer is recorded lost there,
    its started_at kept after the task's creation (the lease margin may differ)."""
    due = NOW + 1000
    assert await schedule(store, "a", due) == 0
    assert (await claim(store, NOW, horizon=due))[1] == ["a"]
    assert (await run(store, "start", "a", "tok"))[0] == 1
    lease = int(await redis.zscore(P + "ls", "a") or 0)
    assert await run(store, "reschedule", "a", NOW + 10, "req-patch", NOW + 20, "") == 1
    assert (await dump(redis))["t:a"]["due"] == lease
    other = Store(redis, "tw", retention_ms=RET, lease_margin_ms=MARGIN + 25_000)
    await other.init()
    now = lease - 500  # a tick looking 1.25 s ahead
    _, tasks = await other.claim(B, now_ms=now, horizon_ms=now + 1250, limit=10, token="t2")
    assert [(t.key, t.attempts) for t in tasks] == [("a", 1)]
    assert history_parsed(await dump(redis))["a:a"] == [
        {"e": LOST, "o": "lost", "n": 1, "s": NOW, "na": lease}]  # NOW: its creation
    assert await other.scripts.start(keys=[P], args=[1, 1, "a", "t2"]) == [2, b"", b"", b""]


async def test_claim_token_retry_returns_same_tasks(store: Store, redis: Redis) -> None:
    """A retried call (same token) claims nothing new and returns what it still holds."""
    await seed(redis, {"t:a": rec(), "t:b": rec(due=NOW + 1), "t:c": rec(due=NOW + 2),
                       f"ms:{M0}": {"a": NOW, "b": NOW + 1}, **minutes(M0), "cur": str(M0)})
    assert await claim(store, NOW + 5, limit=2, token="t1") == (True, ["a", "b"])
    await seed(redis, {f"ms:{M0}": {"c": NOW + 2}})
    before = await dump(redis)
    assert await claim(store, NOW + 5, limit=2, token="t1") == (True, ["a", "b"])
    assert await dump(redis) == before
    assert await run(store, "cancel", "b", NOW + 6, RET, "r1", KEPT) == 1
    assert await claim(store, NOW + 7, limit=2, token="t1") == (True, ["a"])


async def test_claim_trims_old_finished_entries(store: Store, redis: Redis) -> None:
    """Finished-index entries at or before now - retention leave their index."""
    old = {"old": NOW - RET - 1, "edge": NOW - RET, "fresh": NOW - RET + 1}
    await seed(redis, {"ff": old, "fs": old, "fc": old})
    assert await claim(store, NOW) == (False, [])
    fresh = {"fresh": NOW - RET + 1}
    assert await dump(redis) == {"ff": fresh, "fs": fresh, "fc": fresh}


# -- start ---------------------------------------------------------------------------------------

async def test_start_numbers_attempts_and_is_idempotent(store: Store, redis: Redis) -> None:
    """Only the claim's holder starts; the attempt counter is bumped once per claim; the
    reply carries the headers and body as stored at that moment."""
    body = "x" * 70_000
    await seed(redis, {"t:a": delivering(headers="X-A:1\nX-B:", body=body),
                       "t:b": delivering(attempts=2), "t:c": delivering("other"),
                       "t:d": rec(claim="tok")})
    args = ["a", "tok", "b", "tok", "c", "tok", "d", "tok", "none", "tok"]
    expected = [1, b"X-A:1\nX-B:", body.encode(), b"", 3, b"", b"", b"", 0, b"", b"", b"",
                0, b"", b"", b"", 0, b"", b"", b""]
    assert await run(store, "start", *args) == expected
    after = {"t:a": delivering(attempts=1, started=True, headers="X-A:1\nX-B:", body=body),
             "t:b": delivering(attempts=3, started=True), "t:c": delivering("other"),
             "t:d": rec(claim="tok")}
    assert await dump(redis) == after
    assert await run(store, "start", *args) == expected
    assert await dump(redis) == after


# -- complete ------------------------------------------------------------------------------------

def outcome(key: str, kind: str, code: Any = "", err: str = "", due: Any = "",
            token: str = "tok") -> list[Any]:
    return [key, token, kind, code, err, due, NOW + 100, entry(key, kind), ""]


def history_parsed(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each attempt history's entries (``a:<key>``) parsed. A script writes an
    entry with cjson, which orders its fields as its Lua table does: Redis 6.2 and Valkey 8.1
    differ. The service parses entries (store/attempts.py), so the order means nothing."""
    return {name: [json.loads(e) for e in value] if name.startswith("a:") else value
            for name, value in state.items()}


def entry(key: str, kind: str) -> str:
    """A stand-in history entry: complete.lua appends it as it is."""
    return json.dumps({"n": 1, "o": kind, "k": key})


def history(*entries: str) -> list[dict[str, Any]]:
    return [json.loads(e) for e in entries]


HELD = {"t:a": delivering(attempts=1, started=True, last_code=500, last_err="boom",
                          body="the body"),
        "ls": {"a": NOW + 15_000, "x": NOW + 20_000}, "cl:tok": ["a"], "cur": str(M0)}
DONE = {"attempts": 1, "last_at": NOW + 100, "body": "the body"}  # every recorded outcome


async def test_complete_ok(store: Store, redis: Redis) -> None:
    """Success: succeeded, finished, last result replaced, lease removed, retention TTL, into
    the succeeded index."""
    await seed(redis, HELD)
    assert await run(store, "complete", NOW + 300, RET, KEPT, *outcome("a", "ok", 200)) == [1]
    assert await dump(redis) == {
        "t:a": rec("succeeded", finished=NOW + 300, last_code=200, **DONE),
        "fs": {"a": NOW + 300}, "ls": {"x": NOW + 20_000}, "cl:tok": ["a"], "cur": str(M0),
        "a:a": [entry("a", "ok")]}
    await assert_ttls(redis, {"t:a": RET, "a:a": RET})


async def test_complete_retry(store: Store, redis: Redis) -> None:
    """Retry: back into the minute of the next attempt (out of its delete-set), no TTL;
    a next attempt before the cursor is clamped to the cursor's slice."""
    nxt = NOW + 2 * MIN + 5
    await seed(redis, {**HELD, "t:b": delivering(attempts=2), f"md:{M0 + 2}": {"a", "z"}})
    args = [*outcome("a", "retry", 503, due=nxt), *outcome("b", "retry", err="timeout",
                                                           due=NOW - 3 * MIN)]
    assert await run(store, "complete", NOW + 300, RET, KEPT, *args) == [1, 1]
    assert await dump(redis) == {
        "t:a": rec("retrying", due=nxt, exec=NOW, last_code=503, **DONE),
        "t:b": rec("retrying", due=NOW - 3 * MIN, exec=NOW, attempts=2, last_at=NOW + 100,
                   last_err="timeout"),
        f"ms:{M0 + 2}": {"a": nxt}, f"md:{M0 + 2}": {"z"}, f"ms:{M0}": {"b": NOW - 3 * MIN},
        **minutes(M0, M0 + 2), "ls": {"x": NOW + 20_000}, "cl:tok": ["a"], "cur": str(M0),
        "a:a": [entry("a", "retry")], "a:b": [entry("b", "retry")]}
    await assert_ttls(redis, {})


async def test_complete_fail(store: Store, redis: Redis) -> None:
    """Failure: failed, finished, into the dead letters at now, retention TTL."""
    await seed(redis, {**HELD, "ff": {"old": NOW - 50}})
    args = outcome("a", "fail", 404, "HTTP 404")
    assert await run(store, "complete", NOW + 300, RET, KEPT, *args) == [1]
    assert await dump(redis) == {
        "t:a": rec("failed", finished=NOW + 300, last_code=404, last_err="HTTP 404", **DONE),
        "ff": {"old": NOW - 50, "a": NOW + 300}, "ls": {"x": NOW + 20_000},
        "cl:tok": ["a"], "cur": str(M0), "a:a": [entry("a", "fail")]}
    await assert_ttls(redis, {"t:a": RET, "a:a": RET})


async def test_complete_same_error_keeps_the_record_in_place(store: Store, redis: Redis) -> None:
    """An outcome with the error already stored rewrites only the head (the TTL of a record
    is kept either way)."""
    await seed(redis, HELD)
    args = outcome("a", "fail", 500, "boom")
    assert await run(store, "complete", NOW + 300, RET, KEPT, *args) == [1]
    assert (await dump(redis))["t:a"] == rec("failed", finished=NOW + 300, last_code=500,
                                             last_err="boom", **DONE)


async def test_complete_stale_claims_write_nothing(store: Store, redis: Redis) -> None:
    """A token that no longer holds the claim (or a retry without a due time) returns 0."""
    await seed(redis, {**HELD, "t:b": rec("cancelled", finished=NOW, claim="other"),
                       "t:c": delivering("newer")})
    before = await dump(redis)
    args = [*outcome("a", "retry"), *outcome("b", "ok", 200), *outcome("c", "fail", 404),
            *outcome("a", "ok", 200, token="older"), *outcome("none", "ok")]
    assert await run(store, "complete", NOW + 300, RET, KEPT, *args) == [0, 0, 0, 0, 0]
    assert await dump(redis) == before
    await assert_ttls(redis, {})


# -- release -------------------------------------------------------------------------------------

async def test_release_hands_back_claims_not_sent(store: Store, redis: Redis) -> None:
    """Claims go back to their slice (scheduled, or retrying after an attempt); one whose
    attempt was started but not sent is uncounted again; other holders' claims are left
    alone."""
    due_b = NOW - 2 * MIN
    await seed(redis, {
        "t:a": delivering(due=NOW + 20_000), "t:b": delivering(due=due_b, attempts=2),
        "t:c": delivering(attempts=1, started=True), "t:d": delivering("other"),
        "t:e": delivering(attempts=2, started=True),
        "ls": {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}, f"md:{M0}": {"a", "z"},
        "cur": str(M0)})
    args = ["a", "tok", "b", "tok", "c", "tok", "d", "tok", "none", "tok", "e", "tok"]
    assert await run(store, "release", KEPT, *args) == [1, 1, 1, 0, 0, 1]
    assert await dump(redis) == {
        "t:a": rec(due=NOW + 20_000), "t:b": rec("retrying", due=due_b, attempts=2),
        "t:c": rec(), "t:d": delivering("other"), "t:e": rec("retrying", attempts=1),
        f"ms:{M0}": {"a": NOW + 20_000, "b": due_b, "c": NOW, "e": NOW}, f"md:{M0}": {"z"},
        **minutes(M0), "ls": {"d": 4}, "cur": str(M0)}


async def test_release_of_a_claim_cancelled_after_its_start(store: Store, redis: Redis) -> None:
    """A task cancelled after its attempt started keeps that claim (lua/cancel.lua); handed
    back unsent, the history says the DELETE stopped it, and it stays cancelled."""
    await seed(redis, {"t:a": delivering(attempts=1, started=True), "ls": {"a": 1},
                       "cur": str(M0)})
    assert await run(store, "cancel", "a", NOW + 3, RET, "r1", KEPT) == 1
    assert await run(store, "release", KEPT, "a", "tok") == [2]
    assert history_parsed(await dump(redis)) == {
        "t:a": rec("cancelled", finished=NOW + 3, op="r1", attempts=1),
        **cancelled({"a": NOW + 3}), "cur": str(M0),
        "a:a": [{"e": "stopped by a DELETE before it was sent", "o": "cancelled", "n": 1}]}
    assert await run(store, "release", KEPT, "a", "tok") == [0]


# -- replay --------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["failed", "cancelled"])
async def test_replay_schedules_now(store: Store, redis: Redis, status: str) -> None:
    """A failed or cancelled task is scheduled again at now with attempts reset, out of its
    finished index and the delete-set, no longer expiring."""
    now = NOW + 2 * MIN + 7
    await seed(redis, {"t:a": rec(status, attempts=5, finished=NOW, last_code=500),
                       INDEX[status]: {"a": NOW, "b": NOW - 1}, f"md:{M0 + 2}": {"a"},
                       "cur": str(M0)})
    await redis.pexpire(P + "t:a", RET)
    assert await run(store, "replay", "a", now, "r1") == 1
    assert await dump(redis) == {"t:a": rec(due=now, exec=now, last_code=500, op="r1"),
                                 INDEX[status]: {"b": NOW - 1}, f"ms:{M0 + 2}": {"a": now},
                                 **minutes(M0 + 2), "cur": str(M0)}
    await assert_ttls(redis, {})


async def test_replay_repeated_by_a_client_retry_answers_the_same(store: Store,
                                                                  redis: Redis) -> None:
    """The same replay call re-sent after a lost reply answers 1 again and writes nothing;
    another request for the now scheduled task is refused."""
    await seed(redis, {"t:a": rec("failed", finished=NOW), "ff": {"a": NOW}, "cur": str(M0)})
    assert await run(store, "replay", "a", NOW + 5, "r1") == 1
    state = await dump(redis)
    assert await run(store, "replay", "a", NOW + 6, "r1") == 1
    assert await dump(redis) == state
    assert await run(store, "replay", "a", NOW + 5, "r2") == -2


@pytest.mark.parametrize("status", ["scheduled", "delivering", "retrying", "succeeded"])
async def test_replay_refuses_other_statuses(store: Store, redis: Redis, status: str) -> None:
    """Only failed or cancelled tasks replay (-2); unknown keys are -1; nothing changes."""
    await seed(redis, {"t:a": rec(status), "cur": str(M0)})
    assert await run(store, "replay", "a", NOW, "r1") == -2
    assert await run(store, "replay", "none", NOW, "r1") == -1
    assert await dump(redis) == {"t:a": rec(status), "cur": str(M0)}



async def test_cancel_gives_a_tried_tasks_history_the_records_ttl(store: Store,
                                                                  redis: Redis) -> None:
    """A retrying task (tried before, history without TTL while pending) cancelled before its
    next claim: its history expires with the record (no key left behind for ever). Control: a
    task never tried has no history key to expire."""
    await seed(redis, {"t:a": rec("retrying", attempts=1, due=NOW + MIN),
                       f"ms:{M0 + 1}": {"a": NOW + MIN}, **minutes(M0 + 1), "cur": str(M0),
                       "t:b": rec(due=NOW + MIN)})
    await redis.rpush(f"{P}a:a", entry("a", "retry"))
    await assert_ttls(redis, {})
    assert await run(store, "cancel", "a", NOW, RET, "r1", KEPT) == 1
    assert await run(store, "cancel", "b", NOW, RET, "r2", KEPT) == 1
    await assert_ttls(redis, {"t:a": RET, "a:a": RET, "t:b": RET})
    assert "a:b" not in await dump(redis)
