"""Flow pause, retry defaults and waiting reports on a real three-master Redis Cluster: each
script runs in its own slot (the flow's, the reports'), so the pause, the configuration and the
summed reports read the same as on one Redis."""

from __future__ import annotations

import pytest

from tests.conftest import START_MS
from timewheel.delivery.retry_policy import RetryDefaults
from timewheel.store import Store
from timewheel.store.flow_store import FlowStore, StoredLimits

pytestmark = pytest.mark.cluster


async def test_pause_defaults_and_reports_on_a_cluster(cluster_store: Store) -> None:
    flows = FlowStore(cluster_store.redis, cluster_store.keys, cluster_store.scripts,
                      default_parallelism=100)
    flow_names = [f"tenant-{i}" for i in range(6)]  # flows in several slots
    for flow in flow_names:
        await flows.set_limits(flow, StoredLimits(3, None, False, 20, 30_000, None))
        await flows.set_paused(flow, True)
        reply = await flows.permits(flow, now_ms=START_MS, lease_ms=1000,
                                    want=[("p1", START_MS)])
        assert (reply.granted, reply.paused, reply.retry) == (0, True,
                                                              RetryDefaults(20, 30_000, 0))
        await flows.set_paused(flow, False)
        reply = await flows.permits(flow, now_ms=START_MS, lease_ms=1000,
                                    want=[("p1", START_MS)])
        assert (reply.granted, reply.paused) == (1, False)
    assert await flows.configured() == flow_names

    await flows.report_waiting("a", {flow_names[0]: 4, flow_names[1]: 1}, now_ms=START_MS,
                               ttl_ms=3000)
    await flows.report_waiting("b", {flow_names[0]: 5}, now_ms=START_MS, ttl_ms=3000)
    assert await flows.waiting_in_processes(flow_names[:3], now_ms=START_MS + 1) == [9, 1, 0]

    # GET /flows and the scrape read every flow's load in one pipeline, over every master:
    # its configuration, its permits held, and its parked tasks in each bucket (slot) whose
    # index of parked flows lists it (as lua/park.lua parks them).
    for n, flow in enumerate(flow_names):
        for bucket in range(n):
            await cluster_store.redis.zadd(cluster_store.keys.waiting(bucket, flow),
                                           {f"task-{bucket}": START_MS})
            await cluster_store.redis.zadd(cluster_store.keys.waiting_flows(bucket),
                                           {flow: START_MS})
    loads = await flows.loads(flow_names, now_ms=START_MS + 1)
    assert loads == [(StoredLimits(3, None, False, 20, 30_000, None), 1, n)
                     for n in range(len(flow_names))]
