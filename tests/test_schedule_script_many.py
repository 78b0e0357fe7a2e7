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
    delivering,
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


async def test_replaces_answer_and_write_as_one_by_one(store: Store, redis: Redis) -> None:
    """A pending task moved to another minute (its old minute's delete-set marks it), a new
    key, a claimed task (its lease dropped), a request id given again (answered as before)."""
    state = {"t:x": rec(due=NOW + 2 * MIN), f"ms:{M0 + 2}": {"x": NOW + 2 * MIN},
             "t:d": delivering(due=NOW + MIN), "ls": {"d": NOW + MIN + 15_000},
             **minutes(M0 + 2), "cur": str(M0)}
    items = [("x", NOW + 5 * MIN, "fp", "r1"), ("y", NOW + 5 * MIN, "fp", "r2"),
             ("d", NOW + 7 * MIN, "fp", "r3"), ("z", NOW + 9 * MIN, "fp", "r2")]
    alone, together = await one_by_one_and_together(store, redis, state, "replace", items)
    assert together == alone
    replies, bucket = together
    assert replies == [1, 0, 1, 0]
    assert bucket[f"md:{M0 + 2}"] == {"x"} and "ls" not in bucket


async def test_a_key_given_twice_to_replace_is_refused_before_any_write(
        store: Store, redis: Redis) -> None:
    """A record keeps only its last request id: a re-sent call could not tell that the first
    replace of the key was done, so one call replaces a key once."""
    await seed(redis, {"t:x": rec(due=NOW + 2 * MIN)})
    before = await dump(redis)
    with pytest.raises(ResponseError, match="x given twice to replace"):
        await schedule_call(store, "replace", [("y", NOW + MIN, "fp", "r1"),
                                               ("x", NOW + 5 * MIN, "fp", "r2"),
                                               ("x", NOW + 7 * MIN, "fp", "r3")])
    assert await dump(redis) == before


async def test_malformed_arguments_write_nothing(store: Store, redis: Redis) -> None:
    whole = ["a", "r1", template(NOW + MIN), "", "b", "r2", template(NOW + MIN), ""]
    for args in (["create", NOW, *whole[:-1]],  # the last task's values cut short
                 ["create", "soon", *whole], ["upsert", NOW, *whole]):
        with pytest.raises(ResponseError, match="malformed arguments"):
            await store.scripts.schedule(keys=[P], args=args)
    assert await redis.keys("*") == [b"tw:buckets"]


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
