"""Batched creates on a real three-master Redis Cluster: redis-py's cluster pipeline splits the
EVALSHA calls by node, NOSCRIPT on fresh masters is recovered, each task lands on its bucket's
master, and `timewheel serve` delivers a batch once per task."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import START_MS
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisCluster
from timewheel.models import TaskFields
from timewheel.operations.prepare import prepare
from timewheel.store import ScheduleReply, Store
from timewheel.store.batch import get_many, schedule_many
from timewheel.store.record import NewTask

from .conftest import node_clients, once_each, slot_owners, wait_finished
from .test_cluster import keys_in_every_bucket

URL = "http://127.0.0.1:9/hook"  # never called


def new_task(key: str, due_ms: int) -> NewTask:
    """Built through prepare(), as the API builds it, so it follows the record's fields."""
    fields = TaskFields(callback_url=URL, execute_at=due_ms / 1000, body={"k": 1})
    return prepare(fields, key, START_MS, default_timeout=10)

pytestmark = pytest.mark.cluster


async def test_schedule_many_splits_by_node_and_recovers_noscript(
        cluster: RedisCluster, cluster_store: Store) -> None:
    """The fixture emptied every master's script cache: the first batch meets NOSCRIPT on each
    node and re-runs those calls; the second runs pipelined. Codes as on a single Redis, in
    order (a key given twice), and every record on the master serving its bucket."""
    keys = keys_in_every_bucket(cluster_store.keys, 3)
    first = [new_task(k, START_MS + 5000) for k in keys[:24]]
    assert await schedule_many(cluster_store, first, START_MS) == [ScheduleReply.CREATED] * 24
    sha = cluster_store.scripts.schedule.sha
    for conn in node_clients(cluster):
        with conn:
            assert conn.script_exists(sha) == [True]

    second = [new_task(k, START_MS + 5000) for k in keys[24:]]
    second += [new_task(keys[0], START_MS + 5000), new_task(keys[1], START_MS + 9000),
               new_task(keys[30], START_MS + 5000)]
    codes = await schedule_many(cluster_store, second, START_MS)
    assert codes == [ScheduleReply.CREATED] * 24 + [
        ScheduleReply.EXISTS, ScheduleReply.CONFLICT, ScheduleReply.EXISTS]

    owners = slot_owners(cluster)
    for node in cluster.nodes:
        with node.client() as conn:
            held = {k.decode() for k in conn.scan_iter(match="{tw:*}:t:*")}
        mine = {cluster_store.keys.task(k) for k in keys
                if owners[cluster_store.keys.bucket_of(k)] == node.port}
        assert held == mine and mine
    views = await get_many(cluster_store, [*keys, "missing"])
    assert [v.key if v else None for v in views] == [*keys, None]


def test_serve_on_a_cluster_delivers_a_batch_once_per_task(
        start_cluster_service: Any, receiver: ThreadedReceiver) -> None:
    service = start_cluster_service()
    keys = [f"b-{i}" for i in range(60)]
    items = [{"key": k, "callback_url": receiver.url("/batch"), "delay": 0.5} for k in keys]
    with service.client() as http:
        reply = http.post("/tasks/batch", json={"tasks": items})
        assert reply.status_code == 200, reply.text
        assert [r["status"] for r in reply.json()["results"]] == [201] * len(keys)
    views = wait_finished(service, keys, timeout=30)
    assert {v["status"] for v in views.values()} == {"succeeded"}
    assert once_each(receiver, "/batch") == dict.fromkeys(keys, 1)
