"""Store: the wheel's state in Redis, one atomic Lua script per mutation. The reads and
writes of the API's operations are here; the ticker's and the dispatcher's (claim,
start, complete, release, park) are in store/claims.py, ``ClaimSide``, Store's base class.

Methods take ``now_ms`` from the caller's clock (the scripts never read the time themselves),
and translate Redis failures into ``StoreUnavailable``, keeping the cause.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from timewheel.errors import StoreUnavailable, WheelMismatch
from timewheel.store import layout
from timewheel.store.attempts import AttemptRecord
from timewheel.store.claims import ClaimSide
from timewheel.store.claims import Outcome as Outcome  # re-exported: callers import it here
from timewheel.store.encryption import BadCiphertext, Cipher, UnknownKey, is_sealed
from timewheel.store.keys import DEFAULT_BUCKETS, Keyspace
from timewheel.store.migrate import migrate_v1
from timewheel.store.record import NewTask, TaskRecord, record_from_reply
from timewheel.store.redis_errors import redis_errors
from timewheel.store.redis_settings import memory_used_ratio, warn_about_settings
from timewheel.store.replies import CancelReply, ReplayReply, RescheduleReply, ScheduleReply
from timewheel.store.scripts import Scripts, source

DEFAULT_ATTEMPTS_KEPT = 20


class Store(ClaimSide):
    def __init__(self, redis: Redis | RedisCluster, key_prefix: str, *,
                 retention_ms: int, lease_margin_ms: int, buckets: int | None = None,
                 attempts_kept: int = DEFAULT_ATTEMPTS_KEPT, cipher: Cipher | None = None
                 ) -> None:
        self.redis = redis
        # TIMEWHEEL_ENCRYPTION_KEYS: seals headers and bodies on write, opens them on read
        # (timewheel/store/encryption.py); None stores them as they are.
        self.cipher = cipher
        self.keys = Keyspace(key_prefix, buckets or DEFAULT_BUCKETS)
        self.wanted_buckets = buckets  # TIMEWHEEL_BUCKETS; None adopts the wheel's
        self.retention_ms = retention_ms
        self.lease_margin_ms = lease_margin_ms
        self.attempts_kept = attempts_kept  # history entries kept per task (lua/lib/attempts.lua)
        self.scripts = Scripts(redis)
        # Read-only scripts are the store's own, not Scripts'.
        self.view_script = redis.register_script(source("view"))
        self.list_script = redis.register_script(source("list"))
        self.ready = False  # init() has read the bucket count and migrated v1 records
        # Told (bucket, due_ms) of each task a write has just made due: a process's ticker
        # listens (Ticker.run sets SoonClaims.told here: engine/soon_claims.py), so that a
        # task due before its next tick is claimed at once, not a tick late. A no-op until
        # then.
        self.due_soon: Callable[[int, int], None] = _nobody_listens

    async def init(self) -> None:
        """Read (or fix, the first time) the wheel's bucket count, migrate what layout 1 left
        (store/migrate.py), warn about eviction and memory-costly settings
        (store/redis_settings.py). Raises WheelMismatch if the configured count is not the one
        the wheel has. A process calls it before it claims or serves anything
        (again after a start-up without Redis, until it succeeds)."""
        async with redis_errors("init"):
            stored = await self.redis.get(self.keys.buckets_key)
            if stored is None:  # read first: a full Redis refuses even a SET NX that is a no-op
                await self.redis.set(self.keys.buckets_key,
                                     self.wanted_buckets or DEFAULT_BUCKETS, nx=True)
                stored = await self.redis.get(self.keys.buckets_key)
            buckets = int(stored or DEFAULT_BUCKETS)
            if self.wanted_buckets is not None and buckets != self.wanted_buckets:
                raise WheelMismatch(
                    f"TIMEWHEEL_BUCKETS={self.wanted_buckets}, but the wheel "
                    f"{self.keys.key_prefix!r} in Redis has {buckets} buckets "
                    f"({self.keys.buckets_key}); the count cannot change once tasks were "
                    f"written. Unset TIMEWHEEL_BUCKETS (or set it to {buckets}), or start a new "
                    "wheel under another TIMEWHEEL_KEY_PREFIX")
            if buckets != self.keys.buckets:
                self.keys = Keyspace(self.keys.key_prefix, buckets)
        await migrate_v1(self.redis, self.keys)
        self.ready = True
        await warn_about_settings(self.redis)

    def node_of(self, bucket: int) -> str:
        """The Redis node that serves ``bucket`` as far as the client knows ("" on a single
        Redis, or before a cluster's slot map is read): what a silent node holds up."""
        if not isinstance(self.redis, RedisCluster):
            return ""
        try:
            node = self.redis.get_node_from_key(self.keys.prefix(bucket))
        except Exception:  # no slot map yet, or one being refreshed: no node known
            return ""
        return node.name if node is not None else ""

    async def memory_used(self) -> float:
        """used_memory / maxmemory of the fullest primary, 0.0 with no maxmemory set."""
        async with redis_errors("memory"):
            return await memory_used_ratio(self.redis)

    async def ping(self) -> None:
        """Every primary must answer: on a cluster, one master down fails the buckets it holds."""
        async with redis_errors("ping"):
            if isinstance(self.redis, RedisCluster):
                await self.redis.ping(target_nodes=RedisCluster.PRIMARIES)
            else:
                await self.redis.ping()

    # -- the API's operations -----------------------------------------------------------------

    async def schedule(self, task: NewTask, *, replace: bool, now_ms: int) -> ScheduleReply:
        """CREATED, REPLACED, EXISTS (identical, create only) or CONFLICT (create only).
        The request id makes a redis-py retry of this very call answer as the first did."""
        bucket = self.keys.bucket_of(task.key)
        async with redis_errors("schedule"):
            (code,) = await self.scripts.schedule(
                keys=[self.keys.prefix(bucket)],
                args=["replace" if replace else "create", now_ms, *self.schedule_args(task)])
        reply = ScheduleReply(int(code))
        if reply is ScheduleReply.CONFLICT and await self.same_request(task):
            return ScheduleReply.EXISTS
        if reply in (ScheduleReply.CREATED, ScheduleReply.REPLACED):
            self.due_soon(bucket, task.due_ms)
        return reply

    async def same_request(self, task: NewTask) -> bool:
        """Whether the stored task was created by the same request as ``task``, for a create
        that lua/schedule.lua answered CONFLICT because the fingerprints it compares are keyed
        differently: the record is sealed under an older key (not rotated yet) or was stored
        before encryption was turned on. Without encryption the script's answer stands."""
        if self.cipher is None:
            return False
        async with redis_errors("schedule"):
            raw: Any = await self.redis.get(self.keys.task(task.key))
        if raw is None:
            return False
        try:
            stored = layout.decode(raw)
        except layout.BadRecord:
            return False
        wanted = layout.fp_bytes(task.fingerprint)
        if not is_sealed(stored["headers"]):
            return bool(stored["fp"] == wanted)
        try:
            opened = self.cipher.open_task(task.key, stored["headers"])
        except (UnknownKey, BadCiphertext):
            return False
        return (opened.h12 == wanted
                and stored["fp"] == self.cipher.fingerprint(opened.h12, opened.key_id))

    def schedule_args(self, task: NewTask, request_id: str | None = None
                      ) -> list[str | bytes]:
        """One task's four values in the ARGV of ``lua/schedule.lua``, which takes one task or
        many of a bucket (store/batch.py): key, request id, record, result callbacks."""
        return [task.key, request_id or secrets.token_hex(8), task.record(self.cipher),
                task.results()]

    async def cancel(self, key: str, *, now_ms: int) -> CancelReply:
        """CANCELLED, NOT_FOUND, or FINISHED (already finished). The request id makes a
        redis-py retry of this very call answer CANCELLED again."""
        async with redis_errors("cancel"):
            return CancelReply(int(await self.scripts.cancel(
                keys=[self.keys.prefix(self.keys.bucket_of(key))],
                args=[key, now_ms, self.retention_ms, secrets.token_hex(8), self.attempts_kept],
            )))

    async def replay(self, key: str, *, now_ms: int) -> ReplayReply:
        """REPLAYED (scheduled again), NOT_FOUND, or NOT_FAILED (not failed or cancelled)."""
        bucket = self.keys.bucket_of(key)
        async with redis_errors("replay"):
            reply = ReplayReply(int(await self.scripts.replay(
                keys=[self.keys.prefix(bucket)], args=[key, now_ms, secrets.token_hex(8)])))
        if reply is ReplayReply.REPLAYED:
            self.due_soon(bucket, now_ms)
        return reply

    async def reschedule(self, key: str, *, due_ms: int, max_attempts: int | None,
                         now_ms: int) -> RescheduleReply:
        """Move a task that has not finished to ``due_ms``, keeping its request: RESCHEDULED,
        NOT_FOUND, FINISHED or TOO_FEW_ATTEMPTS (``max_attempts`` is not more
        than the attempts made; nothing written). The request id makes a redis-py retry of
        this very call answer RESCHEDULED again."""
        bucket = self.keys.bucket_of(key)
        async with redis_errors("reschedule"):
            reply = RescheduleReply(int(await self.scripts.reschedule(
                keys=[self.keys.prefix(bucket)],
                args=[key, now_ms, secrets.token_hex(8), due_ms,
                      "" if max_attempts is None else max_attempts])))
        if reply is RescheduleReply.RESCHEDULED:
            self.due_soon(bucket, due_ms)
        return reply

    async def get(self, key: str) -> TaskRecord | None:
        """The task, headers and body included; None: no such task."""
        return (await self.views(self.keys.bucket_of(key), [key]))[0]

    async def views(self, bucket: int, keys: Sequence[str], *,
                    request_budget: int | None = None) -> list[TaskRecord | None]:
        """Tasks of one bucket (None: no such task), read by lua/view.lua. With
        ``request_budget``, headers and bodies are read only while their bytes fit in it (the
        first task's always): a later task's come back as None."""
        if not keys:
            return []
        budget = "" if request_budget is None else request_budget
        async with redis_errors("view"):
            reply: list[Any] = await self.view_script(keys=[self.keys.prefix(bucket)],
                                                      args=[budget, *keys])
        out: list[TaskRecord | None] = []
        for i, key in enumerate(keys):
            prefix, last_err, request, results = reply[4 * i:4 * i + 4]
            if not prefix:
                out.append(None)
                continue
            if prefix == b"v1":
                raise StoreUnavailable(f"task {key!r} still has a record of the v1 layout: "
                                       "restart a timewheel process to migrate it")
            try:
                out.append(record_from_reply(key, prefix, last_err, request, results,
                                             self.cipher))
            except layout.BadRecord as exc:
                raise StoreUnavailable(f"task {key!r} has an undecodable record: {exc}") from exc
        return out

    async def attempts(self, key: str) -> list[AttemptRecord] | None:
        """The task's kept attempts, oldest first; None when there is no such task."""
        bucket = self.keys.bucket_of(key)
        pipe: Any = self.redis.pipeline(transaction=False)
        pipe.exists(self.keys.task(key))
        pipe.lrange(self.keys.attempts(bucket, key), 0, -1)
        async with redis_errors("attempts"):
            exists, rows = await pipe.execute()
        if not exists:
            return None
        return [AttemptRecord.decode(row, key=key, cipher=self.cipher) for row in rows]

    async def record(self, key: str) -> dict[str, Any] | None:
        """The whole stored record of a task, decoded (layout.decode): for tests and
        inspection, never the hot path."""
        async with redis_errors("record"):
            raw: Any = await self.redis.get(self.keys.task(key))
        return None if raw is None else layout.decode(raw)


def _nobody_listens(bucket: int, due_ms: int) -> None:
    """Store.due_soon while no ticker listens (the API alone, tests, scripts)."""
