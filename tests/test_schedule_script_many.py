"""lua/schedule.lua given many tasks of one bucket in one call (POST /tasks/batch and recurring
schedules call it so, timewheel/store/batch.py): each task is answered and written as if it
had been called alone, in order; a refusal (a malformed record, a key of the v1 layout) writes
nothing of the whole call."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from tests.support.bucket_state import (
    M0,
    MIN,
    NOW,
    P,
    dump,
    minutes,
    rec,
    schedule,
    seed,
    template,
)
from timewheel.store import Store

Item = tuple[str, int, str, str]  # key, due, fingerprint, request id


async def schedule_call(store: Store, mode: str, items: list[Item]) -> list[int]:
    """One call of the script with every item."""
    args: list[Any] = [mode, NOW]
    for key, due, fp, req in items:
        args += [key, req, template(due, fp), ""]
    return [int(code) for code in await store.scripts.schedule(keys=[P], args=args)]


async def one_by_one_and_together(store: Store, redis: Redis, state: dict[str, Any],
                                  mode: str, items: list[Item]
                                  ) -> tuple[tuple[list[int], Any], tuple[list[int], Any]]:
    """(replies, bucket afterwards) with a call per item, then with one call for all, each from
    ``state``."""
    await seed(redis, state)
    alone = [await schedule(store, key, due, mode, fp=fp, req=req) for key, due, fp, req in items]
    after_alone = await dump(redis)
    await redis.flushall()
    await seed(redis, state)
    together = await schedule_call(store, mode, items)
    return (alone, after_alone), (together, await dump(redis))


async def test_creates_answer_and_write_as_one_by_one(store: Store, redis: Redis) -> None:
    """New tasks in two minutes, a key given again (identical, then other content), an existing
    task, a task already due (clamped to the cursor's minute)."""
    state = {"t:x": rec(due=NOW + 2 * MIN), f"ms:{M0 + 2}": {"x": NOW + 2 * MIN},
             **minutes(M0 + 2), "cur": str(M0)}
    items = [("a", NOW + MIN, "fp", "r1"), ("b", NOW + 3 * MIN, "fp", "r2"),
             ("a", NOW + MIN, "fp", "r3"), ("a", NOW + MIN, "other", "r4"),
             ("x", NOW + 2 * MIN, "fp", "r5"), ("c", NOW - 5 * MIN, "fp", "r6")]
    alone, together = await one_by_one_and_together(store, redis, state, "create", items)
    assert together == alone
    assert together[0] == [0, 0, 2, -1, 2, 0]


async def test_a_key_replaced_twice_in_one_call_moves_from_where_the_first_put_it(
        store: Store, redis: Redis) -> None:
    """The second replace of x reads the record the first wrote: it marks the first's minute
    (M0 + 5) in its delete-set, not the minute x was in before the call (M0 + 2)."""
    state = {"t:x": rec(due=NOW + 2 * MIN), f"ms:{M0 + 2}": {"x": NOW + 2 * MIN},
             **minutes(M0 + 2), "cur": str(M0)}
    items = [("x", NOW + 5 * MIN, "fp", "r1"), ("y", NOW + 5 * MIN, "fp", "r2"),
             ("x", NOW + 7 * MIN, "fp", "r3"), ("y", NOW + 9 * MIN, "fp", "r4"),
             ("x", NOW + 7 * MIN, "fp", "r3")]  # the same request again: answered as before
    alone, together = await one_by_one_and_together(store, redis, state, "replace", items)
    assert together == alone
    replies, bucket = together
    assert replies == [1, 0, 1, 1, 1]
    assert set(bucket[f"md:{M0 + 5}"]) == {"x", "y"}
    assert set(bucket[f"md:{M0 + 2}"]) == {"x"}
    assert bucket[f"ms:{M0 + 7}"] == {"x": NOW + 7 * MIN}


@pytest.mark.parametrize("at", [0, 2])
async def test_a_malformed_record_anywhere_writes_nothing(store: Store, redis: Redis,
                                                          at: int) -> None:
    args: list[Any] = ["create", NOW]
    for i, key in enumerate(["a", "b", "c"]):
        record = b"\x02" + bytes(90) if i == at else template(NOW + MIN)
        args += [key, f"r{i}", record, ""]
    with pytest.raises(ResponseError, match="malformed record for " + "abc"[at]):
        await store.scripts.schedule(keys=[P], args=args)
    assert await redis.keys("*") == [b"tw:buckets"]


async def test_a_key_of_the_v1_layout_anywhere_writes_nothing(store: Store, redis: Redis) -> None:
    await redis.hset(P + "t:b", mapping={"status": "scheduled"})
    with pytest.raises(ResponseError, match="OLDLAYOUT task b"):
        await schedule_call(store, "create", [("a", NOW + MIN, "fp", "r1"),
                                              ("b", NOW + MIN, "fp", "r2"),
                                              ("c", NOW + MIN, "fp", "r3")])
    assert sorted(await redis.keys("*")) == [b"tw:buckets", (P + "t:b").encode()]
