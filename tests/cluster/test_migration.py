"""A bucket's hash slot moves from one master to another while the wheel runs on it (the steps
``redis-cli --cluster reshard`` takes: SETSLOT IMPORTING / MIGRATING, MIGRATE the keys in
batches, SETSLOT NODE; tests/cluster/reshard.py). Scripts of that bucket meet ASK, TRYAGAIN and
MOVED; none runs on the half-moved bucket (the migration guard key,
timewheel/store/connection.py), so no task is lost, none is fired twice (no process crashed)
and none fires early, also when the move breaks off half-way and stays open for a while."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import MovedError

from tests.cluster.replicated import ReplicatedCluster
from tests.cluster.reshard import Migration, finish_migration, migrate_slot, view
from tests.e2e.conftest import Service
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import HOST
from timewheel.errors import StoreUnavailable
from timewheel.models import parse_execute_at
from timewheel.store.connection import make_redis
from timewheel.store.durability import Durability, DurableScript, marker
from timewheel.store.keys import DEFAULT_BUCKETS, Keyspace
from timewheel.store.redis_errors import redis_errors

from .conftest import early_arrivals, keys_in_buckets, post_batch, wait_finished

pytestmark = pytest.mark.cluster

KEYSPACE = Keyspace("tw")


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


class BrokenOff(Exception):
    """Raised from the move's batch hook: the move stops half-way, as a reshard that dies."""


def break_off_at(keys: int) -> Callable[[Migration], None]:
    def hook(migration: Migration) -> None:
        if migration.moved >= keys:
            raise BrokenOff(f"{migration.moved} keys moved")
    return hook


@pytest.mark.parametrize(("batch", "broken_off"), [(1, False), (10, True)],
                         ids=["key-by-key", "broken-off-then-finished"])
def test_a_bucket_slot_moves_under_load(
        replicated_cluster: ReplicatedCluster, start_replicated_service: Any,
        receiver: ThreadedReceiver, batch: int, broken_off: bool) -> None:
    """200 tasks due over 12 s, half of them in one bucket; two processes (WAIT_REPLICAS 0
    and 1, so both the plain and the acknowledged script paths meet the move). 5 s in, the
    bucket's slot moves to another master while 20 more of its tasks are being created:
    key by key; or 10 keys a batch, broken off once half of its keys have moved, left split
    between the two nodes for 3 s (three ticks of claims refused) and then finished."""
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
    with cluster.server(source).client() as src, cluster.server(target).client() as dst:
        slot = int(src.execute_command("CLUSTER KEYSLOT", prefix))
        half = int(src.execute_command("CLUSTER COUNTKEYSINSLOT", slot)) // 2
    late = keys_in_buckets({bucket}, 20, "mvlate")
    statuses: dict[str, list[int]] = {}
    stop = threading.Event()
    time.sleep(5)
    creator = threading.Thread(target=create_while_moving,
                               args=(services, late, url, statuses, stop))
    creator.start()
    split: tuple[int, int] | None = None
    try:
        move_started = time.time()
        if not broken_off:
            migration = migrate_slot(cluster, slot, target, batch=batch)
        else:
            with pytest.raises(BrokenOff):
                migrate_slot(cluster, slot, target, batch=batch, after_batch=break_off_at(half))
            with cluster.server(source).client() as src, \
                    cluster.server(target).client() as dst:
                split = (int(src.execute_command("CLUSTER COUNTKEYSINSLOT", slot)),
                         int(dst.execute_command("CLUSTER COUNTKEYSINSLOT", slot)))
                assert slot in view(src).migrating and slot in view(dst).importing
            time.sleep(3)
            migration = finish_migration(cluster, Migration(slot, source, target))
        move_ended = time.time()
        creator.join(timeout=60)
    finally:
        stop.set()
        creator.join()
    assert migration.moved > 0
    if broken_off:  # the bucket really was split between the nodes while the wheel ran
        assert split is not None and split[0] > 0 and split[1] > 0, split
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


def test_a_closed_slot_strands_the_keys_that_moved(replicated_cluster: ReplicatedCluster
                                                   ) -> None:
    """Why a broken-off move is finished, not undone (tests/cluster/reshard.py): the soak's
    first harness closed the slot on both nodes (SETSLOT STABLE) and then asked the target to
    MIGRATE the keys that had gone over back. The target, neither owner nor importer any
    more, answers MOVED, and the keys stay where no client reaches them."""
    cluster = replicated_cluster
    prefix = KEYSPACE.prefix(4)
    source = cluster.owner(prefix)
    target = next(m.port for m in cluster.masters if m.port != source)
    with cluster.server(source).client() as src, cluster.server(target).client() as dst:
        slot = int(src.execute_command("CLUSTER KEYSLOT", prefix))
        src.set(prefix + "t:a", "record")
        src.zadd(prefix + "ms:1", {"a": 1})
        src_id, dst_id = view(src).node_id, view(dst).node_id
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        src.execute_command("MIGRATE", HOST, target, "", 0, 5000, "KEYS", prefix + "ms:1")
        for conn in (src, dst):  # the old undo
            conn.execute_command("CLUSTER SETSLOT", slot, "STABLE")
        with pytest.raises(MovedError):
            dst.execute_command("MIGRATE", HOST, source, "", 0, 5000, "KEYS", prefix + "ms:1")
        # the record on the owner, its minute slice on a node that does not serve the slot
        assert (src.exists(prefix + "t:a"), src.exists(prefix + "ms:1")) == (1, 0)
        assert dst.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 1


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
        src_id, dst_id = view(src).node_id, view(dst).node_id
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    plain = AsyncRedisCluster.from_url(cluster.seed_url)
    wheel = make_redis(cluster.seed_url, cluster=True)
    try:
        assert await plain.register_script(lua)(keys=[prefix]) == 0  # wrong: it exists
        with pytest.raises(StoreUnavailable):
            async with redis_errors("guarded"):
                await wheel.register_script(lua)(keys=[prefix])
        migrate_slot(cluster, slot, target)
        assert await wheel.register_script(lua)(keys=[prefix]) == 1
    finally:
        await plain.aclose()
        await wheel.aclose()


async def test_an_acknowledged_write_leaves_no_key_on_the_importing_node(
        replicated_cluster: ReplicatedCluster) -> None:
    """An acknowledged write (TIMEWHEEL_REDIS_WAIT_REPLICAS > 0) sends its script, a marker
    SET ``{tw:7}~ack`` and WAIT on one connection (timewheel/store/durability.py). During a
    move the source answers ASK, and the script, sent on with ASKING, is refused TRYAGAIN by
    the importing node (the guard key). The marker must not be written there either: the
    source still holds the marker of the bucket's last acknowledged write, so the reshard's
    MIGRATE of it would meet BUSYKEY and break off (the soak's cluster runs under
    WAIT_REPLICAS=1: 4 of 6 moves did, and the harness's undo of them lost tasks)."""
    cluster = replicated_cluster
    prefix = KEYSPACE.prefix(7)
    source = cluster.owner(prefix)
    target = next(m.port for m in cluster.masters if m.port != source)
    lua = "return redis.call('SET', KEYS[1] .. 't:k', ARGV[1])"
    wheel = make_redis(cluster.seed_url, cluster=True)
    assert isinstance(wheel, AsyncRedisCluster)
    script = DurableScript(wheel, lua, "set", Durability(replicas=1, timeout_ms=2000))
    try:
        assert await script(keys=[prefix], args=["before"]) == b"OK"
        with cluster.server(source).client() as src, cluster.server(target).client() as dst:
            slot = int(src.execute_command("CLUSTER KEYSLOT", prefix))
            assert src.exists(marker(prefix)) == 1  # the last acknowledged write's marker
            src_id, dst_id = view(src).node_id, view(dst).node_id
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
            with pytest.raises(StoreUnavailable):  # TRYAGAIN every round: a 503
                await script(keys=[prefix], args=["during"])
            assert dst.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
        migration = migrate_slot(cluster, slot, target)  # no BUSYKEY
        assert migration.moved == 2  # the record and the marker
        assert await script(keys=[prefix], args=["after"]) == b"OK"
        with cluster.server(target).client() as dst:
            assert dst.get(prefix + "t:k") == b"after"
    finally:
        await wheel.aclose()
