"""FlowStore: a flow's limits and permits, in the flow's own hash slot (lua/permits.lua).

A flow's state never shares a script with a task's: on a Redis Cluster they live in different
slots. The permit is the only link: the dispatcher takes one (this module) before it starts an
attempt (task_store), and gives it back after the answer.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from timewheel.store.keys import Keyspace
from timewheel.store.redis_errors import redis_errors
from timewheel.store.replies import FlowLimitsReply
from timewheel.store.scripts import Scripts


@dataclass(frozen=True, slots=True)
class StoredLimits:
    """What is stored for a flow: None = not set (the defaults apply)."""

    parallelism: int | None
    rate: float | None


@dataclass(frozen=True, slots=True)
class PermitReply:
    granted: int  # the first `granted` of the wanted permit ids are held now
    wait_ms: int  # when short: -1 wait for a release, or ms until the rate window has room
    in_flight: int
    room: int  # how many more permits could be taken now (< 0: over a lowered limit)
    rated: bool  # the flow has a rate: starts are logged at the start times given


def new_permit_id() -> str:
    return secrets.token_hex(8)


class FlowStore:
    def __init__(self, redis: Redis | RedisCluster, keys: Keyspace, scripts: Scripts, *,
                 default_parallelism: int) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = scripts
        self.default_parallelism = default_parallelism

    async def permits(self, flow: str, *, now_ms: int, lease_ms: int,
                      release: Sequence[str] = (), want: Sequence[tuple[str, int]] = ()
                      ) -> PermitReply:
        """Give back ``release``, then take permits for ``want``, (permit id, start ms) pairs
        in order, atomically."""
        async with redis_errors("permits"):
            reply = await self.scripts.permits(
                keys=[self.keys.flow(flow)],
                args=[now_ms, self.default_parallelism, lease_ms, len(release), *release,
                      *(part for pair in want for part in pair)])
        return PermitReply(int(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]),
                           bool(reply[4]))

    async def limits(self, flow: str) -> StoredLimits:
        async with redis_errors("flow limits"):
            values: list[Any] = await self.redis.hmget(self.keys.flow(flow) + "cfg", ["p", "r"])
        return StoredLimits(int(values[0]) if values[0] else None,
                          float(values[1]) if values[1] else None)

    async def set_limits(self, flow: str, limits: StoredLimits) -> None:
        """Store the limits (read by every permits call: in force at once). One script, so
        two PUTs racing each other leave one of them whole."""
        async with redis_errors("set flow limits"):
            reply = FlowLimitsReply(int(await self.scripts.flow_limits(
                keys=[self.keys.flow(flow)],
                args=["" if limits.parallelism is None else limits.parallelism,
                      "" if limits.rate is None else repr(float(limits.rate))])))
            # The registry of configured flows lives in another slot: a hint for listings
            # and metrics, written after the limits themselves.
            if reply is FlowLimitsReply.LIMITED:
                await self.redis.sadd(self.keys.configured_flows, flow)
            else:
                await self.redis.srem(self.keys.configured_flows, flow)

    async def delete_limits(self, flow: str) -> None:
        """Back to the defaults: the flow_limits script with no limits (acknowledged like a
        PUT when replicas are required, see store/scripts.py)."""
        await self.set_limits(flow, StoredLimits(None, None))

    async def in_flight(self, flow: str, *, now_ms: int) -> int:
        """Permits held and not expired, over every process."""
        async with redis_errors("flow in flight"):
            return int(await self.redis.zcount(self.keys.flow(flow) + "held", now_ms + 1, "+inf"))

    async def configured(self) -> list[str]:
        """Flows with limits set (PUT /flows)."""
        async with redis_errors("configured flows"):
            members: Any = await self.redis.smembers(self.keys.configured_flows)
        return sorted(m.decode() for m in members)
