"""Parking: waiting for a flow in Redis rather than in this process (the flow gate's, in
timewheel/engine/flow_gate.py).

An attempt that cannot wait here for a permit of its flow (too many wait here, its park
deadline came, or its flow is paused) is parked (lua/park.lua): its claim goes, and in Redis
it holds no lease, no worker, no connection and no claim budget. Parked tasks are taken back
(lua/unpark.lua) by whichever process holds permits of their flow for them, earliest first
over every bucket, as new claims with new attempts.

``Parking`` makes these Redis calls and moves the attempts' stages; the flow gate decides when,
and keeps per flow where its parked tasks are (``FlowState.parked_buckets``, ``parked_due``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from timewheel.clock import Clock
from timewheel.engine.attempt import Attempt, Lifecycle, Stage
from timewheel.engine.flow_state import FlowState
from timewheel.engine.recorder import Recorder
from timewheel.metrics import Metrics
from timewheel.store import Store

log = logging.getLogger(__name__)

SCAN_FLOWS = 256  # flows with parked tasks read per bucket per tick


class Parking:
    def __init__(self, store: Store, recorder: Recorder, lifecycle: Lifecycle, clock: Clock,
                 metrics: Metrics, *, tokens: Iterator[str], batch_deadline_ms: int,
                 lease_margin_ms: int) -> None:
        self._store = store
        self._recorder = recorder
        self._lifecycle = lifecycle
        self._clock = clock
        self._metrics = metrics
        self._tokens = tokens
        self._batch_deadline_ms = batch_deadline_ms
        self._lease_margin_ms = lease_margin_ms

    async def park(self, attempts: list[Attempt]) -> list[Attempt]:
        """Park the attempts (waiting for their flow, holding no permit); which were parked.
        park.lua answers per claim: one cancelled or replaced meanwhile is SKIPPED, and one
        whose call failed is HANDED_BACK; neither stops the others."""
        results = await asyncio.gather(*(self._recorder.park(a) for a in attempts),
                                       return_exceptions=True)
        # Any error (Redis away, or a library's own): not parked as far as we know, so the
        # claim goes back to the wheel (release.lua answers 0 if it was parked after all).
        parked, unparked = [], []
        for attempt, result in zip(attempts, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("could not park %s; handing it back: %s", attempt.task.key, result)
                self._lifecycle.move(attempt, Stage.HANDED_BACK)
                unparked.append(attempt)
            elif result:
                self._lifecycle.move(attempt, Stage.PARKED)
                parked.append(attempt)
            else:  # cancelled or replaced meanwhile
                self._lifecycle.move(attempt, Stage.SKIPPED)
        self._metrics.flow_parked.inc(len(parked))
        if unparked:
            self._recorder.hand_back(unparked, "could not park")
        return parked

    async def flows(self) -> list[tuple[str, int, int]]:
        """Flows with parked tasks, any process's: (flow, bucket, due time of its earliest
        there), up to SCAN_FLOWS per bucket."""
        found = await asyncio.gather(*(self._store.parked_flows(bucket, SCAN_FLOWS)
                                       for bucket in range(self._store.keys.buckets)))
        return [(flow, bucket, due) for bucket, rows in enumerate(found) for flow, due in rows]

    async def take_back(self, state: FlowState, count: int) -> list[Attempt]:
        """Claim the flow's ``count`` earliest parked tasks, over all buckets (the caller holds
        a permit for each), as new attempts waiting for their flow, and note in ``state``
        which buckets still hold some. Fewer when other processes took some meanwhile."""
        now = self._clock.now_ms()
        buckets = sorted(state.parked_buckets)
        peeks = await asyncio.gather(*(self._store.peek_parked(bucket, state.key, count)
                                       for bucket in buckets))
        earliest = sorted((due, bucket) for bucket, dues in zip(buckets, peeks, strict=True)
                          for due in dues)[:count]
        wanted: dict[int, int] = {}
        for _, bucket in earliest:
            wanted[bucket] = wanted.get(bucket, 0) + 1
        for bucket, dues in zip(buckets, peeks, strict=True):
            if not dues:
                state.parked_buckets.discard(bucket)
        rest = sorted(due for dues in peeks for due in dues)[count:]
        state.parked_due = rest[0] if rest else float("inf")
        results = await asyncio.gather(*(
            self._store.unpark(bucket, state.key, limit=taken, token=next(self._tokens),
                               now_ms=now) for bucket, taken in wanted.items()))
        adopted = []
        for bucket, (more, tasks) in zip(wanted, results, strict=True):
            if not more:
                state.parked_buckets.discard(bucket)
            for task in tasks:
                attempt = self._lifecycle.add(Attempt.claimed(
                    task, now, batch_deadline_ms=self._batch_deadline_ms,
                    lease_margin_ms=self._lease_margin_ms))
                self._lifecycle.move(attempt, Stage.WAITING_FOR_FLOW)
                adopted.append(attempt)
        self._metrics.claimed.inc(len(adopted))
        self._metrics.flow_unparked.inc(len(adopted))
        return adopted
