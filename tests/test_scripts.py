"""Each Lua script on its own: seed raw state, run it once, assert the whole bucket afterwards.

State is written and read as a dict of the bucket's keys (prefix stripped): a hash is a dict,
a zset {member: score}, a set a set, a list a list, a string a str (asynq's Seed*/Get*).
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from tests.conftest import START_MS
from timewheel.store import Store

NOW = START_MS
MIN = 60_000
M0 = NOW // MIN
RET = 7 * 86_400_000  # the store fixture's retention_ms
MARGIN = 5000  # the store fixture's lease_margin_ms
B = 3
P = "{tw:3}:"


def rec(status: str = "scheduled", due: int = NOW, **extra: Any) -> dict[str, str]:
    """A task record as schedule.lua writes it, plus ``extra`` fields."""
    row: dict[str, Any] = {"status": status, "due": due, "minute": due // MIN, "attempts": 0,
                           "created": NOW, "fp": "fp", "url": "http://127.0.0.1:9/cb",
                           "method": "POST", "headers": "[]", "body": "", "exec": due,
                           "max": 5, "backoff": 1000, "timeout": 10000, "flow": "127.0.0.1:9"}
    row.update(extra)
    return {k: str(v) for k, v in row.items()}


async def seed(redis: Redis, state: dict[str, Any]) -> None:
    for short, value in state.items():
        name = P + short
        if short.startswith("t:"):
            await redis.hset(name, mapping=value)
        elif short.startswith(("m:", "lease", "dead", "w:", "wf")):
            await redis.zadd(name, value)
        elif short.startswith("d:"):
            await redis.sadd(name, *value)
        elif short.startswith("c:"):
            await redis.rpush(name, *value)
        else:
            await redis.set(name, value)


async def dump(redis: Redis) -> dict[str, Any]:
    """Every key in Redis but the wheel's bucket count; all of them must be in bucket B."""
    out: dict[str, Any] = {}
    async for raw in redis.scan_iter(match="*"):
        name = raw.decode()
        if name == "tw:buckets":
            continue
        assert name.startswith(P), f"key outside the bucket: {name}"
        kind = (await redis.type(raw)).decode()
        value: Any
        if kind == "hash":
            value = {k.decode(): v.decode() for k, v in (await redis.hgetall(raw)).items()}
        elif kind == "zset":
            value = {m.decode(): int(s) for m, s in await redis.zrange(raw, 0, -1, withscores=True)}
        elif kind == "set":
            value = {m.decode() for m in await redis.smembers(raw)}
        elif kind == "list":
            value = [m.decode() for m in await redis.lrange(raw, 0, -1)]
        else:
            value = (await redis.get(raw)).decode()
        out[name[len(P):]] = value
    return out


async def assert_ttls(redis: Redis, expected: dict[str, int]) -> None:
    """Exactly the keys in ``expected`` expire, each within a minute under its TTL."""
    found = {}
    async for raw in redis.scan_iter(match="*"):
        pttl = await redis.pttl(raw)
        if pttl >= 0:
            found[raw.decode()[len(P):]] = pttl
    assert set(found) == set(expected)
    for short, ttl in expected.items():
        assert ttl - 60_000 < found[short] <= ttl, short


async def run(store: Store, name: str, *args: Any) -> Any:
    return await getattr(store.scripts, name)(keys=[P], args=list(args))


async def schedule(store: Store, key: str, due: int, mode: str = "create", now: int = NOW,
                   fp: str = "fp", req: str = "r1") -> int:
    fields = ["url", "http://127.0.0.1:9/cb", "method", "POST", "headers", "[]", "body", "",
              "exec", due, "max", 5, "backoff", 1000, "timeout", 10000, "flow", "127.0.0.1:9"]
    return int(await run(store, "schedule", key, mode, now, due, fp, req, *fields))


async def claim(store: Store, now: int, horizon: int | None = None, limit: int = 100,
                token: str = "tok", max_minutes: int = 1440) -> tuple[bool, list[str]]:
    more, tasks = await store.claim(B, now_ms=now, horizon_ms=now if horizon is None else horizon,
                                    limit=limit, token=token, max_minutes=max_minutes)
    assert all(t.token == token for t in tasks)
    return more, [t.key for t in tasks]


def delivering(token: str = "tok", **extra: Any) -> dict[str, str]:
    return rec("delivering", claim=token, **extra)


FINISHED = ["succeeded", "failed", "cancelled"]


# -- schedule ------------------------------------------------------------------------------------

async def test_schedule_creates_task_slice_and_cursor(store: Store, redis: Redis) -> None:
    """A new task: its record, its minute's slice entry, and the cursor at now's minute."""
    due = NOW + 90_000
    assert await schedule(store, "a", due) == 0
    assert await dump(redis) == {"t:a": rec(due=due, op="r1=0"), f"m:{M0 + 1}": {"a": due},
                                 "cursor": str(M0)}
    await assert_ttls(redis, {})


async def test_schedule_create_repeat_and_conflict(store: Store, redis: Redis) -> None:
    """Create over an existing key: 2 with the same fingerprint, -1 with another; no writes."""
    await seed(redis, {"t:a": rec(), f"m:{M0}": {"a": NOW}, "cursor": str(M0)})
    before = await dump(redis)
    assert await schedule(store, "a", NOW + 5, fp="fp") == 2
    assert await schedule(store, "a", NOW + 5, fp="other") == -1
    assert await dump(redis) == before


async def test_schedule_replace_scheduled(store: Store, redis: Redis) -> None:
    """Replace moves the task: the old minute's delete-set gets the key, the new slice the entry."""
    old, new = NOW + 61_000, NOW + 3 * MIN + 7
    await seed(redis, {"t:a": rec(due=old), f"m:{M0 + 1}": {"a": old}, "cursor": str(M0),
                       f"d:{M0 + 3}": {"a", "z"}})
    assert await schedule(store, "a", new, mode="replace", now=NOW + 1000) == 1
    assert await dump(redis) == {
        "t:a": rec(due=new, created=NOW + 1000, op="r1=1"), f"m:{M0 + 1}": {"a": old},
        f"d:{M0 + 1}": {"a"}, f"m:{M0 + 3}": {"a": new}, f"d:{M0 + 3}": {"z"},
        "cursor": str(M0)}


async def test_schedule_replace_delivering_drops_lease(store: Store, redis: Redis) -> None:
    """Replacing a claimed task removes its lease and claim token; no delete-set is touched."""
    await seed(redis, {"t:a": delivering(started=NOW, attempts=1), "lease": {"a": NOW + 15_000},
                       "c:tok": ["a"], "cursor": str(M0)})
    assert await schedule(store, "a", NOW + 2 * MIN, mode="replace") == 1
    assert await dump(redis) == {"t:a": rec(due=NOW + 2 * MIN, op="r1=1"),
                                 f"m:{M0 + 2}": {"a": NOW + 2 * MIN},
                                 "c:tok": ["a"], "cursor": str(M0)}


@pytest.mark.parametrize("status", FINISHED)
async def test_schedule_replace_finished_creates(store: Store, redis: Redis, status: str) -> None:
    """A finished task is created afresh: reply 0, TTL and dead-letter entry gone."""
    await seed(redis, {"t:a": rec(status, finished=NOW - 5, last_code=500), "dead": {"a": NOW - 5},
                       "cursor": str(M0)})
    await redis.pexpire(P + "t:a", RET)
    assert await schedule(store, "a", NOW + 10, mode="replace") == 0
    expected = {"t:a": rec(due=NOW + 10, op="r1=0"), f"m:{M0}": {"a": NOW + 10},
                "cursor": str(M0)}
    if status != "failed":
        expected["dead"] = {"a": NOW - 5}
    assert await dump(redis) == expected
    await assert_ttls(redis, {})


@pytest.mark.parametrize("cursor", [M0, None])
async def test_schedule_past_due_is_clamped_to_cursor(store: Store, redis: Redis,
                                                      cursor: int | None) -> None:
    """A due time before the cursor's minute lands in the cursor's slice, keeping its due_ms;
    with no cursor yet, one is created at now's minute and the task lands there."""
    now, due = NOW + 5 * MIN + 1, NOW - 10 * MIN
    if cursor is not None:
        await seed(redis, {"cursor": str(cursor)})
    minute = M0 + 5 if cursor is None else cursor
    assert await schedule(store, "a", due, now=now) == 0
    assert await dump(redis) == {"t:a": rec(due=due, minute=minute, created=now, op="r1=0"),
                                 f"m:{minute}": {"a": due}, "cursor": str(minute)}


# -- cancel --------------------------------------------------------------------------------------

async def test_cancel_scheduled(store: Store, redis: Redis) -> None:
    """Lazy cancel: key into the minute's delete-set, slice entry left, record expires."""
    due = NOW + 10 * MIN
    await seed(redis, {"t:a": rec(due=due), f"m:{M0 + 10}": {"a": due}, "cursor": str(M0)})
    assert await run(store, "cancel", "a", NOW + 3, RET, "r1") == 1
    assert await dump(redis) == {"t:a": rec("cancelled", due=due, finished=NOW + 3, op="r1"),
                                 f"m:{M0 + 10}": {"a": due}, f"d:{M0 + 10}": {"a"},
                                 "cursor": str(M0)}
    await assert_ttls(redis, {"t:a": RET})


async def test_cancel_delivering(store: Store, redis: Redis) -> None:
    """Cancelling a claimed task removes its lease and its claim: the holder cannot start."""
    await seed(redis, {"t:a": delivering(started=NOW), "lease": {"a": NOW + 15_000, "b": NOW + 9},
                       "c:tok": ["a"], "cursor": str(M0)})
    assert await run(store, "cancel", "a", NOW + 3, RET, "r1") == 1
    assert await dump(redis) == {"t:a": rec("cancelled", finished=NOW + 3, op="r1"),
                                 "lease": {"b": NOW + 9}, "c:tok": ["a"], "cursor": str(M0)}
    await assert_ttls(redis, {"t:a": RET})
    assert await run(store, "start", NOW + 4, "a", "tok") == [0]


async def test_cancel_repeated_by_a_client_retry_answers_the_same(store: Store,
                                                                  redis: Redis) -> None:
    """redis-py re-sends a call whose reply was lost with the same arguments (request id
    included): the repeat answers 1 again (the API's 204), not -2 (409), and writes nothing;
    another request is refused."""
    await seed(redis, {"t:a": rec(due=NOW + MIN), f"m:{M0 + 1}": {"a": NOW + MIN},
                       "cursor": str(M0)})
    assert await run(store, "cancel", "a", NOW + 3, RET, "r1") == 1
    state = await dump(redis)
    assert await run(store, "cancel", "a", NOW + 4, RET, "r1") == 1
    assert await dump(redis) == state
    assert await run(store, "cancel", "a", NOW + 3, RET, "r2") == -2


@pytest.mark.parametrize("status", FINISHED)
async def test_cancel_finished_or_missing_is_refused(store: Store, redis: Redis,
                                                     status: str) -> None:
    """A finished task cannot be cancelled (-2), an unknown one neither (-1); no writes."""
    await seed(redis, {"t:a": rec(status, finished=NOW - 1), "cursor": str(M0)})
    assert await run(store, "cancel", "a", NOW, RET, "r1") == -2
    assert await run(store, "cancel", "nope", NOW, RET, "r1") == -1
    assert await dump(redis) == {"t:a": rec(status, finished=NOW - 1), "cursor": str(M0)}
    await assert_ttls(redis, {})


# -- claim ---------------------------------------------------------------------------------------

async def test_claim_due_horizon_and_not_yet_due(store: Store, redis: Redis) -> None:
    """Entries due by the horizon are leased (from max(due, now)); later ones stay put."""
    now = NOW + 30_000
    a, b, c = NOW + 10_000, now + 1250, now + 1251
    await seed(redis, {"t:a": rec(due=a), "t:b": rec(due=b), "t:c": rec(due=c),
                       f"m:{M0}": {"a": a, "b": b, "c": c}, "cursor": str(M0)})
    assert await claim(store, now, horizon=now + 1250) == (False, ["a", "b"])
    assert await dump(redis) == {
        "t:a": delivering(due=a), "t:b": delivering(due=b), "t:c": rec(due=c),
        f"m:{M0}": {"c": c}, "lease": {"a": now + 10_000 + MARGIN, "b": b + 10_000 + MARGIN},
        "c:tok": ["a", "b"], "cursor": str(M0)}
    await assert_ttls(redis, {"c:tok": 300_000})


async def test_claim_drops_deleted_moved_and_expired_entries(store: Store, redis: Redis) -> None:
    """Entries in the delete-set (whatever their record says), moved to another minute, or
    without a record are dropped; the drained past slice and its delete-set are deleted and
    the cursor moves on."""
    now = NOW + 61_000
    await seed(redis, {
        "t:a": rec("cancelled", finished=NOW), "t:b": rec(due=NOW + 2 * MIN), "t:c": rec(),
        "t:e": rec(), f"d:{M0}": {"a", "e"},
        f"m:{M0}": {"a": NOW, "b": NOW + 1, "c": NOW + 2, "gone": NOW + 3, "e": NOW + 4},
        f"m:{M0 + 2}": {"b": NOW + 2 * MIN}, "cursor": str(M0)})
    assert await claim(store, now) == (False, ["c"])
    assert await dump(redis) == {
        "t:a": rec("cancelled", finished=NOW), "t:b": rec(due=NOW + 2 * MIN),
        "t:c": delivering(), "t:e": rec(), f"m:{M0 + 2}": {"b": NOW + 2 * MIN},
        "lease": {"c": now + 10_000 + MARGIN}, "c:tok": ["c"], "cursor": str(M0 + 1)}


async def test_claim_deletes_drained_past_minutes_keeps_current(store: Store,
                                                                redis: Redis) -> None:
    """Past minutes that drain lose their slice and delete-set; the current minute's
    delete-set stays, and the cursor stops at the current minute."""
    now = NOW + 3 * MIN + 10_000
    due = NOW + 3 * MIN + 5000
    await seed(redis, {"t:a": rec(), "t:b": rec(due=due), f"m:{M0}": {"a": NOW},
                       f"d:{M0 + 1}": {"x"}, f"d:{M0 + 3}": {"z"}, f"m:{M0 + 3}": {"b": due},
                       f"d:{M0 + 4}": {"y"}, "cursor": str(M0)})
    assert await claim(store, now, horizon=now + 1250) == (False, ["a", "b"])
    assert await dump(redis) == {
        "t:a": delivering(), "t:b": delivering(due=due), f"d:{M0 + 3}": {"z"},
        f"d:{M0 + 4}": {"y"}, "lease": {"a": now + 10_000 + MARGIN, "b": now + 10_000 + MARGIN},
        "c:tok": ["a", "b"], "cursor": str(M0 + 3)}


async def test_claim_limit_and_more(store: Store, redis: Redis) -> None:
    """At most ``limit`` per call, earliest first; ``more`` until the slices are drained."""
    keys = ["k0", "k1", "k2", "k3", "k4"]
    await seed(redis, {**{f"t:{k}": rec(due=NOW + i) for i, k in enumerate(keys)},
                       f"m:{M0}": {k: NOW + i for i, k in enumerate(keys)}, "cursor": str(M0)})
    now = NOW + MIN
    assert await claim(store, now, limit=2, token="t1") == (True, ["k0", "k1"])
    assert await dump(redis) == {
        "t:k0": delivering("t1", due=NOW), "t:k1": delivering("t1", due=NOW + 1),
        **{f"t:{k}": rec(due=NOW + i) for i, k in enumerate(keys) if i > 1},
        f"m:{M0}": {"k2": NOW + 2, "k3": NOW + 3, "k4": NOW + 4},
        "lease": {"k0": now + 10_000 + MARGIN, "k1": now + 10_000 + MARGIN},
        "c:t1": ["k0", "k1"], "cursor": str(M0)}
    assert await claim(store, now, limit=2, token="t2") == (True, ["k2", "k3"])
    assert await claim(store, now, limit=2, token="t3") == (False, ["k4"])
    assert (await dump(redis))["cursor"] == str(M0 + 1)
    assert await claim(store, now, limit=2, token="t4") == (False, [])


async def test_claim_dropped_entries_do_not_hide_due_tasks(store: Store, redis: Redis) -> None:
    """Three cancelled entries ahead of two due ones, limit 3: the caller must either get the
    due tasks or be told to call again (more=1)."""
    await seed(redis, {**{f"t:x{i}": rec("cancelled", finished=NOW) for i in range(3)},
                       "t:a": rec(due=NOW + 10), "t:b": rec(due=NOW + 11),
                       f"m:{M0}": {"x0": NOW, "x1": NOW + 1, "x2": NOW + 2, "a": NOW + 10,
                                   "b": NOW + 11},
                       f"d:{M0}": {"x0", "x1", "x2"}, "cursor": str(M0)})
    more, keys = await claim(store, NOW + 1000, limit=3)
    assert keys == ["a", "b"] or more


async def test_claim_max_minutes_budget(store: Store, redis: Redis) -> None:
    """After an outage one call scans at most ``max_minutes`` slices and asks to be called again."""
    state: dict[str, Any] = {"cursor": str(M0)}
    for i in range(5):
        state[f"t:k{i}"] = rec(due=NOW + i * MIN)
        state[f"m:{M0 + i}"] = {f"k{i}": NOW + i * MIN}
    await seed(redis, state)
    now = NOW + 10 * MIN
    assert await claim(store, now, max_minutes=2, token="t1") == (True, ["k0", "k1"])
    lease = now + 10_000 + MARGIN
    assert await dump(redis) == {
        "t:k0": delivering("t1"), "t:k1": delivering("t1", due=NOW + MIN),
        **{f"t:k{i}": rec(due=NOW + i * MIN) for i in (2, 3, 4)},
        **{f"m:{M0 + i}": {f"k{i}": NOW + i * MIN} for i in (2, 3, 4)},
        "lease": {"k0": lease, "k1": lease}, "c:t1": ["k0", "k1"], "cursor": str(M0 + 2)}
    assert await claim(store, now, max_minutes=2, token="t2") == (True, ["k2", "k3"])
    assert await claim(store, now, max_minutes=2, token="t3") == (True, ["k4"])
    # Minutes M0+5..M0+10 are empty: three more calls of two minutes each to reach now.
    assert await claim(store, now, max_minutes=2, token="t4") == (True, [])
    assert await claim(store, now, max_minutes=2, token="t5") == (True, [])
    assert (await dump(redis))["cursor"] == str(M0 + 10)
    assert await claim(store, now, max_minutes=2, token="t6") == (False, [])
    assert (await dump(redis))["cursor"] == str(M0 + 10)


async def test_claim_expired_lease_reclaimed(store: Store, redis: Redis) -> None:
    """An expired lease is claimed again under the new token (start mark cleared, attempts
    kept); a stale lease entry is dropped; a live lease stays."""
    await seed(redis, {"t:a": delivering("old", started=NOW - 20_000, attempts=1),
                       "t:b": rec("succeeded", finished=NOW - 9), "t:c": delivering("other"),
                       "lease": {"a": NOW, "b": NOW - 5, "c": NOW + 1},
                       "c:old": ["a"], "cursor": str(M0)})
    more, tasks = await store.claim(B, now_ms=NOW, horizon_ms=NOW, limit=10, token="new")
    assert (more, [(t.key, t.attempts) for t in tasks]) == (False, [("a", 1)])
    assert await dump(redis) == {
        "t:a": delivering("new", attempts=1), "t:b": rec("succeeded", finished=NOW - 9),
        "t:c": delivering("other"), "lease": {"a": NOW + 10_000 + MARGIN, "c": NOW + 1},
        "c:old": ["a"], "c:new": ["a"], "cursor": str(M0)}


async def test_claim_token_retry_returns_same_tasks(store: Store, redis: Redis) -> None:
    """A retried call (same token) claims nothing new and returns what it still holds."""
    await seed(redis, {"t:a": rec(), "t:b": rec(due=NOW + 1), "t:c": rec(due=NOW + 2),
                       f"m:{M0}": {"a": NOW, "b": NOW + 1}, "cursor": str(M0)})
    assert await claim(store, NOW + 5, limit=2, token="t1") == (True, ["a", "b"])
    await seed(redis, {f"m:{M0}": {"c": NOW + 2}})
    before = await dump(redis)
    assert await claim(store, NOW + 5, limit=2, token="t1") == (True, ["a", "b"])
    assert await dump(redis) == before
    assert await run(store, "cancel", "b", NOW + 6, RET, "r1") == 1
    assert await claim(store, NOW + 7, limit=2, token="t1") == (True, ["a"])


async def test_claim_trims_old_dead_letters(store: Store, redis: Redis) -> None:
    """Dead letters finished at or before now - retention leave the index."""
    await seed(redis, {"dead": {"old": NOW - RET - 1, "edge": NOW - RET, "fresh": NOW - RET + 1}})
    assert await claim(store, NOW) == (False, [])
    assert await dump(redis) == {"dead": {"fresh": NOW - RET + 1}}


# -- start ---------------------------------------------------------------------------------------

async def test_start_numbers_attempts_and_is_idempotent(store: Store, redis: Redis) -> None:
    """Only the claim's holder starts; the attempt counter is bumped once per claim."""
    await seed(redis, {"t:a": delivering(), "t:b": delivering(attempts=2),
                       "t:c": delivering("other"), "t:d": rec(claim="tok")})
    args = ["a", "tok", "b", "tok", "c", "tok", "d", "tok", "none", "tok"]
    assert await run(store, "start", NOW, *args) == [1, 3, 0, 0, 0]
    after = {"t:a": delivering(attempts=1, started=NOW),
             "t:b": delivering(attempts=3, started=NOW), "t:c": delivering("other"),
             "t:d": rec(claim="tok")}
    assert await dump(redis) == after
    assert await run(store, "start", NOW + 50, *args) == [1, 3, 0, 0, 0]
    assert await dump(redis) == after


# -- complete ------------------------------------------------------------------------------------

def outcome(key: str, kind: str, code: Any = "", err: str = "", due: Any = "",
            token: str = "tok") -> list[Any]:
    return [key, token, kind, code, err, due, NOW + 100]


HELD = {"t:a": delivering(attempts=1, started=NOW + 100, last_code=500, last_err="boom"),
        "lease": {"a": NOW + 15_000, "x": NOW + 20_000}, "c:tok": ["a"], "cursor": str(M0)}
DONE = {"attempts": "1", "last_at": str(NOW + 100)}  # what every recorded outcome leaves


async def test_complete_ok(store: Store, redis: Redis) -> None:
    """Success: succeeded, finished, last result replaced, lease removed, retention TTL."""
    await seed(redis, HELD)
    assert await run(store, "complete", NOW + 300, RET, *outcome("a", "ok", 200)) == [1]
    assert await dump(redis) == {
        "t:a": rec("succeeded", finished=NOW + 300, last_code=200, **DONE),
        "lease": {"x": NOW + 20_000}, "c:tok": ["a"], "cursor": str(M0)}
    await assert_ttls(redis, {"t:a": RET})


async def test_complete_retry(store: Store, redis: Redis) -> None:
    """Retry: back into the minute of the next attempt (out of its delete-set), no TTL;
    a next attempt before the cursor is clamped to the cursor's slice."""
    nxt = NOW + 2 * MIN + 5
    await seed(redis, {**HELD, "t:b": delivering(attempts=2), f"d:{M0 + 2}": {"a", "z"}})
    args = [*outcome("a", "retry", 503, due=nxt), *outcome("b", "retry", err="timeout",
                                                           due=NOW - 3 * MIN)]
    assert await run(store, "complete", NOW + 300, RET, *args) == [1, 1]
    assert await dump(redis) == {
        "t:a": rec("retrying", due=nxt, exec=NOW, last_code=503, **DONE),
        "t:b": rec("retrying", due=NOW - 3 * MIN, minute=M0, exec=NOW, attempts=2,
                   last_at=NOW + 100, last_err="timeout"),
        f"m:{M0 + 2}": {"a": nxt}, f"d:{M0 + 2}": {"z"}, f"m:{M0}": {"b": NOW - 3 * MIN},
        "lease": {"x": NOW + 20_000}, "c:tok": ["a"], "cursor": str(M0)}
    await assert_ttls(redis, {})


async def test_complete_fail(store: Store, redis: Redis) -> None:
    """Failure: failed, finished, into the dead letters at now, retention TTL."""
    await seed(redis, {**HELD, "dead": {"old": NOW - 50}})
    args = outcome("a", "fail", 404, "HTTP 404")
    assert await run(store, "complete", NOW + 300, RET, *args) == [1]
    assert await dump(redis) == {
        "t:a": rec("failed", finished=NOW + 300, last_code=404, last_err="HTTP 404", **DONE),
        "dead": {"old": NOW - 50, "a": NOW + 300}, "lease": {"x": NOW + 20_000},
        "c:tok": ["a"], "cursor": str(M0)}
    await assert_ttls(redis, {"t:a": RET})


async def test_complete_stale_claims_write_nothing(store: Store, redis: Redis) -> None:
    """A token that no longer holds the claim (or a retry without a due time) returns 0."""
    await seed(redis, {**HELD, "t:b": rec("cancelled", finished=NOW, claim="tok"),
                       "t:c": delivering("newer")})
    before = await dump(redis)
    args = [*outcome("a", "retry"), *outcome("b", "ok", 200), *outcome("c", "fail", 404),
            *outcome("a", "ok", 200, token="older"), *outcome("none", "ok")]
    assert await run(store, "complete", NOW + 300, RET, *args) == [0, 0, 0, 0, 0]
    assert await dump(redis) == before
    await assert_ttls(redis, {})


# -- release -------------------------------------------------------------------------------------

async def test_release_hands_back_unstarted_claims(store: Store, redis: Redis) -> None:
    """Unstarted claims go back to their slice (scheduled, or retrying after an attempt);
    started ones and other holders' claims are left alone."""
    due_b = NOW - 2 * MIN
    await seed(redis, {
        "t:a": delivering(due=NOW + 20_000), "t:b": delivering(due=due_b, attempts=2),
        "t:c": delivering(attempts=1, started=NOW), "t:d": delivering("other"),
        "lease": {"a": 1, "b": 2, "c": 3, "d": 4}, f"d:{M0}": {"a", "z"}, "cursor": str(M0)})
    args = ["a", "tok", "b", "tok", "c", "tok", "d", "tok", "none", "tok"]
    assert await run(store, "release", *args) == [1, 1, 0, 0, 0]
    assert await dump(redis) == {
        "t:a": rec(due=NOW + 20_000), "t:b": rec("retrying", due=due_b, minute=M0, attempts=2),
        "t:c": delivering(attempts=1, started=NOW), "t:d": delivering("other"),
        f"m:{M0}": {"a": NOW + 20_000, "b": due_b}, f"d:{M0}": {"z"},
        "lease": {"c": 3, "d": 4}, "cursor": str(M0)}


# -- replay --------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["failed", "cancelled"])
async def test_replay_schedules_now(store: Store, redis: Redis, status: str) -> None:
    """A failed or cancelled task is scheduled again at now with attempts reset, out of the
    dead letters and the delete-set, no longer expiring."""
    now = NOW + 2 * MIN + 7
    await seed(redis, {"t:a": rec(status, attempts=5, finished=NOW, last_code=500),
                       "dead": {"a": NOW, "b": NOW - 1}, f"d:{M0 + 2}": {"a"},
                       "cursor": str(M0)})
    await redis.pexpire(P + "t:a", RET)
    assert await run(store, "replay", "a", now, "r1") == 1
    assert await dump(redis) == {"t:a": rec(due=now, exec=NOW, last_code=500, op="r1"),
                                 "dead": {"b": NOW - 1}, f"m:{M0 + 2}": {"a": now},
                                 "cursor": str(M0)}
    await assert_ttls(redis, {})


async def test_replay_repeated_by_a_client_retry_answers_the_same(store: Store,
                                                                  redis: Redis) -> None:
    """The same replay call re-sent after a lost reply answers 1 again and writes nothing;
    another request for the now scheduled task is refused."""
    await seed(redis, {"t:a": rec("failed", finished=NOW), "dead": {"a": NOW},
                       "cursor": str(M0)})
    assert await run(store, "replay", "a", NOW + 5, "r1") == 1
    state = await dump(redis)
    assert await run(store, "replay", "a", NOW + 6, "r1") == 1
    assert await dump(redis) == state
    assert await run(store, "replay", "a", NOW + 5, "r2") == -2


@pytest.mark.parametrize("status", ["scheduled", "delivering", "retrying", "succeeded"])
async def test_replay_refuses_other_statuses(store: Store, redis: Redis, status: str) -> None:
    """Only failed or cancelled tasks replay (-2); unknown keys are -1; nothing changes."""
    await seed(redis, {"t:a": rec(status), "cursor": str(M0)})
    assert await run(store, "replay", "a", NOW, "r1") == -2
    assert await run(store, "replay", "none", NOW, "r1") == -1
    assert await dump(redis) == {"t:a": rec(status), "cursor": str(M0)}
