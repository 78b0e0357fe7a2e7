"""The service's Redis connections drop what they have not delivered when redis-py gives up on
a call (timewheel/store/connection.py ``AbortiveClose``): across a partition (a forwarder that
holds what is sent during the cut, tests/support/partition_proxy.py), a pipeline too big for
the kernel's buffers, given up on, reaches Redis after the heal not even in part, and neither
does a command over TLS. A normal close would first deliver the transport's buffer, or run a
TLS shutdown (the socket open meanwhile). tests/e2e/test_partition.py has a single PUT."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.exceptions
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tests.support.partition_proxy import PartitionProxy
from tests.support.redis_server import RedisServer
from tests.support.tls import tls_terminator
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
        await until_closed(proxy)
        assert direct.keys("abort:*") == []
    finally:
        direct.close()
        await client.aclose()
        proxy.stop()


async def test_a_command_over_tls_given_up_on_in_a_partition_never_reaches_redis(
        redis_server: RedisServer, tmp_path: Path) -> None:
    direct = redis_server.client()
    async with tls_terminator(redis_server.port, tmp_path) as (tls_port, cert):
        proxy = PartitionProxy("127.0.0.1", tls_port).start()
        pool = ConnectionPool(connection_class=wheel_connection(SSLConnection),
                              host="127.0.0.1", port=proxy.port, ssl_ca_certs=str(cert),
                              socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        client = Redis(connection_pool=pool)
        try:
            await client.ping()
            proxy.partition()
            with pytest.raises(redis.exceptions.TimeoutError):
                await client.set("abort:tls", "during")
            # The cut outlasts the give-up by a few turns of this loop: a TLS transport's abort
            # closes its socket on the next turn, and heal() blocks this loop while it runs.
            await asyncio.sleep(0.05)
            proxy.heal()
            await until_closed(proxy)
            assert direct.get("abort:tls") is None
        finally:
            direct.close()
            await client.aclose()
            proxy.stop()


async def until_closed(proxy: PartitionProxy) -> None:
    """Until the forwarder has closed both sides of every connection it joined."""
    for _ in range(500):
        if proxy.joined == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{proxy.joined} connections still open")
