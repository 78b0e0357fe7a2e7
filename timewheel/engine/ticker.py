"""Ticker: once a tick, claim every task due before the next tick and hand it to the dispatcher.

``tick()`` is one pass (tests call it directly with a fake clock); ``run()`` is the thin loop
around it. Ticks never overlap: the loop awaits each pass, and a pass that overruns skips the
ticks it covered. While Redis is down the loop backs off and logs once per outage. With
``phases``, the processes of a wheel spread their ticks over the period, so that they share
the claims evenly (timewheel/engine/tick_phase.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
from collections.abc import Iterator

from timewheel.clock import Clock
from timewheel.engine.dispatcher import Dispatcher
from timewheel.engine.soon_claims import SoonClaims
from timewheel.engine.tick_phase import TickPhases
from timewheel.errors import StoreUnavailable
from timewheel.metrics import Metrics
from timewheel.store import Store

log = logging.getLogger(__name__)

LOOKAHEAD_MARGIN_MS = 250  # claims reach this far past the next tick, in case it runs late
MAX_BACKOFF_SECONDS = 5.0
# A bucket's claim not answered in this long is left to finish on its own, and the pass goes
# on with the other buckets: on a Redis Cluster one silent master (stopped, frozen, cut off)
# held the whole wheel for as long as the client kept retrying it, minutes (tests/cluster/
# test_silent_master.py). Claims between ticks (engine/soon_claims.py) are left the same way.
# Until that claim ends, the buckets of its node are skipped, by ticks and by claims between
# them: a pass waits this long once per silent node, not once per bucket. A healthy claim
# takes milliseconds, a loaded one ~100 ms.
CLAIM_WAIT_S = 1.0


def claim_tokens() -> Iterator[str]:
    """Claim tokens: unique per call, across processes and restarts."""
    return (f"{os.getpid()}.{secrets.token_hex(4)}.{n}" for n in itertools.count())


class Ticker:
    def __init__(self, store: Store, clock: Clock, dispatcher: Dispatcher, metrics: Metrics, *,
                 tick_ms: int, claim_batch: int, max_pending: int,
                 tokens: Iterator[str] | None = None,
                 phases: TickPhases | None = None) -> None:
        self._store = store
        self._clock = clock
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._tick_ms = tick_ms
        self._claim_batch = claim_batch
        self._max_pending = max_pending
        self._tokens = tokens or claim_tokens()
        self._phases = phases
        self._stopping = asyncio.Event()
        self.soon: SoonClaims | None = None  # while run() runs
        self._reserved = 0  # room taken by claims under way (_claim_within_room)
        # Claims left to finish on their own: the claim -> its node.
        self._left: dict[asyncio.Task[tuple[bool, int]], str] = {}
        self._partial = 0  # passes in a row that failed in some buckets, not all

    async def tick(self) -> int:
        """Claim what falls due by the next tick (plus a margin); returns how many.

        Buckets are claimed one after another in batches of ``claim_batch``, not all at once:
        each reply is handed over before the next call, so the event loop keeps firing due
        tasks between batches instead of stalling on a thousand claims at a time. Each call
        reads the clock afresh: a slow pass must not claim later buckets with a stale "now"
        (their tasks would miss their start and be handed back)."""
        claimed = 0
        failed: list[tuple[int, Exception]] = []
        buckets = self._store.keys.buckets
        full = False
        for bucket in range(buckets):
            if full:
                break  # bounded work: the rest waits in Redis for the next tick
            if self._held_up(bucket):  # its node has a claim out that did not answer
                failed.append((bucket, StoreUnavailable(
                    f"claim of bucket {bucket}: its Redis node left a claim unanswered for "
                    f"over {CLAIM_WAIT_S:g} s")))
                continue
            more = True
            while more and not self._stopping.is_set():
                try:
                    within = await self._claim_within_room(bucket)
                except Exception as exc:  # one bucket must not stop the others
                    # A slot half-moved on a cluster, one master refusing: the other buckets
                    # (other slots, other masters) are claimed all the same (the soak found a
                    # redis-py AttributeError on ASKING stopping every bucket after it).
                    failed.append((bucket, exc))
                    break
                if within is None:
                    full = True
                    break
                more, count = within
                claimed += count
        if len(failed) == buckets:
            raise failed[0][1]  # nothing answered: Redis is down, run() backs off
        self._note_partial(failed, buckets)
        return claimed

    def _note_partial(self, failed: list[tuple[int, Exception]], buckets: int) -> None:
        """Count and log a pass that failed in some buckets (one master refusing, a full
        Redis refusing the buckets that hold tasks): a line at the 1st, 2nd, 4th, ... such
        pass in a row, not one a tick, and one when every bucket is claimed again."""
        if not failed:
            if self._partial:
                log.warning("every bucket claimed again, after %d passes that failed in part",
                            self._partial)
                self._partial = 0
            return
        self._metrics.tick_errors.inc()
        self._partial += 1
        if self._partial & (self._partial - 1) == 0:
            first_bucket, first = failed[0]
            log.warning("claiming %d of %d buckets failed (bucket %d: %s: %s); the others "
                        "were claimed (%d passes in a row)", len(failed), buckets,
                        first_bucket, type(first).__name__, first, self._partial)

    def _held_up(self, bucket: int) -> bool:
        """Whether the node of ``bucket`` has a claim out that was left (CLAIM_WAIT_S)."""
        if not self._left:
            return False
        return self._store.node_of(bucket) in self._left.values()

    async def _claim_within_room(self, bucket: int) -> tuple[bool, int] | None:
        """One claim of up to ``claim_batch`` tasks, no more than the dispatcher has room for
        (None: no room; (False, 0) while the bucket's node is held up).

        The room a claim takes is reserved while it is out, so claims under way at once (a
        tick's, those between ticks) keep max_pending. A claim not answered in CLAIM_WAIT_S is
        left to finish on its own: its room is given back (a silent master must not hold it
        for minutes and starve the others; when it does answer, it passes max_pending by one
        batch at most, one left claim a node), the buckets of its node are skipped until it
        ends, and this raises StoreUnavailable."""
        if self._held_up(bucket):
            return False, 0
        room = self._max_pending - self._dispatcher.holding - self._reserved
        if room <= 0:
            return None
        limit = min(self._claim_batch, room)
        self._reserved += limit
        reserved = [limit]

        def give_back(_: object = None) -> None:
            self._reserved -= reserved[0]
            reserved[0] = 0

        claim = asyncio.ensure_future(self._claim(bucket, limit))
        claim.add_done_callback(give_back)  # before the waiter below wakes
        try:
            done, _ = await asyncio.wait({claim}, timeout=CLAIM_WAIT_S)
        except BaseException:  # cancelled (shutdown): the claim goes with it
            claim.cancel()
            raise
        if not done:
            node = self._store.node_of(bucket)
            if node not in self._left.values():
                give_back()  # one left claim a node passes max_pending; more keep their room
            self._left[claim] = node
            claim.add_done_callback(self._answered)
            raise StoreUnavailable(f"claim of bucket {bucket}: no answer in {CLAIM_WAIT_S:g} "
                                   "s; left to finish on its own")
        return claim.result()

    def _answered(self, claim: asyncio.Task[tuple[bool, int]]) -> None:
        """A claim left to finish on its own ended: its node is no longer held up."""
        self._left.pop(claim, None)
        if not claim.cancelled() and (exc := claim.exception()) is not None:
            log.warning("a claim left to finish on its own failed: %s: %s",
                        type(exc).__name__, exc)

    async def _claim(self, bucket: int, limit: int) -> tuple[bool, int]:
        now = self._clock.now_ms()
        horizon = now + self._tick_ms + LOOKAHEAD_MARGIN_MS
        more, tasks = await self._store.claim(bucket, now_ms=now, horizon_ms=horizon,
                                              limit=limit, token=next(self._tokens))
        self._dispatcher.submit(tasks, now)
        self._metrics.claimed.inc(len(tasks))
        return more, len(tasks)

    async def _pass(self) -> float:
        """One pass of ``run``: a tick, then the flows' poll; how much earlier the next pass
        should come (ms)."""
        if not self._store.ready:
            await self._store.init()
        await self._clock.refresh()
        tick_at = self._clock.now_ms()
        await self.tick()
        await self._dispatcher.poll_flows(self._tick_ms)
        return 0.0 if self._phases is None else await self._phases.note(tick_at)

    async def run(self) -> None:
        """Tick every ``tick_ms`` until ``stop()``; between ticks, claim the tasks made due
        before the next one as the store tells of them (engine/soon_claims.py)."""
        self.soon = soon = SoonClaims(self._clock, tick_ms=self._tick_ms,
                                      claim=self._claim_within_room)
        listening, self._store.due_soon = self._store.due_soon, soon.told
        claiming = asyncio.create_task(soon.run(), name="timewheel-soon")
        try:
            await self._run()
        finally:
            self._store.due_soon = listening
            soon.stop()
            try:  # first: its claim under way may yet be left (CLAIM_WAIT_S at most)
                await claiming
            except Exception:  # never in the way of the shutdown that follows
                log.exception("claims between ticks failed")
            # Claims left to finish on their own: given up (what one claimed in Redis comes
            # back when its lease runs out, as after a crash).
            left = list(self._left)
            for claim in left:
                claim.cancel()
            await asyncio.gather(*left, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        failures = 0
        while not self._stopping.is_set():
            earlier_ms = 0.0
            try:
                earlier_ms = await self._pass()
            except StoreUnavailable as exc:
                self._metrics.tick_errors.inc()
                if failures == 0:
                    log.error("Redis unavailable, ticker backing off until it returns: %s", exc)
                failures += 1
            except Exception:  # one bad pass must not stop the wheel
                self._metrics.tick_errors.inc()
                log.exception("ticker pass failed")
                failures += 1
            else:
                if failures:
                    log.warning("Redis answers again after %d failed ticks; ticker resumed",
                                failures)
                failures = 0
            self._metrics.ticks.inc()
            period = self._tick_ms / 1000.0
            if failures:
                period = min(MAX_BACKOFF_SECONDS, period * 2 ** min(failures - 1, 8))
            next_at = max(next_at + period - earlier_ms / 1000.0, loop.time())
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=next_at - loop.time())
            except TimeoutError:
                pass

    def stop(self) -> None:
        self._stopping.set()
