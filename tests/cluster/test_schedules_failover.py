"""A master fails over under running schedules (three masters with a replica each, a real
process): no schedule loses an occurrence.

Every occurrence fires once while any process runs (docs/api.md, "Recurring schedules"); only
after every process was down does a schedule skip to the latest missed occurrence. The
materializer's pass mark lives on one master; while it is away (and while the whole cluster
answers CLUSTERDOWN during the election), no pass reaches Redis. The process ran through it, so
it knows the wheel was not down (timewheel/engine/materializer.py ``_wheel_was_down``), and
makes the missed occurrences up, late. Before, every schedule of the wheel skipped the
occurrences of the outage (an outside audit found it, session 28).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from tests.cluster.replicated import ReplicatedCluster
from tests.support.receiver import ThreadedReceiver
from tests.support.waiting import settle
from timewheel.store.keys import Keyspace

from .conftest import buckets_of, early_arrivals

pytestmark = pytest.mark.cluster

# The materializer's pass mark (timewheel/store/schedule_store.py ``mark_pass``): this test
# stops its master, the outage the audit found.
PASS_MARK = "tw:sched:pass"


def ids_on(cluster: ReplicatedCluster, port: int, count: int, prefix: str) -> list[str]:
    """``count`` schedule ids whose buckets ``port`` serves."""
    buckets, keyspace = buckets_of(cluster, port), Keyspace("tw")
    found = [f"{prefix}{n}" for n in range(1000) if keyspace.bucket_of(f"{prefix}{n}") in buckets]
    assert len(found) >= count, (port, buckets)
    return found[:count]


def occurrences(receiver: ThreadedReceiver, schedule_id: str) -> Counter[int]:
    """The occurrence times (ms) the receiver got for a schedule, with how many times each."""
    return Counter(int(a.headers["webhook-id"].rpartition(".")[2])
                   for a in receiver.arrivals_for(f"/{schedule_id}"))


def test_a_failover_under_a_running_process_skips_no_occurrence(
        replicated_cluster: ReplicatedCluster, start_replicated_service: Any,
        receiver: ThreadedReceiver) -> None:
    """Two every-second schedules on each master; the pass mark's master is SIGSTOPped for 8 s
    (its replica is promoted after ~2 s) while the process runs. Every schedule, on every
    master, fires every occurrence of the whole run, once each, none before its time, and the
    log says nothing was skipped."""
    cluster = replicated_cluster
    victim = cluster.owner(PASS_MARK)
    assert victim != cluster.masters[0].port, "the victim is the services' seed"
    others = [m.port for m in cluster.masters if m.port != victim]
    service = start_replicated_service()
    kept = [i for n, port in enumerate(others) for i in ids_on(cluster, port, 2, f"k{n}-")]
    stopped = ids_on(cluster, victim, 2, "v-")
    with service.client() as http:
        for schedule_id in kept + stopped:
            reply = http.put(f"/schedules/{schedule_id}", json={
                "every": 1, "task": {"callback_url": receiver.url(f"/{schedule_id}")}})
            assert reply.status_code == 201, reply.text
    settle(lambda: all(len(occurrences(receiver, i)) >= 3 for i in kept + stopped), 20,
           "three occurrences of every schedule before the outage")

    with cluster.server(victim).stopped():
        time.sleep(8)
    cluster.wait_ok()
    back = time.time()
    settle(lambda: all(max(occurrences(receiver, i)) > (back + 4) * 1000
                       for i in kept + stopped), 30, "occurrences due 4 s after the outage")

    for schedule_id in kept + stopped:
        seen = occurrences(receiver, schedule_id)
        first, last = min(seen), max(seen)
        assert sorted(seen) == list(range(first, last + 1, 1000)), (
            schedule_id, sorted(set(range(first, last + 1, 1000)) - set(seen)))
        assert set(seen.values()) == {1}, (schedule_id, seen)
    for schedule_id in kept + stopped:
        assert early_arrivals(receiver, f"/{schedule_id}") == []
    skipped = [line for line in service.log_path.read_text().splitlines()
               if "skipped after an outage" in line]
    assert skipped == []
