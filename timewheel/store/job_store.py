"""Bulk jobs in Redis (``POST /tasks/cancel``, ``/tasks/replay``; docs/design.md, "Bulk jobs").

A job's own record and the list of running jobs share one hash slot (``{<prefix>:jobs}:``,
lua/job_create.lua, lua/job_lease.lua, lua/job_finish.lua). Its progress lives in the buckets
it walks: one small hash per bucket with the position reached in that bucket's indexes and the
counts so far (lua/job_step.lua), so that a step acts on its tasks, moves the position and
counts them in one atomic script of one slot, on a single Redis and on a cluster alike. The
tasks a step acts on are found first by the listing script of ``GET /tasks`` (lua/list.lua,
read-only and bounded), with the job's filter.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from timewheel.store.listing import Source
from timewheel.store.redis_errors import redis_errors
from timewheel.store.replies import JobFinishReply, JobStepReply
from timewheel.store.scripts import source
from timewheel.store.task_store import Store


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """A job's filter as the scripts take it (lua/lib/matching.lua), beside the source's own
    status letters and attempts rule. Times in epoch ms; None: any."""

    key_prefix: str = ""
    flow: str = ""
    due_before_ms: int | None = None
    created_before_ms: int | None = None

    def args(self, src: Source) -> list[str | int]:
        """The six filter values of lua/lib/matching.lua for one source."""
        return [src.status, src.attempts, self.key_prefix, self.flow,
                "" if self.due_before_ms is None else self.due_before_ms,
                "" if self.created_before_ms is None else self.created_before_ms]


@dataclass(frozen=True, slots=True)
class Position:
    """Where a job stands in one bucket: the source (index into the job's sources) and the
    last entry looked at in it (score, key; "" "" at the source's start)."""

    source: int = 0
    score: str = ""
    key: str = ""
    ended: bool = False


@dataclass(frozen=True, slots=True)
class Counts:
    matched: int = 0
    done: int = 0
    skipped: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.matched + other.matched, self.done + other.done,
                      self.skipped + other.skipped)


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    kind: str
    filter: dict[str, Any]
    state: str  # running, done, failed
    started_ms: int
    finished_ms: int | None
    error: str
    counts: Counts


@dataclass(frozen=True, slots=True)
class Found:
    """A listing call's answer for a job: the keys found after a position, how far it looked
    (None: nothing left to look at) and whether it read the source to its end."""

    keys: list[str]
    reached: tuple[str, str] | None
    done: bool


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class JobStore:
    def __init__(self, store: Store) -> None:
        self.store = store
        redis = store.redis
        self._create = store.scripts.register("job_create")
        self._lease = redis.register_script(source("job_lease"))
        self._finish = redis.register_script(source("job_finish"))
        self._step = redis.register_script(source("job_step"))

    @property
    def _jobs(self) -> str:
        return self.store.keys.jobs

    async def create(self, job_id: str, kind: str, filter_json: str, *, now_ms: int) -> None:
        async with redis_errors("job_create"):
            await self._create(keys=[self._jobs], args=[job_id, kind, filter_json, now_ms])

    async def get(self, job_id: str) -> JobRecord | None:
        """The job with its counts summed over every bucket; None: no such job (or expired)."""
        keys = self.store.keys
        async with redis_errors("job_get"):
            raw: dict[Any, Any] = await self.store.redis.hgetall(keys.job(job_id))
            if not raw:
                return None
            rows = await asyncio.gather(*(
                self.store.redis.hmget(keys.job_state(b, job_id), "m", "d", "s")
                for b in range(keys.buckets)))
        total = Counts()
        for row in rows:
            total += Counts(*(int(v or 0) for v in row))
        job = {_text(k): _text(v) for k, v in raw.items()}
        return JobRecord(id=job_id, kind=job["kind"], filter=json.loads(job["filter"]),
                         state=job["state"], started_ms=int(job["started"]),
                         finished_ms=int(job["finished"]) if job["finished"] else None,
                         error=job.get("error", ""), counts=total)

    async def lease(self, *, now_ms: int, lease_ms: int, holder: str, job_id: str = ""
                    ) -> str | None:
        """Take a running job whose lease expired (``job_id`` ""), or renew the lease on
        ``job_id``: the job held, or None (none free; or this runner lost ``job_id``)."""
        async with redis_errors("job_lease"):
            reply = await self._lease(keys=[self._jobs],
                                      args=[now_ms, lease_ms, holder, job_id])
        return _text(reply) or None

    async def finish(self, job_id: str, *, holder: str, state: str, now_ms: int,
                     error: str = "") -> JobFinishReply:
        async with redis_errors("job_finish"):
            return JobFinishReply(int(await self._finish(
                keys=[self._jobs],
                args=[job_id, holder, state, now_ms, self.store.retention_ms, error[:500]])))

    async def position(self, bucket: int, job_id: str) -> Position:
        async with redis_errors("job_position"):
            src, score, key, ended = await self.store.redis.hmget(
                self.store.keys.job_state(bucket, job_id), "src", "sc", "k", "end")
        return Position(int(src or 0), _text(score or b""), _text(key or b""), ended == b"1")

    async def find(self, bucket: int, src: Source, after: tuple[str | int, str],
                   task_filter: TaskFilter, *, limit: int,
                   cancelled_since: tuple[int, str] | None = None) -> Found:
        """The next tasks of one source after a position (lua/list.lua, with the filter);
        with ``cancelled_since`` (a cancel job's start and id), also the tasks of the slices
        cancelled since then, not by the job, that the filter would have taken: the step
        counts them as skipped."""
        args = task_filter.args(src)
        async with redis_errors("job_find"):
            reply: list[Any] = await self.store.list_script(
                keys=[self.store.keys.prefix(bucket)],
                args=[src.index, "desc" if src.desc else "asc", args[0], args[1], args[2],
                      after[0], after[1], limit, limit, *args[3:],
                      *(cancelled_since or ("", ""))])
        rows = reply[3:]
        reached = (_text(reply[1]), _text(reply[2])) if reply[1] != b"" else None
        return Found([_text(rows[i]) for i in range(1, len(rows), 2)], reached,
                     bool(int(reply[0])))

    async def step(self, bucket: int, job_id: str, kind: str, *, now_ms: int, start: Position,
                   reached: Position, keys: list[str], src: Source, task_filter: TaskFilter,
                   ) -> tuple[JobStepReply, Counts]:
        """Act on ``keys`` (found after ``start``) and move the bucket's position to
        ``reached``, in one script (lua/job_step.lua): STEPPED with the bucket's counts, or
        STALE (the position is not ``start`` any more: nothing written)."""
        retention = self.store.retention_ms
        async with redis_errors("job_step"):
            reply: list[Any] = await self._step(
                keys=[self.store.keys.prefix(bucket)],
                args=[job_id, kind, now_ms, retention, self.store.attempts_kept,
                      2 * retention, start.source, start.score, start.key,
                      reached.source, reached.score, reached.key, int(reached.ended),
                      *task_filter.args(src), *keys])
        code = JobStepReply(int(reply[0]))
        if kind == "replay" and code is JobStepReply.STEPPED and keys:
            # What it replayed is due now: the ticker claims the bucket before its next tick
            # (timewheel/engine/soon_claims.py), as for POST /tasks/{key}/replay. A step whose
            # tasks all stopped matching meanwhile costs one claim that finds nothing.
            self.store.due_soon(bucket, now_ms)
        return code, Counts(*(int(v) for v in reply[1:4]))
