"""Store: every read and write of the wheel's state, one atomic Lua script per mutation.

Methods take ``now_ms`` from the caller's clock (the scripts never read the time themselves),
and translate Redis failures into ``StoreUnavailable``, keeping the cause.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel.errors import StoreUnavailable, WheelMismatch
from timewheel.models import TaskView
from timewheel.store.keys import DEFAULT_BUCKETS, Keyspace
from timewheel.store.record import VIEW_FIELDS, ClaimedTask, NewTask, view_from_fields
from timewheel.store.scripts import Scripts

log = logging.getLogger(__name__)

CREATED, REPLACED, EXISTS, CONFLICT = 0, 1, 2, -1
NOT_FOUND, NOT_ALLOWED = -1, -2
_CLAIM_FIELDS = 12  # key, due, then the ten CLAIM_FIELDS of lua/lib/claiming.lua


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of one attempt, for ``Store.complete``."""

    key: str
    token: str
    kind: Literal["ok", "retry", "fail"]
    status_code: int | None = None
    error: str | None = None
    next_due_ms: int | None = None
    started_ms: int = 0


@asynccontextmanager
async def redis_errors(what: str) -> AsyncIterator[None]:
    try:
        yield
    except RedisError as exc:
        raise StoreUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc


_redis_errors = redis_errors  # the name sibling modules used before it was shared


class Store:
    def __init__(self, redis: Redis | RedisCluster, key_prefix: str, *,
                 retention_ms: int, lease_margin_ms: int, buckets: int | None = None) -> None:
        self.redis = redis
        self.keys = Keyspace(key_prefix, buckets or DEFAULT_BUCKETS)
        self.wanted_buckets = buckets  # TIMEWHEEL_BUCKETS; None adopts the wheel's
        self.retention_ms = retention_ms
        self.lease_margin_ms = lease_margin_ms
        self.scripts = Scripts(redis)
        self.ready = False  # init() has read the bucket count


    async def init(self) -> None:
        """Read (or fix, the first time) the wheel's bucket count; warn about eviction.
        Raises WheelMismatch if the configured count is not the one the wheel has."""
        async with redis_errors("init"):
            await self.redis.set(self.keys.buckets_key, self.wanted_buckets or DEFAULT_BUCKETS,
                                 nx=True)
            buckets = int(await self.redis.get(self.keys.buckets_key) or DEFAULT_BUCKETS)
            if self.wanted_buckets is not None and buckets != self.wanted_buckets:
                raise WheelMismatch(
                    f"TIMEWHEEL_BUCKETS={self.wanted_buckets}, but the wheel "
                    f"{self.keys.key_prefix!r} in Redis has {buckets} buckets "
                    f"({self.keys.buckets_key}); the count cannot change once tasks were "
                    f"written. Unset TIMEWHEEL_BUCKETS (or set it to {buckets}), or start a new "
                    "wheel under another TIMEWHEEL_KEY_PREFIX")
            if buckets != self.keys.buckets:
                self.keys = Keyspace(self.keys.key_prefix, buckets)
        self.ready = True
        try:
            policies = await self._eviction_policies()
        except RedisError:  # managed Redis often refuses CONFIG
            return
        for node, policy in policies.items():
            if policy != "noeviction":
                log.warning("Redis %s has maxmemory-policy %r, not noeviction: it may evict "
                            "tasks under memory pressure", node, policy)

    async def _eviction_policies(self) -> dict[str, str]:
        """maxmemory-policy of every primary (one entry for a single Redis)."""
        if isinstance(self.redis, RedisCluster):
            reply: Any = await self.redis.config_get(
                "maxmemory-policy", target_nodes=RedisCluster.PRIMARIES)
        else:
            reply = await self.redis.config_get("maxmemory-policy")
        # A cluster answers {node: {name: value}}, or a flat {name: value} for one primary.
        nodes = reply if any(isinstance(v, dict) for v in reply.values()) else {"redis": reply}
        policies = {}
        for node, values in nodes.items():
            value = values.get("maxmemory-policy", values.get(b"maxmemory-policy", b""))
            policies[str(node)] = value.decode() if isinstance(value, bytes) else str(value)
        return policies

    async def ping(self) -> None:
        """Every primary must answer: on a cluster, one master down fails the buckets it holds."""
        async with redis_errors("ping"):
            if isinstance(self.redis, RedisCluster):
                await self.redis.ping(target_nodes=RedisCluster.PRIMARIES)
            else:
                await self.redis.ping()

    # -- the API's operations -----------------------------------------------------------------

    async def schedule(self, task: NewTask, *, replace: bool, now_ms: int) -> int:
        """CREATED, REPLACED, EXISTS (identical, create only) or CONFLICT (create only).
        The request id makes a redis-py retry of this very call answer as the first did."""
        async with redis_errors("schedule"):
            return int(await self.scripts.schedule(
                keys=[self.keys.prefix(self.keys.bucket_of(task.key))],
                args=self.schedule_args(task, replace=replace, now_ms=now_ms)))

    def schedule_args(self, task: NewTask, *, replace: bool, now_ms: int,
                      request_id: str | None = None) -> list[str | bytes | int]:
        """ARGV of ``lua/schedule.lua`` for one task (also used by batched creates)."""
        return [task.key, "replace" if replace else "create", now_ms, task.due_ms,
                task.fingerprint, request_id or secrets.token_hex(8), *task.fields()]

    async def cancel(self, key: str, *, now_ms: int) -> int:
        """1 cancelled, NOT_FOUND, or NOT_ALLOWED (already finished). The request id makes a
        redis-py retry of this very call answer 1 again."""
        async with redis_errors("cancel"):
            return int(await self.scripts.cancel(
                keys=[self.keys.prefix(self.keys.bucket_of(key))],
                args=[key, now_ms, self.retention_ms, secrets.token_hex(8)],
            ))

    async def replay(self, key: str, *, now_ms: int) -> int:
        """1 scheduled again, NOT_FOUND, or NOT_ALLOWED (not failed or cancelled)."""
        async with redis_errors("replay"):
            return int(await self.scripts.replay(
                keys=[self.keys.prefix(self.keys.bucket_of(key))],
                args=[key, now_ms, secrets.token_hex(8)]))

    async def get(self, key: str) -> TaskView | None:
        async with redis_errors("get"):
            values: list[Any] = await self.redis.hmget(self.keys.task(key), list(VIEW_FIELDS))
        return view_from_fields(key, values)

    async def list_failed(self, limit: int, cursor: tuple[int, str] | None
                          ) -> tuple[list[TaskView], tuple[int, str] | None]:
        """Dead letters, newest first, across every bucket. ``cursor`` is the (finished_ms, key)
        of the last task of the previous page."""
        async with redis_errors("list_failed"):
            pages = await asyncio.gather(*(self._dead_page(bucket, limit, cursor)
                                           for bucket in range(self.keys.buckets)))
            rows = sorted((row for page in pages for row in page), reverse=True)
            page = rows[:limit]
            views = await asyncio.gather(*(self.get(key) for _, key in page))
        more = len(rows) > limit
        return [v for v in views if v is not None], (page[-1] if more and page else None)

    async def _dead_page(self, bucket: int, limit: int, cursor: tuple[int, str] | None
                         ) -> list[tuple[int, str]]:
        """Up to ``limit`` dead letters of one bucket after the cursor, newest first."""
        dead = self.keys.dead(bucket)
        found: Any
        if cursor is None:
            found = await self.redis.zrevrangebyscore(dead, "+inf", "-inf", start=0, num=limit,
                                                      withscores=True)
        else:
            # Ties on the cursor's millisecond come in descending key order, then older ones.
            ties: list[Any] = await self.redis.zrangebyscore(dead, cursor[0], cursor[0],
                                                             withscores=True)
            found = [(member, score) for member, score in ties
                     if member.decode() < cursor[1]]
            older: list[Any] = await self.redis.zrevrangebyscore(
                dead, f"({cursor[0]}", "-inf", start=0, num=limit, withscores=True)
            found += older
        return [(int(score), member.decode()) for member, score in found]

    # -- the ticker's and dispatcher's operations ----------------------------------------------

    async def claim(self, bucket: int, *, now_ms: int, horizon_ms: int, limit: int, token: str,
                    max_minutes: int = 1440) -> tuple[bool, list[ClaimedTask]]:
        """Claim up to ``limit`` tasks of one bucket due at or before ``horizon_ms``.
        Returns (more, tasks): call again while ``more``."""
        async with redis_errors("claim"):
            reply = await self.scripts.claim(
                keys=[self.keys.prefix(bucket)],
                args=[now_ms, horizon_ms, limit, token, self.lease_margin_ms, max_minutes,
                      self.retention_ms],
            )
        more, tasks = await self._claimed(bucket, token, reply, now_ms)
        return more, tasks

    async def _claimed(self, bucket: int, token: str, reply: list[Any], now_ms: int
                       ) -> tuple[bool, list[ClaimedTask]]:
        """Decode a claim reply (lua/lib/claiming.lua). A record that cannot be decoded is
        failed at once with the reason, instead of holding back the rest of its batch."""
        more, count = int(reply[0]), int(reply[1])
        tasks, bad = [], []
        for i in range(2, 2 + count * _CLAIM_FIELDS, _CLAIM_FIELDS):
            row = reply[i:i + _CLAIM_FIELDS]
            try:
                tasks.append(_claimed_task(bucket, token, row))
            except (ValueError, TypeError, AttributeError) as exc:
                key = row[0].decode(errors="replace")
                log.error("task %s has an undecodable record, failing it: %s", key, exc)
                bad.append(Outcome(key, token, "fail", error=f"undecodable record: {exc}"[:500],
                                   started_ms=now_ms))
        if bad:
            await self.complete(bucket, now_ms=now_ms, outcomes=bad)
        return bool(more), tasks

    async def start(self, bucket: int, *, now_ms: int,
                    claims: Sequence[tuple[str, str]]) -> list[int]:
        """Begin attempts for (key, token) pairs: the attempt number each, or 0 (do not send)."""
        async with redis_errors("start"):
            reply = await self.scripts.start(
                keys=[self.keys.prefix(bucket)],
                args=[now_ms, *(part for claim in claims for part in claim)])
        return [int(x) for x in reply]

    async def complete(self, bucket: int, *, now_ms: int,
                       outcomes: Sequence[Outcome]) -> list[int]:
        """Record outcomes; 1 each recorded, 0 each stale (the claim was no longer ours)."""
        args: list[str | int] = [now_ms, self.retention_ms]
        for o in outcomes:
            args += [o.key, o.token, o.kind, "" if o.status_code is None else o.status_code,
                     o.error or "", "" if o.next_due_ms is None else o.next_due_ms,
                     o.started_ms]
        async with redis_errors("complete"):
            reply = await self.scripts.complete(keys=[self.keys.prefix(bucket)], args=args)
        return [int(x) for x in reply]

    async def release(self, bucket: int, claims: Sequence[tuple[str, str]]) -> list[int]:
        """Hand back claims that never started; 1 each handed back."""
        async with redis_errors("release"):
            reply = await self.scripts.release(
                keys=[self.keys.prefix(bucket)],
                args=[part for claim in claims for part in claim])
        return [int(x) for x in reply]

    # -- flow control: tasks waiting for a permit (lua/park.lua, lua/unpark.lua) ---------------

    async def park(self, bucket: int, claims: Sequence[tuple[str, str]]) -> list[int]:
        """Set claimed, unstarted tasks aside until their flow has room; 1 each parked."""
        async with redis_errors("park"):
            reply = await self.scripts.park(
                keys=[self.keys.prefix(bucket)],
                args=[part for claim in claims for part in claim])
        return [int(x) for x in reply]

    async def parked_flows(self, bucket: int, limit: int) -> list[tuple[str, int]]:
        """Flows with parked tasks in a bucket, and the due time of each one's earliest."""
        async with redis_errors("parked_flows"):
            rows: list[Any] = await self.redis.zrange(
                self.keys.waiting_flows(bucket), 0, limit - 1, withscores=True)
        return [(flow.decode(), int(due)) for flow, due in rows]

    async def peek_parked(self, bucket: int, flow: str, limit: int) -> list[int]:
        """Due times of a flow's earliest parked tasks in a bucket (no change)."""
        async with redis_errors("peek_parked"):
            rows: list[Any] = await self.redis.zrange(
                self.keys.waiting(bucket, flow), 0, limit - 1, withscores=True)
        return [int(due) for _, due in rows]

    async def parked_count(self, flow: str) -> int:
        """How many tasks of a flow are parked, over every bucket."""
        async with redis_errors("parked_count"):
            counts = await asyncio.gather(*(self.redis.zcard(self.keys.waiting(bucket, flow))
                                            for bucket in range(self.keys.buckets)))
        return sum(int(c) for c in counts)

    async def unpark(self, bucket: int, flow: str, *, limit: int, token: str, now_ms: int
                     ) -> tuple[bool, list[ClaimedTask]]:
        """Claim up to ``limit`` of a flow's earliest parked tasks in a bucket (the caller holds
        permits for them). Returns (more parked in this bucket, tasks)."""
        async with redis_errors("unpark"):
            reply = await self.scripts.unpark(
                keys=[self.keys.prefix(bucket)],
                args=[now_ms, flow, limit, token, self.lease_margin_ms])
        return await self._claimed(bucket, token, reply, now_ms)


def _claimed_task(bucket: int, token: str, row: list[Any]) -> ClaimedTask:
    (key, due, exec_ms, attempts, max_attempts, backoff, timeout, url, method, headers, body,
     flow) = row
    return ClaimedTask(
        key=key.decode(), bucket=bucket, token=token, due_ms=int(due),
        execute_at_ms=int(exec_ms), attempts=int(attempts), max_attempts=int(max_attempts),
        backoff_ms=int(backoff), timeout_ms=int(timeout), url=url.decode(),
        method=method.decode(),
        headers=[(str(n), str(v)) for n, v in json.loads(headers)], body=body,
        flow=flow.decode())
