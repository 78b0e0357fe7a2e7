"""Every write the delivery path makes to Redis after a claim, batched per bucket.

- ``start``: count an attempt and read what it sends (lua/start.lua), just before it is due.
- ``record``: an attempt's outcome and history entry (lua/complete.lua), fenced by the claim
  token; while Redis is away it is tried again until the attempt's lease would have run out
  (after that another process re-sends the task: at-least-once).
- ``hand_back``: a claim whose attempt was not sent (lua/release.lua), claimable by any
  process at once (at its next tick); while Redis is away it is tried again until it answers
  (a start call lost in a Redis restart must not leave its task to wait out the whole lease).
- ``park``: set claims aside until their flow has room (lua/park.lua).

A burst of 10,000 due tasks would cost 40,000 round trips one by one; batched
(timewheel/engine/batching.py) it costs a few dozen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from timewheel.clock import Clock
from timewheel.engine.attempt import Attempt
from timewheel.engine.batching import BucketBatcher
from timewheel.errors import StoreUnavailable
from timewheel.metrics import Metrics
from timewheel.store import CompleteReply, Outcome, ParkReply, ReleaseReply, Store
from timewheel.store.record import Started

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.05
COMPLETE_LINGER_S = 0.005
RETRY_MAX_S = 1.0


class Recorder:
    def __init__(self, store: Store, clock: Clock, metrics: Metrics) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        # On a single Redis one start call carries every bucket's claims (group 0).
        self._starts: BucketBatcher[tuple[int, str, str], Started] = BucketBatcher(
            self._flush_starts, group=_one_call if store.starts_span_buckets else None)
        # Outcomes are written in the background, so they wait up to COMPLETE_LINGER_S for
        # others: at 1,000 callbacks a second one call records ~5 instead of one each.
        self._completes: BucketBatcher[tuple[int, Outcome], CompleteReply] = BucketBatcher(
            self._flush_completes, group=_one_call if store.starts_span_buckets else None,
            linger_s=COMPLETE_LINGER_S)
        self._releases: BucketBatcher[tuple[str, str], ReleaseReply] = BucketBatcher(
            lambda bucket, claims: self._store.release(bucket, claims))
        self._parks: BucketBatcher[tuple[str, str], ParkReply] = BucketBatcher(
            lambda bucket, claims: self._store.park(bucket, claims))
        self._background: set[asyncio.Task[Any]] = set()
        # Outcomes written again after a failed first write (record_soon); not in ``busy``:
        # their attempts are still the dispatcher's (ANSWERED) and count there.
        self._retrying: set[asyncio.Task[bool]] = set()
        self._handed_back = 0

    @property
    def busy(self) -> int:
        """Hand-backs under way in the background."""
        return len(self._background)

    async def start(self, attempt: Attempt) -> Started:
        """Count the attempt in Redis and get its headers and body; NOT_STARTED (attempt 0)
        when the claim is not ours any more. Raises StoreUnavailable."""
        task = attempt.task
        return await self._starts.submit(task.bucket, (task.bucket, task.key, task.token))

    async def park(self, attempt: Attempt) -> bool:
        """Whether the claim was parked (False: not ours any more). Raises StoreUnavailable."""
        return await self._parks.submit(attempt.task.bucket, attempt.claim) == ParkReply.PARKED

    async def record(self, attempt: Attempt, outcome: Outcome, *,
                     failed: Exception | None = None) -> bool:
        """Store the outcome and its history entry. False when it could not be stored before
        the attempt's lease ran out (Redis away: another process re-sends the task).
        ``failed``: the error of a first try made already (``record_soon``)."""
        lease_end = attempt.send_by_ms + attempt.task.timeout_ms
        bucket = attempt.task.bucket
        # An error that is not Redis's may be an outcome of the same batch that cannot be
        # written (a bug): written with it again, this one would fail with it again until its
        # lease ran out, and its task would be sent again. Alone, it is written.
        alone = failed is not None and not isinstance(failed, StoreUnavailable)

        async def write() -> int:
            if alone:
                (reply,) = await self._flush_completes(bucket, [(bucket, outcome)])
                return reply
            return await self._completes.submit(bucket, (bucket, outcome))

        result = await self._keep_trying(write, lease_end, f"outcome of {attempt.task.key}",
                                         failed=failed)
        return self._recorded(attempt, result)

    def record_soon(self, attempt: Attempt, outcome: Outcome) -> asyncio.Future[bool]:
        """``record`` in the background: the future answers what it would. The first try
        is a future of the batch and a callback; only when it fails does a task take over
        (``record``'s retries). A task per outcome, with record's coroutines, cost 17 us
        against 4.5 for a future and a callback (measured alone). Cancelling the future (the
        dispatcher's stop, at the end of its grace period) cancels its retries; a batch that
        took the write already may still send it (fenced by the claim token, as before)."""
        recorded: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        first = self._completes.submit_nowait(attempt.task.bucket,
                                              (attempt.task.bucket, outcome))
        retrying: list[asyncio.Task[bool]] = []

        def answered(reply: asyncio.Future[CompleteReply]) -> None:
            error = None if reply.cancelled() else reply.exception()  # read: never unseen
            if recorded.done():  # given up (shutdown): its lease will do
                return
            if reply.cancelled() or error is not None:
                failed = (error if isinstance(error, Exception)
                          else RuntimeError("its write was cancelled"))
                task = asyncio.create_task(self.record(attempt, outcome, failed=failed))
                self._retrying.add(task)
                task.add_done_callback(self._retrying.discard)
                task.add_done_callback(lambda done: _pass_on(done, recorded, attempt))
                retrying.append(task)
            else:
                recorded.set_result(self._recorded(attempt, reply.result()))

        def given_up(future: asyncio.Future[bool]) -> None:
            if future.cancelled():
                first.cancel()
                for task in retrying:
                    task.cancel()

        first.add_done_callback(answered)
        recorded.add_done_callback(given_up)
        return recorded

    @staticmethod
    def _recorded(attempt: Attempt, result: int | None) -> bool:
        if result == CompleteReply.STALE:
            log.info("outcome of %s dropped: replaced or re-claimed meanwhile",
                     attempt.task.key)
        return result is not None

    def hand_back(self, attempts: Sequence[Attempt], why: str) -> None:
        """Give claims whose attempt was not sent back to the wheel, in the background."""
        for attempt in attempts:
            self._spawn(self._hand_back(attempt))
        self._metrics.skipped.inc(len(attempts))
        self._handed_back += len(attempts)
        if attempts and self._handed_back & (self._handed_back - 1) == 0:  # 1, 2, 4, ...
            log.warning("%d claims handed back so far (now: %s)", self._handed_back, why)

    async def _hand_back(self, attempt: Attempt) -> None:
        # Until the lease would give it back anyway: its end is the latest useful moment.
        lease_end = attempt.send_by_ms + attempt.task.timeout_ms
        await self._keep_trying(lambda: self._releases.submit(attempt.task.bucket,
                                                              attempt.claim),
                                lease_end, f"hand-back of {attempt.task.key}")

    async def _keep_trying(self, write: Callable[[], Awaitable[int]], until_ms: int,
                           what: str, *, failed: Exception | None = None) -> int | None:
        """The write's reply; None if Redis did not answer before ``until_ms``. ``failed``:
        the error of a first try made already (the next one waits RETRY_FIRST_S)."""
        delay = RETRY_FIRST_S
        while True:
            if failed is None:
                try:
                    return await write()
                except Exception as exc:  # StoreUnavailable, or a client library's own
                    # error (redis-py's cluster client raised AttributeError mid-failover)
                    failed = exc
            if self._clock.now_ms() + delay * 1000 > until_ms:
                log.warning("%s not stored, its lease will do: %s", what, failed)
                return None
            failed = None
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def drain(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for the background writes; cancel the rest (their
        leases cover them). Returns how many were cancelled."""
        writes = self._background | self._retrying
        if not writes:
            return 0
        _, late = await asyncio.wait(writes, timeout=max(0.1, timeout))
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        return len(late)

    async def _flush_starts(self, group: int,
                            claims: Sequence[tuple[int, str, str]]) -> list[Started]:
        return await self._store.start_many(claims)

    async def _flush_completes(self, group: int, outcomes: Sequence[tuple[int, Outcome]]
                               ) -> list[CompleteReply]:
        return await self._store.complete_many(outcomes, now_ms=self._clock.now_ms())


def _one_call(bucket: int) -> int:
    return 0


def _pass_on(done: asyncio.Future[bool], recorded: asyncio.Future[bool],
             attempt: Attempt) -> None:
    """``done``'s answer to ``recorded``: an error (a bug: logged) or a cancel as not
    recorded."""
    error = None if done.cancelled() else done.exception()
    if error is not None:
        log.error("recording the outcome of %s failed", attempt.task.key, exc_info=error)
    if not recorded.done():
        recorded.set_result(not done.cancelled() and error is None and done.result())
