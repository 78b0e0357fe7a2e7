"""Builds the redis-py asyncio client: a single Redis or a Redis Cluster, from a URL."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

# Short timeouts: a dead Redis must turn into a quick 503, not a hung request. Retries are safe
# for every script: claim is idempotent per token, start per token, and schedule, complete,
# release, cancel and replay answer the same (or "stale") when run twice.
SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0
MAX_CONNECTIONS = 64  # per process (per node on a cluster); calls are batched per bucket


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=0.5, base=0.02), retries=2,
                 supported_errors=(ConnectionError, TimeoutError))


def make_redis(url: str, *, cluster: bool = False) -> Redis | RedisCluster:
    if cluster:
        return RedisCluster.from_url(
            url, max_connections=MAX_CONNECTIONS, socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT,
            retry=_retry(), decode_responses=False)
    # A blocking pool: under a burst, callers queue for a connection instead of failing with
    # "Too many connections" (the default pool's behaviour at its 100-connection cap).
    pool = BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=SOCKET_TIMEOUT,
        socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT,
        retry=_retry(), retry_on_error=[ConnectionError, TimeoutError], decode_responses=False,
        health_check_interval=30)
    return Redis.from_pool(pool)
