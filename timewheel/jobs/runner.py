"""JobRunner: the small task each ``timewheel serve`` runs beside its ticker to work bulk jobs
(docs/design.md, "Bulk jobs").

It takes one running job whose lease has expired (a new job's never was held), and works it
bucket by bucket, round robin, one bounded step at a time: renew the lease, find the next
``step_tasks`` matching tasks after the job's position in the bucket (lua/list.lua), act on
them and move the position (lua/job_step.lua), then pause so that steps take at most
``busy_share`` of the time (and at least ``pause_s``): a job holds Redis and the event loop
for a quarter of the time at most by default, in slices of a millisecond or two, so the
ticker and the API never wait long behind it (bench/README.md, "Bulk jobs"). When every
bucket has been read to its end the job is done. A runner that loses its lease (its process
stalled past it) drops the job: the runner that took it over goes on from the positions stored
in the buckets, and a step brought twice finds its position moved and writes nothing, so no
task is acted on or counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

from redis.exceptions import ResponseError

from timewheel.clock import Clock
from timewheel.domain import TaskStatus
from timewheel.errors import RedisFull, StoreUnavailable
from timewheel.jobs.sources import acting, sources, start_of, task_filter
from timewheel.loops import stop_loop
from timewheel.store.job_store import JobRecord, JobStore, Position, TaskFilter
from timewheel.store.listing import Source
from timewheel.store.replies import JobStepReply

log = logging.getLogger(__name__)


class LostLease(Exception):
    """Another runner holds the job now."""


# A refusal a later try gets past: another script is over lua-time-limit (BUSY, which redis-py
# raises as a plain ResponseError). Its own subclasses (OOM, LOADING, TRYAGAIN, READONLY, ...)
# are retried already; any other plain ResponseError is a script's refusal (a record of the v1
# layout), which no retry mends, but a full Redis 6.2's (an OOM inside a script comes as a
# plain ERR there: RedisFull, store/redis_errors.py).
_PASSING = ("BUSY ",)


def _refused_for_good(exc: StoreUnavailable) -> bool:
    cause = exc.__cause__
    return (type(cause) is ResponseError and not isinstance(exc, RedisFull)
            and not str(cause).startswith(_PASSING))


class JobRunner:
    def __init__(self, jobs: JobStore, clock: Clock, *,
                 poll_s: float = 1.0, lease_ms: int = 10_000, step_tasks: int = 50,
                 pause_s: float = 0.002, busy_share: float = 0.25) -> None:
        self.jobs = jobs
        self.clock = clock
        self.poll_s = poll_s  # how often an idle runner looks for a job
        self.lease_ms = lease_ms  # how long a dead runner's job waits before another takes it
        self.step_tasks = step_tasks  # index entries one step looks at (~1 ms of Redis)
        self.pause_s = pause_s  # the least pause between two steps
        self.busy_share = busy_share  # the most of the time that steps take
        self.holder = secrets.token_hex(8)
        self.steps = 0  # steps this runner took (tests read it)
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self.run(), name="timewheel-jobs")

    async def stop(self) -> None:
        """Stop between two steps, or cancel the step under way if Redis holds it up
        (timewheel/loops.py); the job's lease expires and another process carries it on (each
        step is atomic, so stopping never leaves half a step)."""
        self._stopping.set()
        await stop_loop(self._task)
        self._task = None

    async def run(self) -> None:
        failing = False
        while not self._stopping.is_set():
            try:
                worked = False
                if self.jobs.store.ready:
                    worked = await self.work_one()
                failing = False
            except StoreUnavailable as exc:
                if not failing:
                    log.error("Redis unavailable, bulk jobs wait for it: %s", exc)
                failing, worked = True, False
            except Exception:  # a bug in one job must not stop the runner
                log.exception("bulk job runner pass failed")
                worked = False
            if not worked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.poll_s)

    async def work_one(self) -> bool:
        """Take a job and work it until it is done, this runner loses it or stops; False when
        there was none to take."""
        job_id = await self.jobs.lease(now_ms=self.clock.now_ms(), lease_ms=self.lease_ms,
                                       holder=self.holder)
        if job_id is None:
            return False
        job = await self.jobs.get(job_id)
        if job is None:  # expired between the two calls
            return True
        log.info("bulk job %s (%s %s) taken by runner %s", job.id, job.kind, job.filter,
                 self.holder)
        try:
            await self._work(job)
        except StoreUnavailable as exc:
            if not _refused_for_good(exc):  # Redis away: retried, maybe elsewhere
                raise
            # A script refused (a record of the v1 layout) or failed: no retry mends it.
            log.error("bulk job %s failed: %s", job.id, exc)
            await self.jobs.finish(job.id, holder=self.holder, state="failed",
                                   now_ms=self.clock.now_ms(), error=str(exc))
        except LostLease:
            log.warning("bulk job %s: lease lost to another runner, which carries it on", job.id)
        return True

    async def _work(self, job: JobRecord) -> None:
        status = job.filter.get("status")
        srcs = sources(job.kind, None if status is None else TaskStatus(status))
        filt = task_filter(job.filter, job.started_ms)
        buckets = self.jobs.store.keys.buckets
        positions = {b: await self.jobs.position(b, job.id) for b in range(buckets)}
        pending = [b for b, p in positions.items() if not p.ended]
        while pending and not self._stopping.is_set():
            failed = 0
            for bucket in list(pending):
                if self._stopping.is_set():
                    break
                began = time.perf_counter()
                try:
                    await self._renew(job.id)
                    position = await self._step(job, bucket, positions[bucket], srcs, filt)
                except StoreUnavailable as exc:
                    if _refused_for_good(exc):
                        raise
                    # One bucket's master failing over or its slot moving: the other buckets
                    # go on, this one is tried again next round (from its stored position).
                    log.warning("bulk job %s: a step in bucket %d failed, tried again: %s",
                                job.id, bucket, exc)
                    failed += 1
                    positions[bucket] = await self._position_or(bucket, job.id,
                                                                positions[bucket])
                    continue
                positions[bucket] = position
                if position.ended:
                    pending.remove(bucket)
                # In proportion to the step's time: what the job takes of Redis and of this
                # process stays at busy_share, however loaded the machine is.
                took = time.perf_counter() - began
                await asyncio.sleep(max(self.pause_s, took * (1 / self.busy_share - 1)))
            if failed and failed == len(pending):  # Redis away altogether: wait a little
                await asyncio.sleep(self.poll_s)
        if pending:  # stopping
            await self._hand_back(job.id)
            return
        await self.jobs.finish(job.id, holder=self.holder, state="done",
                               now_ms=self.clock.now_ms())
        done = await self.jobs.get(job.id)
        if done is not None:
            log.info("bulk job %s done: matched=%d done=%d skipped=%d", job.id,
                     done.counts.matched, done.counts.done, done.counts.skipped)

    async def _hand_back(self, job_id: str) -> None:
        """On shutdown: a lease that ends now, so another process carries the job on at once
        instead of after the lease (best effort: otherwise it waits for the lease)."""
        with contextlib.suppress(StoreUnavailable):
            await self.jobs.lease(now_ms=self.clock.now_ms(), lease_ms=0, holder=self.holder,
                                  job_id=job_id)
        log.info("bulk job %s handed back at shutdown", job_id)

    async def _position_or(self, bucket: int, job_id: str, known: Position) -> Position:
        """The stored position (a step whose reply was lost may have been taken), or ``known``
        while Redis does not answer."""
        try:
            return await self.jobs.position(bucket, job_id)
        except StoreUnavailable:
            return known

    async def _renew(self, job_id: str) -> None:
        held = await self.jobs.lease(now_ms=self.clock.now_ms(), lease_ms=self.lease_ms,
                                     holder=self.holder, job_id=job_id)
        if held is None:
            raise LostLease(job_id)

    async def _step(self, job: JobRecord, bucket: int, at: Position,
                    srcs: tuple[Source, ...], filt: TaskFilter) -> Position:
        """One bounded step in one bucket; the bucket's position after it."""
        src = srcs[at.source]
        after = (at.score, at.key) if at.score else start_of(src, job.kind, job.started_ms)
        found = await self.jobs.find(
            bucket, src, after, filt, limit=self.step_tasks,
            cancelled_since=(job.started_ms, job.id) if job.kind == "cancel" else None)
        if not found.done and found.reached is not None:
            reached = Position(at.source, *found.reached)
        elif at.source + 1 < len(srcs):  # this source is read: the next one from its start
            reached = Position(at.source + 1)
        else:
            reached = Position(at.source, at.score, at.key, ended=True)
        status = job.filter.get("status")
        code, _ = await self.jobs.step(
            bucket, job.id, job.kind, now_ms=self.clock.now_ms(), start=at, reached=reached,
            keys=found.keys, task_filter=filt,
            src=acting(src, job.kind, None if status is None else TaskStatus(status)))
        if code is JobStepReply.STALE:  # another runner took this step: go on from its position
            return await self.jobs.position(bucket, job.id)
        self.steps += 1
        return reached
