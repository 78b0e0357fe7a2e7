"""Review: a full Redis reached part-way through a multi-bucket write (POST /tasks/batch on one
Redis; a topic publish on a three-master Redis Cluster with one master full).

docs/deploy.md, "A full Redis", and README (the batch): a batch is refused bucket by bucket and
a 503 may come after some items were stored; sending the same batch again stores the rest, the
stored ones answering 200 and unchanged. Every stored task is delivered once, when due.

Found: on a cluster, a publish whose tasks' master (not its record's) was full answered 503
after it had been opened and its other masters' tasks created (sent at once; the sweep
completed the rest later), so a keyless publish sent again called every subscriber once per
try.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.cluster.conftest import (  # noqa: F401 (fixtures)
    cluster,
    node_clients,
    once_each,
    redis_cluster,
    slot_owners,
    start_cluster_service,
    wait_finished,
)
from tests.conftest import running_app
from tests.support.receiver import Receiver, ThreadedReceiver
from tests.support.redis_server import RedisCluster, RedisServer
from tests.support.waiting import wait_until
from tests.test_full_redis import full_redis, redis, unfill  # noqa: F401 (fixtures)
from timewheel.api.app import create_app
from timewheel.models import parse_execute_at
from timewheel.settings import Settings
from timewheel.store.keys import Keyspace


async def stored_task_keys(redis: Redis, keys: list[str]) -> set[str]:  # noqa: F811
    keyspace = Keyspace("tw")
    found = set()
    for key in keys:
        if await redis.exists(f"{keyspace.prefix(keyspace.bucket_of(key))}t:{key}"):
            found.add(key)
    return found


async def test_a_batch_that_fills_redis_part_way_is_completed_by_its_retry(
        full_redis: RedisServer, redis: Redis, tmp_path: Path) -> None:  # noqa: F811
    """16 buckets' worth of tasks; Redis fills part-way through the batch: 503 with
    Retry-After, some buckets stored; once Redis has room the stored tasks go out when due,
    the same batch again answers 200 for each stored one (unchanged) and 201 for the rest,
    and every task is delivered exactly once, none early."""
    settings = Settings(redis_url=full_redis.url, allow_private_networks=True,
                        data_dir=tmp_path, tick_seconds=0.2)
    keys = [f"bat-{i}" for i in range(160)]
    keyspace = Keyspace("tw")
    assert len({keyspace.bucket_of(k) for k in keys}) == keyspace.buckets
    async with Receiver() as receiver:
        async with running_app(create_app(settings)) as api:
            items = [{"key": k, "callback_url": receiver.url("/hook"), "delay": 3,
                      "body": {"pad": "x" * 4000, "n": i}} for i, k in enumerate(keys)]
            used = int((await redis.info("memory"))["used_memory"])
            await redis.config_set("maxmemory", used + 500_000)
            first = await api.post("/tasks/batch", json={"tasks": items})
            stored = await stored_task_keys(redis, keys)
            assert first.status_code == 503, (first.status_code, len(stored))
            assert first.headers["retry-after"] == "10"
            assert "Redis is full" in first.json()["detail"]
            assert 0 < len(stored) < len(keys), len(stored)
            views = {k: (await api.get(f"/tasks/{k}")).json() for k in stored}
            await unfill(redis)

            retry = await api.post("/tasks/batch", json={"tasks": items})
            assert retry.status_code == 200, retry.text[:300]
            codes = {r["key"]: r["status"] for r in retry.json()["results"]}
            assert {k for k, c in codes.items() if c == 200} == stored
            assert {k for k, c in codes.items() if c == 201} == set(keys) - stored
            for k in stored:
                again = (await api.get(f"/tasks/{k}")).json()
                assert again["execute_at"] == views[k]["execute_at"], k
                assert again["created_at"] == views[k]["created_at"], k
            due = {r["key"]: r["task"]["execute_at"] for r in retry.json()["results"]}

            async def all_arrived() -> bool:
                return len({a.headers["webhook-id"] for a in receiver.arrivals}) == len(keys)

            await wait_until(all_arrived, "every task of the batch delivered", 60)
            await asyncio.sleep(1.0)  # a duplicate would come within a tick or two
            counts = Counter(a.headers["webhook-id"] for a in receiver.arrivals)
            assert [k for k, n in counts.items() if n != 1] == []
            early = [a.headers["webhook-id"] for a in receiver.arrivals
                     if a.received_at < parse_execute_at(due[a.headers["webhook-id"]]) / 1000
                     - 0.001]
            assert early == []


# -- a topic publish on a three-master Redis Cluster, one master full ------------------------

PUBLISH_ENDPOINTS = [f"e{i}" for i in range(12)]  # their tasks' buckets span all three masters


def fill_node(servers: RedisCluster, node: RedisServer, conn: Any) -> None:
    """That master alone over its maxmemory: it refuses every command that adds data."""
    used = int(conn.info("memory")["used_memory"])
    conn.config_set("maxmemory", max(1, used // 2))
    bucket = next(b for b, port in slot_owners(servers).items() if port == node.port)
    with pytest.raises(Exception, match="maxmemory"):  # a key of a slot the node serves
        conn.set(f"{Keyspace('tw').prefix(bucket)}probe", "x")


def stored_records(servers: RedisCluster) -> set[str]:
    """Every task record and publish record left on any master (``t:<key>``, ``pb:<key>``)."""
    found = set()
    for conn in node_clients(servers):
        with conn:
            for key in conn.scan_iter(match="{tw:*}:*"):
                name = key.decode().split("}:", 1)[1]
                if name.startswith(("t:", "pb:")):
                    found.add(name)
    return found


@pytest.mark.cluster
def test_a_publish_refused_by_one_full_master_writes_nothing(
        cluster: RedisCluster, start_cluster_service: Any,  # noqa: F811
        receiver: ThreadedReceiver) -> None:
    """docs/deploy.md: while Redis is full, publishes "answer 503 ... and change nothing";
    docs/api.md: a publish's tasks are "all created in one atomic step or none". On a cluster
    with one master full (not the publish key's own), the 503 came after the publish was opened
    and its tasks on the other masters created: those subscribers were called at once, and the
    publish completed itself later (the sweep). A client that believes the 503 and publishes
    again without a key has every subscriber called twice."""
    service = start_cluster_service()
    owners = slot_owners(cluster)
    keyspace = Keyspace("tw")
    home_port = owners[keyspace.bucket_of("p1")]
    task_ports = {owners[keyspace.bucket_of(f"p1.{name}")] for name in PUBLISH_ENDPOINTS}
    assert len(task_ports) == 3
    full = next(n for n in cluster.nodes if n.port != home_port)
    endpoints = [{"name": name, "url": receiver.url(f"/{name}")} for name in PUBLISH_ENDPOINTS]
    with service.client() as http, full.client() as conn:
        assert http.put("/topics/t", json={"endpoints": endpoints}).status_code == 201
        try:
            fill_node(cluster, full, conn)
            refused = http.post("/topics/t/publish", json={"key": "p1"})
            left = stored_records(cluster)
            time.sleep(1.0)  # a callback of a task stored meanwhile would come now
            called = len(receiver.arrivals)
        finally:
            conn.config_set("maxmemory", 0)
        assert refused.status_code == 503, refused.text
        assert (sorted(left), called) == ([], 0), (
            "a publish answered 503 (\"refused the write\") left records behind and called "
            "subscribers")
        # Once there is room, the client's retry publishes it, each subscriber called once.
        again = http.post("/topics/t/publish", json={"key": "p1"})
        assert again.status_code in (200, 201), again.text
    keys = [f"p1.{name}" for name in PUBLISH_ENDPOINTS]
    views = wait_finished(service, keys, timeout=30)
    assert {v["status"] for v in views.values()} == {"succeeded"}
    time.sleep(1.0)
    for name in PUBLISH_ENDPOINTS:
        assert once_each(receiver, f"/{name}") == {f"p1.{name}": 1}


@pytest.mark.cluster
def test_a_keyless_publish_retried_after_a_full_master_calls_each_subscriber_once(
        cluster: RedisCluster, start_cluster_service: Any,  # noqa: F811
        receiver: ThreadedReceiver) -> None:
    """The consequence for a client: a publish without a key answered 503 (Redis full) is sent
    again once Redis has room. Each subscriber must be called once, not once for the retry and
    once more for the refused publish, completed later by the sweep."""
    service = start_cluster_service()
    full = cluster.nodes[1]
    endpoints = [{"name": name, "url": receiver.url(f"/{name}")} for name in PUBLISH_ENDPOINTS]
    with service.client() as http, full.client() as conn:
        assert http.put("/topics/t", json={"endpoints": endpoints}).status_code == 201
        try:
            fill_node(cluster, full, conn)
            # A few tries while full (Retry-After: 10 each in real life): each a new key,
            # whose home is on the full master or not.
            refused = [http.post("/topics/t/publish", json={}) for _ in range(4)]
        finally:
            conn.config_set("maxmemory", 0)
        assert {r.status_code for r in refused} == {503}, [r.text for r in refused]
        done = http.post("/topics/t/publish", json={})
        assert done.status_code == 201, done.text
    time.sleep(15)  # past the sweep's 10 s: whatever was left open is completed by now
    counts = Counter(a.path.rsplit("/", 1)[-1] for a in receiver.arrivals)
    assert counts == Counter(PUBLISH_ENDPOINTS), counts


@pytest.mark.cluster
def test_a_batch_refused_by_one_full_master_is_completed_by_its_retry(
        cluster: RedisCluster, start_cluster_service: Any,  # noqa: F811
        receiver: ThreadedReceiver) -> None:
    """POST /tasks/batch on a cluster with one master full: 503 with Retry-After, the other
    masters' buckets stored (README: a 503 may come after some items were stored); once there
    is room the same batch again answers 200 for those and 201 for the rest, and each task is
    delivered once."""
    service = start_cluster_service()
    full = cluster.nodes[2]
    keys = [f"cb-{i}" for i in range(48)]
    items = [{"key": k, "callback_url": receiver.url("/hook"), "delay": 1} for k in keys]
    with service.client() as http, full.client() as conn:
        try:
            fill_node(cluster, full, conn)
            refused = http.post("/tasks/batch", json={"tasks": items})
            left = {name[2:] for name in stored_records(cluster) if name.startswith("t:")}
        finally:
            conn.config_set("maxmemory", 0)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "10"
        assert 0 < len(left) < len(keys)
        again = http.post("/tasks/batch", json={"tasks": items})
        assert again.status_code == 200, again.text
        codes = {r["key"]: r["status"] for r in again.json()["results"]}
        assert {k for k, c in codes.items() if c == 200} == left
        assert {k for k, c in codes.items() if c == 201} == set(keys) - left
    views = wait_finished(service, keys, timeout=30)
    assert {v["status"] for v in views.values()} == {"succeeded"}
    time.sleep(1.0)
    assert once_each(receiver, "/hook") == Counter(dict.fromkeys(keys, 1))
