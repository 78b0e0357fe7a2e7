"""The single-Redis client's pool (timewheel/store/connection.py ``WheelPool``): redis-py's
blocking pool with a fast path while nobody waits. Checked on a real redis-server: the fast
path is taken when it may be and only then, an exhausted pool still queues its callers and
serves every one within its bound, and the calls after the server dropped a connection
succeed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import Connection
from redis.exceptions import TimeoutError as RedisTimeoutError

from tests.support.redis_server import RedisServer
from tests.support.silent_redis import count_dials
from timewheel import __version__
from timewheel.store import connection
from timewheel.store.connection import DRIVER_INFO, WheelPool, make_redis


@pytest.fixture
def slow_paths(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = {"get": 0, "release": 0}
    get, release = BlockingConnectionPool.get_connection, BlockingConnectionPool.release

    async def counted_get(self: BlockingConnectionPool, *args: Any, **kwargs: Any) -> Any:
        counts["get"] += 1
        return await get(self, *args, **kwargs)

    async def counted_release(self: BlockingConnectionPool, connection: Any) -> None:
        counts["release"] += 1
        await release(self, connection)

    monkeypatch.setattr(BlockingConnectionPool, "get_connection", counted_get)
    monkeypatch.setattr(BlockingConnectionPool, "release", counted_release)
    return counts


@pytest.fixture
async def small_pool(redis_server: RedisServer) -> AsyncIterator[tuple[Redis, WheelPool]]:
    pool = WheelPool.from_url(redis_server.url, max_connections=2, timeout=10)
    client = Redis.from_pool(pool)
    yield client, pool
    await client.aclose()


def test_the_service_client_uses_the_pool() -> None:
    assert isinstance(make_redis("redis://127.0.0.1:1").connection_pool, WheelPool)


async def test_an_idle_connection_is_taken_and_given_back_on_the_fast_path(
        small_pool: tuple[Redis, WheelPool], slow_paths: dict[str, int]) -> None:
    client, pool = small_pool
    await client.ping()  # the first call makes the connection: redis-py's path
    assert slow_paths == {"get": 1, "release": 0}
    for _ in range(5):
        assert await client.ping()
    assert slow_paths == {"get": 1, "release": 0}
    assert (len(pool._available_connections), len(pool._in_use_connections)) == (1, 0)


async def test_an_exhausted_pool_queues_its_callers_and_serves_them_all(
        small_pool: tuple[Redis, WheelPool], slow_paths: dict[str, int]) -> None:
    """Ten 50 ms commands over two connections: eight wait on redis-py's path, and every
    release while someone waits goes that way too, so each waiter is woken."""
    client, pool = small_pool
    async with asyncio.timeout(10):
        replies = await asyncio.gather(*[client.blpop([f"pool:empty:{i}"], timeout=0.05)
                                         for i in range(10)])
    assert replies == [None] * 10
    assert len(pool._in_use_connections) == 0 and len(pool._available_connections) == 2
    assert slow_paths["get"] >= 8 and slow_paths["release"] >= 8
    assert not pool._condition._waiters  # type: ignore[attr-defined]


async def test_a_connection_the_server_dropped_is_made_again(
        redis_server: RedisServer) -> None:
    """The service's client, its idle connection closed by the server: the next calls
    succeed. redis-py's retry makes the new connection, with its own pool as with this one
    (neither notices the close before the call); this guards the fast path against handing
    out a connection that no retry can recover."""
    client = make_redis(redis_server.url)
    try:
        assert await client.ping()
        killer = Redis.from_url(redis_server.url)
        try:
            assert await killer.client_kill_filter(_type="normal", skipme=True) >= 1
        finally:
            await killer.aclose()
        await asyncio.sleep(0.05)  # the close reaches the idle connection's reader
        assert await client.ping()
        assert await client.set("pool:after", "1") and await client.get("pool:after") == b"1"
    finally:
        await client.aclose()


async def test_the_service_connections_name_timewheel_and_share_one_driver_info(
        redis_server: RedisServer) -> None:
    """CLIENT LIST shows which program holds a connection; and every connection of the pool
    reuses one DriverInfo, which redis-py otherwise builds per connection from its installed
    metadata (~1 ms of the event loop each)."""
    client = make_redis(redis_server.url)
    try:
        await asyncio.gather(*(client.execute_command("DEBUG", "SLEEP", "0.05")
                               for _ in range(3)))  # three at once: three connections
        pool = client.connection_pool
        made = [*pool._available_connections, *pool._in_use_connections]
        assert len(made) == 3
        assert all(c.driver_info is DRIVER_INFO for c in made)
        ours = {"{}:{}".format(*c._writer.get_extra_info("sockname")[:2]) for c in made}
        names = [c["lib-name"] for c in await client.client_list() if c["addr"] in ours]
        assert names == [f"redis-py(timewheel_v{__version__})"] * 3
    finally:
        await client.aclose()


async def test_a_silent_redis_is_given_up_on_after_one_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis that answers nothing (stopped, cut off) raises at the first socket timeout: a
    503 then, not after two more tries of the same timeout. A reset connection is still tried
    again on a new one (the calls after the server dropped one, above)."""
    dials = count_dials(monkeypatch)
    with RedisServer(tmp_path / "redis") as server:
        client = make_redis(server.url)
        try:
            assert await client.ping()
            before = dials()
            with server.stopped(), pytest.raises(RedisTimeoutError):
                await client.get("k")
            assert dials() == before  # no new connection for a second try
            assert await client.ping()  # and the next call, once it answers, succeeds
        finally:
            await client.aclose()


async def test_a_connect_the_event_loop_held_up_is_not_a_timeout(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new connection whose connect the event loop could not finish within the cluster's
    short connect timeout (a burst of requests on a fresh pool holds the loop) still succeeds:
    a single Redis's connect has the socket timeout, which is not retried. Timeouts shortened
    here: the loop is held 0.4 s, past a 0.1 s connect timeout, within a 1 s socket one."""
    monkeypatch.setattr(connection, "SOCKET_TIMEOUT", 1.0)
    monkeypatch.setattr(connection, "CONNECT_TIMEOUT", 0.1)
    dialling = asyncio.Event()
    dial = Connection._connect

    async def flagged(self: Connection) -> None:
        dialling.set()
        await dial(self)  # its timeout is armed before its first wait

    monkeypatch.setattr(Connection, "_connect", flagged)
    client = make_redis(redis_server.url)
    try:
        ping = asyncio.create_task(client.ping())
        await dialling.wait()
        time.sleep(0.4)  # the loop held: what a burst of requests does to a connect in flight
        assert await ping
    finally:
        await client.aclose()
