"""Spare permits: a permit of a flow without a rate, given back while no task of the flow
waits in this process, is kept a moment (at most ``SPARE_MS`` after Redis granted it) for the
flow's next task. A flow whose callbacks come one at a time otherwise costs two permits calls
per callback (take, give back), half of its Redis calls: with spares, 10,000 callbacks over
10 s made 1,574 permits calls instead of 12,848, and Redis used 20-29 % less CPU
(bench/README.md, "Spare permits").

A spare is still held in Redis, so it counts against the flow's parallelism (and shows in
``GET /flows`` as in flight): no limit in force at its grant is exceeded. A limit set meanwhile
reaches it when it goes back, at most ``SPARE_MS`` after its grant (starts made on it until
then are not in the log of a rate set meanwhile: docs/design.md). A flow known to be rated
keeps no spares, since every start of it must be logged in Redis.
"""

from __future__ import annotations

from collections.abc import Callable

from timewheel.clock import Clock
from timewheel.engine.flow_state import FlowState, Lease
from timewheel.engine.timeline import Timeline

SPARE_MS = 250
SPARE_CAP = 16  # spare permits kept per flow (and at most half the room Redis last reported)


class SparePermits:
    def __init__(self, clock: Clock, leases: dict[str, Lease], *, lease_margin_ms: int,
                 flow: Callable[[str], FlowState | None],
                 release: Callable[[FlowState, list[str]], None]) -> None:
        self._clock = clock
        self._leases = leases  # the gate's: every permit this process holds
        self._lease_margin_ms = lease_margin_ms
        self._flow = flow  # the flow's state, if the gate still has one
        self._release = release  # give permits back to Redis (the gate's next permits call)
        self._alarms: Timeline[str] = Timeline(clock, self._expire)

    def keep(self, state: FlowState, permit: str, lease: Lease) -> bool:
        """Keep ``permit``, just given back, for the flow's next task, if that is safe and
        fair: no rate, no task of the flow waiting here or parked (those come first), the
        permit is fresh, and the spares stay under half the room Redis reported at the flow's
        last permits call, so that other processes find room too (a flow of parallelism 1 or
        2 keeps none)."""
        if (state.rated or state.queue or state.parked_buckets
                or len(state.spare) >= min(SPARE_CAP, state.room // 2)):
            return False
        until = lease.granted_ms + SPARE_MS
        if until <= self._clock.wall_ms():
            return False
        state.spare.append(permit)
        self._leases[permit] = lease
        if state.spare_alarm_ms is None or until < state.spare_alarm_ms:
            state.spare_alarm_ms = until
            self._alarms.add(until, state.key)
        return True

    def take(self, state: FlowState, timeout_ms: int) -> str | None:
        """A spare permit for a task of the flow with this timeout: fresh, and its lease
        outlasts the attempt with its margin, as a fresh one would. None: ask Redis."""
        if state.rated or state.room < 0 or state.parked_buckets:
            self.give_back(state, stale_only=False)  # limits changed: they go back
            return None
        self.give_back(state, stale_only=True)
        now = self._clock.wall_ms()
        for index in range(len(state.spare) - 1, -1, -1):  # the newest first
            permit = state.spare[index]
            if self._leases[permit].expiry_ms - now >= timeout_ms + self._lease_margin_ms:
                del state.spare[index]
                return permit
        # None outlasts this attempt: they go back, so that it need not wait behind them.
        self.give_back(state, stale_only=False)
        return None

    def give_back(self, state: FlowState, *, stale_only: bool) -> None:
        """Give the flow's spares back to Redis: those kept ``SPARE_MS`` past their grant,
        or all of them."""
        if not state.spare:
            return
        now = self._clock.wall_ms()
        going = [p for p in state.spare
                 if not stale_only or self._leases[p].granted_ms + SPARE_MS <= now]
        if not going:
            return
        state.spare = [p for p in state.spare if p not in going]
        for permit in going:
            del self._leases[permit]
        self._release(state, going)

    def _expire(self, flow: str) -> None:
        state = self._flow(flow)
        if state is None:
            return
        state.spare_alarm_ms = None
        self.give_back(state, stale_only=True)
        if state.spare:
            until = min(self._leases[p].granted_ms for p in state.spare) + SPARE_MS
            state.spare_alarm_ms = until
            self._alarms.add(until, flow)

    async def close(self) -> None:
        await self._alarms.close()
