"""GET /tasks/{key}/attempts on a real three-master Redis Cluster: a `timewheel serve` with
TIMEWHEEL_REDIS_CLUSTER=true reads the history of tasks in every bucket (so every master), and
the history a delivery writes sits beside its task, in its bucket's slot."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import RedisCluster
from timewheel.store import attempts
from timewheel.store.keys import DEFAULT_BUCKETS, Keyspace

from .conftest import all_keys, node_clients, post_tasks, slot_owners, wait_finished

pytestmark = pytest.mark.cluster

KEYS = Keyspace("tw")


def keys_over_every_bucket(prefix: str) -> list[str]:
    """One key per bucket: their slots span the three masters."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < DEFAULT_BUCKETS:
        key, n = f"{prefix}-{n}", n + 1
        found.setdefault(KEYS.bucket_of(key), key)
    return list(found.values())


def test_attempts_are_read_in_every_slot(start_cluster_service: Any, cluster: RedisCluster,
                                         receiver: ThreadedReceiver) -> None:
    service = start_cluster_service()
    owners = slot_owners(cluster)
    assert len(set(owners.values())) == 3
    pending = keys_over_every_bucket("hist")
    post_tasks(service, pending, receiver.url("/later"), 3600)

    with service.client() as http:
        for key in pending:
            assert http.get(f"/tasks/{key}/attempts").json() == {"attempts": []}, key

    # Seed two entries per task on the master that serves its bucket (no redirects).
    nodes = {node.port: client for node, client in zip(cluster.nodes, node_clients(cluster),
                                                       strict=True)}
    for n, key in enumerate(pending):
        bucket = KEYS.bucket_of(key)
        nodes[owners[bucket]].rpush(KEYS.attempts(bucket, key), *[attempts.entry(
            attempt=i, started_ms=1_800_000_000_000 + n, duration_ms=n, verdict=verdict,
            status_code=code, error=None, headers={"x-request-id": f"{key}/{i}"}, body=key,
            body_truncated=False, next_attempt_ms=None, process=f"p:{n}")
            for i, verdict, code in ((1, "retry", 503), (2, "ok", 200))])
    for client in nodes.values():
        client.close()

    with service.client() as http:
        for n, key in enumerate(pending):
            r = http.get(f"/tasks/{key}/attempts")
            assert r.status_code == 200, (key, r.text)
            shown = r.json()["attempts"]
            assert [(a["attempt"], a["outcome"], a["status_code"]) for a in shown] == [
                (1, "retry", 503), (2, "delivered", 200)], key
            assert [a["response_headers"] for a in shown] == [
                {"x-request-id": f"{key}/1"}, {"x-request-id": f"{key}/2"}]
            assert {(a["response_body"], a["duration_ms"], a["process"]) for a in shown} == {
                (key, n, f"p:{n}")}
        assert http.get("/tasks/nope/attempts").status_code == 404

    # Delivered by the service itself: each history is written in its task's slot.
    due = keys_over_every_bucket("live")
    post_tasks(service, due, receiver.url("/now"), 0)
    wait_finished(service, due, timeout=30)
    with service.client() as http:
        for key in due:
            shown = http.get(f"/tasks/{key}/attempts").json()["attempts"]
            assert [(a["outcome"], a["status_code"]) for a in shown] == [("delivered", 200)], key
    clients = node_clients(cluster)
    found = all_keys(clients)
    for key in due:
        bucket = KEYS.bucket_of(key)
        history, record = found[KEYS.attempts(bucket, key)], found[KEYS.task(key)]
        assert history[0] is record[0], key
        assert history[0].connection_pool.connection_kwargs["port"] == owners[bucket]
        # Both expire (the history takes the record's TTL in the script call that finished
        # the task; tests/test_scripts.py checks the figure).
        assert history[1] > 0 and record[1] > 0, key
    for client in clients:
        client.close()
