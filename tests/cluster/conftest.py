"""Cluster fixtures and helpers: one real three-master Redis Cluster per test session (per
xdist worker), emptied before every test, and `timewheel serve` processes pointed at it; and
for the tests that kill or move things, a cluster of the test's own in production shape
(three masters with a replica each, ``replicated_cluster``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from tests.cluster.replicated import ReplicatedCluster
from tests.e2e.conftest import Service, services  # noqa: F401 (the e2e fixture, here too)
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisCluster
from tests.support.waiting import settle
from timewheel.models import parse_execute_at
from timewheel.store import Store
from timewheel.store.connection import make_redis
from timewheel.store.keys import DEFAULT_BUCKETS, Keyspace

RETENTION_MS = 7 * 86_400_000


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with RedisCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


def node_clients(cluster: RedisCluster) -> list[redis.Redis]:
    """A sync client per master, talking to that node alone (no redirects)."""
    return [node.client() for node in cluster.nodes]


def slot_owners(cluster: RedisCluster) -> dict[int, int]:
    """Bucket -> port of the master that serves the bucket prefix's slot (asked of Redis)."""
    with cluster.nodes[0].client() as conn:
        ranges = conn.execute_command("CLUSTER SLOTS")
        owners = {}
        for bucket in range(DEFAULT_BUCKETS):
            slot = int(conn.execute_command("CLUSTER KEYSLOT", Keyspace("tw").prefix(bucket)))
            owners[bucket] = next(int(r[2][1]) for r in ranges if r[0] <= slot <= r[1])
    return owners


def owner_of(cluster: RedisCluster, key: str) -> int:
    """Port of the master serving ``key``'s slot, as the cluster itself says."""
    with cluster.nodes[0].client() as conn:
        slot = int(conn.execute_command("CLUSTER KEYSLOT", key))
        ranges = conn.execute_command("CLUSTER SLOTS")
    return next(int(r[2][1]) for r in ranges if r[0] <= slot <= r[1])


def all_keys(nodes: list[redis.Redis]) -> dict[str, tuple[redis.Redis, int]]:
    """Every key on every node -> (the node's client, the key's PTTL)."""
    found: dict[str, tuple[redis.Redis, int]] = {}
    for conn in nodes:
        for key in conn.scan_iter(count=1000):
            found[key.decode()] = (conn, int(conn.pttl(key)))
    return found


def post_tasks(service: Service, keys: list[str], url: str, delay: float) -> None:
    with service.client() as http:
        for key in keys:
            reply = http.post("/tasks", json={"key": key, "callback_url": url, "delay": delay})
            assert reply.status_code == 201, reply.text


def wait_finished(service: Service, keys: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Poll GET /tasks/{key} until none is scheduled, delivering or retrying; the views."""
    views: dict[str, dict[str, Any]] = {}
    pending = list(keys)
    with service.client() as http:
        def finished() -> bool:
            for key in list(pending):
                view = http.get(f"/tasks/{key}").json()
                if view["status"] in ("succeeded", "failed", "cancelled"):
                    views[key] = view
                    pending.remove(key)
            return not pending

        settle(finished, timeout, lambda: f"{len(pending)} of {len(keys)} tasks to finish "
               f"(first unfinished: {pending[:3]}); the service's log:\n{service.log()}")
    return views


def once_each(receiver: ThreadedReceiver, path: str) -> Counter[str]:
    return Counter(a.headers["webhook-id"] for a in receiver.arrivals_for(path))


def metric(service: Service, name: str) -> float:
    text = httpx.get(f"{service.base_url}/metrics", timeout=10).text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def cluster_state(conn: redis.Redis) -> str:
    info = conn.execute_command("CLUSTER INFO")  # parsed to a dict by some client versions
    if isinstance(info, dict):
        return str(info.get("cluster_state"))
    return re.search(r"cluster_state:(\w+)", info.decode()).group(1)  # type: ignore[union-attr]


@pytest.fixture
def cluster(redis_cluster: RedisCluster) -> Iterator[RedisCluster]:
    """The session's cluster, every master emptied (keys and script cache) before the test."""
    for conn in node_clients(redis_cluster):
        with conn:
            conn.flushall()
            conn.script_flush()
    yield redis_cluster


@pytest.fixture
async def cluster_redis(cluster: RedisCluster) -> AsyncIterator[AsyncRedisCluster]:
    """The service's own cluster client (``make_redis(seed, cluster=True)``)."""
    client = make_redis(cluster.seed_url, cluster=True)
    assert isinstance(client, AsyncRedisCluster)
    yield client
    await client.aclose()


@pytest.fixture
async def cluster_store(cluster_redis: AsyncRedisCluster) -> Store:
    store = Store(cluster_redis, "tw", retention_ms=RETENTION_MS, lease_margin_ms=5000)
    await store.init()
    return store


def _services_on(tmp_path: Path, seed_url: str) -> Iterator[Callable[..., Service]]:
    """Yields ``start(**settings)``: one more `timewheel serve` with TIMEWHEEL_REDIS_URL=
    ``seed_url`` and TIMEWHEEL_REDIS_CLUSTER=true; every one started is killed at the end."""
    started: list[Service] = []

    def start(**settings: str) -> Service:
        service = Service(tmp_path / f"serve{len(started)}", seed_url,
                          redis_cluster="true", **settings)
        started.append(service)
        return service.start()

    yield start
    for service in started:
        service.kill()


@pytest.fixture
def start_cluster_service(tmp_path: Path, cluster: RedisCluster
                          ) -> Iterator[Callable[..., Service]]:
    """``start_cluster_service(**settings)``: one more `timewheel serve` on the shared cluster."""
    yield from _services_on(tmp_path, cluster.seed_url)


@pytest.fixture
def replicated_cluster(tmp_path: Path) -> Iterator[ReplicatedCluster]:
    """Three masters, each with one replica, of this test alone (it may kill or move nodes)."""
    with ReplicatedCluster(tmp_path / "replicated") as cluster:
        yield cluster


@pytest.fixture
def start_replicated_service(tmp_path: Path, replicated_cluster: ReplicatedCluster
                             ) -> Iterator[Callable[..., Service]]:
    """``start_replicated_service(**settings)``: one more `timewheel serve` on the test's
    replicated cluster (seed: its first master)."""
    yield from _services_on(tmp_path, replicated_cluster.seed_url)


def keys_in_buckets(buckets: set[int], count: int, prefix: str) -> list[str]:
    """``count`` task keys ``<prefix>-<n>`` whose buckets are in ``buckets``."""
    keyspace, found, n = Keyspace("tw"), [], 0
    while len(found) < count:
        key, n = f"{prefix}-{n}", n + 1
        if keyspace.bucket_of(key) in buckets:
            found.append(key)
    return found


def buckets_of(cluster: ReplicatedCluster, master_port: int) -> set[int]:
    """The buckets whose slot ``master_port`` serves now."""
    keyspace = Keyspace("tw")
    return {b for b in range(DEFAULT_BUCKETS) if cluster.owner(keyspace.prefix(b)) == master_port}


def post_batch(service: Service, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """POST /tasks/batch; the per-item results."""
    with service.client() as http:
        reply = http.post("/tasks/batch", json={"tasks": tasks})
    assert reply.status_code == 200, reply.text
    results: list[dict[str, Any]] = reply.json()["results"]
    return results


def early_arrivals(receiver: ThreadedReceiver, path: str) -> list[tuple[str, float, str]]:
    """Arrivals before their task's execute_at (timewheel-scheduled-at): must be none."""
    early = []
    for arrival in receiver.arrivals_for(path):
        due_ms = parse_execute_at(arrival.headers["timewheel-scheduled-at"])
        if arrival.received_at * 1000 < due_ms:
            early.append((arrival.headers["webhook-id"], arrival.received_at,
                          arrival.headers["timewheel-scheduled-at"]))
    return early
