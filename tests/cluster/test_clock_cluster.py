"""RedisClock on a real three-master cluster: every process reads TIME from the same node, so
the masters' clocks cannot skew one process against another."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from tests.support.redis_server import RedisCluster
from timewheel.clock import CLOCK_ROUTE_KEY, RedisClock
from timewheel.store.connection import make_redis

from .conftest import node_clients, owner_of

pytestmark = pytest.mark.cluster


def time_calls(cluster: RedisCluster) -> dict[int, int]:
    """Port of each master -> TIME calls it served since the last CONFIG RESETSTAT."""
    calls = {}
    for node, conn in zip(cluster.nodes, node_clients(cluster), strict=True):
        with conn:
            stats: dict[str, Any] = conn.info("commandstats")
            calls[node.port] = int(stats.get("cmdstat_time", {}).get("calls", 0))
    return calls


async def test_clocks_with_different_default_nodes_read_the_same_node(
        cluster: RedisCluster) -> None:
    """Three processes' clients, each with another master as its default node (where redis-py
    sends keyless commands such as TIME): all their clocks read TIME from one master, the one
    serving the clock's route key."""
    clients: list[AsyncRedisCluster] = []
    try:
        for node in cluster.nodes:
            client = make_redis(cluster.seed_url, cluster=True)
            assert isinstance(client, AsyncRedisCluster)
            clients.append(client)
            await client.initialize()
            target = client.get_node(host="127.0.0.1", port=node.port)
            assert target is not None
            client.set_default_node(target)
        defaults = {client.get_default_node().port for client in clients}
        assert len(defaults) == 3  # the test would pass trivially with one default node

        for conn in node_clients(cluster):
            with conn:
                conn.config_resetstat()
        for client in clients:
            clock = RedisClock(client)
            for _ in range(3):
                await clock.refresh()
            assert clock.now_ms() > 0

        calls = time_calls(cluster)
        owner = owner_of(cluster, CLOCK_ROUTE_KEY)
        assert calls == {port: (9 if port == owner else 0) for port in calls}
    finally:
        for client in clients:
            await client.aclose()
