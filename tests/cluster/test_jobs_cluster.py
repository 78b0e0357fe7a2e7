"""Bulk jobs on a real three-master Redis Cluster (docs/design.md, "Bulk jobs": on a cluster):
a job's tasks span every bucket's slot; each step stays in one slot, keeps its position and
counts there, and a second process carries the job on after the first is SIGKILLed."""

from __future__ import annotations

from typing import Any

from tests.cluster.conftest import node_clients, post_batch, slot_owners
from tests.e2e.conftest import Service
from tests.support.redis_server import RedisCluster
from tests.support.waiting import settle
from timewheel.store.keys import Keyspace

MATCHING = 4_000
OTHERS = 400


def job(service: Service, job_id: str) -> dict[str, Any]:
    with service.client() as http:
        reply = http.get(f"/jobs/{job_id}")
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def statuses(service: Service, keys: list[str]) -> set[str]:
    with service.client() as http:
        return {http.get(f"/tasks/{key}").json()["status"] for key in keys}


def test_a_job_across_slots_survives_a_sigkill(start_cluster_service: Any,
                                               cluster: RedisCluster) -> None:
    settings = {"job_step_tasks": "20", "job_step_pause_seconds": "0.02",
                "job_lease_seconds": "2", "job_busy_share": "0.5"}
    first = start_cluster_service(**settings)
    url = "http://127.0.0.1:9/never"  # due in an hour: never called
    matching = [f"c.{i}" for i in range(MATCHING)]
    others = [f"k.{i}" for i in range(OTHERS)]
    keyspace = Keyspace("tw")
    assert {keyspace.bucket_of(k) for k in matching} == set(range(16))
    for i in range(0, MATCHING + OTHERS, 1000):
        chunk = (matching + others)[i:i + 1000]
        # A replayed task is due at once and fails to connect: an hour before its retry.
        results = post_batch(first, [{"key": k, "callback_url": url, "delay": 3600,
                                      "retry_backoff": 3600} for k in chunk])
        assert {r["status"] for r in results} == {201}
    second = start_cluster_service(**settings)  # both up before the job starts
    with first.client() as http:
        reply = http.post("/tasks/cancel", json={"key_prefix": "c."})
    assert reply.status_code == 202, reply.text
    job_id = reply.json()["job"]
    settle(lambda: "taken by" in first.log() or "taken by" in second.log(), 20, "a runner")
    running, survivor = (first, second) if "taken by" in first.log() else (second, first)
    settle(lambda: job(survivor, job_id)["done"] >= MATCHING // 4, 60, "a quarter done")
    running.kill()
    assert job(survivor, job_id)["done"] < MATCHING
    settle(lambda: job(survivor, job_id)["state"] == "done", 60, "the job done")
    final = job(survivor, job_id)
    assert (final["matched"], final["done"], final["skipped"]) == (MATCHING, MATCHING, 0)
    assert statuses(survivor, matching[::37]) == {"cancelled"}
    assert statuses(survivor, others) == {"scheduled"}

    # Each bucket's share of the job lives in the bucket's slot, on the master that serves it.
    owners = slot_owners(cluster)
    nodes = {conn.connection_pool.connection_kwargs["port"]: conn
             for conn in node_clients(cluster)}
    counted = 0
    try:
        for bucket in range(16):
            state = nodes[owners[bucket]].hgetall(keyspace.job_state(bucket, job_id))
            assert state[b"end"] == b"1", (bucket, state)
            counted += int(state[b"d"])
    finally:
        for conn in nodes.values():
            conn.close()
    assert len(set(owners.values())) == 3  # the job spanned all three masters
    assert counted == MATCHING

    # A replay across the slots schedules them again, now (so they are being tried already).
    with survivor.client() as http:
        reply = http.post("/tasks/replay", json={"status": "cancelled", "key_prefix": "c."})
    replay_id = reply.json()["job"]
    settle(lambda: job(survivor, replay_id)["state"] == "done", 60, "the replay done")
    assert job(survivor, replay_id)["done"] == MATCHING
    assert statuses(survivor, matching[::37]) <= {"scheduled", "delivering", "retrying"}
