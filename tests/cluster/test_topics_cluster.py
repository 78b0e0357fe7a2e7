"""Topic publishes on a real three-master Redis Cluster: the tasks of one publish live on
several masters, and the publish is still all or none (store/publish.py's steps), idempotent,
and completed when its process stops half-way (by a repeat, or by the sweep)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from tests.conftest import START_MS
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisCluster
from timewheel.models import TaskFields
from timewheel.operations.prepare import prepare
from timewheel.store import Store
from timewheel.store.publish import Publisher, PublishRequest
from timewheel.store.replies import PublishReply

from .conftest import node_clients, once_each, slot_owners, wait_finished

pytestmark = pytest.mark.cluster

URL = "http://127.0.0.1:9/hook"  # never called
ENDPOINTS = [f"e{i}" for i in range(12)]


def request(store: Store, key: str = "p1", fingerprint: str = "pfp",
            body: Any = None) -> PublishRequest:
    tasks = [prepare(TaskFields(callback_url=f"{URL}/{name}", delay=60, body=body or {"n": 1}),
                     f"{key}.{name}", START_MS, default_timeout=10) for name in ENDPOINTS]
    return PublishRequest(key=key, fingerprint=fingerprint, tasks=tasks,
                          rec={"topic": "t", "tasks": [t.key for t in tasks], "created": START_MS})


def stored(cluster: RedisCluster) -> dict[str, int]:
    """Every task record and publish record -> the port of the master holding it."""
    found = {}
    for node, conn in zip(cluster.nodes, node_clients(cluster), strict=True):
        with conn:
            for key in conn.scan_iter(match="{tw:*}:*"):
                name = key.decode().split("}:", 1)[1]
                if name.startswith(("t:", "pb:")):
                    found[name] = node.port
    return found


async def test_a_publish_spans_masters_and_repeats_as_200(cluster: RedisCluster,
                                                          cluster_store: Store) -> None:
    publisher = Publisher(cluster_store)
    first = request(cluster_store)
    owners = slot_owners(cluster)
    assert len({owners[cluster_store.keys.bucket_of(t.key)] for t in first.tasks}) == 3

    done = await publisher.publish(first, now_ms=START_MS)
    assert done == (type(done))(PublishReply.CREATED, existing=[])
    where = stored(cluster)
    assert {name for name in where if name.startswith("t:")} == {f"t:{t.key}" for t in first.tasks}
    for task in first.tasks:
        assert where[f"t:{task.key}"] == owners[cluster_store.keys.bucket_of(task.key)]
    assert where["pb:p1"] == owners[cluster_store.keys.bucket_of("p1")]

    again = await publisher.publish(request(cluster_store), now_ms=START_MS + 10)
    assert again.reply is PublishReply.EXISTS
    assert again.rec is not None and again.rec["tasks"] == [t.key for t in first.tasks]
    assert again.rec["state"] == "done"
    other = await publisher.publish(request(cluster_store, fingerprint="other"), now_ms=START_MS)
    assert other.reply is PublishReply.CONFLICT
    assert stored(cluster) == where


async def test_a_taken_key_on_another_master_stores_nothing(
        cluster: RedisCluster, cluster_store: Store, cluster_redis: AsyncRedisCluster) -> None:
    """All or none across masters: one task key already holds another task (on some master),
    so neither the other eleven tasks nor the publish record are written."""
    publisher = Publisher(cluster_store)
    taken = request(cluster_store).tasks[7]
    other = prepare(TaskFields(callback_url=URL), taken.key, START_MS, default_timeout=10)
    assert await cluster_store.schedule(other, replace=False, now_ms=START_MS) == 0
    before = stored(cluster)
    done = await publisher.publish(request(cluster_store), now_ms=START_MS)
    assert (done.reply, done.conflict_key) == (PublishReply.TASK_CONFLICT, taken.key)
    assert stored(cluster) == before == {f"t:{taken.key}": before[f"t:{taken.key}"]}
    # Control: the same publish under another key is written whole.
    assert (await publisher.publish(request(cluster_store, key="p2"), now_ms=START_MS)).reply \
        is PublishReply.CREATED
    assert sum(name.startswith("t:p2.") for name in stored(cluster)) == len(ENDPOINTS)


async def open_only(publisher: Publisher, req: PublishRequest) -> None:
    """Step (1) alone: what a process leaves behind when it dies right after it."""
    head = publisher._head("open", req, START_MS, "dead-process")
    quads = [v for t in req.tasks for v in (1, t.key, t.record(), t.results())]
    reply = await publisher.script(keys=[publisher.home(req.key)], args=head + quads)
    assert reply == [0, []]


async def test_a_publish_cut_off_is_completed_by_its_repeat(cluster: RedisCluster,
                                                            cluster_store: Store) -> None:
    publisher = Publisher(cluster_store)
    await open_only(publisher, request(cluster_store))
    assert not any(name.startswith("t:") for name in stored(cluster))
    done = await publisher.publish(request(cluster_store), now_ms=START_MS + 50)
    assert done.reply is PublishReply.EXISTS  # the API answers 200 with the tasks
    assert sum(name.startswith("t:p1.") for name in stored(cluster)) == len(ENDPOINTS)
    home = cluster_store.keys.prefix(cluster_store.keys.bucket_of("p1"))
    assert await cluster_store.redis.hget(f"{home}pb:p1", "st") == b"done"
    assert await cluster_store.redis.zcard(f"{home}po") == 0


async def test_a_publish_cut_off_is_completed_by_the_sweep(cluster: RedisCluster,
                                                           cluster_store: Store) -> None:
    publisher = Publisher(cluster_store)
    await open_only(publisher, request(cluster_store))
    bucket = cluster_store.keys.bucket_of("p1")
    assert await publisher.complete_open(bucket, now_ms=START_MS + 1, older_than_ms=10_000) == 0
    assert not any(name.startswith("t:") for name in stored(cluster))  # control: too early
    assert await publisher.complete_open(bucket, now_ms=START_MS + 10_000,
                                         older_than_ms=10_000) == 1
    assert sum(name.startswith("t:p1.") for name in stored(cluster)) == len(ENDPOINTS)
    # Each task created once: a repeat now finds every one identical.
    again = await publisher.publish(request(cluster_store), now_ms=START_MS + 20_000)
    assert again.reply is PublishReply.EXISTS and again.rec is not None
    assert again.rec["state"] == "done"


def test_serve_on_a_cluster_delivers_a_publish_once_per_endpoint(
        start_cluster_service: Any, receiver: ThreadedReceiver) -> None:
    service = start_cluster_service()
    endpoints = [{"name": name, "url": receiver.url(f"/{name}")} for name in ENDPOINTS]
    with service.client() as http:
        assert http.put("/topics/t", json={"endpoints": endpoints}).status_code == 201
        answer = http.post("/topics/t/publish", json={"key": "p1", "delay": 0.5})
        assert answer.status_code == 201, answer.text
        repeat = http.post("/topics/t/publish", json={"key": "p1", "delay": 0.5})
        assert repeat.status_code == 200
        assert [t["key"] for t in repeat.json()["tasks"]] == [
            t["key"] for t in answer.json()["tasks"]]
    keys = [f"p1.{name}" for name in ENDPOINTS]
    views = wait_finished(service, keys, timeout=30)
    assert {v["status"] for v in views.values()} == {"succeeded"}
    for name in ENDPOINTS:
        assert once_each(receiver, f"/{name}") == {f"p1.{name}": 1}
