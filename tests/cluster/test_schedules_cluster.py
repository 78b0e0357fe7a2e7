"""Recurring schedules on a real three-master Redis Cluster: every sched_* script runs in one
slot (its schedule's bucket, or the occurrence task's), schedules spread over every master, and
two materializers racing still create each occurrence once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from tests.conftest import START_MS
from tests.support.redis_server import RedisCluster
from timewheel.engine.materializer import Materializer
from timewheel.engine.occurrences import next_after
from timewheel.models import ScheduleCreate, TaskStatus
from timewheel.operations.prepare import template_task
from timewheel.operations.schedules import schedule_store, spec_of
from timewheel.store import ScheduleReply, Store
from timewheel.store.record import NewTask
from timewheel.store.schedule_store import ScheduleStore, occurrence_task

from .conftest import node_clients, slot_owners

pytestmark = pytest.mark.cluster

NOW = START_MS
URL = "http://127.0.0.1:9/cb"  # never called: no ticker runs here


def bare_template() -> NewTask:
    """The prepared template of a schedule whose task names only its callback."""
    return template_task({"callback_url": URL}, default_timeout=10.0)


def materializer(store: Store, schedules: ScheduleStore) -> Materializer:
    return Materializer(store, schedules, clock=None, tick_ms=1000)  # type: ignore[arg-type]


async def test_schedules_on_a_cluster(cluster: RedisCluster, cluster_store: Store,
                                      cluster_redis: AsyncRedisCluster) -> None:
    schedules = schedule_store(cluster_store, default_timeout=10.0)
    ids = [f"c{i}" for i in range(48)]
    assert {schedules.bucket_of(i) for i in ids} == set(range(16))
    body = ScheduleCreate.model_validate({"every": 1, "task": {"callback_url": URL}})
    for i in ids:
        assert (await schedules.put(i, spec_of(body), paused=False, now_ms=NOW,
                                    next_after=next_after))[0] == 0

    # Schedules live on every master, in their buckets' slots.
    owners = slot_owners(cluster)
    holding = set()
    for conn in node_clients(cluster):
        with conn:
            if any(conn.scan_iter(match="*}:s:c*")):
                holding.add(conn.connection_pool.connection_kwargs["port"])
    assert holding == set(owners.values()) and len(holding) == 3

    first, second = (materializer(cluster_store, schedule_store(cluster_store,
                                                               default_timeout=10.0))
                     for _ in range(2))
    for step in range(4):
        now = NOW + step * 1000
        await asyncio.gather(first.tick(now), second.tick(now + 1))
    expected = [f"{i}.{NOW + s * 1000}" for i in ids for s in range(1, 6)]
    # (Read in one pipeline: a cluster client refuses more than 64 connections per node.)
    statuses = await schedules.task_statuses(expected)
    assert statuses == [TaskStatus.SCHEDULED] * len(expected)
    assert first.created + second.created == len(expected)

    # Pause: created occurrences cancelled, a reserved one tombstoned, in their own slots.
    outstanding = await schedules.pause("c0")
    assert outstanding == [NOW + s * 1000 for s in range(1, 6)]
    await schedules.cancel_occurrences("c0", outstanding, {"callback_url": URL}, now_ms=NOW + 4001)
    statuses = await schedules.task_statuses([f"c0.{occ}" for occ in outstanding])
    assert statuses == [TaskStatus.CANCELLED] * 5
    tomb: Any = await schedules.tombstone(
        occurrence_task("c0", NOW + 9000, bare_template()),
        now_ms=NOW + 4001)
    assert tomb is True
    late = occurrence_task("c0", NOW + 9000, bare_template())
    assert await cluster_store.schedule(late, replace=False,
            now_ms=NOW + 4002) == ScheduleReply.CONFLICT

    # The listing merges every bucket, on every node, in id order.
    seen: list[str] = []
    cursor = None
    while True:
        records, cursor = await schedules.page(20, cursor)
        seen += [r.id for r in records]
        if cursor is None:
            break
    assert seen == sorted(ids)
    assert await schedules.delete("c1") is not None
    assert await schedules.get("c1") is None
