"""The registry of configured flows (<prefix>:flows, GET /flows, the per-flow
gauges) must list every flow whose configuration is in force. 19eb4ba writes it before the
configuration (SADD) and drops it after (SREM), but the SREM of a call that took a flow back
to its defaults is not checked against what another process wrote meanwhile: a PUT or a pause
by another process between the resume's (or DELETE's) script and its SREM leaves the flow
configured - paused - and unlisted. Two FlowStores play two processes; the interleaving is
forced (the other process's call runs when the first one sends its SREM), no timing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from timewheel.store import Store
from timewheel.store.flow_store import FlowStore, StoredLimits

FLOW = "incident"


class _SremAfter:
    """The shared client, but its SREM first lets another process's call run to its end."""

    def __init__(self, redis: Redis, before_srem: Callable[[], Awaitable[None]]) -> None:
        self._redis = redis
        self._before_srem = before_srem

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)

    async def srem(self, *args: Any) -> Any:
        await self._before_srem()
        return await self._redis.srem(*args)


@pytest.mark.parametrize("race", ["delete-vs-put", "resume-vs-pause"])
async def test_a_configured_flow_stays_listed_when_a_reset_races_a_change(
        store: Store, redis: Redis, race: str) -> None:
    other = FlowStore(redis, store.keys, store.scripts, default_parallelism=100)

    async def other_process() -> None:  # lands between the script and the SREM below
        if race == "delete-vs-put":
            await other.set_limits(FLOW, StoredLimits(1, None, paused=True))
        else:
            await other.set_paused(FLOW, True)

    first = FlowStore(_SremAfter(redis, other_process), store.keys,  # type: ignore[arg-type]
                      store.scripts, default_parallelism=100)
    if race == "delete-vs-put":
        await other.set_limits(FLOW, StoredLimits(5, None))
        await first.delete_limits(FLOW)  # DELETE /flows/incident
    else:
        await other.set_paused(FLOW, True)
        await first.set_paused(FLOW, False)  # POST /flows/incident/resume

    in_force = await other.limits(FLOW)
    assert in_force.paused, "the other process's pause is the last write: in force"
    assert FLOW in await other.configured(), (
        "a paused flow, in force, is missing from the registry (GET /flows, metrics)")
