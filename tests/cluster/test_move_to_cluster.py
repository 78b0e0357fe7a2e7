"""docs/deploy.md, "Moving a wheel to a Redis Cluster", run as written.

A wheel holding one of everything (tests/support/wheel_contents.py), on one Redis with 8
buckets (not the default: the count must come along with the keys), or on the embedded Redis;
its service stopped; the document's blocks run into the session's three-master cluster; a
service started on the cluster without TIMEWHEEL_BUCKETS. Every key must be on the cluster
with its time to live, and the service must show everything as it was and deliver the due
tasks once each, none early.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.e2e.conftest import Service
from tests.support import deploy_doc
from tests.support.receiver import ThreadedReceiver
from tests.support.redis_server import (
    HOST,
    RedisCluster,
    RedisServer,
    free_port,
    redis_cli_binary,
)
from tests.support.waiting import settle
from tests.support.wheel_contents import PAUSED, Contents, early, ok

pytestmark = pytest.mark.cluster

BUCKETS = 8


def filled_and_stopped(source: Service, services: list[Service], receiver: ThreadedReceiver
                       ) -> tuple[Service, Contents, Any, int]:
    """The source wheel started, given one of everything, read back, and stopped: the source,
    its contents, what they read, and how many callbacks had arrived by then."""
    services.append(source)
    source.start()
    contents = Contents(receiver, soon_s=20)
    with source.client() as http:
        contents.create(http)
        before = contents.snapshot(http)
    assert source.stop() == 0
    return source, contents, before, len(receiver.arrivals)


def keys_and_ttls(clients: list[redis.Redis]) -> dict[bytes, int]:
    """Every key of these servers -> its PTTL (-1: none)."""
    found: dict[bytes, int] = {}
    for conn in clients:
        for key in conn.scan_iter(count=1000):
            found[key] = int(conn.pttl(key))
    return found


def on_the_cluster(cluster: RedisCluster) -> dict[bytes, int]:
    nodes = [node.client() for node in cluster.nodes]
    try:
        return keys_and_ttls(nodes)
    finally:
        for conn in nodes:
            conn.close()


def assert_moved(source: dict[bytes, int], moved: dict[bytes, int], imported: str) -> None:
    """Every key of the source is on the cluster, with about the TTL it had (none expired in
    between here: the ticks key and claim tokens live seconds to minutes)."""
    assert "[OK] All 16384 slots covered." in imported, imported
    assert f"Importing {len(source)} keys from DB 0" in imported, imported
    assert set(moved) == set(source)
    assert {k for k, ttl in moved.items() if ttl == -1} == {
        k for k, ttl in source.items() if ttl == -1}
    assert all(abs(moved[k] - ttl) < 60_000 for k, ttl in source.items() if ttl >= 0)


def check_on_the_cluster(tmp_path: Path, cluster: RedisCluster, services: list[Service],
                         contents: Contents, before: dict[str, Any], arrived: int) -> Service:
    """A service on the cluster shows ``before`` and delivers the due tasks once, none early;
    the paused flow's task once the flow is resumed."""
    receiver = contents.receiver
    target = Service(tmp_path / "target", cluster.seed_url, redis_cluster="true")
    services.append(target)
    target.start()
    with target.client() as http:
        contents.compare(before, contents.snapshot(http))
        contents.wait_delivered()
        receiver.wait_for_sync(arrived + len(contents.due) + 1, timeout=30)  # a schedule's too
        assert {key: len(contents.arrivals(key)) for key in contents.due} == dict.fromkeys(
            contents.due, 1)
        assert contents.arrivals("bk-held") == []
        assert len(contents.arrivals("bk-done")) == 1
        ok(http.post(f"/flows/{PAUSED}/resume"))
        receiver.wait_for_sync(1, timeout=30, path="/held")
        for key in [*contents.due, "bk-held"]:
            settle(lambda key=key: http.get(f"/tasks/{key}").json()["status"] == "succeeded",
                   30, f"{key} to succeed")
        assert http.get("/tasks/bk-far").json()["status"] == "scheduled"
        assert http.get("/tasks/bk-cancelled").json()["status"] == "cancelled"
    assert early(receiver.arrivals) == []
    return target


def test_a_stopped_wheel_moves_to_a_cluster_with_every_task(
        tmp_path: Path, cluster: RedisCluster, receiver: ThreadedReceiver,
        services: list[Service]) -> None:
    with RedisServer(tmp_path / "single", appendfsync="always") as single:
        _, contents, before, arrived = filled_and_stopped(
            Service(tmp_path / "source", single.url, buckets=str(BUCKETS)), services, receiver)

        with single.client() as conn:
            assert conn.get("tw:buckets") == str(BUCKETS).encode()
            source_keys = keys_and_ttls([conn])
        env = {"CLI": redis_cli_binary(), "SOURCE": f"{HOST}:{single.port}",
               "CLUSTER": f"{HOST}:{cluster.nodes[0].port}"}
        deploy_doc.run(["move-to-cluster"], env, tmp_path)
        assert_moved(source_keys, on_the_cluster(cluster), (tmp_path / "import.log").read_text())

    # The source is gone: only the cluster holds the wheel now, and its bucket count.
    refused = Service(tmp_path / "refused", cluster.seed_url, redis_cluster="true",
                      buckets="16")
    services.append(refused)
    with pytest.raises(RuntimeError, match="exited early"):
        refused.start(timeout=30)
    assert "TIMEWHEEL_BUCKETS=16, but the wheel 'tw' in Redis has 8 buckets" in refused.log()

    target = check_on_the_cluster(tmp_path, cluster, services, contents, before, arrived)
    assert f"Redis Cluster: {BUCKETS} buckets over 3 masters" in target.log()


def test_the_embedded_redis_moves_to_a_cluster_with_every_task(
        tmp_path: Path, cluster: RedisCluster, receiver: ThreadedReceiver,
        services: list[Service]) -> None:
    source, contents, before, arrived = filled_and_stopped(
        Service(tmp_path / "source", None), services, receiver)

    port = free_port()
    env = {"PY": sys.executable, "TIMEWHEEL_DATA_DIR": str(source.directory / "data"),
           "SOURCE": f"{HOST}:{port}", "CLUSTER": f"{HOST}:{cluster.nodes[0].port}"}
    deploy_doc.run(["embedded-tools", "embedded-source", "move-to-cluster",
                    "embedded-source-stop"], env, tmp_path)
    # The import copied: the data dir still has every key, as a server of it shows.
    with RedisServer(source.directory / "data") as again, again.client() as conn:
        source_keys = keys_and_ttls([conn])
    assert_moved(source_keys, on_the_cluster(cluster), (tmp_path / "import.log").read_text())

    target = check_on_the_cluster(tmp_path, cluster, services, contents, before, arrived)
    assert "Redis Cluster: 16 buckets over 3 masters" in target.log()
