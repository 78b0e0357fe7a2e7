"""Store: every read and write of the wheel's state, one atomic Lua script per mutation.

Methods take ``now_ms`` from the caller's clock (the scripts never read the time themselves),
and translate Redis failures into ``StoreUnavailable``, keeping the cause.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from timewheel.errors import StoreUnavailable, WheelMismatch
from timewheel.store import attempts, layout
from timewheel.store.attempts import AttemptRecord
from timewheel.store.encryption import BadCiphertext, Cipher, UnknownKey, is_sealed
from timewheel.store.keys import DEFAULT_BUCKETS, Keyspace
from timewheel.store.migrate import migrate_v1
from timewheel.store.record import (
    NOT_STARTED,
    ClaimedTask,
    NewTask,
    Started,
    TaskRecord,
    claimed_task,
    decode_results,
    open_request,
    record_from_reply,
)
from timewheel.store.redis_errors import redis_errors
from timewheel.store.redis_settings import warn_about_settings
from timewheel.store.replies import (
    CancelReply,
    CompleteReply,
    ParkReply,
    ReleaseReply,
    ReplayReply,
    RescheduleReply,
    ScheduleReply,
)
from timewheel.store.results import ResultCallback
from timewheel.store.scripts import Scripts, source

log = logging.getLogger(__name__)

DEFAULT_ATTEMPTS_KEPT = 20


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
    history: str = ""  # the attempt's history entry (attempts.entry); "" writes a bare one
    result: ResultCallback | None = None  # what a finished task's result callback reports


def _no_history(o: Outcome) -> str:
    """The entry of an outcome decided without an attempt on the wire (a record set aside)."""
    return attempts.entry(attempt=0, started_ms=o.started_ms, duration_ms=0, verdict=o.kind,
                          status_code=o.status_code, error=o.error, headers=None, body=None,
                          body_truncated=False, next_attempt_ms=o.next_due_ms, process="")



class Store:
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

    async def init(self) -> None:
        """Read (or fix, the first time) the wheel's bucket count, migrate what layout 1 left
        (store/migrate.py), warn about eviction and memory-costly settings
        (store/redis_settings.py). Raises WheelMismatch if the configured count is not the one
        the wheel has. A process calls it before it claims or serves anything
        (again after a start-up without Redis, until it succeeds)."""
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
        await migrate_v1(self.redis, self.keys)
        self.ready = True
        await warn_about_settings(self.redis)

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
        async with redis_errors("schedule"):
            reply = ScheduleReply(int(await self.scripts.schedule(
                keys=[self.keys.prefix(self.keys.bucket_of(task.key))],
                args=self.schedule_args(task, replace=replace, now_ms=now_ms))))
        if reply is ScheduleReply.CONFLICT and await self.same_request(task):
            return ScheduleReply.EXISTS
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

    def schedule_args(self, task: NewTask, *, replace: bool, now_ms: int,
                      request_id: str | None = None) -> list[str | bytes | int]:
        """ARGV of ``lua/schedule.lua`` for one task (also used by batched creates)."""
        args: list[str | bytes | int] = [task.key, "replace" if replace else "create", now_ms,
                                         request_id or secrets.token_hex(8),
                                         task.record(self.cipher)]
        results = task.results()
        if results:  # lua/schedule.lua ARGV[6]; absent for the many tasks without any
            args.append(results)
        return args

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
        async with redis_errors("replay"):
            return ReplayReply(int(await self.scripts.replay(
                keys=[self.keys.prefix(self.keys.bucket_of(key))],
                args=[key, now_ms, secrets.token_hex(8)])))

    async def reschedule(self, key: str, *, due_ms: int, max_attempts: int | None,
                         now_ms: int) -> RescheduleReply:
        """Move a task that has not finished to ``due_ms``, keeping its request: RESCHEDULED,
        NOT_FOUND, FINISHED or TOO_FEW_ATTEMPTS (``max_attempts`` is not more
        than the attempts made; nothing written). The request id makes a redis-py retry of
        this very call answer RESCHEDULED again."""
        async with redis_errors("reschedule"):
            return RescheduleReply(int(await self.scripts.reschedule(
                keys=[self.keys.prefix(self.keys.bucket_of(key))],
                args=[key, now_ms, secrets.token_hex(8), due_ms,
                      "" if max_attempts is None else max_attempts])))

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

    # -- the ticker's and dispatcher's operations ----------------------------------------------

    async def claim(self, bucket: int, *, now_ms: int, horizon_ms: int, limit: int, token: str,
                    max_minutes: int = 1440) -> tuple[bool, list[ClaimedTask]]:
        """Claim up to ``limit`` tasks of one bucket due at or before ``horizon_ms``.
        Returns (more, tasks): call again while ``more``."""
        async with redis_errors("claim"):
            reply = await self.scripts.claim(
                keys=[self.keys.prefix(bucket)],
                args=[now_ms, horizon_ms, limit, token, self.lease_margin_ms, max_minutes,
                      self.retention_ms, self.attempts_kept],
            )
        return await self._claimed(bucket, token, reply, now_ms)

    async def _claimed(self, bucket: int, token: str, reply: list[Any], now_ms: int
                       ) -> tuple[bool, list[ClaimedTask]]:
        """Decode a claim reply (lua/lib/claiming.lua). A record that cannot be decoded is
        failed at once with the reason, instead of holding back the rest of its batch."""
        more, count = int(reply[0]), int(reply[1])
        tasks, bad = [], []
        for i in range(2, 2 + 2 * count, 2):
            key = reply[i].decode(errors="replace")
            try:
                tasks.append(claimed_task(key, bucket, token, reply[i + 1]))
            except layout.BadRecord as exc:
                bad.append(self._set_aside(key, token, exc, now_ms))
        if bad:
            await self.complete(bucket, now_ms=now_ms, outcomes=bad)
        return bool(more), tasks

    @staticmethod
    def _set_aside(key: str, token: str, exc: Exception, now_ms: int) -> Outcome:
        if isinstance(exc, UnknownKey):
            error = f"{exc}: list the key, then replay the task"
        else:
            error = f"undecodable record: {exc}"
        log.error("task %s cannot be sent, failing it: %s", key, error)
        return Outcome(key, token, "fail", error=error[:500], started_ms=now_ms)

    @property
    def starts_span_buckets(self) -> bool:
        """Whether one start call may carry several buckets' claims: on a single Redis, yes;
        on a cluster each bucket is its own slot, and a script's keys must share one."""
        return not isinstance(self.redis, RedisCluster)

    async def start(self, bucket: int, *, now_ms: int,
                    claims: Sequence[tuple[str, str]]) -> list[Started]:
        """Begin attempts for (key, token) pairs of one bucket: see ``start_many``."""
        return await self.start_many([(bucket, key, token) for key, token in claims],
                                     now_ms=now_ms)

    async def start_many(self, claims: Sequence[tuple[int, str, str]], *,
                         now_ms: int) -> list[Started]:
        """Begin attempts for (bucket, key, token) claims, in one call (several buckets only
        where ``starts_span_buckets``): for each, the attempt number with the headers and body
        to send (opened here when sealed: once per attempt), or NOT_STARTED (do not send). A
        record whose headers cannot be decoded, or that is sealed under a key id
        TIMEWHEEL_ENCRYPTION_KEYS does not list, is failed at once with the reason as its
        last_error (a dead letter, replayable once the key is listed), like an undecodable
        one at claim time."""
        by_bucket: dict[int, list[int]] = {}  # bucket -> indexes into claims, in order
        for i, (bucket, _, _) in enumerate(claims):
            by_bucket.setdefault(bucket, []).append(i)
        order = [i for indexes in by_bucket.values() for i in indexes]
        args: list[str | int] = [len(by_bucket), *(len(ix) for ix in by_bucket.values())]
        for i in order:
            args += claims[i][1:]
        async with redis_errors("start"):
            reply = await self.scripts.start(
                keys=[self.keys.prefix(bucket) for bucket in by_bucket], args=args)
        out: list[Started] = [NOT_STARTED] * len(claims)
        bad: dict[int, list[Outcome]] = {}
        for j, i in enumerate(order):
            bucket, key, token = claims[i]
            attempt, headers, body, results = reply[4 * j:4 * j + 4]
            if not int(attempt):
                continue
            try:
                out[i] = Started(int(attempt), *open_request(key, headers, body, self.cipher),
                                 *decode_results(results))
            except (layout.BadRecord, UnicodeDecodeError, UnknownKey, BadCiphertext) as exc:
                bad.setdefault(bucket, []).append(self._set_aside(key, token, exc, now_ms))
        for bucket, outcomes in bad.items():
            await self.complete(bucket, now_ms=now_ms, outcomes=outcomes)
        return out

    async def complete(self, bucket: int, *, now_ms: int,
                       outcomes: Sequence[Outcome]) -> list[CompleteReply]:
        """Record outcomes of one bucket: see ``complete_many``."""
        return await self.complete_many([(bucket, o) for o in outcomes], now_ms=now_ms)

    async def complete_many(self, outcomes: Sequence[tuple[int, Outcome]], *,
                            now_ms: int) -> list[CompleteReply]:
        """Record (bucket, outcome) pairs with their history entries, in one call (several
        buckets only where ``starts_span_buckets``): RECORDED, STALE (the claim was no longer
        ours: nothing written) or CANCELLED_IN_FLIGHT (only the history entry) each. An
        outcome that finishes its task with a ``result`` creates its result task in the same
        call (lua/complete.lua)."""
        by_bucket: dict[int, list[int]] = {}  # bucket -> indexes into outcomes, in order
        for i, (bucket, _) in enumerate(outcomes):
            by_bucket.setdefault(bucket, []).append(i)
        order = [i for indexes in by_bucket.values() for i in indexes]
        args: list[str | bytes | int] = [now_ms, self.retention_ms, self.attempts_kept,
                                         len(by_bucket),
                                         *(len(ix) for ix in by_bucket.values())]
        for i in order:
            o = outcomes[i][1]
            args += [o.key, o.token, o.kind, "" if o.status_code is None else o.status_code,
                     o.error or "", "" if o.next_due_ms is None else o.next_due_ms,
                     o.started_ms, o.history or _no_history(o),
                     # made at the script's now: its finished_at is the parent's
                     b"" if o.result is None else o.result.task(o.key, now_ms).record(self.cipher)]
        async with redis_errors("complete"):
            reply = await self.scripts.complete(
                keys=[self.keys.prefix(bucket) for bucket in by_bucket], args=args)
        out: list[CompleteReply] = [CompleteReply.STALE] * len(outcomes)
        for j, i in enumerate(order):
            out[i] = CompleteReply(int(reply[j]))
        return out

    async def release(self, bucket: int, claims: Sequence[tuple[str, str]]
                      ) -> list[ReleaseReply]:
        """Hand back claims whose attempt this process did not send (started or not):
        HANDED_BACK, STALE (not ours any more) or CANCELLED (meanwhile) each."""
        async with redis_errors("release"):
            reply = await self.scripts.release(
                keys=[self.keys.prefix(bucket)],
                args=[self.attempts_kept, *(part for claim in claims for part in claim)])
        return [ReleaseReply(int(x)) for x in reply]

    # -- flow control: tasks waiting for a permit (lua/park.lua, lua/unpark.lua) ---------------

    async def park(self, bucket: int, claims: Sequence[tuple[str, str]]) -> list[ParkReply]:
        """Set claimed, unstarted tasks aside until their flow has room: PARKED or STALE
        (not ours any more) each."""
        async with redis_errors("park"):
            reply = await self.scripts.park(
                keys=[self.keys.prefix(bucket)],
                args=[part for claim in claims for part in claim])
        return [ParkReply(int(x)) for x in reply]

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

