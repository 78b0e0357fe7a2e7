"""Dispatcher: fires each claimed task at its own millisecond and records the outcome.

Per task: wait until just before it is due; check with Redis that the claim still holds
(``start``: a task cancelled or replaced after the claim is not sent); wait until it is due
(never before); send; record the outcome (``complete``). The Redis calls of all tasks in flight
are batched per bucket (timewheel/engine/batching.py). Concurrency is bounded by a semaphore and the
sender's connection pool.

Flow control: a due task starts only with a permit of its flow (timewheel/engine/flow_gate.py);
it gives the permit back as soon as its answer is in. Waiting for a permit is not an attempt.

Deadlines: a task must start within half its lease margin of its due time, or it is handed back
unstarted (``release``) for any process to claim at once; an attempt in flight when its tick's
batch deadline passes is abandoned and its lease left to run out, so another process re-sends
it (its outcome is unknown: at-least-once).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Iterator, Sequence
from typing import cast

from timewheel import __version__
from timewheel.clock import Clock
from timewheel.delivery.retry_policy import classify_status, next_due_ms
from timewheel.delivery.senders import Answer, Sender, SendError
from timewheel.delivery.signing import Signer
from timewheel.engine.batching import BucketBatcher
from timewheel.engine.flow_gate import FlowGate
from timewheel.engine.flow_state import Waiter
from timewheel.engine.timeline import Timeline
from timewheel.errors import StoreUnavailable
from timewheel.metrics import Metrics
from timewheel.models import format_ms
from timewheel.store import Outcome, Store
from timewheel.store.flow_store import FlowStore
from timewheel.store.record import ClaimedTask, Started
from timewheel.tracing import Tracing, record_callback

log = logging.getLogger(__name__)

Entry = tuple[ClaimedTask, int, int]  # (task, claimed_at_ms, batch deadline_ms)
Permitted = tuple[Entry, str, int]  # an entry, its flow's permit, no start before (ms)

USER_AGENT = f"timewheel/{__version__}"
START_SAFETY_MS = 1000  # an attempt must start this long before its lease can run out
# A task leaves the timeline this long before it is due, to ask its flow for a permit (a Redis
# round trip, batched per flow) off the critical path: with 5 ms the permit was often still out
# at the due time (bench/README.md, spread p99 15-19 ms; 3.7-5.3 ms with 20). A permit so taken
# is idle until the due time only while the flow has room (a saturated flow's waiters are due).
START_LEAD_MS = 20.0
# The claim check waits until this long before the due time: from the check on the attempt
# counts as started, and a DELETE after it can no longer stop it (API.md: "in flight").
CHECK_LEAD_MS = 5.0
MAX_ERROR_CHARS = 500
PARK_LEAD_MS = 100  # a task waiting for a permit is parked this long before its start deadline
RATE_SLACK_MS = 20  # a rated flow's attempt starts at most this long after its logged start


class Dispatcher:
    def __init__(self, store: Store, flows: FlowStore, clock: Clock, sender: Sender,
                 metrics: Metrics, *, signer: Signer | None, max_concurrency: int,
                 batch_deadline_ms: int, tokens: Iterator[str], flow_local_cap: int = 10_000,
                 tracing: Tracing | None = None, log_deliveries: bool = False) -> None:
        self._store = store
        # Successes at DEBUG unless TIMEWHEEL_LOG_DELIVERIES: at thousands of callbacks a
        # second, a line each costs real CPU.
        self._ok_level = logging.INFO if log_deliveries else logging.DEBUG
        self._clock = clock
        self._sender = sender
        self._metrics = metrics
        self._signer = signer
        self._tracing = tracing or Tracing(None)
        self._batch_deadline_ms = batch_deadline_ms
        self._max_workers = max_concurrency
        self._starts: BucketBatcher[tuple[str, str], Started] = BucketBatcher(self._flush_starts)
        self._completes: BucketBatcher[Outcome, int] = BucketBatcher(self._flush_completes)
        self._releases: BucketBatcher[tuple[str, str], int] = BucketBatcher(self._store.release)
        self._parks: BucketBatcher[tuple[str, str], int] = BucketBatcher(self._store.park)
        self._gate = FlowGate(
            flows, store, clock, metrics, start=self._permitted, park=self._park,
            adopt=self._adopt, tokens=tokens, lease_margin_ms=store.lease_margin_ms,
            max_lease_ms=batch_deadline_ms + store.lease_margin_ms,
            local_cap=flow_local_cap, max_waiting=max_concurrency * 20)
        self._parking: set[asyncio.Task[None]] = set()
        # Claimed tasks wait on the timeline until just before they are due, then in the ready
        # queue for one of at most max_concurrency workers. A burst of 10,000 due tasks thus
        # costs 10,000 queue entries, not 10,000 coroutines started at the same instant.
        self._timeline: Timeline[Entry] = Timeline(clock, self._launch)
        self._ready: deque[Permitted] = deque()
        self._workers: set[asyncio.Task[None]] = set()
        self._holding: dict[asyncio.Task[None], ClaimedTask] = {}  # worker -> unstarted task
        self._recording: set[asyncio.Task[None]] = set()
        self._late_releases = 0
        self._passing_on = False  # a worker is giving back its permit and will loop
        # A burst shares its scheduled time: format each once (2 % of a burst's CPU otherwise).
        self._scheduled_at = functools.lru_cache(maxsize=1024)(format_ms)

    @property
    def in_flight(self) -> int:
        """Claimed tasks this process holds: waiting, ready, being sent or being recorded."""
        return (len(self._timeline) + self._gate.waiting + len(self._ready)
                + len(self._workers) + len(self._recording))

    @property
    def holding(self) -> int:
        """Claims that count against the ticker's budget: all but those waiting for a permit
        of their flow (bounded on their own, per flow and in all), so a flow that floods
        its own waiting room never stops this process from claiming other flows' tasks."""
        return self.in_flight - self._gate.waiting

    async def poll_flows(self) -> None:
        """Once a tick: take back parked tasks whose flow has room (any process parked them)."""
        await self._gate.poll()

    def submit(self, tasks: Sequence[ClaimedTask], claimed_at_ms: int) -> None:
        """Take over freshly claimed tasks; each fires at its own time."""
        deadline_ms = claimed_at_ms + self._batch_deadline_ms
        for claimed in tasks:
            self._timeline.add(claimed.due_ms - START_LEAD_MS,
                               (claimed, claimed_at_ms, deadline_ms))

    def _launch(self, entry: Entry) -> None:
        """Due (nearly): ask the task's flow for a permit. It may wait for one until just
        before its start deadline, then it is parked in Redis."""
        task, claimed_at_ms, _ = entry
        self._gate.admit(task, entry, self._start_by(task, claimed_at_ms) - PARK_LEAD_MS)

    def _permitted(self, payload: object, permit: str, start_ms: int) -> None:
        """The flow granted a permit for an attempt starting at ``start_ms``: to a worker."""
        self._ready.append((cast(Entry, payload), permit, start_ms))
        if self._passing_on:
            return  # a worker gives its permit to this task and takes it next: no new worker
        if len(self._workers) < self._max_workers:
            worker = asyncio.create_task(self._work())
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)

    def _adopt(self, task: ClaimedTask, permit: str, start_ms: int) -> None:
        """A parked task taken back by this process, its permit already held."""
        now = self._clock.now_ms()
        self._metrics.claimed.inc()
        self._permitted((task, now, now + self._batch_deadline_ms), permit, start_ms)

    def _park(self, waiters: list[Waiter]) -> None:
        parking = asyncio.create_task(self._park_now(waiters))
        self._parking.add(parking)
        parking.add_done_callback(self._parking.discard)

    async def _park_now(self, waiters: list[Waiter]) -> None:
        results = await asyncio.gather(
            *(self._parks.submit(w.task.bucket, (w.task.key, w.task.token)) for w in waiters),
            return_exceptions=True)
        for waiter, result in zip(waiters, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("could not park %s; its lease will hand it back: %s",
                            waiter.task.key, result)
            elif result:
                self._gate.parked(waiter.task.flow, waiter.task.bucket, waiter.task.due_ms)
                self._metrics.flow_parked.inc()

    def _start_by(self, task: ClaimedTask, claimed_at_ms: int) -> int:
        """The latest start that is safe: the lease runs out at max(due, claimed) + timeout +
        margin, and an attempt that starts later than this could still be running when
        another process re-claims the task."""
        return max(task.due_ms, claimed_at_ms) + max(
            self._store.lease_margin_ms // 2, self._store.lease_margin_ms - START_SAFETY_MS)

    async def _work(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        while self._ready:
            entry = self._ready.popleft()
            (task, claimed_at_ms, deadline_ms), permit, start_ms = entry
            if self._clock.now_ms() > start_ms + RATE_SLACK_MS and self._gate.rated(task.flow):
                # Its start was logged in the flow's rate window for start_ms, and it has
                # waited for a worker since: sent now, it could overrun the rate. Ask again.
                self._gate.give_back(task.flow, permit)
                self._launch(entry[0])
                continue
            self._holding[me] = task
            try:
                await self._deliver(me, task, claimed_at_ms, deadline_ms, start_ms)
            except Exception:  # one bad task must not stop the worker; its lease re-sends it
                log.exception("delivering %s failed", task.key)
            except BaseException:  # cancelled (shutdown): give the permit back and stop
                self._holding.pop(me, None)
                self._gate.give_back(task.flow, permit)
                raise
            self._holding.pop(me, None)
            # A permit handed on to a waiter here lands in the ready queue, which this worker
            # reads next: a saturated flow does not spawn a worker per attempt.
            self._passing_on = True
            try:
                self._gate.give_back(task.flow, permit)
            finally:
                self._passing_on = False

    async def _deliver(self, me: asyncio.Task[None], task: ClaimedTask, claimed_at_ms: int,
                       deadline_ms: int, start_ms: int) -> None:
        if self._clock.now_ms() > self._start_by(task, claimed_at_ms):
            await self._release_late(task)
            return
        await self._clock.sleep_until(task.due_ms - CHECK_LEAD_MS)
        try:
            started = await self._starts.submit(task.bucket, (task.key, task.token))
        except StoreUnavailable as exc:
            # Cannot tell whether it was cancelled: do not send. The lease runs out and a
            # process re-claims it once Redis answers again.
            log.warning("cannot start %s, leaving it to its lease: %s", task.key, exc)
            return
        if started.attempt == 0:
            self._metrics.skipped.inc()  # cancelled or replaced since the claim
            return
        self._holding.pop(me, None)  # started: shutdown lets it finish instead of handing back
        await self._clock.sleep_until(max(task.due_ms, start_ms))
        timeout_ms = min(task.timeout_ms, deadline_ms - self._clock.now_ms())
        if timeout_ms <= 0:
            self._metrics.outcomes["abandoned"].inc()
            return  # the batch deadline passed while waiting; the lease re-sends it
        outcome = await self._attempt(task, started, timeout_ms / 1000.0)
        # Recorded in the background: the worker moves on to the next ready task.
        recorder = asyncio.create_task(self._record(task, outcome))
        self._recording.add(recorder)
        recorder.add_done_callback(self._recording.discard)

    async def _attempt(self, task: ClaimedTask, started: Started, timeout: float) -> Outcome:
        """Send one attempt with the headers and body that ``start`` read (not the claim's:
        claim replies carry no bodies, so what is sent is what is stored at start)."""
        attempt = started.attempt
        started_ms = self._clock.wall_ms()
        lateness = (started_ms - max(task.due_ms, task.created_ms)) / 1000.0
        (self._metrics.lateness_first if attempt == 1
         else self._metrics.lateness_retry).observe(lateness)
        headers = self._headers(task, started, int(started_ms // 1000))
        answer: Answer | None = None
        error: SendError | None = None
        with self._tracing.callback_span(task.key, attempt, task.method, task.url) as span:
            self._metrics.inflight.inc()
            try:
                answer = await self._sender.send(task.method, task.url, headers,
                                                 started.body or None, timeout)
            except SendError as exc:
                error = exc
            finally:
                self._metrics.inflight.dec()
            took = (self._clock.wall_ms() - started_ms) / 1000.0
            self._metrics.duration.observe(took)
            outcome = self._outcome(task, attempt, answer, error, took, int(started_ms))
            record_callback(span, status_code=outcome.status_code, outcome=outcome.kind,
                            error=outcome.error)
        return outcome

    def _headers(self, task: ClaimedTask, started: Started,
                 timestamp: int) -> list[tuple[str, str]]:
        headers = [*started.headers,
                   ("webhook-id", task.key),
                   ("webhook-timestamp", str(timestamp)),
                   ("timewheel-attempt", str(started.attempt)),
                   ("timewheel-scheduled-at", self._scheduled_at(task.execute_at_ms) or ""),
                   ("User-Agent", USER_AGENT)]
        if self._signer is not None:
            headers.append(("webhook-signature",
                            self._signer.sign(task.key, timestamp, started.body)))
        return headers

    def _outcome(self, task: ClaimedTask, attempt: int, answer: Answer | None,
                 error: SendError | None, took: float, started_ms: int) -> Outcome:
        now = self._clock.now_ms()
        if answer is not None:
            verdict = classify_status(answer.status)
            code: int | None = answer.status
            message = None if verdict == "ok" else f"HTTP {answer.status}"
            retry_after = answer.retry_after
        else:
            assert error is not None
            verdict = "fail" if error.kind == "blocked" else "retry"
            code, message, retry_after = None, f"{error.kind}: {error}"[:MAX_ERROR_CHARS], None
        if verdict == "retry" and attempt >= task.max_attempts:
            verdict = "fail"
        log.log(self._ok_level if verdict == "ok" else logging.INFO,
                "callback %s attempt=%d %s %.3fs -> %s", task.key, attempt,
                code if code is not None else message, took, verdict,
                extra={"task_key": task.key, "flow_key": task.flow, "attempt": attempt,
                       "status_code": code, "duration_ms": round(took * 1000, 1),
                       "outcome": verdict, "error": message})
        if verdict == "retry":
            self._metrics.outcomes["retried"].inc()
            return Outcome(task.key, task.token, "retry", code, message,
                           next_due_ms(now, task.backoff_ms, attempt, retry_after), started_ms)
        self._metrics.outcomes["succeeded" if verdict == "ok" else "failed"].inc()
        return Outcome(task.key, task.token, verdict, code, message, started_ms=started_ms)

    async def _record(self, task: ClaimedTask, outcome: Outcome) -> None:
        """Store the outcome; while Redis is down, keep trying until the lease would have
        run out anyway (after that the task is re-sent: at-least-once)."""
        give_up = self._clock.now_ms() + task.timeout_ms + self._store.lease_margin_ms
        delay = 0.05
        while True:
            try:
                if not await self._completes.submit(task.bucket, outcome):
                    log.info("outcome of %s dropped: cancelled, replaced or re-claimed meanwhile",
                             task.key)
                return
            except StoreUnavailable as exc:
                if self._clock.now_ms() + delay * 1000 > give_up:
                    log.warning("outcome of %s not stored, it will be re-sent: %s", task.key, exc)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _release_late(self, task: ClaimedTask) -> None:
        """Hand back a claim that could not start in time (the process is saturated), so any
        process can take it at once. Batched: a saturated process has many of these."""
        try:
            await self._releases.submit(task.bucket, (task.key, task.token))
        except StoreUnavailable as exc:
            log.warning("could not hand back %s; its lease will: %s", task.key, exc)
        self._metrics.skipped.inc()
        self._late_releases += 1
        if self._late_releases & (self._late_releases - 1) == 0:  # 1, 2, 4, 8, ... : no flood
            log.warning("%d claims handed back so far: they could not start before their "
                        "lease margin ran out (saturated; add processes or concurrency)",
                        self._late_releases)

    async def _hand_back(self, tasks: Sequence[ClaimedTask], why: str) -> None:
        """Release claims at shutdown, through the same per-bucket batcher as late releases
        (at most MAX_BATCH claims per script call, however many are held)."""
        results = await asyncio.gather(
            *(self._releases.submit(task.bucket, (task.key, task.token)) for task in tasks),
            return_exceptions=True)
        failed = sum(isinstance(result, BaseException) for result in results)
        if failed:
            log.warning("could not hand back %d claims (%s); their leases will", failed, why)
        self._metrics.skipped.inc(len(tasks))
        log.info("handed back %d claims: %s", len(tasks) - failed, why)

    async def _flush_starts(self, bucket: int,
                            claims: Sequence[tuple[str, str]]) -> list[Started]:
        return await self._store.start(bucket, now_ms=self._clock.now_ms(), claims=claims)

    async def _flush_completes(self, bucket: int, outcomes: Sequence[Outcome]) -> list[int]:
        return await self._store.complete(bucket, now_ms=self._clock.now_ms(), outcomes=outcomes)

    async def stop(self, grace_seconds: float) -> None:
        """Hand back every claim not yet started, at once; give attempts in flight up to
        ``grace_seconds`` to finish and be recorded; abandon the rest to their leases."""
        unlaunched = [entry[0] for entry in self._timeline.drain()]
        await self._timeline.close()
        # Drain the gate first: from then on a permit given back is not handed on.
        unlaunched += [waiter.task for waiter in self._gate.drain()]
        ready, self._ready = list(self._ready), deque()
        for (task, _, _), permit, _ in ready:
            unlaunched.append(task)
            self._gate.give_back(task.flow, permit)
        holders = dict(self._holding)
        for worker in holders:
            worker.cancel()  # each gives its permit back on the way out
        await asyncio.gather(*holders, return_exceptions=True)
        # A worker cancelled inside its start check may have started; release skips those.
        if unlaunched or holders:
            await self._hand_back([*unlaunched, *holders.values()], "shutting down")
        # Workers still busy are sending; each records its outcome in the background.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds
        for group in (self._workers, self._recording):
            if not group:
                continue
            _, late = await asyncio.wait(set(group), timeout=max(0.1, deadline - loop.time()))
            for runner in late:
                runner.cancel()
            if late:
                log.warning("%d attempts or outcomes unfinished at shutdown; their leases "
                            "will re-send them", len(late))
                await asyncio.gather(*late, return_exceptions=True)
        if self._parking:  # parks on their way; a claim not parked in time keeps its lease
            _, late = await asyncio.wait(set(self._parking), timeout=2.0)
            for parking in late:
                parking.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self._gate.close()
