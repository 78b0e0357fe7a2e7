"""ScheduleStore: recurring schedules in Redis, spread over the wheel's buckets like tasks.

A schedule lives in the bucket of its id (``crc32(id) % buckets``), so every script touches one
hash slot. Under that bucket's prefix P (the ``lua/sched_*.lua`` scripts derive these from P):

    P s:<id>    hash   the schedule: spec (JSON), paused, ver, next, hi, created (+ state, op)
    P sdue      zset   id -> next occurrence ms (live, unpaused schedules only)
    P sids      zset   ids, score 0: the listing, in id order
    P socc      zset   "<id> <occ ms>" -> when to look at it again (its outstanding occurrences)
    P soccl     zset   the same members, score 0: a schedule's outstanding ones by prefix

An occurrence's task is an ordinary task with key ``<id>.<occ ms>``, in its own bucket, created
through ``Store.schedule`` like any POST /tasks. docs/design.md ("Recurring schedules") gives
the exactly-once argument.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from redis.commands.core import AsyncScript

from timewheel.domain import TaskStatus
from timewheel.errors import RecordUnreadable
from timewheel.logs import LogOnce
from timewheel.store.batch import get_many
from timewheel.store.encryption import BadCiphertext, UnknownKey, spec_text
from timewheel.store.record import NewTask
from timewheel.store.redis_errors import redis_errors
from timewheel.store.replies import (
    SchedDeleteReply,
    SchedPauseReply,
    SchedPutReply,
    SchedReserveReply,
    SchedResumeReply,
    SchedTombstoneReply,
)
from timewheel.store.task_store import Store

log = logging.getLogger(__name__)

SCRIPTS = ("sched_put", "sched_reserve", "sched_drop", "sched_pause", "sched_resume",
           "sched_delete", "sched_tombstone", "sched_due", "sched_checks")
# The fingerprint of a tombstone: real ones are 64 hex digits, so a create never matches it.
TOMBSTONE_FP = "tombstone"
# Where a tombstone of a schedule that is long gone would call, if someone replayed it.
_NOWHERE = "http://tombstone.invalid/"
_RECORD_FIELDS = ("spec", "paused", "ver", "next", "hi", "created", "state")
_CAS_TRIES = 10
# When a schedule fires next, strictly after a given ms: (spec, after_ms) -> ms or None. The
# engine computes it (timewheel.engine.occurrences); the store only stores the answer.
NextAfter = Callable[[dict[str, Any], int], "int | None"]
# A task template (the client's JSON) as the task it stands for, validated and prepared: given
# by the service (timewheel/operations/prepare.py ``template_task``), since validating a
# request is not the store's business. Raises ValueError when the template does not validate.
TemplateTask = Callable[[dict[str, Any]], NewTask]


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A stored schedule, as the API shows it and the materializer reads it."""

    id: str
    spec: dict[str, Any]  # {cron, every, timezone, task}: the task as its template
    paused: bool
    version: str
    next_ms: int | None
    hi_ms: int | None  # the latest occurrence reserved (materialized)
    created_ms: int


@dataclass(frozen=True, slots=True)
class Due:
    """A schedule whose next occurrence is due, as read (the compare-and-set's expectations)."""

    id: str
    version: str
    next_raw: str

    @property
    def next_ms(self) -> int:
        return int(self.next_raw)


@dataclass(frozen=True, slots=True)
class Reservation:
    id: str
    version: str
    expected_next: str
    new_next: int | None
    occurrences: tuple[int, ...]


def spec_json(spec: dict[str, Any]) -> str:
    """The stored form of a schedule, ``{cron, every, timezone, task}`` with the task only with
    the fields the client set (operations/schedules.py ``spec_of``), so an occurrence's task is
    validated (and fingerprinted) exactly as the POST it stands for."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def occurrence_key(schedule_id: str, occ_ms: int) -> str:
    return f"{schedule_id}.{occ_ms}"


def occurrence_task(schedule_id: str, occ_ms: int, base: NewTask) -> NewTask:
    """The task of one occurrence: the prepared template (``TemplateTask``) with execute_at =
    the occurrence. Every process builds the same record and fingerprint for it, so a second
    create of the same occurrence answers EXISTS."""
    fingerprint = hashlib.sha256(f"{base.fingerprint}:{occ_ms}".encode()).hexdigest()
    return replace(base, key=occurrence_key(schedule_id, occ_ms), due_ms=occ_ms,
                   fingerprint=fingerprint)


def _member(schedule_id: str, occ_ms: int) -> str:
    return f"{schedule_id} {occ_ms}"


def _int(value: bytes | None) -> int | None:
    return int(value) if value else None


class ScheduleStore:
    """Every read and write of schedules; the scripts' reply codes become values here."""

    def __init__(self, store: Store, *, template_task: TemplateTask,
                 keep_deleted_ms: int = 3_600_000, concurrency: int = 32) -> None:
        self.store = store
        self.redis = store.redis
        self.template_task = template_task
        self.keep_deleted_ms = keep_deleted_ms
        self._limit = asyncio.Semaphore(concurrency)
        self._unreadable = LogOnce()  # specs (and listed records) logged as unreadable
        # Told (bucket, next_ms) when a put or a resume sets a schedule's next occurrence: a
        # process's materializer listens (Materializer.materialize_soon), as Store.due_soon.
        self.next_soon: Callable[[int, int], None] = _nobody_listens
        self.scripts: dict[str, AsyncScript] = {
            name: store.scripts.register(name) for name in SCRIPTS}  # acknowledged: see there

    def bucket_of(self, schedule_id: str) -> int:
        return self.store.keys.bucket_of(schedule_id)

    def prefix(self, bucket: int) -> str:
        return self.store.keys.prefix(bucket)

    @property
    def buckets(self) -> int:
        return self.store.keys.buckets

    @property
    def _pass_key(self) -> str:
        return f"{self.store.keys.key_prefix}:sched:pass"

    async def last_pass(self) -> int | None:
        """The time of the last materializer pass (any process's), or None; ``mark_pass``
        without the mark."""
        async with redis_errors("read last pass"):
            last: Any = await self.redis.get(self._pass_key)
        return int(last) if last is not None else None

    async def mark_pass(self, now_ms: int) -> int | None:
        """Record a materializer pass at ``now_ms``; returns the previous pass's time (any
        process's), or None. The key expires a day after the last pass."""
        async with redis_errors("mark pass"):
            previous: Any = await self.redis.set(self._pass_key, now_ms, px=86_400_000,
                                                 get=True)
        return int(previous) if previous is not None else None

    async def _run(self, name: str, bucket: int, args: Sequence[str | int | bytes]) -> Any:
        async with redis_errors(name):
            return await self.scripts[name](keys=[self.prefix(bucket)], args=list(args))

    async def _bounded(self, calls: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
        async def one(call: Callable[[], Awaitable[Any]]) -> Any:
            async with self._limit:
                return await call()
        return list(await asyncio.gather(*(one(c) for c in calls)))

    # -- the API's operations -----------------------------------------------------------------

    def _sealed_spec(self, schedule_id: str, text: str) -> str | bytes:
        """The spec as stored: sealed with TIMEWHEEL_ENCRYPTION_KEYS (store/encryption.py)."""
        cipher = self.store.cipher
        return text if cipher is None else cipher.seal_schedule(schedule_id, text)

    def _spec_text(self, schedule_id: str, raw: bytes) -> str:
        """The spec JSON of a stored spec, opened when sealed. Raises UnknownKey or
        BadCiphertext."""
        return spec_text(self.store.cipher, raw,
                         lambda cipher, blob: cipher.open_schedule(schedule_id, blob))

    def _readable_spec(self, schedule_id: str, raw: bytes) -> str | None:
        """``_spec_text``, or None (logged once per stored spec) when it cannot be opened."""
        try:
            return self._spec_text(schedule_id, raw)
        except (UnknownKey, BadCiphertext) as exc:
            if self._unreadable.first(hash(raw)):  # a spec may be a MiB: not kept whole
                log.error("schedule %s cannot be read, so it makes no occurrences: %s",
                          schedule_id, exc)
            return None

    async def get(self, schedule_id: str) -> ScheduleRecord | None:
        key = f"{self.prefix(self.bucket_of(schedule_id))}s:{schedule_id}"
        async with redis_errors("schedule get"):
            values: list[Any] = await self.redis.hmget(key, list(_RECORD_FIELDS))
        row = dict(zip(_RECORD_FIELDS, values, strict=True))
        if row["ver"] is None or row["state"] == b"deleted":
            return None
        try:
            text = self._spec_text(schedule_id, row["spec"])
        except (UnknownKey, BadCiphertext) as exc:
            raise RecordUnreadable(f"schedule {schedule_id!r}: {exc}") from exc
        return ScheduleRecord(
            id=schedule_id, spec=json.loads(text), paused=row["paused"] == b"1",
            version=row["ver"].decode(), next_ms=_int(row["next"]), hi_ms=_int(row["hi"]),
            created_ms=int(row["created"]))

    async def _hi(self, schedule_id: str) -> tuple[str, int | None]:
        """(version, hi) as the put and resume scripts will compare them ("" for no record)."""
        key = f"{self.prefix(self.bucket_of(schedule_id))}s:{schedule_id}"
        async with redis_errors("schedule read"):
            row: list[Any] = await self.redis.hmget(key, ["ver", "state", "hi"])
        ver, state, hi = row
        live = ver is not None and state != b"deleted"
        return (ver.decode() if live else ""), _int(hi)

    async def put(self, schedule_id: str, spec: dict[str, Any], *, paused: bool, now_ms: int,
                  next_after: NextAfter) -> tuple[SchedPutReply, list[int]]:
        """Create or replace (``spec``: see ``spec_json``). Returns (CREATED or REPLACED,
        outstanding occurrences that the caller must cancel: see ``cancel_occurrences``). The
        next occurrence comes after now and after every occurrence reserved before (``hi``),
        so no occurrence key is used twice."""
        text = spec_json(spec)
        request_id = secrets.token_hex(8)
        for _ in range(_CAS_TRIES):
            version, hi = await self._hi(schedule_id)
            nxt = None if paused else next_after(json.loads(text), max(now_ms, hi or 0))
            reply = await self._run("sched_put", self.bucket_of(schedule_id), [
                schedule_id, version, self._sealed_spec(schedule_id, text),
                "1" if paused else "0",
                "" if nxt is None else nxt, now_ms, request_id])
            code = SchedPutReply(int(reply[0]))
            if code is not SchedPutReply.STALE:
                if nxt is not None:
                    self.next_soon(self.bucket_of(schedule_id), nxt)
                return code, [int(x) for x in reply[1:]]
        raise RuntimeError(f"schedule {schedule_id!r} kept changing while being written")

    async def pause(self, schedule_id: str) -> list[int] | None:
        """Outstanding occurrences to cancel, or None if there is no such schedule."""
        reply = await self._run("sched_pause", self.bucket_of(schedule_id), [schedule_id])
        if SchedPauseReply(int(reply[0])) is SchedPauseReply.NOT_FOUND:
            return None
        return [int(x) for x in reply[1:]]

    async def resume(self, schedule_id: str, *, now_ms: int, next_after: NextAfter) -> bool:
        """Materialize again from the next occurrence after now (no backlog). False: no such
        schedule. Resuming a running schedule changes nothing."""
        for _ in range(_CAS_TRIES):
            record = await self.get(schedule_id)
            if record is None:
                return False
            nxt = next_after(record.spec, max(now_ms, record.hi_ms or 0))
            code = SchedResumeReply(int(await self._run(
                "sched_resume", self.bucket_of(schedule_id),
                [schedule_id, record.version, "" if nxt is None else nxt])))
            if code is SchedResumeReply.RESUMED and nxt is not None:
                self.next_soon(self.bucket_of(schedule_id), nxt)
            if code is not SchedResumeReply.STALE:
                return code is not SchedResumeReply.NOT_FOUND
        raise RuntimeError(f"schedule {schedule_id!r} kept changing while being resumed")

    async def delete(self, schedule_id: str) -> tuple[list[int], dict[str, Any] | None] | None:
        """(outstanding occurrences to cancel, the task template), or None if there is no such
        schedule."""
        bucket = self.bucket_of(schedule_id)
        key = f"{self.prefix(bucket)}s:{schedule_id}"
        async with redis_errors("schedule read"):
            raw: Any = await self.redis.hget(key, "spec")
        reply = await self._run("sched_delete", bucket,
                                [schedule_id, secrets.token_hex(8), self.keep_deleted_ms])
        if SchedDeleteReply(int(reply[0])) is SchedDeleteReply.NOT_FOUND:
            return None
        text = self._readable_spec(schedule_id, raw) if raw else None
        return [int(x) for x in reply[1:]], (json.loads(text)["task"] if text else None)

    async def page(self, limit: int, cursor: str | None
                   ) -> tuple[list[ScheduleRecord], str | None]:
        """Schedules in id order after ``cursor`` (the last id of the previous page)."""
        low = f"({cursor}" if cursor else "-"

        async def ids_of(bucket: int) -> list[str]:
            async with redis_errors("schedule list"):
                ids: list[Any] = await self.redis.zrangebylex(
                    f"{self.prefix(bucket)}sids", low, "+", start=0, num=limit + 1)
            return [i.decode() for i in ids]

        pages = await asyncio.gather(*(ids_of(b) for b in range(self.buckets)))
        ids = list(heapq.merge(*pages))[:limit + 1]
        records = await self._bounded([partial(self._listed, i) for i in ids[:limit]])
        more = len(ids) > limit
        return [r for r in records if r is not None], (ids[limit - 1] if more else None)

    async def _listed(self, schedule_id: str) -> ScheduleRecord | None:
        """A listed schedule, or None for one no listed key opens: left out of the listing
        (logged once) rather than failing it, as topics are; GET /schedules/{id} says why."""
        try:
            return await self.get(schedule_id)
        except RecordUnreadable as exc:
            if self._unreadable.first(str(exc)):
                log.warning("schedule left out of the listing: %s", exc)
            return None

    # -- occurrences --------------------------------------------------------------------------

    async def cancel_occurrences(self, schedule_id: str, occurrences: Sequence[int],
                                 template: dict[str, Any] | None, *, now_ms: int) -> None:
        """Make sure none of these occurrences starts: cancel its task, or, when the task does
        not exist yet (reserved, not created), write a cancelled record in its place so that
        the late create answers CONFLICT. Then forget them."""
        base = self.template_task(template or {"callback_url": _NOWHERE})

        async def one(occ: int) -> None:
            task = occurrence_task(schedule_id, occ, base)
            if not await self.tombstone(task, now_ms=now_ms):
                await self.store.cancel(task.key, now_ms=now_ms)  # any answer will do

        await self._bounded([partial(one, o) for o in occurrences])
        await self.drop(self.bucket_of(schedule_id),
                        [_member(schedule_id, occ) for occ in occurrences])

    async def tombstone(self, task: NewTask, *, now_ms: int) -> bool:
        """True: written (the task did not exist); False: the task exists."""
        keys = self.store.keys
        reply = await self._run("sched_tombstone", keys.bucket_of(task.key), [
            task.key, now_ms, self.store.retention_ms, TOMBSTONE_FP,
            *task.fields(self.store.cipher)])
        return SchedTombstoneReply(int(reply)) is SchedTombstoneReply.WRITTEN

    async def drop(self, bucket: int, members: Sequence[str]) -> None:
        if members:
            await self._run("sched_drop", bucket, members)

    async def due(self, bucket: int, *, until_ms: int, limit: int, from_ms: int | None = None
                  ) -> tuple[bool, list[Due]]:
        """(full, schedules due by ``until_ms``, and from ``from_ms`` when given): call again
        while full (after reserving)."""
        args = [until_ms, limit] if from_ms is None else [until_ms, limit, from_ms]
        reply = await self._run("sched_due", bucket, args)
        rows = reply[1:]
        found = [Due(rows[i].decode(), rows[i + 1].decode(), rows[i + 2].decode())
                 for i in range(0, len(rows), 3)]
        return int(reply[0]) >= limit, found

    async def specs(self, bucket: int, ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        """id -> (version, spec JSON) of live schedules."""
        prefix = self.prefix(bucket)
        async with redis_errors("schedule specs"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for i in ids:
                    pipe.hmget(f"{prefix}s:{i}", ["ver", "spec"])
                rows: list[Any] = await pipe.execute()
        out = {}
        for i, (v, s) in zip(ids, rows, strict=True):
            text = None if v is None or s is None else self._readable_spec(i, s)
            if text is not None:
                out[i] = (v.decode(), text)
        return out

    async def reserve(self, bucket: int, reservations: Sequence[Reservation], *, now_ms: int,
                      lease_ms: int) -> list[bool]:
        """Compare-and-set each reservation (see lua/sched_reserve.lua); True = reserved."""
        if not reservations:
            return []
        args: list[str | int] = [now_ms, lease_ms]
        for r in reservations:
            args += [r.id, r.version, r.expected_next, "" if r.new_next is None else r.new_next,
                     len(r.occurrences), *r.occurrences]
        reply = await self._run("sched_reserve", bucket, args)
        return [SchedReserveReply(int(x)) is SchedReserveReply.RESERVED for x in reply]

    async def settle(self, bucket: int, entries: Sequence[tuple[str, int, int]]) -> None:
        """Look at (id, occ) again at the given ms, if it is still outstanding (XX: an entry
        dropped by a pause or delete meanwhile stays dropped)."""
        if not entries:
            return
        mapping = {_member(i, occ): at for i, occ, at in entries}
        async with redis_errors("schedule settle"):
            await self.redis.zadd(f"{self.prefix(bucket)}socc", mapping, xx=True)

    async def task_statuses(self, keys: Sequence[str]) -> list[TaskStatus | None]:
        """The status of each task (None: no such task), read in one pipeline through the
        task store's own reader (the record's layout is its business)."""
        views = await get_many(self.store, keys)
        return [None if view is None else view.status for view in views]

    async def checks(self, bucket: int, *, now_ms: int, limit: int
                     ) -> tuple[bool, list[tuple[str, int, str]]]:
        """(full, [(id, occ, schedule state "active"|"paused"|"gone")]) due for a look."""
        reply = await self._run("sched_checks", bucket, [now_ms, limit])
        rows = reply[1:]
        found = []
        for i in range(0, len(rows), 2):
            schedule_id, _, occ = rows[i].decode().rpartition(" ")
            found.append((schedule_id, int(occ), rows[i + 1].decode()))
        return int(reply[0]) >= limit, found


def _nobody_listens(bucket: int, next_ms: int) -> None:
    """ScheduleStore.next_soon while no materializer listens."""
