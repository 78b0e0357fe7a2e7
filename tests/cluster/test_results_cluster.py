"""Result callbacks on a real three-master Redis Cluster: the result task ``{key}.on_success``
lives in its parent's bucket, hence its slot and master, so lua/complete.lua creates it in the
call that finishes the parent (docs/design.md, "Result callbacks")."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisCluster
from timewheel.store.keys import DEFAULT_BUCKETS, Keyspace

from .conftest import all_keys, node_clients, once_each, slot_owners, wait_finished

pytestmark = pytest.mark.cluster

KEYS = Keyspace("tw")


def keys_over_every_bucket(prefix: str) -> list[str]:
    found: dict[int, str] = {}
    n = 0
    while len(found) < DEFAULT_BUCKETS:
        key, n = f"{prefix}-{n}", n + 1
        found.setdefault(KEYS.bucket_of(key), key)
    return list(found.values())


def test_results_are_created_beside_their_task(start_cluster_service: Any,
                                               cluster: RedisCluster,
                                               receiver: ThreadedReceiver) -> None:
    service = start_cluster_service()
    owners = slot_owners(cluster)
    assert len(set(owners.values())) == 3
    keys = keys_over_every_bucket("res")
    # Hashed on its own, most result keys would fall in another bucket (the control: the
    # rule is what puts them beside their parent).
    assert sum(zlib.crc32(f"{k}.on_success".encode()) % DEFAULT_BUCKETS != KEYS.bucket_of(k)
               for k in keys) > DEFAULT_BUCKETS // 2
    receiver.respond("/fail", [404])
    with service.client() as http:
        for n, key in enumerate(keys):
            path = "/fail" if n % 2 else "/h"
            r = http.post("/tasks", json={"key": key, "callback_url": receiver.url(path),
                                          "on_success": receiver.url("/ok"),
                                          "on_failure": receiver.url("/failed")})
            assert r.status_code == 201, r.text
    wait_finished(service, keys, timeout=30)
    results = [f"{k}.on_failure" if n % 2 else f"{k}.on_success" for n, k in enumerate(keys)]
    receiver.wait_for_sync(len(keys) // 2, timeout=30, path="/ok")
    receiver.wait_for_sync(len(keys) // 2, timeout=30, path="/failed")
    views = wait_finished(service, results, timeout=30)
    assert {v["status"] for v in views.values()} == {"succeeded"}
    arrived = once_each(receiver, "/ok") + once_each(receiver, "/failed")
    assert arrived == dict.fromkeys(results, 1)
    for arrival in receiver.arrivals_for("/ok"):
        assert json.loads(arrival.body)["key"] + ".on_success" == arrival.headers["webhook-id"]

    clients = node_clients(cluster)
    found = all_keys(clients)
    for key, result in zip(keys, results, strict=True):
        bucket = KEYS.bucket_of(key)
        assert KEYS.bucket_of(result) == bucket
        parent, child = found[KEYS.task(key)], found[KEYS.task(result)]
        urls = found[KEYS.results(bucket, key)]
        assert parent[0] is child[0] is urls[0], key
        assert parent[0].connection_pool.connection_kwargs["port"] == owners[bucket]
        assert urls[1] > 0  # expires with its finished task
    for client in clients:
        client.close()
