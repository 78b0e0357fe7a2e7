"""A bucket's hash slot moves from one master to another while the wheel runs on it (the steps
``redis-cli --cluster reshard`` takes: SETSLOT IMPORTING / MIGRATING, MIGRATE the keys in
batches, SETSLOT NODE). Scripts of that bucket meet ASK, TRYAGAIN and MOVED; none runs on the
half-moved bucket (the migration guard key, timewheel/store/connection.py), so no task is lost,
none is fired twice (no process crashed) and none fires early."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from tests.cluster.replicated import ReplicatedCluster
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import HOST
from timewheel.errors import StoreUnavailable
from timewheel.models import parse_execute_at
from timewheel.store.connection import make_redis
from timewheel.store.keys import DEFAULT_BUCKETS, Keyspace
from timewheel.store.redis_errors import redis_errors

from .conftest import early_arrivals, keys_in_buckets, post_batch, wait_finished

pytestmark = pytest.mark.cluster

KEYSPACE = Keyspace("tw")


def migrate_slot(cluster: ReplicatedCluster, slot: int, source: int, target: int) -> int:
    """Move ``slot`` from master ``source`` to master ``target`` key batch by key batch, with
    a pause between batches so that the wheel meets the slot half-moved; keys moved."""
    # Every master learns the new owner; roles as each server states its own (one node's
    # CLUSTER NODES may still list a fresh replica as a master, and SETSLOT on a replica fails).
    others = [server.port for server in cluster.servers if server.running
              and server.port not in (source, target) and not cluster.is_replica(server)]
    src, dst = cluster.server(source).client(), cluster.server(target).client()
    masters = [cluster.server(port).client() for port in others]
    try:
        src_id = src.execute_command("CLUSTER MYID").decode()
        dst_id = dst.execute_command("CLUSTER MYID").decode()
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 10):
            src.execute_command("MIGRATE", HOST, target, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
            time.sleep(0.05)
        for conn in [dst, src, *masters]:  # the new owner first, as redis-cli does
            conn.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
        return moved
    finally:
        for conn in [src, dst, *masters]:
            conn.close()


def create_while_moving(services: list[Service], keys: list[str], url: str,
                        statuses: dict[str, list[int]], stop: threading.Event) -> None:
    """Create ``keys`` one by one, alternating processes, each retried after a 503 (its slot
    was mid-migration) until it is acknowledged."""
    for n, key in enumerate(keys):
        with services[n % 2].client() as http:
            while not stop.is_set():
                reply = http.post("/tasks", json={"key": key, "callback_url": url, "delay": 4})
                statuses.setdefault(key, []).append(reply.status_code)
                if reply.status_code in (200, 201):
                    break
                time.sleep(0.05)


def test_a_bucket_slot_moves_under_load(
        replicated_cluster: ReplicatedCluster, start_replicated_service: Any,
        receiver: ThreadedReceiver) -> None:
    """200 tasks due over 12 s, half of them in one bucket; two processes (WAIT_REPLICAS 0
    and 1, so both the plain and the acknowledged script paths meet the move). 5 s in, the
    bucket's slot moves to another master while 20 more of its tasks are being created."""
    cluster = replicated_cluster
    services = [start_replicated_service(),
                start_replicated_service(redis_wait_replicas="1", redis_wait_timeout_ms="2000")]
    url = receiver.url("/mv")
    bucket = 7
    moving = keys_in_buckets({bucket}, 100, "mv")
    others = keys_in_buckets(set(range(DEFAULT_BUCKETS)) - {bucket}, 100, "st")
    initial = [k for pair in zip(moving, others, strict=True) for k in pair]
    for n, start in enumerate(range(0, 200, 50)):
        chunk = initial[start:start + 50]
        results = post_batch(services[n % 2], [
            {"key": k, "callback_url": url, "delay": 3 + 12 * (start + i) / 200}
            for i, k in enumerate(chunk)])
        assert [r["status"] for r in results] == [201] * len(chunk), results

    prefix = KEYSPACE.prefix(bucket)
    source = cluster.owner(prefix)
    target = next(m.port for m in cluster.masters if m.port != source)
    with cluster.server(source).client() as conn:
        slot = int(conn.execute_command("CLUSTER KEYSLOT", prefix))
    late = keys_in_buckets({bucket}, 20, "mvlate")
    statuses: dict[str, list[int]] = {}
    stop = threading.Event()
    time.sleep(5)
    creator = threading.Thread(target=create_while_moving,
                               args=(services, late, url, statuses, stop))
    creator.start()
    try:
        move_started = time.time()
        moved = migrate_slot(cluster, slot, source, target)
        move_ended = time.time()
        creator.join(timeout=60)
    finally:
        stop.set()
        creator.join()
    assert moved > 0
    assert cluster.owner(prefix) == target
    assert set(statuses) == set(late)
    assert all(s[-1] in (200, 201) for s in statuses.values()), statuses

    keys = [*initial, *late]
    views = wait_finished(services[0], keys, timeout=60)
    assert {k: (v["status"], v["attempts"]) for k, v in views.items()} == (
        dict.fromkeys(keys, ("succeeded", 1)))
    assert Counter(a.headers["webhook-id"] for a in receiver.arrivals_for("/mv")) == (
        Counter(dict.fromkeys(keys, 1)))
    assert early_arrivals(receiver, "/mv") == []
    # Else the wheel never met the slot half-moved and the test proves nothing about it.
    due_during_move = [a.headers["webhook-id"] for a in receiver.arrivals_for("/mv")
                       if a.headers["webhook-id"] in set(moving) and move_started * 1000
                       <= parse_execute_at(a.headers["timewheel-scheduled-at"])
                       <= move_ended * 1000]
    assert due_during_move, (move_started, move_ended)
    with cluster.server(source).client() as src, cluster.server(target).client() as dst:
        assert src.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
        assert dst.exists(KEYSPACE.task(moving[0])) == 1


async def test_the_guard_key_keeps_scripts_off_a_half_moved_slot(
        replicated_cluster: ReplicatedCluster) -> None:
    """While a bucket's slot migrates (nothing moved yet), redis-py's own cluster client runs
    a script given the bucket prefix alone on the importing node, which has none of the
    bucket's keys: a task that exists looks missing. The wheel's client (make_redis) adds the
    guard key, so the importing node refuses the call (TRYAGAIN) and the caller gets
    StoreUnavailable, a 503, rather than a wrong answer; after SETSLOT NODE it runs, right."""
    cluster = replicated_cluster
    prefix = KEYSPACE.prefix(3)
    source = cluster.owner(prefix)
    target = next(m.port for m in cluster.masters if m.port != source)
    lua = "return redis.call('EXISTS', KEYS[1] .. 't:k')"
    with cluster.server(source).client() as src, cluster.server(target).client() as dst:
        src.set(prefix + "t:k", "record")
        slot = int(src.execute_command("CLUSTER KEYSLOT", prefix))
        src_id = src.execute_command("CLUSTER MYID").decode()
        dst_id = dst.execute_command("CLUSTER MYID").decode()
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    plain = AsyncRedisCluster.from_url(cluster.seed_url)
    wheel = make_redis(cluster.seed_url, cluster=True)
    try:
        assert await plain.register_script(lua)(keys=[prefix]) == 0  # wrong: it exists
        with pytest.raises(StoreUnavailable):
            async with redis_errors("guarded"):
                await wheel.register_script(lua)(keys=[prefix])
        migrate_slot(cluster, slot, source, target)
        assert await wheel.register_script(lua)(keys=[prefix]) == 1
    finally:
        await plain.aclose()
        await wheel.aclose()
