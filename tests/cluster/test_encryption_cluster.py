"""Payload encryption at rest on a real three-master Redis Cluster: tasks in every bucket (so on
every master) are sealed, delivered with their payload, and `timewheel keys rotate` (its SCAN
and compare-and-set scripts) reaches every master."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.cluster.test_attempts_cluster import keys_over_every_bucket
from tests.e2e.test_encryption import (
    BODY_VALUE,
    HEADER_VALUE,
    K0,
    K1,
    MARKERS,
    RESPONSE_VALUE,
    create,
    view,
)
from tests.support.receiver import Reply, ThreadedReceiver
from tests.support.redis_server import RedisCluster

from .conftest import node_clients, slot_owners, wait_finished

pytestmark = pytest.mark.cluster


def dump_every_master(cluster: RedisCluster) -> bytes:
    """Every value of every key on every master, read as its type says."""
    out: list[bytes] = []
    for conn in node_clients(cluster):
        with conn:
            for name in conn.scan_iter():
                kind = conn.type(name)
                if kind == b"string":
                    out.append(conn.get(name) or b"")
                elif kind == b"list":
                    out += conn.lrange(name, 0, -1)
                elif kind == b"hash":
                    out += [v for pair in conn.hgetall(name).items() for v in pair]
                elif kind == b"zset":
                    out += conn.zrange(name, 0, -1)
                elif kind == b"set":
                    out += list(conn.smembers(name))
    return b"\n".join(out)


def test_sealed_in_every_slot_and_rotated(start_cluster_service: Any, cluster: RedisCluster,
                                          receiver: ThreadedReceiver) -> None:
    assert len(set(slot_owners(cluster).values())) == 3
    receiver.respond("/ok", [Reply(200, body=RESPONSE_VALUE.encode())])
    service = start_cluster_service(encryption_keys=K0)
    due = keys_over_every_bucket("now")
    pending = keys_over_every_bucket("later")
    for key in due:
        create(service, key, receiver.url("/ok"))
    for key in pending:
        create(service, key, receiver.url("/ok"), delay=3600)
    views = wait_finished(service, due, 30)
    assert {v["status"] for v in views.values()} == {"succeeded"}
    arrivals = {a.headers["webhook-id"]: a for a in receiver.arrivals_for("/ok")}
    assert sorted(arrivals) == sorted(due)
    for key, arrival in arrivals.items():
        assert arrival.headers["x-secret"] == HEADER_VALUE
        assert json.loads(arrival.body) == {"note": BODY_VALUE, "key": key}

    dump = dump_every_master(cluster)
    assert pending[0].encode() in dump  # the dump read the tasks
    for marker in MARKERS:
        assert marker.encode() not in dump, marker

    rotated = subprocess.run(
        [sys.executable, "-m", "timewheel.cli", "keys", "rotate"],
        env={**service.env, "TIMEWHEEL_ENCRYPTION_KEYS": f"{K1},{K0}"},
        capture_output=True, text=True, timeout=120, check=False)
    assert rotated.returncode == 0, rotated.stderr
    # Every task record (due and pending, 16 buckets each) and each delivered attempt's body.
    total = len(due) + len(pending)
    assert f"tasks_rekeyed={total} " in rotated.stdout, rotated.stdout
    assert f"attempts_rekeyed={len(due)} " in rotated.stdout, rotated.stdout

    assert service.stop() == 0
    only_k1 = start_cluster_service(encryption_keys=K1)
    for key in pending:
        seen = view(only_k1, key)
        assert seen["headers"]["X-Secret"] == HEADER_VALUE, key
        assert seen["body"] == {"note": BODY_VALUE, "key": key}
    with only_k1.client() as http:
        [attempt] = http.get(f"/tasks/{due[0]}/attempts").json()["attempts"]
    assert attempt["response_body"] == RESPONSE_VALUE
    assert RESPONSE_VALUE.encode() not in dump_every_master(cluster)
