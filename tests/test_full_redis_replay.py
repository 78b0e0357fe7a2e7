"""A replay while Redis is full (found reviewing 525e7f4, a DELETE of a task goes through while
full):

lua/replay.lua's first write is PERSIST, which Redis does not check against maxmemory (not
deny-oom); after it Redis checks none of the script's writes. So POST /tasks/{key}/replay
answered 200 while Redis was full and stored the task again (its record, a slice entry),
where docs/deploy.md promises that writes are refused whole. Since cancels now go through
while full too, a client alternating DELETE and replay grows a full Redis without bound: each
pair in a new minute leaves a slice entry and a delete-set entry that only the claimer (itself
refused while full) drops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from tests.conftest import START_MS, running_app
from tests.support.redis_server import RedisServer
from tests.test_full_redis import fill, full_redis, redis, state, unfill  # noqa: F401
from tests.test_store import task
from timewheel.api.app import create_app
from timewheel.errors import StoreUnavailable
from timewheel.settings import Settings
from timewheel.store import Store

MIN = 60_000


@pytest.fixture
async def api(full_redis: RedisServer, tmp_path: Path  # noqa: F811
              ) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=full_redis.url, allow_private_networks=True,
                        data_dir=tmp_path, tick_seconds=0.2)
    async with running_app(create_app(settings, run_ticker=False)) as client:
        yield client


async def test_replay_while_full_is_refused_and_changes_nothing(
        api: httpx.AsyncClient, redis: Redis) -> None:  # noqa: F811
    url = "http://127.0.0.1:9/hook"
    assert (await api.put("/tasks/k", json={"callback_url": url, "delay": 3600})
            ).status_code == 201
    assert (await api.delete("/tasks/k")).status_code == 204
    await fill(redis)
    before = await state(redis)
    answer = await api.post("/tasks/k/replay")
    assert answer.status_code == 503, answer.text
    assert answer.headers.get("retry-after")
    assert await state(redis) == before, "replay answered 503 but wrote"
    await unfill(redis)
    assert (await api.get("/tasks/k")).json()["status"] == "cancelled"
    assert (await api.post("/tasks/k/replay")).status_code == 200


async def test_cancel_and_replay_while_full_do_not_grow_redis(
        redis: Redis) -> None:  # noqa: F811
    """The same task cancelled and replayed again and again while full (a minute apart)."""
    store = Store(redis, "tw", retention_ms=7 * 86_400_000, lease_margin_ms=5000)
    await store.init()
    keys = [f"k{i}" for i in range(10)]
    for key in keys:
        await store.schedule(task(key, START_MS + 3600_000), replace=False, now_ms=START_MS)
    await fill(redis)
    sizes = []
    now = START_MS
    for _ in range(30):
        now += MIN
        for key in keys:
            await store.cancel(key, now_ms=now)  # goes through while full (525e7f4)
            try:
                await store.replay(key, now_ms=now)
            except StoreUnavailable:
                pass
        sizes.append(await redis.dbsize())
    assert sizes[-1] == sizes[0], f"keys grew while full: {sizes[0]} -> {sizes[-1]}"
