"""The Redis settings that keep a dense wheel compact (timewheel/store/redis_settings.py): the
start-up warning about each one a Redis has too low, its absence with the recommended values,
silence where CONFIG is refused, and the embedded Redis started with them."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.support.redis_server import HOST, RedisServer, redis_server_version
from tests.test_store import schedule_all, task
from timewheel.store import Store
from timewheel.store.embedded import EmbeddedRedis
from timewheel.store.redis_settings import (
    COMPACT_ENTRIES,
    MEMORY_SETTINGS,
    costly_settings,
    parse_version,
    server_args,
)

START_MS = 1_800_000_000_000  # a minute boundary
DENSE = 200  # tasks of one bucket due in one minute: more than Redis's default limit, 128


async def started_store(url: str) -> AsyncIterator[Store]:
    client = Redis.from_url(url)
    store = Store(client, "tw", retention_ms=86_400_000, lease_margin_ms=5000)
    try:
        await store.init()
        yield store
    finally:
        await client.aclose()


def memory_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "max" in r.getMessage()]


async def dense_slice_encoding(store: Store) -> str:
    """Schedule DENSE tasks of bucket 0 due in the next minute; the encoding of its slice."""
    keys = (f"k{i}" for i in range(100_000))
    mine = [k for k in keys if store.keys.bucket_of(k) == 0][:DENSE]
    minute = START_MS + 60_000
    await schedule_all(store, (task(k, minute + i) for i, k in enumerate(mine)), START_MS)
    slice_key = store.keys.slice(0, minute // 60_000)
    assert await store.redis.zcard(slice_key) == DENSE
    return (await store.redis.object("encoding", slice_key)).decode()


async def test_a_redis_with_its_defaults_is_warned_about_and_its_slices_are_not_compact(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="timewheel.store")
    with RedisServer(tmp_path / "redis", memory_settings=False) as server:
        async for store in started_store(server.url):
            assert await dense_slice_encoding(store) == "skiplist"
    warnings = memory_warnings(caplog)
    assert len(warnings) == 1, warnings
    version = redis_server_version()  # each setting this server has, in the name it uses
    costly = [f"{s.named_for(version)} 128 (set 512)" for s in MEMORY_SETTINGS
              if version >= s.since]
    assert costly and all(text in warnings[0] for text in costly), (costly, warnings[0])


async def test_the_recommended_settings_are_not_warned_about_and_keep_slices_compact(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The control for the silence is the test above: the same init, the same check."""
    caplog.set_level(logging.WARNING, logger="timewheel.store")
    with RedisServer(tmp_path / "redis", memory_settings=True) as server:
        async for store in started_store(server.url):
            assert await dense_slice_encoding(store) in {"ziplist", "listpack"}
    assert caplog.records == []


async def test_nothing_is_said_where_config_is_refused(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Managed Redis often renames or refuses CONFIG: the wheel starts, without a warning."""
    caplog.set_level(logging.WARNING, logger="timewheel.store")
    with RedisServer(tmp_path / "redis", memory_settings=False,
                     extra_args=["--rename-command", "CONFIG", ""]) as server:
        async for store in started_store(server.url):
            assert store.ready
    assert caplog.records == []


async def test_the_embedded_redis_starts_with_the_compact_settings(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="timewheel.store")
    embedded = EmbeddedRedis(tmp_path / "data", appendfsync="everysec")
    embedded.start()
    try:
        async for store in started_store(embedded.url):
            config = await store.redis.config_get("*set-max-listpack-entries")
            # the embedded Valkey 8.1 has both: the slices' and the delete-sets' (7.2+)
            assert config == {"zset-max-listpack-entries": str(COMPACT_ENTRIES),
                              "set-max-listpack-entries": str(COMPACT_ENTRIES)}
            assert await dense_slice_encoding(store) in {"ziplist", "listpack"}
    finally:
        embedded.stop()
    assert caplog.records == []


def test_server_args_use_the_names_each_version_accepts() -> None:
    assert server_args((6, 2)) == ["--zset-max-ziplist-entries", "512"]
    assert server_args((7, 0)) == ["--zset-max-listpack-entries", "512"]
    assert server_args((7, 2)) == ["--zset-max-listpack-entries", "512",
                                   "--set-max-listpack-entries", "512"]
    assert parse_version("Redis server v=6.2.14 sha=40305114:0 malloc=libc") == (6, 2)
    assert parse_version("Redis server v=7.4.1 sha=00000000:0 malloc=jemalloc") == (7, 4)
    with pytest.raises(ValueError):
        parse_version("redis-cli 7.4.1")


def test_costly_settings_name_each_one_in_the_servers_own_names() -> None:
    # Redis 7.2+ answers CONFIG GET "*set-max-*-entries" under both zset names.
    redis_72 = {"zset-max-listpack-entries": "128", "zset-max-ziplist-entries": "128",
                "set-max-listpack-entries": "128", "set-max-intset-entries": "512"}
    assert costly_settings(redis_72) == ["zset-max-listpack-entries 128 (set 512)",
                                         "set-max-listpack-entries 128 (set 512)"]
    assert costly_settings({**redis_72, "zset-max-listpack-entries": "2048",
                            "zset-max-ziplist-entries": "2048",
                            "set-max-listpack-entries": "512"}) == []
    assert costly_settings({"zset-max-ziplist-entries": "128",
                            "set-max-intset-entries": "512"}) == [
        "zset-max-ziplist-entries 128 (set 512)"]


@pytest.mark.parametrize(("server_options", "said"), [
    ({"extra_args": ["--appendonly", "no"]}, "appendonly no: a restart of it loses every task"),
    ({"appendfsync": "no"}, "appendfsync no: a power loss loses"),
])
async def test_a_redis_that_may_lose_acknowledged_tasks_is_warned_about(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, server_options: dict[str, Any],
        said: str) -> None:
    """The README promised a start-up warning for a Redis without an append-only file, and
    there was none: its restart loses the wheel. One now, naming the setting; the control
    (always, everysec: the test servers') is the silence of the tests above."""
    caplog.set_level(logging.WARNING, logger="timewheel.store")
    with RedisServer(tmp_path / "redis", **server_options) as server:
        async for _ in started_store(server.url):
            pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and said in warnings[0], warnings
    # It names the Redis by its address, as a cluster's warnings name each master (it said
    # "Redis redis has ...": the name of no server).
    assert warnings[0].startswith(f"Redis {HOST}:{server.port} has "), warnings
