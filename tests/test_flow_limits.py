"""lua/flow_limits.lua on its own: a PUT /flows replaces a flow's limits in one step."""

from __future__ import annotations

from redis.asyncio import Redis

from timewheel.store import Store

F = "{tw:f:127.0.0.1:9}:"


async def cfg(redis: Redis) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (await redis.hgetall(F + "cfg")).items()}


async def test_flow_limits_replaces_both_at_once(store: Store, redis: Redis) -> None:
    """A PUT sets the whole limits: what the previous one set and this one does not is gone
    in the same step, so two racing PUTs leave one of them whole, never a mix or nothing."""
    assert await store.scripts.flow_limits(keys=[F], args=["5", "", "1", "", "", ""]) == 1
    assert await cfg(redis) == {"p": "5", "x": "1"}
    assert await store.scripts.flow_limits(keys=[F], args=["", "10.0", "", "", "", ""]) == 1
    assert await cfg(redis) == {"r": "10.0"}
    assert await store.scripts.flow_limits(keys=[F], args=["", ""]) == 0  # the rest: ""
    assert await redis.exists(F + "cfg") == 0
