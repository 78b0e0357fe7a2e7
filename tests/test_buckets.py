"""TIMEWHEEL_BUCKETS: the bucket count is chosen when a wheel is first written to Redis and fixed
afterwards. Unset adopts what Redis holds (16 for a new wheel); set, it is written on a new
wheel, and a wheel in Redis with another count refuses to start."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from tests.conftest import START_MS, running_app
from tests.e2e.conftest import Service
from tests.support.redis_server import RedisServer
from timewheel.api.app import create_app
from timewheel.clock import FakeClock
from timewheel.errors import WheelMismatch
from timewheel.settings import Settings
from timewheel.store import Store
from timewheel.store.keys import DEFAULT_BUCKETS


def new_store(redis: Redis, buckets: int | None = None, prefix: str = "tw") -> Store:
    return Store(redis, prefix, retention_ms=86_400_000, lease_margin_ms=5000, buckets=buckets)


async def test_unset_on_a_new_wheel_writes_and_uses_the_default(redis: Redis) -> None:
    store = new_store(redis)
    await store.init()
    assert await redis.get("tw:buckets") == str(DEFAULT_BUCKETS).encode()
    assert store.ready and store.keys.buckets == DEFAULT_BUCKETS


async def test_set_on_a_new_wheel_is_written_and_used(redis: Redis) -> None:
    store = new_store(redis, 64)
    await store.init()
    assert await redis.get("tw:buckets") == b"64"
    assert store.keys.buckets == 64
    assert {store.keys.bucket_of(f"task-{i}") for i in range(2000)} == set(range(64))
    assert store.keys.prefix(63) == "{tw:63}:"


async def test_unset_adopts_the_count_the_wheel_has(redis: Redis) -> None:
    await new_store(redis, 256).init()
    store = new_store(redis)
    await store.init()
    assert store.keys.buckets == 256
    assert await redis.get("tw:buckets") == b"256"


async def test_the_same_count_as_the_wheel_starts(redis: Redis) -> None:
    await new_store(redis).init()
    store = new_store(redis, DEFAULT_BUCKETS)
    await store.init()
    assert store.ready and store.keys.buckets == DEFAULT_BUCKETS


async def test_another_count_than_the_wheel_has_refuses_and_changes_nothing(
        redis: Redis) -> None:
    await new_store(redis).init()
    store = new_store(redis, 64)
    with pytest.raises(WheelMismatch) as raised:
        await store.init()
    message = str(raised.value)
    assert "TIMEWHEEL_BUCKETS=64" in message and "16 buckets" in message
    assert "TIMEWHEEL_KEY_PREFIX" in message  # and what to do about it
    assert not store.ready
    assert await redis.get("tw:buckets") == b"16"


async def test_wheels_under_other_prefixes_keep_their_own_count(redis: Redis) -> None:
    await new_store(redis, 64, prefix="a").init()
    store = new_store(redis, 128, prefix="b")
    await store.init()
    assert store.keys.buckets == 128
    assert await redis.get("a:buckets") == b"64"


async def test_api_started_while_redis_was_down_learns_the_count_before_writing(
        tmp_path: Path) -> None:
    """A process that started while Redis was down cannot know the wheel's count yet: its
    first request after Redis is back reads it, so the task lands in the bucket every other
    process computes (64 here), not in one of the default 16."""
    key = next(k for k in (f"task-{i}" for i in range(100))
               if zlib.crc32(k.encode()) % 64 != zlib.crc32(k.encode()) % 16)
    server = RedisServer(tmp_path / "redis").start()
    try:
        with server.client() as conn:
            conn.set("tw:buckets", 64)
        server.stop()
        settings = Settings(redis_url=server.url, allow_private_networks=True,
                            data_dir=tmp_path)
        app = create_app(settings, clock=FakeClock(START_MS), run_ticker=False)
        async with running_app(app) as client:
            task = {"key": key, "callback_url": "http://127.0.0.1:9/hook", "delay": 60}
            assert (await client.post("/tasks", json=task)).status_code == 503
            server.start()
            assert (await client.post("/tasks", json=task)).status_code == 201
        with server.client() as conn:
            bucket = zlib.crc32(key.encode()) % 64
            assert conn.exists(f"{{tw:{bucket}}}:t:{key}")
    finally:
        server.stop()


@pytest.mark.parametrize("value", ["0", "-1", "16385", "many"])
def test_out_of_range_values_are_rejected(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TIMEWHEEL_BUCKETS", value)
    with pytest.raises(ValidationError):
        Settings()


def test_the_environment_variable_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().buckets is None
    monkeypatch.setenv("TIMEWHEEL_BUCKETS", "16384")
    assert Settings().buckets == 16384


@pytest.mark.e2e
def test_serve_refuses_to_start_on_a_wheel_with_another_count(tmp_path: Path) -> None:
    """`timewheel serve` with its embedded Redis: a wheel created with 16 buckets, then a start
    with TIMEWHEEL_BUCKETS=64 exits non-zero saying both numbers and what to do; the data is
    left as it was, and a start with the matching count serves again."""
    first = Service(tmp_path, None).start()
    try:
        assert first.stop() == 0
        refused = Service(tmp_path, None, buckets="64")
        with pytest.raises(RuntimeError, match="exited early"):
            refused.start()
        assert refused.process is not None and refused.process.returncode != 0
        log = refused.log()
        assert "TIMEWHEEL_BUCKETS=64" in log and "16 buckets" in log, log
        matching = Service(tmp_path, None, buckets="16").start()
        try:
            with matching.client() as http:
                assert http.get("/healthz").status_code == 200
        finally:
            assert matching.stop() == 0
    finally:
        first.kill()
