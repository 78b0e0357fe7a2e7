"""The request deadline (api/deadline.py) cancels a request wherever it is. On a cluster a
request may be the one refreshing the slot map (redis-py's ``RedisCluster.initialize``, which
every command runs first once a timeout set ``_initialize``: the silent-master case the
deadline is for, where a refresh that asks the silent master takes its 5 s socket timeout).
Cancelled there, redis-py closed every node's connections (``except BaseException: await
self.nodes_manager.aclose()``), those of commands in flight on healthy masters too: they
failed, and were sent again only after the next refresh."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster


async def test_a_request_cancelled_while_it_refreshes_the_slot_map_leaves_other_commands_be(
        cluster_redis: AsyncRedisCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    await cluster_redis.initialize()
    await cluster_redis.set("warm", "1")
    # A command in flight on a healthy master: a BLPOP that answers None after 1 s.
    other = asyncio.create_task(cluster_redis.blpop(["{healthy}:list"], timeout=1))
    await asyncio.sleep(0.3)
    # A request meets a slot map to refresh, and the refresh is slow (it asks the silent
    # master first: its socket timeout).
    manager = type(cluster_redis.nodes_manager)  # slotted: patched on its class
    real_refresh, real_close = manager.initialize, manager.aclose
    closes: list[str] = []

    async def slow_refresh(self: Any, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(5)
        await real_refresh(self, *args, **kwargs)

    async def counted_close(self: Any, *args: Any, **kwargs: Any) -> None:
        closes.append("every node's connections")
        await real_close(self, *args, **kwargs)

    monkeypatch.setattr(manager, "initialize", slow_refresh)
    monkeypatch.setattr(manager, "aclose", counted_close)
    cluster_redis._initialize = True
    request = asyncio.create_task(cluster_redis.get("{silent}:t:x"))
    await asyncio.sleep(0.2)
    request.cancel()  # what the request deadline's watchdog does
    with pytest.raises(asyncio.CancelledError):
        await request
    assert await other is None
    assert closes == []  # the BLPOP's connection, among others, was never torn down


async def test_callers_cancelled_during_a_refresh_leave_one_refresh_not_one_each(
        cluster_redis: AsyncRedisCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """(A second review.) Shielded, each cancelled caller left its own refresh queued on
    redis-py's lock; a silent master's refreshes fail, so each one ran in turn, a socket
    timeout each. Callers meanwhile now wait for the one refresh under way."""
    await cluster_redis.initialize()
    manager = type(cluster_redis.nodes_manager)
    real_refresh = manager.initialize
    refreshes: list[str] = []

    async def slow_failing_refresh(self: Any, *args: Any, **kwargs: Any) -> None:
        refreshes.append("refresh")
        await asyncio.sleep(0.5)
        raise ConnectionError("the silent master did not answer")

    monkeypatch.setattr(manager, "initialize", slow_failing_refresh)
    cluster_redis._initialize = True
    callers = [asyncio.create_task(cluster_redis.initialize()) for _ in range(5)]
    await asyncio.sleep(0.1)
    for caller in callers:
        caller.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    await asyncio.sleep(1.5)  # room for the queued ones, had there been any
    assert refreshes == ["refresh"]
    monkeypatch.setattr(manager, "initialize", real_refresh)
    await cluster_redis.initialize()  # and the client refreshes again once asked
    assert cluster_redis._initialize is False
