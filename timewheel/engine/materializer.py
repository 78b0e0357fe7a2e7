"""Materializer: turns the due occurrences of recurring schedules into ordinary tasks.

Every process runs one, every tick; none is special. Exactly-once per occurrence comes from
Redis (docs/design.md, "Recurring schedules"):

1. Reserve: a compare-and-set in the schedule's slot (lua/sched_reserve.lua) moves the
   schedule's ``next`` past the occurrences it takes and records them as outstanding. Two
   processes that read the same ``next`` cannot both reserve: one of them is stale.
2. Create: each occurrence becomes the task ``<id>.<occ ms>`` through ``Store.schedule`` in
   create mode, the same atomic path as POST /tasks: a second create answers EXISTS.
3. Settle: outstanding occurrences are looked at again, by any process. One whose creator died
   before creating it is created again (idempotent, step 2); one whose task finished is
   forgotten; one whose schedule was paused or deleted is cancelled (or tombstoned).

Occurrences are materialized ``ahead_ms`` (two ticks) before they are due: early enough for the
ticker to claim them on time, late enough that a pause or delete stops them at once. After every
process was down (the due ``next`` is older than ``grace_ms``, and so is the last pass) only the
latest missed occurrence fires; after an outage of Redis alone, every one fires, late
(timewheel/engine/downtime.py tells them apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from timewheel.clock import Clock
from timewheel.domain import FINISHED
from timewheel.engine.downtime import Downtime
from timewheel.engine.occurrences import Recurrence
from timewheel.errors import StoreUnavailable
from timewheel.loops import stop_loop
from timewheel.store import ScheduleReply, Store
from timewheel.store.batch import schedule_many
from timewheel.store.record import NewTask
from timewheel.store.schedule_store import (
    Due,
    Reservation,
    ScheduleStore,
    occurrence_key,
    occurrence_task,
)

log = logging.getLogger(__name__)

MAX_OCCURRENCES_PER_RESERVATION = 32
CATCH_UP_PER_PASS = 4  # occurrences of a schedule behind by more than grace, in one pass
_SPEC_CACHE = 100_000


@dataclass(frozen=True, slots=True)
class _Spec:
    recurrence: Recurrence
    template: dict[str, Any]
    task: NewTask | None  # the template prepared; None: it does not validate (any more)


class Materializer:
    def __init__(self, store: Store, schedules: ScheduleStore, clock: Clock, *, tick_ms: int,
                 batch: int = 100, max_per_tick: int = 20_000, settle_ms: int = 10_000,
                 recheck_ms: int = 30_000) -> None:
        self._store = store
        self._schedules = schedules
        self._clock = clock
        self.tick_ms = tick_ms
        self.ahead_ms = 2 * tick_ms  # the ticker claims one tick (plus a margin) ahead
        self.downtime = Downtime(schedules, tick_ms=tick_ms)
        self.grace_ms = self.downtime.grace_ms
        self.lease_ms = 2 * tick_ms  # a reservation not settled by then is created again
        self.settle_ms = settle_ms
        self.recheck_ms = recheck_ms
        self.batch = batch
        self.max_per_tick = max_per_tick
        self._specs: OrderedDict[tuple[str, str], _Spec] = OrderedDict()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # materialize_soon: the buckets with a pass under way (True: once more after it).
        self._soon: dict[int, bool] = {}
        self._soon_tasks: set[asyncio.Task[None]] = set()
        # Counters (tests and the bench read them).
        self.created = 0  # occurrence tasks this process created
        self.recovered = 0  # of which created again after their creator's lease ran out
        self.skipped = 0  # missed occurrences skipped after an outage
        self.cancelled = 0  # outstanding occurrences of paused or deleted schedules

    # -- one pass ---------------------------------------------------------------------------

    async def tick(self, now_ms: int) -> int:
        """Materialize what falls due by ``now_ms + ahead_ms`` (at most ``max_per_tick``
        schedules), then settle outstanding occurrences (as many at most). Buckets are worked
        on concurrently, each in batches of ``batch`` within an equal share of the budget (a
        shared budget would let the first buckets starve the others, tick after tick), so Redis
        and Python overlap. Returns how many schedules were reserved."""
        buckets = self._store.keys.buckets
        share = max(1, self.max_per_tick // buckets)
        self.downtime.note_running(now_ms)
        was_down = await self.downtime.judge(now_ms)
        # Waiting for a witness: only what is not behind, which no judgement touches.
        since = now_ms - self.grace_ms if was_down is None else None

        async def settle(bucket: int) -> None:
            left = share
            while left > 0:
                full, items = await self._schedules.checks(bucket, now_ms=now_ms,
                                                           limit=min(self.batch, left))
                left -= len(items)
                await self._settle(bucket, items, now_ms)
                if not full or not items:
                    break

        reserved = await asyncio.gather(*(self._bucket(b, now_ms, bool(was_down), share, since)
                                          for b in range(buckets)))
        await asyncio.gather(*(settle(b) for b in range(buckets)))
        # Only now: a pass that judged the wheel down must have skipped what it skips before
        # materialize_soon may pass a bucket as if it had not been.
        if was_down is not None:
            self.downtime.passed_ms = now_ms
        return sum(reserved)

    async def _bucket(self, bucket: int, now_ms: int, was_down: bool, budget: int,
                      since_ms: int | None = None) -> int:
        """Materialize the bucket's schedules due by ``now_ms + ahead_ms`` (and from
        ``since_ms``, when given), in batches, up to ``budget`` of them; how many were
        reserved."""
        made, left = 0, budget
        while left > 0:
            full, due = await self._schedules.due(bucket, until_ms=now_ms + self.ahead_ms,
                                                  limit=min(self.batch, left), from_ms=since_ms)
            left -= len(due)
            made += await self._materialize(bucket, due, now_ms, was_down)
            if not full or not due:
                break
        return made

    def materialize_soon(self, bucket: int, next_ms: int) -> None:
        """Listens to ``ScheduleStore.next_soon`` while ``run()`` runs. A schedule just put or
        resumed whose next occurrence falls before this process's next pass has its bucket
        materialized now: else that occurrence would become a task only at the next pass, up
        to a tick after it is due. Only after a pass of this process within ``grace_ms``
        (none yet: the wheel may have been down, which only a pass may judge) and one bucket
        pass at a time (asked again meanwhile: once more after it)."""
        passed_ms = self.downtime.passed_ms
        if self._stopping.is_set() or passed_ms is None:
            return
        try:
            now_ms = self._clock.now_ms()
        except Exception:  # never raise into the write that told it: leave it to a pass
            return
        if next_ms >= now_ms + self.tick_ms or passed_ms < now_ms - self.grace_ms:
            return
        if bucket in self._soon:
            self._soon[bucket] = True
            return
        self._soon[bucket] = False
        task = asyncio.create_task(self._materialize_soon(bucket),
                                   name="timewheel-materialize-soon")
        self._soon_tasks.add(task)
        task.add_done_callback(self._soon_tasks.discard)

    async def _materialize_soon(self, bucket: int) -> None:
        try:
            while not self._stopping.is_set():
                self._soon[bucket] = False
                await self._bucket(bucket, self._clock.now_ms(), False, self.batch)
                if not self._soon[bucket]:
                    break
        except Exception as exc:  # the next pass materializes it, as without this
            log.debug("materializing bucket %d for a schedule due soon failed: %s",
                      bucket, exc)
        finally:
            del self._soon[bucket]

    async def _materialize(self, bucket: int, due: list[Due], now_ms: int,
                           was_down: bool = True) -> int:
        if not due:
            return 0
        specs = await self._specs_of(bucket, [(d.id, d.version) for d in due])
        reservations = []
        for d in due:
            spec = specs.get((d.id, d.version))
            if spec is not None:
                reservations.append(self._plan(d, spec.recurrence, now_ms, was_down))
        taken = await self._schedules.reserve(bucket, reservations, now_ms=now_ms,
                                              lease_ms=self.lease_ms)
        work = [(r.id, occ, specs[(r.id, r.version)].task)
                for r, ok in zip(reservations, taken, strict=True) if ok
                for occ in r.occurrences]
        created = await self._create_many(work, now_ms)
        await self._schedules.settle(bucket, [
            (i, occ, max(occ, now_ms) + self.settle_ms)
            for (i, occ, _), ok in zip(work, created, strict=True) if ok])
        return sum(taken)

    def _plan(self, due: Due, rec: Recurrence, now_ms: int, was_down: bool = True
              ) -> Reservation:
        """The occurrences to reserve for a due schedule, and its next one after them."""
        first: int | None = due.next_ms
        if was_down and due.next_ms < now_ms - self.grace_ms:
            # Every process was down past this occurrence: fire only the latest missed one.
            latest = rec.latest_at_or_before(now_ms)
            if latest is not None and latest > due.next_ms:
                self.skipped += 1
                log.info("schedule %s: occurrences from %d to %d skipped after an outage, %d "
                         "fires", due.id, due.next_ms, latest, latest)
                first = latest
        assert first is not None
        until = max(now_ms + self.ahead_ms, first)
        # Behind by more than grace, after an outage of Redis alone (engine/downtime.py): a few
        # at a time, so that making up a long outage costs a pass a few times its usual work.
        most = (CATCH_UP_PER_PASS if first < now_ms - self.grace_ms
                else MAX_OCCURRENCES_PER_RESERVATION)
        occurrences = [first, *rec.between(first, until, most - 1)]
        return Reservation(due.id, due.version, due.next_raw,
                           rec.next_after(occurrences[-1]), tuple(occurrences))

    async def _create_many(self, work: list[tuple[str, int, NewTask | None]], now_ms: int
                           ) -> list[bool]:
        """Create occurrence tasks through lua/schedule.lua in create mode, as POST /tasks
        does, pipelined (timewheel.store.batch). True for each that exists now (or can never
        be created); False leaves it outstanding, for any process to create after the lease."""
        done = [True] * len(work)
        tasks, where = [], []
        for n, (schedule_id, occ, base) in enumerate(work):
            if base is None:  # a template that no longer validates: it can never fire
                log.error("schedule %s: occurrence %d cannot become a task", schedule_id, occ)
                continue
            tasks.append(occurrence_task(schedule_id, occ, base))
            where.append(n)
        if not tasks:
            return done
        try:
            codes = await schedule_many(self._store, tasks, now_ms)
        except StoreUnavailable:
            log.warning("occurrences left for another pass: Redis unavailable", exc_info=True)
            for n in where:
                done[n] = False
            return done
        for task, code in zip(tasks, codes, strict=True):
            if code is ScheduleReply.CREATED:
                self.created += 1
            elif code is ScheduleReply.CONFLICT:  # cancelled (a pause, a delete) before created
                log.debug("occurrence %s exists with other content", task.key)
        return done

    async def _settle(self, bucket: int, items: list[tuple[str, int, str]], now_ms: int) -> None:
        """Look at outstanding occurrences whose lease ran out or that were due a while ago."""
        if not items:
            return
        specs = await self._schedules.specs(bucket, sorted({i for i, _, _ in items}))
        retention = self._store.retention_ms
        drop: list[str] = []
        later: list[tuple[str, int, int]] = []

        def spec(schedule_id: str) -> _Spec | None:
            found = specs.get(schedule_id)
            return self._spec(schedule_id, *found) if found else None

        def template(schedule_id: str) -> dict[str, Any] | None:
            found = spec(schedule_id)
            return found.template if found else None

        # Paused or deleted: finish what the pause or delete caller may not have.
        for schedule_id, occ, state in items:
            if state != "active":
                await self._schedules.cancel_occurrences(schedule_id, [occ],
                                                         template(schedule_id), now_ms=now_ms)
                self.cancelled += 1
        active = [(i, occ) for i, occ, state in items if state == "active"]
        found = await self._schedules.task_statuses([occurrence_key(i, o) for i, o in active])
        missing: list[tuple[str, int, NewTask | None]] = []
        for (schedule_id, occ), status in zip(active, found, strict=True):
            current = spec(schedule_id)
            if status is None and occ > now_ms - retention // 2 and current is not None:
                # Reserved, never created: its creator died. Creating it again is idempotent.
                missing.append((schedule_id, occ, current.task))
            elif status is None or status in FINISHED:
                drop.append(f"{schedule_id} {occ}")
            else:
                later.append((schedule_id, occ, now_ms + self.recheck_ms))
        for (schedule_id, occ, _), ok in zip(missing, await self._create_many(missing, now_ms),
                                             strict=True):
            self.recovered += ok
            later.append((schedule_id, occ, max(occ, now_ms) + self.settle_ms))
        await self._schedules.drop(bucket, drop)
        await self._schedules.settle(bucket, later)

    # -- specs, cached per (id, version) -----------------------------------------------------

    async def _specs_of(self, bucket: int, wanted: list[tuple[str, str]]
                        ) -> dict[tuple[str, str], _Spec]:
        missing = [i for i, v in wanted if (i, v) not in self._specs]
        if missing:
            for i, (version, text) in (await self._schedules.specs(bucket, missing)).items():
                self._spec(i, version, text)
        return {k: self._specs[k] for k in wanted if k in self._specs}

    def _spec(self, schedule_id: str, version: str, text: str) -> _Spec:
        key = (schedule_id, version)
        spec = self._specs.get(key)
        if spec is None:
            raw = json.loads(text)
            try:
                task: NewTask | None = self._schedules.template_task(raw["task"])
            except ValueError:
                log.exception("schedule %s: its task template does not validate", schedule_id)
                task = None
            spec = _Spec(Recurrence(raw["cron"], raw["every"], raw["timezone"]), raw["task"],
                         task)
            self._specs[key] = spec
            if len(self._specs) > _SPEC_CACHE:
                self._specs.popitem(last=False)
        return spec

    # -- the loop ---------------------------------------------------------------------------

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self.run(), name="timewheel-materializer")

    async def stop(self) -> None:
        """Stop after the pass under way, or cancel it (and what ``materialize_soon`` started)
        if Redis holds it up (timewheel/loops.py)."""
        self._stopping.set()
        await stop_loop(self._task)
        self._task = None

    async def run(self) -> None:
        """Tick every ``tick_ms`` until ``stop()``; errors are logged and the loop goes on.
        Meanwhile materialize schedules put with an occurrence before the next pass
        (``materialize_soon``)."""
        listening, self._schedules.next_soon = self._schedules.next_soon, self.materialize_soon
        heartbeat = asyncio.create_task(self._heartbeat(), name="timewheel-materializer-beat")
        try:
            await self._run()
        except asyncio.CancelledError:  # stop() waited long enough: theirs go too
            for task in self._soon_tasks:
                task.cancel()
            raise
        finally:
            heartbeat.cancel()
            self._schedules.next_soon = listening
            await asyncio.gather(heartbeat, *self._soon_tasks, return_exceptions=True)

    async def _heartbeat(self) -> None:
        """Notes that this process runs (``Downtime.note_running``) a few times a tick, apart
        from the passes: a pass that waits on a silent Redis (a master failing over: seconds)
        is this process running, not stopped, and must not make it judge the wheel down."""
        while True:
            with contextlib.suppress(StoreUnavailable):  # the clock not read from Redis yet
                self.downtime.note_running(self._clock.now_ms())
            await asyncio.sleep(self.tick_ms / 4000)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        failing = False
        while not self._stopping.is_set():
            try:
                if self._store.ready:
                    await self.tick(self._clock.now_ms())
                failing = False
            except StoreUnavailable as exc:
                if not failing:
                    log.error("Redis unavailable, materializer waits for it: %s", exc)
                failing = True
            except Exception:  # one bad pass must not stop the schedules
                log.exception("materializer pass failed")
            next_at = max(next_at + self.tick_ms / 1000.0, loop.time())
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=next_at - loop.time())
            except TimeoutError:
                pass
