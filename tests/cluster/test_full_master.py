"""A three-master Redis Cluster with one master full (noeviction, used_memory over maxmemory),
as docs/deploy.md "A full Redis" promises it: a publish is refused whole, a batch bucket by
bucket, and the same request again once there is room completes it, each task delivered once.

From an audit of a full Redis (session 25): a publish whose tasks' master (not its record's)
was full answered 503 after it had been opened and its other masters' tasks created (sent at
once; the sweep completed the rest later), so a keyless publish sent again called every
subscriber once per try.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisCluster, RedisServer
from timewheel.store.keys import Keyspace

from .conftest import node_clients, once_each, slot_owners, wait_finished

pytestmark = pytest.mark.cluster

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


def test_a_publish_refused_by_one_full_master_writes_nothing(
        cluster: RedisCluster, start_cluster_service: Any,
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


def test_a_keyless_publish_retried_after_a_full_master_calls_each_subscriber_once(
        cluster: RedisCluster, start_cluster_service: Any,
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


def test_a_batch_refused_by_one_full_master_is_completed_by_its_retry(
        cluster: RedisCluster, start_cluster_service: Any,
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
