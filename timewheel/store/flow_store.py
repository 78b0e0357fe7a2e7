"""FlowStore: a flow's limits and permits, in the flow's own hash slot (lua/permits.lua).

A flow's state never shares a script with a task's: on a Redis Cluster they live in different
slots. The permit is the only link: the dispatcher takes one (this module) before it starts an
attempt (store/claims.py), and gives it back after the answer.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from timewheel.delivery.retry_policy import NO_DEFAULTS, RetryDefaults
from timewheel.store.keys import INDEX_KEEPER_SCORE, Keyspace
from timewheel.store.redis_errors import redis_errors
from timewheel.store.replies import FlowLimitsReply, FlowPauseReply
from timewheel.store.rounds import in_rounds
from timewheel.store.scripts import Scripts

_CFG_FIELDS = ["p", "r", "x", "ma", "rb", "mb"]  # lua/flow_limits.lua
DEFAULTS_FRESH_MS = 1000  # task views show a flow's retry defaults read at most this long ago
DEFAULTS_KEPT = 10_000  # flows whose retry defaults are kept for the views
# A rated flow's attempt starts (its request is written) at most this long after the start its
# flow logged for it, or it asks its flow again (engine/dispatcher.py); lua/permits.lua keeps
# logged starts that much longer apart, so the real ones keep the rate whatever their drift.
RATE_SLACK_MS = 20
# Up to this many flows, FlowStore.loads asks each bucket's parked-flows index for them by
# name; more (GET /flows, a scrape) read the whole index once, as it is shorter than they are.
FEW_FLOWS = 64


@dataclass(frozen=True, slots=True)
class StoredLimits:
    """What is stored for a flow (PUT /flows): None = not set (the defaults apply)."""

    parallelism: int | None
    rate: float | None
    paused: bool = False
    max_attempts: int | None = None
    backoff_ms: int | None = None
    max_backoff_ms: int | None = None

    @property
    def retry(self) -> RetryDefaults:
        return RetryDefaults(self.max_attempts or 0, self.backoff_ms or 0,
                             self.max_backoff_ms or 0)


@dataclass(frozen=True, slots=True)
class PermitReply:
    granted: int  # the first `granted` of the wanted permit ids are held now
    wait_ms: int  # when short: -1 wait for a release, or ms until the rate window has room
    in_flight: int
    room: int  # how many more permits could be taken now (< 0: over a lowered limit)
    rated: bool  # the flow has a rate: starts are logged at the start times given
    paused: bool = False  # no new permit while paused (POST /flows/{key}/pause)
    retry: RetryDefaults = NO_DEFAULTS  # the flow's retry defaults, as stored now


def _limits(values: list[Any]) -> StoredLimits:
    p, r, x, ma, rb, mb = values
    return StoredLimits(int(p) if p else None, float(r) if r else None, x == b"1",
                        int(ma) if ma else None, int(rb) if rb else None,
                        int(mb) if mb else None)


def new_permit_id() -> str:
    return secrets.token_hex(8)


class FlowStore:
    def __init__(self, redis: Redis | RedisCluster, keys: Keyspace, scripts: Scripts, *,
                 default_parallelism: int) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = scripts
        self.default_parallelism = default_parallelism
        self._defaults: dict[str, tuple[int, RetryDefaults]] = {}  # flow -> (read at, value)

    async def permits(self, flow: str, *, now_ms: int, lease_ms: int,
                      release: Sequence[str] = (), unused: Sequence[str] = (),
                      want: Sequence[tuple[str, int]] = ()) -> PermitReply:
        """Give back ``release`` (their attempts were or may have been sent) and ``unused``
        (never sent: the starts logged for them leave a rated flow's log), then take permits
        for ``want``, (permit id, start ms) pairs in order, atomically."""
        async with redis_errors("permits"):
            reply = await self.scripts.permits(
                keys=[self.keys.flow(flow)],
                args=[now_ms, self.default_parallelism, lease_ms, RATE_SLACK_MS,
                      len(release), *release,
                      len(unused), *unused, *(part for pair in want for part in pair)])
        return PermitReply(int(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]),
                           bool(reply[4]), bool(reply[5]),
                           RetryDefaults(int(reply[6]), int(reply[7]), int(reply[8])))

    async def limits(self, flow: str) -> StoredLimits:
        async with redis_errors("flow limits"):
            values: list[Any] = await self.redis.hmget(self.keys.flow(flow) + "cfg",
                                                       _CFG_FIELDS)
        return _limits(values)

    async def loads(self, flows: Sequence[str], *, now_ms: int
                    ) -> list[tuple[StoredLimits, int, int]]:
        """(limits, permits held, tasks parked over every bucket) of each flow, read in
        pipelines of bounded size: a flow's reads one command at a time cost GET /flows and a
        scrape ~3 ms a flow (bench/README.md). Parked tasks are counted only where a bucket's
        index of flows with parked tasks (``pf``, kept exact by lua/lib/parking.lua: the
        processes find parked tasks to take back through it) lists the flow: most flows park
        nothing, and a ZCARD per bucket and flow was 16 of a flow's 18 commands. A few flows
        (GET /flows/{key}, a PUT's answer) look themselves up in each ``pf`` (ZMSCORE), which
        costs what they are, not what every parked flow is (bench/README.md)."""
        if not flows:
            return []
        buckets = self.keys.buckets
        commands: list[tuple[str | int, ...]] = []
        for flow in flows:
            commands.append(("HMGET", self.keys.flow(flow) + "cfg", *_CFG_FIELDS))
            commands.append(("ZCOUNT", self.keys.flow(flow) + "held", now_ms + 1,
                             f"({INDEX_KEEPER_SCORE}"))
        few = len(flows) <= FEW_FLOWS
        commands += [("ZMSCORE", self.keys.waiting_flows(bucket), *flows) if few
                     else ("ZRANGE", self.keys.waiting_flows(bucket), 0, -1)
                     for bucket in range(buckets)]
        async with redis_errors("flow loads"):
            replies = await in_rounds(self.redis, commands)
            indexes = replies[2 * len(flows):]
            if few:  # each bucket's score of each flow asked for, None where not parked
                parked_at = [(bucket, flow) for bucket, scores in enumerate(indexes)
                             for flow, score in zip(flows, scores, strict=True)
                             if score is not None]
            else:
                wanted = set(flows)
                parked_at = [(bucket, flow) for bucket, names in enumerate(indexes)
                             for flow in (name.decode() for name in names) if flow in wanted]
            counts = await in_rounds(self.redis, [("ZCARD", self.keys.waiting(bucket, flow))
                                                  for bucket, flow in parked_at])
        parked = dict.fromkeys(flows, 0)
        for (_, flow), count in zip(parked_at, counts, strict=True):
            parked[flow] += int(count)
        return [(_limits(replies[2 * i]), int(replies[2 * i + 1]), parked[flow])
                for i, flow in enumerate(flows)]

    async def retry_defaults(self, flows: Collection[str], *, now_ms: int
                             ) -> dict[str, RetryDefaults]:
        """The flows' retry defaults for task views, each read from Redis at most once a
        second (a view may show a default changed up to a second ago; the attempts read
        them with their permit)."""
        stale = [flow for flow in flows if (found := self._defaults.get(flow)) is None
                 or now_ms - found[0] >= DEFAULTS_FRESH_MS]
        if stale:
            read = await asyncio.gather(*(self.limits(flow) for flow in stale))
            if len(self._defaults) + len(stale) > DEFAULTS_KEPT:
                self._defaults.clear()  # bounded: a page of many flows reads them again
            for flow, limits in zip(stale, read, strict=True):
                self._defaults[flow] = (now_ms, limits.retry)
        return {flow: self._defaults[flow][1] for flow in flows}

    async def set_limits(self, flow: str, limits: StoredLimits) -> None:
        """Store the whole configuration (read by every permits call: in force at once). One
        script, so two PUTs racing each other leave one of them whole."""
        values = (limits.parallelism, None if limits.rate is None else repr(float(limits.rate)),
                  1 if limits.paused else None, limits.max_attempts, limits.backoff_ms,
                  limits.max_backoff_ms)
        configured = any(value is not None for value in values)
        async with redis_errors("set flow limits"):
            if configured:
                await self.redis.sadd(self.keys.configured_flows, flow)
            reply = FlowLimitsReply(int(await self.scripts.flow_limits(
                keys=[self.keys.flow(flow)],
                args=["" if value is None else value for value in values])))
            await self._settle_registry(flow, reply is FlowLimitsReply.LIMITED)

    async def set_paused(self, flow: str, paused: bool) -> None:
        """Pause or resume, keeping the rest of the flow's configuration: every process
        starts no attempt of a paused flow from its next permits call on (each tick at the
        latest)."""
        async with redis_errors("pause flow"):
            if paused:
                await self.redis.sadd(self.keys.configured_flows, flow)
            reply = FlowPauseReply(int(await self.scripts.flow_pause(
                keys=[self.keys.flow(flow)], args=["1" if paused else "0"])))
            await self._settle_registry(flow, reply is FlowPauseReply.CONFIGURED)

    async def _settle_registry(self, flow: str, configured: bool) -> None:
        """The registry of configured flows (listings, metrics) lives in another slot than
        the configuration, so no script writes both. A configuring call adds the flow before
        its script (a full Redis refusing the add then refuses the script too, never leaving
        a configuration in force unlisted) and checks after it; a call that took the flow back
        to its defaults drops it and then reads the configuration again: another process may
        have configured it in between, and its check may have come before this drop."""
        registry = self.keys.configured_flows
        if configured:
            if not await self.redis.sismember(registry, flow):
                await self.redis.sadd(registry, flow)
            return
        await self.redis.srem(registry, flow)
        if await self.redis.exists(self.keys.flow(flow) + "cfg"):
            await self.redis.sadd(registry, flow)

    async def delete_limits(self, flow: str) -> None:
        """Back to the defaults: the flow_limits script with no limits (acknowledged like a
        PUT when replicas are required, see store/scripts.py)."""
        await self.set_limits(flow, StoredLimits(None, None))

    async def in_flight(self, flow: str, *, now_ms: int) -> int:
        """Permits held and not expired, over every process."""
        async with redis_errors("flow in flight"):
            return int(await self.redis.zcount(self.keys.flow(flow) + "held", now_ms + 1,
                                               f"({INDEX_KEEPER_SCORE}"))  # not the keeper

    async def report_waiting(self, process: str, counts: Mapping[str, int], *, now_ms: int,
                             ttl_ms: int) -> None:
        """This process's attempts waiting in memory for their flow, per flow (counts > 0;
        empty: none), counted by GET /flows until ``now_ms + ttl_ms`` (lua/waiting_report.lua)."""
        async with redis_errors("waiting report"):
            await self.scripts.waiting_report(
                keys=[self.keys.waiting_reports],
                args=[now_ms, ttl_ms, process, *(x for pair in counts.items() for x in pair)])

    async def waiting_in_processes(self, flows: Sequence[str], *, now_ms: int) -> list[int]:
        """Per flow, the attempts waiting in the memory of every live process, as last
        reported (each process reports once a tick)."""
        if not flows:
            return []
        async with redis_errors("waiting count"):
            reply = await self.scripts.waiting_count(keys=[self.keys.waiting_reports],
                                                     args=[now_ms, *flows])
        return [int(count) for count in reply]

    async def configured(self) -> list[str]:
        """Flows with limits set (PUT /flows)."""
        async with redis_errors("configured flows"):
            members: Any = await self.redis.smembers(self.keys.configured_flows)
        return sorted(m.decode() for m in members)
