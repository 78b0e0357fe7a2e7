"""A topic publish in Redis: one task per endpoint, all created or none (lua/publish.lua).

- **One Redis**: one script call (mode ``all``) names every bucket the tasks are in and checks
  the publish record and every task before it writes anything: all or none, at once.
- **Redis Cluster**: a script may touch one slot, and the tasks ``<key>.<endpoint>`` hash to
  different buckets. The publish becomes a short protocol around a record in the bucket of the
  publish key (docs/design.md, "Topics"). First the record is looked up: a repeat is answered
  from it, whatever the topic makes of the request now, and another publish under the key
  conflicts. Then (0) every bucket's tasks are checked, nothing written; (1) the record is
  written *open*; (2) each bucket's tasks are created, each bucket in one call; (3) the record
  is marked *done*. The open record holds every task's record, and a repeat that finds it open
  runs (2) and (3) from those records: each task is created once (an identical one is left as
  it is), so a publish cut off between (1) and (3) is completed as it was recorded, by its
  client's retry or else by any process's sweep of records left open (``complete_open``, run
  by timewheel/engine/publish_sweeper.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from timewheel.store import layout
from timewheel.store.record import NewTask, due_of
from timewheel.store.redis_errors import redis_errors
from timewheel.store.replies import PublishReply
from timewheel.store.task_store import Store

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class PublishRequest:
    """What a publish stores: its key, its fingerprint (topic and request), the record kept for
    a repeat (``rec``: topic, endpoints, task keys), and the tasks."""

    key: str
    fingerprint: str
    rec: dict[str, Any]
    tasks: Sequence[NewTask]

    def keep_ms(self, now_ms: int, retention_ms: int) -> int:
        """How long the publish record is kept: until its last task's due time has passed by
        the retention period (a repeat meanwhile answers 200, never creates a second set)."""
        latest = max((task.due_ms for task in self.tasks), default=now_ms)
        return max(latest - now_ms, 0) + retention_ms


@dataclass(frozen=True, slots=True)
class Published:
    reply: PublishReply
    existing: list[str] = field(default_factory=list)  # CREATED: identical tasks found
    rec: dict[str, Any] | None = None  # EXISTS: the stored record of the publish
    conflict_key: str | None = None  # TASK_CONFLICT: the key that holds another task


class Publisher:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.keys = store.keys
        self.script: AsyncScript = store.scripts.register("publish")  # acknowledged

    def _record(self, task: NewTask) -> bytes:
        """The task's record as stored: headers and body sealed when TIMEWHEEL_ENCRYPTION_KEYS
        is set, as Store.schedule stores a POST /tasks."""
        return task.record(self.store.cipher)

    def home(self, publish_key: str) -> str:
        return self.keys.prefix(self.keys.bucket_of(publish_key))

    async def publish(self, request: PublishRequest, *, now_ms: int) -> Published:
        async with redis_errors("publish"):
            if isinstance(self.store.redis, RedisCluster):
                return await self._in_steps(request, now_ms)  # (its tasks step tells)
            published = await self._at_once(request, now_ms)
        if published.reply is PublishReply.CREATED:
            for task in request.tasks:
                self.store.due_soon(self.keys.bucket_of(task.key), task.due_ms)
        return published

    def _head(self, mode: str, request: PublishRequest, now_ms: int, request_id: str
              ) -> list[Any]:
        rec = json.dumps(request.rec, separators=(",", ":"), ensure_ascii=False)
        return [mode, request.key, now_ms, request_id, request.fingerprint, rec,
                request.keep_ms(now_ms, self.store.retention_ms)]

    async def _at_once(self, request: PublishRequest, now_ms: int) -> Published:
        prefixes = [self.home(request.key)]
        args = self._head("all", request, now_ms, secrets.token_hex(8))
        for task in request.tasks:
            prefix = self.keys.prefix(self.keys.bucket_of(task.key))
            if prefix not in prefixes:
                prefixes.append(prefix)
            args += [prefixes.index(prefix) + 1, task.key, self._record(task), task.results()]
        return _published(await self.script(keys=prefixes, args=args))

    async def _in_steps(self, request: PublishRequest, now_ms: int) -> Published:
        request_id = secrets.token_hex(8)
        home = [self.home(request.key)]
        # A repeat is answered from the record, whatever the topic makes of the request now:
        # so the record is looked at before (0), which checks the tasks the topic makes now.
        found = await self._looked_up(request, now_ms)
        if found.reply is not PublishReply.CREATED:  # CREATED: no record
            return await self._repeat(request, found, now_ms)
        groups = self._groups(request)
        head = self._head("check", request, now_ms, request_id)
        for reply in await asyncio.gather(*(self.script(keys=[prefix], args=head + quads)
                                            for prefix, quads in groups.items())):
            checked = _published(reply)  # (0) nothing is written before every bucket passes
            if checked.reply is PublishReply.TASK_CONFLICT:
                return checked
        quads = [v for t in request.tasks for v in (1, t.key, self._record(t), t.results())]
        opened = _published(await self.script(keys=home, args=self._head(
            "open", request, now_ms, request_id) + quads))  # (1)
        if opened.reply is not PublishReply.CREATED:  # another call opened it meanwhile
            return await self._repeat(request, opened, now_ms)
        return await self._create(request.key, groups, now_ms, request_id)  # (2) and (3)

    async def _looked_up(self, request: PublishRequest, now_ms: int) -> Published:
        """The publish's record, read only: EXISTS (with it), CONFLICT, or CREATED for none."""
        return _published(await self.script(keys=[self.home(request.key)], args=self._head(
            "record", request, now_ms, secrets.token_hex(8))))

    def _groups(self, request: PublishRequest) -> dict[str, list[Any]]:
        """The request's tasks by bucket prefix, as the check and tasks steps take them."""
        groups: dict[str, list[Any]] = {}
        for task in request.tasks:
            groups.setdefault(self.keys.prefix(self.keys.bucket_of(task.key)), []).extend(
                [1, task.key, self._record(task), task.results()])
        return groups

    async def _repeat(self, request: PublishRequest, found: Published, now_ms: int
                      ) -> Published:
        """The answer when the publish's record exists: CONFLICT (other content), or EXISTS
        once the record's tasks are there. An open record (its call died between (1) and (3))
        is completed from the task records it holds, not from what the topic makes now; a
        ``partial`` one (a task key was taken) runs its tasks again, so the taken key's 409
        comes again while that task is there."""
        if found.reply is not PublishReply.EXISTS:
            return found
        state = (found.rec or {}).get("state")
        if state == "done":
            return found
        if state == "open":
            made = await self._complete(request.key, now_ms)
            if made is None:  # closed meanwhile by the call that opened it: as it ended
                again = await self._looked_up(request, now_ms)
                if again.reply is PublishReply.EXISTS:
                    return await self._repeat(request, again, now_ms)
                return found
        else:
            made = await self._create(request.key, self._groups(request), now_ms,
                                      secrets.token_hex(8))
        return made if made is not None and made.reply is PublishReply.TASK_CONFLICT else found

    async def _create(self, publish_key: str, groups: dict[str, list[Any]], now_ms: int,
                      request_id: str) -> Published:
        """Steps (2) and (3): each bucket's tasks, then the record closed: ``done``, or
        ``partial`` when a task key was taken by another task between (0) and (2)."""
        head: list[Any] = ["tasks", publish_key, now_ms, request_id, "", "", 0]
        answers = await asyncio.gather(*(self.script(keys=[prefix], args=head + quads)
                                         for prefix, quads in groups.items()),
                                       return_exceptions=True)
        # Tell the ticker of each task, whichever call made it (this publish's own, its repeat
        # after it died, the sweep), or one due before the next tick waits for that tick; and
        # when a call was refused (a full master), of those the others stored meanwhile.
        # Told of a task that was not written (a taken key, a refused call): one claim of its
        # bucket too many.
        for quads in groups.values():
            for key, stored in zip(quads[1::4], quads[2::4], strict=True):
                try:
                    due = due_of(stored)
                except layout.BadRecord:  # another layout (a rolling update): claim soon
                    due = now_ms
                self.store.due_soon(self.keys.bucket_of(key), due)
        refused = next((a for a in answers if isinstance(a, BaseException)), None)
        if refused is not None:
            raise refused
        replies = [_published(answer) for answer in answers]
        taken = next((r for r in replies if r.reply is PublishReply.TASK_CONFLICT), None)
        await self.script(keys=[self.home(publish_key)], args=[
            "close", publish_key, now_ms, request_id, "", "partial" if taken else "done", 0])
        if taken is not None:
            return taken
        return Published(PublishReply.CREATED, existing=[k for r in replies for k in r.existing])

    async def complete_open(self, bucket: int, *, now_ms: int, older_than_ms: int,
                            limit: int = 100) -> int:
        """Complete the publishes of ``bucket`` left open for longer than ``older_than_ms``
        (their process died between steps (1) and (3)): steps (2) and (3) from the task
        records the open record holds. Returns how many were looked at."""
        prefix = self.keys.prefix(bucket)
        async with redis_errors("publish sweep"):
            stale: list[Any] = await self.store.redis.zrangebyscore(
                f"{prefix}po", "-inf", now_ms - older_than_ms, start=0, num=limit)
            for raw in stale:
                publish_key = raw.decode()
                done = await self._complete(publish_key, now_ms)
                if done is None:  # closed or expired meanwhile: only its open entry goes
                    await self.script(keys=[prefix], args=[
                        "close", publish_key, now_ms, secrets.token_hex(8), "", "done", 0])
                elif done.reply is PublishReply.TASK_CONFLICT:
                    log.error("publish %s completed in part: task %s holds another task",
                              publish_key, done.conflict_key)
        return len(stale)

    async def _complete(self, publish_key: str, now_ms: int) -> Published | None:
        """Steps (2) and (3) of an open publish, from the task records its record holds;
        None when the record is not open (closed, or expired)."""
        fields: Any = await self.store.redis.hgetall(f"{self.home(publish_key)}pb:{publish_key}")
        if fields.get(b"st") != b"open":
            return None
        groups: dict[str, list[Any]] = {}
        for name, value in fields.items():
            if name.startswith(b"t:"):
                key = name[2:].decode()
                results = fields.get(b"u:" + name[2:], b"")
                groups.setdefault(self.keys.prefix(self.keys.bucket_of(key)), []).extend(
                    [1, key, value, results])
        return await self._create(publish_key, groups, now_ms, secrets.token_hex(8))


def _published(reply: Any) -> Published:
    code = PublishReply(int(reply[0]))
    if code is PublishReply.CREATED:
        return Published(code, existing=[k.decode() for k in reply[1]])
    if code is PublishReply.EXISTS:
        rec = json.loads(reply[1])
        rec["state"] = reply[2].decode()
        return Published(code, rec=rec)
    if code is PublishReply.TASK_CONFLICT:
        return Published(code, conflict_key=reply[1].decode())
    return Published(code)
