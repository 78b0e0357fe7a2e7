"""The service's Redis connections drop what they have not delivered when redis-py gives up on
a call (timewheel/store/connection.py ``AbortiveClose``): across a partition (a forwarder that
holds what is sent during the cut, tests/support/partition_proxy.py), a pipeline too big for
the kernel's buffers, given up on, reaches Redis after the heal not even in part. A normal
close would first deliver the transport's buffer (tests/e2e/test_partition.py has the small
request of a single PUT)."""

from __future__ import annotations

import asyncio

import pytest
import redis.exceptions
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tests.support.partition_proxy import PartitionProxy
from tests.support.redis_server import RedisServer
from timewheel.store.connection import wheel_connection

VALUE = "v" * 1000
WRITES = 12_000  # ~12 MB: more than the kernel's socket buffers on both sides hold


async def test_a_big_write_given_up_on_in_a_partition_never_reaches_redis(
        redis_server: RedisServer) -> None:
    proxy = PartitionProxy("127.0.0.1", redis_server.port).start()
    pool = ConnectionPool(connection_class=wheel_connection(Connection), host="127.0.0.1",
                          port=proxy.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    client = Redis(connection_pool=pool)
    direct = redis_server.client()
    try:
        await client.ping()  # connected before the cut, as the service's pool is
        proxy.partition()
        pipe = client.pipeline(transaction=False)
        for i in range(WRITES):
            pipe.set(f"abort:{i}", VALUE)
        with pytest.raises(redis.exceptions.TimeoutError):
            await pipe.execute()
        proxy.heal()
        for _ in range(500):  # until the forwarder has closed both sides of the connection
            if proxy.joined == 0:
                break
            await asyncio.sleep(0.02)
        assert proxy.joined == 0
        assert direct.keys("abort:*") == []
    finally:
        direct.close()
        await client.aclose()
        proxy.stop()
