"""``timewheel keys rotate``: every task record, attempt history entry, schedule and topic spec
not sealed under the first key of TIMEWHEEL_ENCRYPTION_KEYS sealed anew under it (docs/security.md,
"Rotating").

It runs beside the serving processes, in bounded steps: SCAN a few hundred keys, read them,
seal their requests anew in Python (the scripts never see a plaintext they do not store), and
write each back with its own compare-and-set script (lua/rekey.lua, lua/rekey_attempt.lua,
lua/rekey_schedule.lua), which writes only when the record or entry still holds what was read.
A cancel, replace or claim in between is kept: the record is left as it now is (a replace is
sealed under the first key anyway) and counted as ``changed``; run the command again to pick up
what a step skipped.

Records written before encryption was turned on are sealed too, so turning it on for a wheel
with tasks is: set the keys, restart, rotate. Finished records (kept for the retention period,
the dead letters among them) are rotated as well: a replay of one needs its key.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from timewheel.store import layout
from timewheel.store.durability import NONE as NO_REPLICAS
from timewheel.store.durability import Call, Durability, run_acknowledged
from timewheel.store.encryption import (
    BadCiphertext,
    Cipher,
    UnknownKey,
    is_sealed,
    sealed_key_id,
)
from timewheel.store.redis_errors import redis_errors
from timewheel.store.replies import RekeyAttemptReply, RekeyReply, RekeyScheduleReply
from timewheel.store.scripts import source

DEFAULT_STEP = 200  # keys per SCAN step (one GET and at most one script call each)
IN_FLIGHT = 32  # records read at once within a step: 32 MiB at most with 1 MiB bodies
TOMBSTONE_FP = b"tombstone".ljust(12, b"\0")  # store/schedule_store.py TOMBSTONE_FP, stored
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


@dataclass
class RotationReport:
    """What one ``rotate`` run did, counted per record (tasks) and per history entry."""

    tasks_rekeyed: int = 0
    tasks_current: int = 0  # already sealed under the first key
    tasks_changed: int = 0  # changed or gone while the step ran: left as they are
    tasks_unreadable: int = 0  # sealed under a key id not listed (or not verifying)
    attempts_rekeyed: int = 0
    attempts_changed: int = 0
    attempts_unreadable: int = 0  # response bodies sealed under a key id not listed
    schedules_rekeyed: int = 0  # specs (their task templates hold headers and bodies)
    schedules_changed: int = 0
    schedules_unreadable: int = 0
    topics_rekeyed: int = 0  # specs (their endpoints' headers)
    topics_changed: int = 0
    topics_unreadable: int = 0

    def line(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


class Rotation:
    def __init__(self, redis: Redis | RedisCluster, key_prefix: str, cipher: Cipher, *,
                 step: int = DEFAULT_STEP, durability: Durability = NO_REPLICAS) -> None:
        self.redis = redis
        self.cipher = cipher
        self.step = step
        self.durability = durability
        self._written: set[str] = set()  # the prefixes (slots) a rekey script ran in
        self._mark = redis.register_script("return 1")  # a call routed to one of them
        self.report = RotationReport()
        self._prefix = key_prefix
        # "{<prefix>:<bucket>}:t:<key>" and ":a:<key>"; task keys hold no braces.
        self._name = re.compile(r"^\{" + re.escape(key_prefix) + r":(\d+)\}:([tas]):(.+)$")
        self._rekey = redis.register_script(source("rekey"))
        self._rekey_attempt = redis.register_script(source("rekey_attempt"))
        self._rekey_schedule = redis.register_script(source("rekey_schedule"))
        self._in_flight = asyncio.Semaphore(IN_FLIGHT)

    async def run(self, progress: Callable[[RotationReport], None] | None = None
                  ) -> RotationReport:
        """Rotate every task record, every attempt history, every schedule's spec, then every
        topic's; ``progress`` after each step that changed the counts."""
        if progress is not None:
            progress = _when_changed(progress)
        for kind in ("t", "a", "s"):
            batch: list[tuple[str, str, str]] = []
            pattern = f"{{{self._prefix}:*}}:{kind}:*"
            async with redis_errors("rotate"):
                async for raw in self.redis.scan_iter(match=pattern, count=self.step):
                    name = raw.decode() if isinstance(raw, bytes) else str(raw)
                    found = self._name.match(name)
                    if found is None:
                        continue
                    batch.append((name, f"{{{self._prefix}:{found[1]}}}:", found[3]))
                    if len(batch) >= self.step:
                        await self._step(kind, batch, progress)
                        batch = []
            if batch:
                await self._step(kind, batch, progress)
        await self._topics()
        if progress is not None:
            progress(self.report)
        await self._replicated()
        return self.report

    async def _replicated(self) -> None:
        """With TIMEWHEEL_REDIS_WAIT_REPLICAS set, wait until that many replicas of every
        master written to have all of it, as every acknowledged change does: a failover
        right after a rotation must not bring back records sealed under the key the operator
        removes next. Raises NotReplicated (the rotation stands; running it again is safe)."""
        if not self.durability.enabled or not self._written:
            return
        calls = [Call(self._mark, [prefix], []) for prefix in sorted(self._written)]
        async with redis_errors("rotate"):
            await run_acknowledged(self.redis, self.durability, "rotate", calls)

    async def _topics(self) -> None:
        """Every topic's spec: topics are few, in one slot, so one SCAN of it."""
        prefix = f"{{{self._prefix}:topics}}:"
        async with redis_errors("rotate"):
            async for raw in self.redis.scan_iter(match=f"{prefix}tp:*", count=self.step):
                rest = (raw.decode() if isinstance(raw, bytes) else str(raw))[len(prefix):]
                await self._spec("topics", prefix, rest, self.cipher.seal_topic,
                                 self.cipher.open_topic)

    async def _step(self, kind: str, batch: Sequence[tuple[str, str, str]],
                    progress: Callable[[RotationReport], None] | None) -> None:
        one = {"t": self._task, "a": self._history, "s": self._schedule}[kind]

        async def bounded(name: str, prefix: str, key: str) -> None:
            async with self._in_flight:
                await one(name, prefix, key)

        async with redis_errors("rotate"):
            await asyncio.gather(*(bounded(name, prefix, key) for name, prefix, key in batch))
        if progress is not None:
            progress(self.report)

    async def _task(self, name: str, prefix: str, key: str) -> None:
        raw: Any = await self.redis.get(name)
        if raw is None:
            self.report.tasks_changed += 1
            return
        try:
            record = layout.decode(raw)
        except layout.BadRecord:
            self.report.tasks_unreadable += 1
            return
        headers, body, fp = record["headers"], record["body"], record["fp"]
        if is_sealed(headers):
            key_id = sealed_key_id(headers)
            if key_id == self.cipher.key_id:
                self.report.tasks_current += 1
                return
            try:
                opened = self.cipher.open_task(key, headers)
            except (UnknownKey, BadCiphertext):
                self.report.tasks_unreadable += 1
                return
            h12, plain_headers, plain_body = opened.h12, opened.headers, opened.body
            keyed = fp == self.cipher.fingerprint(h12, key_id)
        else:  # stored before encryption was on: its fingerprint is the unkeyed h12
            h12, plain_headers, plain_body = fp, headers, body
            keyed = fp != TOMBSTONE_FP
        new_fp = self.cipher.fingerprint(h12) if keyed else fp  # a tombstone's stays one
        sealed = self.cipher.seal_task(key, h12, plain_headers, plain_body)
        self._written.add(prefix)
        reply = RekeyReply(int(await self._rekey(
            keys=[prefix], args=[key, headers, body, fp, sealed, new_fp])))
        if reply is RekeyReply.REKEYED:
            self.report.tasks_rekeyed += 1
        else:
            self.report.tasks_changed += 1

    async def _history(self, name: str, prefix: str, key: str) -> None:
        rows: list[Any] = await self.redis.lrange(name, 0, -1)
        for row in rows:
            entry = json.loads(row)
            try:
                text = self._body_to_seal(key, entry)
            except (UnknownKey, BadCiphertext):
                self.report.attempts_unreadable += 1  # left as it is; its view shows no body
                continue
            if text is None:
                continue
            entry.pop("b", None)
            entry["bx"] = self.cipher.seal_text(key, int(entry["n"]), text)
            self._written.add(prefix)
            reply = RekeyAttemptReply(int(await self._rekey_attempt(
                keys=[prefix], args=[key, row, _encode(entry)])))
            if reply is RekeyAttemptReply.REKEYED:
                self.report.attempts_rekeyed += 1
            else:
                self.report.attempts_changed += 1

    async def _schedule(self, name: str, prefix: str, schedule_id: str) -> None:
        await self._spec("schedules", prefix, f"s:{schedule_id}", self.cipher.seal_schedule,
                         self.cipher.open_schedule)

    async def _spec(self, kind: str, prefix: str, rest: str,
                    seal: Callable[[str, str], bytes], open_: Callable[[str, bytes], str]
                    ) -> None:
        """A schedule's or topic's ``spec`` field (hash ``prefix + rest``), sealed anew;
        ``kind`` names the report's counters ("schedules", "topics")."""
        raw: Any = await self.redis.hget(prefix + rest, "spec")
        if raw is None:
            return  # a deleted schedule's tombstone, or gone
        ident = rest.partition(":")[2]  # the schedule id or topic name: the seal's AD
        if is_sealed(raw):
            if sealed_key_id(raw) == self.cipher.key_id:
                return
            try:
                text = open_(ident, raw)
            except (UnknownKey, BadCiphertext):
                self._count(kind, "unreadable")
                return
        else:
            text = raw.decode()
        self._written.add(prefix)
        reply = RekeyScheduleReply(int(await self._rekey_schedule(
            keys=[prefix], args=[rest, raw, seal(ident, text)])))
        self._count(kind, "rekeyed" if reply is RekeyScheduleReply.REKEYED else "changed")

    def _count(self, kind: str, what: str) -> None:
        name = f"{kind}_{what}"
        setattr(self.report, name, getattr(self.report, name) + 1)

    def _body_to_seal(self, key: str, entry: dict[str, Any]) -> str | None:
        """The entry's response body when it is not sealed under the first key; else None.
        UnknownKey or BadCiphertext: sealed under a key id not listed, or not verifying."""
        if "b" in entry:
            return str(entry["b"])
        sealed = entry.get("bx")
        if sealed is None:
            return None
        try:
            attempt = int(entry["n"])
            if sealed_key_id(base64.b64decode(sealed)) == self.cipher.key_id:
                return None
        except (KeyError, TypeError, ValueError):
            return None  # not an entry or a seal as written: left as it is; no body shown
        return self.cipher.open_text(key, attempt, sealed)


def _when_changed(progress: Callable[[RotationReport], None]
                  ) -> Callable[[RotationReport], None]:
    """``progress``, called only with counts that differ from the last it was given (the
    topics add no step of their own: the report after them is often the last step's)."""
    last: list[str] = []

    def report(counts: RotationReport) -> None:
        line = counts.line()
        if last != [line]:
            last[:] = [line]
            progress(counts)
    return report
