"""Builds the redis-py asyncio client: a single Redis or a Redis Cluster, from a URL."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

# Short timeouts: a dead Redis must turn into a quick 503, not a hung request. Retries are safe
# for every script: claim is idempotent per token, start per token, and schedule, complete,
# release, cancel and replay answer the same (or "stale") when run twice.
SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=0.5, base=0.02), retries=2,
                 supported_errors=(ConnectionError, TimeoutError))


def make_redis(url: str, *, cluster: bool = False) -> Redis | RedisCluster:
    if cluster:
        return RedisCluster.from_url(
            url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT,
            retry=_retry(), decode_responses=False)
    return Redis.from_url(
        url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT,
        retry=_retry(), retry_on_error=[ConnectionError, TimeoutError], decode_responses=False,
        health_check_interval=30)
