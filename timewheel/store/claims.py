"""ClaimSide: the Store's methods for the ticker and the dispatcher (claim, start, complete,
release, and parking tasks that wait for their flow's permits), each a call of one script
(lua/claim.lua, start.lua, complete.lua, release.lua, park.lua, unpark.lua). ``Store``
(store/task_store.py) takes them in as a base class, so its callers see one object; what the
API's operations call stays there.

Methods take ``now_ms`` from the caller's clock and translate Redis failures into
``StoreUnavailable``, keeping the cause.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import TimeoutError as RedisTimeoutError

from timewheel.store import attempts, layout
from timewheel.store.encryption import BadCiphertext, Cipher, UnknownKey
from timewheel.store.keys import Keyspace
from timewheel.store.record import (
    NOT_STARTED,
    ClaimedTask,
    Started,
    claimed_task,
    decode_results,
    open_request,
    unsendable_reason,
)
from timewheel.store.redis_errors import redis_errors
from timewheel.store.replies import CompleteReply, ParkReply, ReleaseReply
from timewheel.store.results import ResultCallback
from timewheel.store.scripts import Scripts

log = logging.getLogger(__name__)

# A claim or unpark call whose reply was lost (a timeout: it may have run) is sent again as it
# was, same token and same now: lua/claim.lua and unpark.lua then hand back what the token
# took, under the lease it set, which is what the caller's ``now_ms`` tells the dispatcher.
# The single-Redis client does not re-send a timed-out command (store/connection.py: a silent
# Redis is a 503 after one timeout); left unsent, those tasks would wait out their lease,
# leased to nobody.
_CLAIM_RESENT = Retry(NoBackoff(), retries=2, supported_errors=(RedisTimeoutError,))


async def _resend(error: Exception) -> None:
    # DEBUG: a silent Redis times out every call, and the ticker logs its outage once.
    log.debug("claim or unpark: %s; sending the same call again", error)


class Outcome(NamedTuple):
    """The result of one attempt, for ``Store.complete``. (A named tuple: one is made per
    attempt, 0.36 us against 2.5 for a frozen dataclass.)"""

    key: str
    token: str
    kind: Literal["ok", "retry", "fail"]
    status_code: int | None = None
    error: str | None = None
    next_due_ms: int | None = None
    started_ms: int = 0
    history: str = ""  # the attempt's history entry (attempts.entry); "" writes a bare one
    result: ResultCallback | None = None  # what a finished task's result callback reports
    # A "fail" because the attempts ran out (the answer alone would have been retried): a
    # PATCH that raised max_attempts meanwhile undoes it (lua/complete.lua "spent").
    spent: bool = False


def _no_history(o: Outcome) -> str:
    """The entry of an outcome decided without an attempt on the wire (a record set aside)."""
    return attempts.entry(attempt=0, started_ms=o.started_ms, duration_ms=0, verdict=o.kind,
                          status_code=o.status_code, error=o.error, headers=None, body=None,
                          body_truncated=False, next_attempt_ms=o.next_due_ms, process="")


class ClaimSide:
    """Set by ``Store.__init__``: the connection, key names, scripts, the cipher of
    TIMEWHEEL_ENCRYPTION_KEYS, and the settings these scripts take."""

    redis: Redis | RedisCluster
    keys: Keyspace
    scripts: Scripts
    cipher: Cipher | None
    retention_ms: int
    lease_margin_ms: int
    attempts_kept: int
    due_soon: Callable[[int, int], None]  # (bucket, due_ms) of a task just made due

    async def claim(self, bucket: int, *, now_ms: int, horizon_ms: int, limit: int, token: str,
                    max_minutes: int = 1440) -> tuple[bool, list[ClaimedTask]]:
        """Claim up to ``limit`` tasks of one bucket due at or before ``horizon_ms``.
        Returns (more, tasks): call again while ``more``."""
        async with redis_errors("claim"):
            reply = await self._tokened_call(
                self.scripts.claim, bucket,
                [now_ms, horizon_ms, limit, token, self.lease_margin_ms, max_minutes,
                 self.retention_ms, self.attempts_kept])
        return await self._claimed(bucket, token, reply, now_ms)

    async def _tokened_call(self, script: AsyncScript, bucket: int, args: list[Any]
                            ) -> list[Any]:
        """A claim or unpark call, sent again as it was if its reply timed out (above)."""
        async def call() -> list[Any]:
            reply: list[Any] = await script(keys=[self.keys.prefix(bucket)], args=args)
            return reply

        if isinstance(self.redis, RedisCluster):
            return await call()  # its client re-sends a timed-out command itself
        reply: list[Any] = await _CLAIM_RESENT.call_with_retry(call, _resend)
        return reply

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
        error = unsendable_reason(exc)
        log.error("task %s cannot be sent, failing it: %s", key, error)
        return Outcome(key, token, "fail", error=error[:500], started_ms=now_ms)

    @property
    def starts_span_buckets(self) -> bool:
        """Whether one start call may carry several buckets' claims: on a single Redis, yes;
        on a cluster each bucket is its own slot, and a script's keys must share one."""
        return not isinstance(self.redis, RedisCluster)

    async def start(self, bucket: int, *, claims: Sequence[tuple[str, str]]) -> list[Started]:
        """Begin attempts for (key, token) pairs of one bucket: see ``start_many``."""
        return await self.start_many([(bucket, key, token) for key, token in claims])

    async def start_many(self, claims: Sequence[tuple[int, str, str]]) -> list[Started]:
        """Begin attempts for (bucket, key, token) claims, in one call (several buckets only
        where ``starts_span_buckets``): for each, the attempt number with the headers and body
        to send (opened here when sealed: once per attempt), or NOT_STARTED (do not send). A
        record whose headers cannot be decoded, or that is sealed under a key id
        TIMEWHEEL_ENCRYPTION_KEYS does not list, is started with the reason as ``unsendable``:
        the executor fails it at its time, unsent, as an attempt of its own (a dead letter,
        with its on_failure; replayable once the key is listed), unless, for a key id
        (``unknown_key``), another live process lists it: then it is handed back for that
        one (timewheel/engine/dispatcher.py)."""
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
        for j, i in enumerate(order):
            key = claims[i][1]
            attempt, headers, body, results = reply[4 * j:4 * j + 4]
            if not int(attempt):
                continue
            try:
                out[i] = Started(int(attempt), *open_request(key, headers, body, self.cipher),
                                 *decode_results(results))
            except (layout.BadRecord, UnicodeDecodeError, UnknownKey, BadCiphertext) as exc:
                out[i] = Started(int(attempt), [], b"", *decode_results(results),
                                 unsendable=unsendable_reason(exc),
                                 unknown_key=exc.key_id if isinstance(exc, UnknownKey) else None)
        return out

    async def complete(self, bucket: int, *, now_ms: int,
                       outcomes: Sequence[Outcome]) -> list[CompleteReply]:
        """Record outcomes of one bucket: see ``complete_many``."""
        return await self.complete_many([(bucket, o) for o in outcomes], now_ms=now_ms)

    async def complete_many(self, outcomes: Sequence[tuple[int, Outcome]], *,
                            now_ms: int) -> list[CompleteReply]:
        """Record (bucket, outcome) pairs with their history entries, in one call (several
        buckets only where ``starts_span_buckets``): RECORDED, STALE (the claim was no longer
        ours: nothing written), CANCELLED_IN_FLIGHT or MOVED_IN_FLIGHT each. An
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
            args += [o.key, o.token, "spent" if o.spent else o.kind,
                     "" if o.status_code is None else o.status_code,
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
            bucket, o = outcomes[i]
            if out[i] is CompleteReply.RECORDED:
                if o.next_due_ms is not None:  # a retry (its backoff may be under a tick)
                    self.due_soon(bucket, o.next_due_ms)
                elif o.result is not None:  # its result task, due now, in the same bucket
                    self.due_soon(bucket, now_ms)
            elif out[i] is CompleteReply.CANCELLED_IN_FLIGHT and o.result is not None \
                    and o.kind == "ok":  # delivered after all: on_success, due now
                self.due_soon(bucket, now_ms)
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

    async def note_tick(self, process: str, tick_ms: int, *, stale_ms: int) -> dict[str, int]:
        """Note a process's tick; every live process's last tick (this one's included), those
        that have not ticked within ``stale_ms`` dropped (the key goes with the last). Not
        atomic, on one key: a tick noted meanwhile shows at the next call."""
        async with redis_errors("note_tick"):
            pipe: Any = self.redis.pipeline(transaction=False)
            pipe.zadd(self.keys.ticks, {process: tick_ms})
            pipe.zremrangebyscore(self.keys.ticks, "-inf", tick_ms - stale_ms)
            pipe.pexpire(self.keys.ticks, stale_ms)
            pipe.zrange(self.keys.ticks, 0, -1, withscores=True)
            *_, rows = await pipe.execute()
        return {proc.decode(): int(at) for proc, at in rows}

    async def note_key_ids(self, process: str, key_ids: Sequence[str], now_ms: int, *,
                           stale_ms: int) -> dict[str, tuple[str, ...]]:
        """Note a process's encryption key ids (the sealing one first; none: encryption off);
        every process's noted within ``stale_ms`` (this one's included). Older entries are
        dropped, and the key goes once every process is gone."""
        name = self.keys.key_ids
        async with redis_errors("note_key_ids"):
            pipe: Any = self.redis.pipeline(transaction=False)
            pipe.hset(name, process, f"{now_ms} {','.join(key_ids)}")
            pipe.pexpire(name, stale_ms)
            pipe.hgetall(name)
            *_, rows = await pipe.execute()
            live: dict[str, tuple[str, ...]] = {}
            stale: list[bytes] = []
            for proc, value in rows.items():
                noted = _noted_key_ids(value)
                # Dropped too: an entry that does not parse (it would otherwise stay, the hash
                # kept alive by the others), and one noted "later" than a stale period ahead
                # (the wheel's clock stepped back: a gone process's would count for that long).
                if noted is None or not now_ms - stale_ms <= noted[0] <= now_ms + stale_ms:
                    stale.append(proc)
                else:
                    live[proc.decode(errors="replace")] = noted[1]
            if stale:
                await self.redis.hdel(name, *stale)
        return live

    async def forget_key_ids(self, process: str) -> None:
        """Drop a process's entry of ``note_key_ids`` (it stops)."""
        async with redis_errors("forget_key_ids"):
            await self.redis.hdel(self.keys.key_ids, process)

    # -- flow control: tasks waiting for a permit (lua/park.lua, lua/unpark.lua) ---------------

    async def park(self, bucket: int, claims: Sequence[tuple[str, str]]) -> list[ParkReply]:
        """Set claimed, unstarted tasks aside until their flow has room: PARKED or STALE
        (not ours any more) each."""
        async with redis_errors("park"):
            reply = await self.scripts.park(
                keys=[self.keys.prefix(bucket)],
                args=[self.attempts_kept, *(part for claim in claims for part in claim)])
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
            reply = await self._tokened_call(self.scripts.unpark, bucket,
                                             [now_ms, flow, limit, token, self.lease_margin_ms])
        return await self._claimed(bucket, token, reply, now_ms)


def _noted_key_ids(value: bytes) -> tuple[int, tuple[str, ...]] | None:
    """A ``<prefix>:key-ids`` entry, "<ms> <key id>,...", as (ms, key ids); None if it is not
    one (written by hand, or by another program)."""
    at, _, ids = value.decode(errors="replace").partition(" ")
    try:
        return int(at), (tuple(ids.split(",")) if ids else ())
    except ValueError:
        return None

