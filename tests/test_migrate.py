"""Upgrading a wheel written by layout 1 (timewheel/store/migrate.py): every v1 record becomes a
layout-2 record in the index of its state, the v1 indexes go, nothing is dropped."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from tests.support.bucket_state import (
    FLOW,
    M0,
    MIN,
    NOW,
    RET,
    URL,
    P,
    assert_ttls,
    cancelled,
    dump,
    minutes,
    rec,
)
from timewheel.models import TaskStatus
from timewheel.store import Store
from timewheel.store.migrate import migrate_v1
from timewheel.store.scripts import source


def v1(status: str = "scheduled", due: int = NOW, **extra: Any) -> dict[str, str]:
    """A v1 record (a hash) as v1's schedule.lua wrote the tests' standard task."""
    row: dict[str, Any] = {"status": status, "due": due, "minute": due // MIN, "attempts": 0,
                           "created": NOW, "fp": "fp", "op": "r1=0", "url": URL,
                           "method": "POST", "headers": "[]", "body": "", "exec": due,
                           "max": 5, "backoff": 1000, "timeout": 10000, "flow": FLOW}
    row.update(extra)
    return {k: str(v) for k, v in row.items() if v is not None}


V1_STATE: dict[str, Any] = {
    "t:s": v1(due=NOW + 90_000),
    "t:r": v1("retrying", due=NOW + 5, exec=NOW - 1000, attempts=1, last_at=NOW - 1000,
              last_code=503, last_err="HTTP 503",
              headers='[["Content-Type","application/json"],["X-\\u00e9","a:b"]]',
              body='{"n":1}'),
    "t:d": v1("delivering", claim="tok", started=NOW - 10, attempts=1),
    "t:w": v1("waiting", due=NOW - 7),
    "t:f": v1("failed", finished=NOW - 5, attempts=5, last_code=500, last_err="HTTP 500"),
    "t:o": v1("succeeded", finished=NOW - 9, attempts=1, last_code=200),
    "t:c": v1("cancelled", due=NOW + 2 * MIN, finished=NOW - 3, op="r9"),
    "t:tomb": v1("cancelled", fp="tombstone", finished=NOW - 2),
    "t:old": v1(flow=None, url="https://Example.com/h", method="GET"),
    "t:bad": v1(url=None, headers="not json"),
}
V1_INDEXES: dict[str, Any] = {
    f"m:{M0 + 1}": {"s": NOW + 90_000}, f"m:{M0}": {"r": NOW + 5, "old": NOW, "bad": NOW},
    f"m:{M0 + 2}": {"c": NOW + 2 * MIN}, f"d:{M0 + 2}": {"c"}, "lease": {"d": NOW + 15_000},
    "c:tok": ["d"], f"w:{FLOW}": {"w": NOW - 7}, "wf": {FLOW: NOW - 7},
    "dead": {"f": NOW - 5}, "cursor": str(M0)}
TTL = {"t:f": RET, "t:o": RET, "t:c": RET, "t:tomb": RET}


async def seed_v1(redis: Redis, state: dict[str, Any]) -> None:
    for short, value in state.items():
        name = P + short
        if short.startswith("t:"):
            await redis.hset(name, mapping=value)
        elif short.startswith("d:"):
            await redis.sadd(name, *value)
        elif short.startswith("c:"):
            await redis.rpush(name, *value)
        elif isinstance(value, dict):
            await redis.zadd(name, value)
        else:
            await redis.set(name, value)
    for short, ttl in TTL.items():
        if short in state:
            await redis.pexpire(P + short, ttl)


async def test_every_v1_record_becomes_a_layout_2_task_in_its_index(store: Store,
                                                                    redis: Redis) -> None:
    await seed_v1(redis, {**V1_STATE, **V1_INDEXES})
    assert await migrate_v1(redis, store.keys, now_ms=NOW) == 10
    state = await dump(redis)
    bad = state.pop("t:bad")
    assert (bad["st"], bad["url"], bad["finished"]) == ("f", b"", NOW)
    assert bad["last_err"].startswith(b"could not migrate the v1 record: ")
    assert state == {
        "t:s": rec(due=NOW + 90_000),
        "t:r": rec("retrying", due=NOW + 5, exec=NOW - 1000, attempts=1, last_at=NOW - 1000,
                   last_code=503, last_err="HTTP 503",
                   headers="Content-Type:application/json\nX-\u00e9:a:b", body='{"n":1}'),
        "t:d": rec("delivering", claim="tok", started=True, attempts=1),
        "t:w": rec("waiting", due=NOW - 7),
        "t:f": rec("failed", finished=NOW - 5, attempts=5, last_code=500, last_err="HTTP 500"),
        "t:o": rec("succeeded", finished=NOW - 9, attempts=1, last_code=200),
        "t:c": rec("cancelled", due=NOW + 2 * MIN, finished=NOW - 3),
        "t:tomb": {**rec("cancelled", finished=NOW - 2), "fp": b"tombstone\0\0\0"},
        "t:old": rec(url="https://Example.com/h", meth="G", flow="example.com:443"),
        f"ms:{M0 + 1}": {"s": NOW + 90_000}, f"ms:{M0}": {"r": NOW + 5, "old": NOW},
        **minutes(M0, M0 + 1), "cur": str(M0), "ls": {"d": NOW + 15_000},
        f"pw:{FLOW}": {"w": NOW - 7}, "pa": {"w": NOW - 7}, "pf": {FLOW: NOW - 7},
        "ff": {"f": NOW - 5, "bad": NOW}, "fs": {"o": NOW - 9},
        **cancelled({"c": NOW - 3, "tomb": NOW - 2})}
    await assert_ttls(redis, TTL)
    # Nothing is left to do; the tasks work as any other.
    assert await migrate_v1(redis, store.keys, now_ms=NOW) == 0
    _, tasks = await store.claim(3, now_ms=NOW + 5, horizon_ms=NOW + 5, limit=10, token="x")
    assert sorted(t.key for t in tasks) == ["old", "r"]
    [started] = await store.start(3, claims=[(t.key, "x") for t in tasks if t.key == "r"])
    assert started.headers == [("Content-Type", "application/json"), ("X-\u00e9", "a:b")]
    assert (started.attempt, started.body) == (2, b'{"n":1}')
    [view] = await store.views(3, ["f"])  # (the tests' keys sit in bucket 3 whatever their hash)
    assert view is not None and view.status is TaskStatus.FAILED and view.last_error == "HTTP 500"


async def test_a_v1_process_writing_after_the_upgrade_is_caught_up_at_the_next_start(
        store: Store, redis: Redis) -> None:
    """A v1 process still writing (its cursor back in the bucket): claims do not look at
    layout 1, and the next start of a process (Store.init) migrates its records, which are
    then claimed like any other."""
    await seed_v1(redis, {"t:late": v1(due=NOW), f"m:{M0}": {"late": NOW}, "cursor": str(M0)})
    assert await store.claim(3, now_ms=NOW, horizon_ms=NOW, limit=10, token="a") == (False, [])
    assert await redis.exists(P + "cursor", P + f"m:{M0}") == 2
    restarted = Store(redis, "tw", retention_ms=RET, lease_margin_ms=5000)
    await restarted.init()
    assert await redis.exists(P + "cursor", P + f"m:{M0}") == 0
    _, tasks = await restarted.claim(3, now_ms=NOW, horizon_ms=NOW, limit=10, token="b")
    assert [t.key for t in tasks] == ["late"]


async def test_a_record_changed_while_read_is_read_again(store: Store, redis: Redis) -> None:
    """lua/migrate.lua writes nothing for a v1 record that differs from what was read."""
    await seed_v1(redis, {"t:s": v1(due=NOW + 90_000), "cursor": str(M0)})
    migrate_script = redis.register_script(source("migrate"))
    reply = await migrate_script(keys=[P], args=[NOW, "s", "0" * 40, b"x"])
    assert reply == [-1]
    assert (await redis.type(P + "t:s")) == b"hash"
    assert await migrate_v1(redis, store.keys, now_ms=NOW) == 1
    assert (await dump(redis))["t:s"] == rec(due=NOW + 90_000)


async def test_at_start_the_migration_takes_redis_time(store: Store, redis: Redis) -> None:
    """Store.init migrates, and passes no time: lua/migrate.lua reads Redis's clock for what
    needs one."""
    await seed_v1(redis, {"t:bad": v1(url=None, headers="not json"), "cursor": str(M0)})
    await Store(redis, "tw", retention_ms=RET, lease_margin_ms=5000).init()
    assert await redis.exists(P + "cursor") == 0
    seconds, micros = await redis.time()
    now = seconds * 1000 + micros // 1000
    bad = (await dump(redis))["t:bad"]
    assert now - 60_000 < bad["finished"] <= now
