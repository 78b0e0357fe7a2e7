"""FlowGate: an attempt starts only with a permit of its flow (API.md, "Flow control").

It sits between the timeline and the workers. A claimed task that falls due asks its flow for
a permit (lua/permits.lua: parallelism and rate over every process of the wheel). Granted, it
goes on to be sent, and the permit is given back after the answer. Refused, it waits: in this
process for a short while (at most ``local_cap`` tasks per flow, and never past its park
deadline, which comes before its claim's lease could run out), then parked in Redis
(lua/park.lua), where waiting holds no lease, no worker, no connection and no claim budget,
and costs one sorted-set entry. Parked tasks are taken back (lua/unpark.lua) by whichever
process finds room in their flow: after giving back a permit, when a rate window reopens, or
at each tick.

Redis calls are batched per flow: what one event-loop iteration gives back and asks for goes
to Redis as one permits call, so a busy flow costs one round trip per batch, not two per
attempt. A permit of a flow without a rate is handed straight to the next waiter of its flow
in this process while its lease leaves room for that attempt (``PERMIT_REUSE_MS``), so a
saturated flow does not pay a round trip per attempt either; with no waiter, it is kept a
moment for the flow's next task (timewheel/engine/spare_permits.py). A flow in trouble only
ever makes its own tasks wait.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterator

from timewheel.clock import Clock
from timewheel.engine.flow_state import MAX_WANT, FlowState, Lease, Waiter
from timewheel.engine.spare_permits import SparePermits
from timewheel.engine.timeline import Timeline
from timewheel.errors import StoreUnavailable
from timewheel.metrics import Metrics
from timewheel.store import Store
from timewheel.store.flow_store import FlowStore, new_permit_id
from timewheel.store.record import ClaimedTask

log = logging.getLogger(__name__)

UNPARK_BATCH = 256  # parked tasks taken back in one go
SCAN_FLOWS = 256  # flows with parked tasks read per bucket per tick
RETRY_MS = 200  # after a failed permits call
# A task taken back from Redis starts this long after its permit (the rate log counts it
# then): time for the unpark and start round trips, so it never starts before it is logged.
UNPARK_START_MS = 50
# A permit's lease covers its attempt (timeout + lease margin) and this much more, so that it
# can be handed to the next waiter of its flow here without asking Redis. A process that dies
# holds its permits that much longer.
PERMIT_REUSE_MS = 10_000


class FlowGate:
    def __init__(self, flows: FlowStore, store: Store, clock: Clock, metrics: Metrics, *,
                 start: Callable[[object, str, int], None],
                 park: Callable[[list[Waiter]], None],
                 adopt: Callable[[ClaimedTask, str, int], None],
                 tokens: Iterator[str], lease_margin_ms: int, max_lease_ms: int,
                 local_cap: int, max_waiting: int) -> None:
        self._flows = flows
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._start = start  # (payload, permit, start ms): go on, send no earlier than that
        self._park = park  # set these waiters aside in Redis
        self._adopt = adopt  # (task, permit, start ms): an unparked task, permit held
        self._tokens = tokens
        self._lease_margin_ms = lease_margin_ms
        self._max_lease_ms = max_lease_ms
        self._local_cap = local_cap
        self._max_waiting = max_waiting
        self._states: dict[str, FlowState] = {}
        self._waiting = 0
        self._to_park: list[Waiter] = []
        self._stopping = False  # drained: start nothing new (no hand-over, no unpark)
        self._closed = False
        self._leases: dict[str, Lease] = {}  # the permits this process holds
        # Park deadlines and rate windows reopening, on the wheel's clock.
        self._alarms: Timeline[str] = Timeline(clock, self._alarm)
        self._spares = SparePermits(clock, self._leases, lease_margin_ms=lease_margin_ms,
                                    flow=self._states.get, release=self._release)

    def rated(self, flow: str) -> bool:
        """Whether the flow had a rate at its last permits call (True when not known)."""
        state = self._states.get(flow)
        return state is None or state.rated

    @property
    def waiting(self) -> int:
        """Tasks waiting in this process for a permit."""
        return self._waiting

    def _flow(self, key: str) -> FlowState:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = FlowState(key)
        return state

    # -- what the dispatcher calls ----------------------------------------------------------

    def admit(self, task: ClaimedTask, payload: object, park_by_ms: float) -> None:
        """A task is due: send it once its flow grants a permit."""
        state = self._flow(task.flow)
        if state.spare and not state.queue:
            permit = self._spares.take(state, task.timeout_ms)
            if permit is not None:
                self._start(payload, permit, max(self._clock.now_ms(), task.due_ms))
                return
        if len(state.queue) >= self._local_cap or self._waiting >= self._max_waiting:
            # Enough of this flow waits here already: wait in Redis, holding nothing.
            self._park_soon([Waiter(task, payload, "", park_by_ms)])
            return
        state.queue.append(Waiter(task, payload, new_permit_id(), park_by_ms))
        self._waiting += 1
        self._metrics.flow_waiting.set(self._waiting)
        self._kick(state)

    def give_back(self, flow: str, permit: str) -> None:
        """The attempt holding ``permit`` is over (or never started): the next waiter of the
        flow here takes it over when that is safe, else it goes back to Redis."""
        state = self._flow(flow)
        lease = self._leases.pop(permit, None)
        if (lease is not None and state.queue and not state.rated and state.room >= 0
                and not self._stopping
                and not (state.parked_buckets and state.parked_due < state.queue[0].task.due_ms)):
            waiter = state.queue[0]
            now = self._clock.now_ms()
            # Not for a rated flow: every start must be logged in Redis. Not when the flow
            # holds more than its (lowered) parallelism, nor when older tasks of it are
            # parked. Only if the lease outlasts the whole attempt with its margin, as a fresh
            # one would.
            if lease.expiry_ms - now >= waiter.task.timeout_ms + self._lease_margin_ms:
                state.queue.popleft()
                waiter.gone = waiter.handed_on = True  # its own permit, if granted, is unused
                self._waiting -= 1
                self._leases[permit] = lease
                self._start(waiter.payload, permit, max(now, waiter.task.due_ms))
                return
        if lease is not None and not self._stopping and self._spares.keep(state, permit, lease):
            return
        self._release(state, [permit])

    def _release(self, state: FlowState, permits: list[str]) -> None:
        state.releases.extend(permits)
        self._kick(state)

    def parked(self, flow: str, bucket: int, due_ms: float = float("inf")) -> None:
        """A task of ``flow`` due at ``due_ms`` was parked in ``bucket``: take it back when
        there is room."""
        state = self._flow(flow)
        state.parked_due = min(state.parked_due, due_ms)
        self._spares.give_back(state, stale_only=False)  # the parked tasks come first
        if bucket not in state.parked_buckets:
            state.parked_buckets.add(bucket)
            self._kick(state)  # there may be room already (a permit came back meanwhile)

    async def poll(self) -> None:
        """Once a tick: permits given back by other processes, and parked tasks anywhere."""
        found = await asyncio.gather(*(self._store.parked_flows(bucket, SCAN_FLOWS)
                                       for bucket in range(self._store.keys.buckets)))
        for bucket, rows in enumerate(found):
            for flow, due in rows:
                self.parked(flow, bucket, due)
        for key, state in list(self._states.items()):
            if state.idle:
                del self._states[key]
            elif state.queue or state.parked_buckets:
                self._kick(state)

    def drain(self) -> list[Waiter]:
        """Shutdown: take every waiter out (the caller hands their claims back); a permit
        granted to one of them meanwhile is given back."""
        self._stopping = True
        waiters = []
        for state in self._states.values():
            # At once: close() comes only after the attempts in flight, up to the grace period.
            self._spares.give_back(state, stale_only=False)
            for waiter in state.queue:
                waiter.gone = True
                state.releases.append(waiter.permit)  # in case a reply on its way granted it
                waiters.append(waiter)
            state.queue.clear()
        self._waiting = 0
        self._metrics.flow_waiting.set(0)
        return waiters

    async def close(self) -> None:
        """Stop, after ``drain``: give back the permits still to give back, once."""
        self._closed = True  # from now on a permit given back waits for its lease
        await self._alarms.close()
        await self._spares.close()
        running = [s.running for s in self._states.values() if s.running is not None]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for state in self._states.values():
            if state.releases:
                try:
                    await self._flows.permits(state.key, now_ms=self._clock.now_ms(),
                                              lease_ms=1, release=state.releases)
                except StoreUnavailable:
                    pass  # Redis (or its clock) unreachable: their leases give them back
        self._states.clear()

    # -- the per-flow exchange with Redis ---------------------------------------------------

    def _kick(self, state: FlowState) -> None:
        if self._closed:
            return  # a permit given back after close: its lease returns it
        if state.running is not None:
            state.dirty = True  # the running exchange goes round once more
            return
        state.running = asyncio.create_task(self._exchange(state))

    async def _exchange(self, state: FlowState) -> None:
        try:
            state.dirty = True
            while state.dirty:
                state.dirty = False
                await self._exchange_once(state)
        except StoreUnavailable as exc:
            log.warning("flow %s: permits unavailable, waiting: %s", state.key, exc)
            self._alarm_at(state, self._clock.wall_ms() + RETRY_MS)
        except Exception:  # one bad exchange must not stop the flow: retry soon
            log.exception("flow %s: permit exchange failed", state.key)
            self._alarm_at(state, self._clock.wall_ms() + RETRY_MS)
        finally:
            state.running = None

    async def _exchange_once(self, state: FlowState) -> None:
        """One permits call: give back what finished, then ask for the waiters here or for
        parked tasks of the flow (then taken back from Redis), whichever are older."""
        releases, state.releases = state.releases, []
        waiters, unparking, want, lease = self._wanted(state, len(releases))
        if not releases and not want:
            return
        now = self._clock.now_ms()
        try:
            reply = await self._flows.permits(state.key, now_ms=now, lease_ms=lease,
                                              release=releases, want=want)
        except BaseException:  # unavailable, or cancelled by close(), which sends them
            state.releases[:0] = releases  # try again; their leases bound the damage
            raise
        state.rated, state.room = reply.rated, reply.room
        if state.spare and (state.rated or state.room < 0):
            self._spares.give_back(state, stale_only=False)  # a rate, or over a lowered limit
        if waiters:
            self._hand_over(state, waiters, want[:reply.granted], Lease(now + lease, now))
        elif unparking and reply.granted:
            await self._unpark(state, [permit for permit, _ in want[:reply.granted]],
                               want[0][1], granted_ms=now)
        if reply.room > 0 and (state.queue or (state.parked_buckets and not self._stopping)):
            state.dirty = True  # room left for more than was asked: go round again
        if reply.wait_ms > 0 and (state.queue or state.parked_buckets):
            self._alarm_at(state, self._clock.wall_ms() + reply.wait_ms)  # rate window
        if state.queue:
            # Waiters come in due order, so the head's deadline is (about) the earliest; an
            # alarm parks every waiter whose deadline has come.
            self._alarm_at(state, state.queue[0].park_by_ms)

    def _wanted(self, state: FlowState, releasing: int
                ) -> tuple[list[Waiter], bool, list[tuple[str, int]], int]:
        """What to ask for: (waiters asked for, or unparking), the (permit, start) pairs and
        the lease. Asks for what can be had: the room left last time plus what is given back
        now (one more, to notice a limit raised meanwhile), not a whole queue each time."""
        asked = min(MAX_WANT, max(0, state.room) + releasing + 1)
        waiters = list(itertools.islice(state.queue, asked))
        # Parked tasks go first when they are older than the waiters here (a flow overloaded
        # for long must not keep its oldest tasks in Redis while newer ones go out).
        unparking = bool(state.parked_buckets) and not self._stopping and (
            not waiters or state.parked_due < waiters[0].task.due_ms)
        now = self._clock.now_ms()
        if unparking:
            start = now + UNPARK_START_MS if state.rated else now
            return ([], True, [(new_permit_id(), start) for _ in range(min(UNPARK_BATCH, asked))],
                    self._max_lease_ms)
        if not waiters:
            return [], False, [], self._max_lease_ms
        # Waiters are handed over a few ms before they are due and start at their due time:
        # the rate log must count them when they start, not when let through.
        want = [(w.permit, max(now, w.task.due_ms)) for w in waiters]
        return (waiters, False, want, self._lease_margin_ms + PERMIT_REUSE_MS
                + max(w.task.timeout_ms for w in waiters))

    def _hand_over(self, state: FlowState, waiters: list[Waiter], granted: list[tuple[str, int]],
                   lease: Lease) -> None:
        """Start the waiters whose permits were granted (the first ones asked for)."""
        unused = []
        for waiter, (permit, start) in zip(waiters, granted, strict=False):
            if waiter.handed_on:  # started on a permit handed on while the call was out
                unused.append(permit)
                continue
            if waiter.gone:  # parked while the call was out: its permit is being given back
                state.releases.append(permit)
                state.dirty = True
                continue
            # Still waiting, so at the head: removals keep the order, admissions append.
            if state.queue and state.queue[0] is waiter:
                state.queue.popleft()
            else:
                state.queue.remove(waiter)
            self._waiting -= 1
            self._leases[permit] = lease
            self._start(waiter.payload, permit, start)
        self._metrics.flow_waiting.set(self._waiting)
        for permit in unused:  # fresh: worth keeping for the flow's next task, if allowed
            if self._stopping or not self._spares.keep(state, permit, lease):
                state.releases.append(permit)
                state.dirty = True

    async def _unpark(self, state: FlowState, held: list[str], start: int, *,
                      granted_ms: int) -> None:
        """Take back as many of the flow's earliest parked tasks, over all buckets, as there
        are permits in ``held`` (granted at ``granted_ms``); give back the permits left over."""
        now = self._clock.now_ms()
        buckets = sorted(state.parked_buckets)
        peeks = await asyncio.gather(*(self._store.peek_parked(bucket, state.key, len(held))
                                       for bucket in buckets))
        earliest = sorted((due, bucket) for bucket, dues in zip(buckets, peeks, strict=True)
                          for due in dues)[:len(held)]
        wanted: dict[int, int] = {}
        for _, bucket in earliest:
            wanted[bucket] = wanted.get(bucket, 0) + 1
        for bucket, dues in zip(buckets, peeks, strict=True):
            if not dues:
                state.parked_buckets.discard(bucket)
        rest = sorted(due for dues in peeks for due in dues)[len(held):]
        state.parked_due = rest[0] if rest else float("inf")
        results = await asyncio.gather(*(
            self._store.unpark(bucket, state.key, limit=count, token=next(self._tokens),
                               now_ms=now) for bucket, count in wanted.items()))
        adopted = 0
        for bucket, (more, tasks) in zip(wanted, results, strict=True):
            if not more:
                state.parked_buckets.discard(bucket)
            for task in tasks:
                self._leases[held[adopted]] = Lease(granted_ms + self._max_lease_ms, granted_ms)
                self._adopt(task, held[adopted], start)
                adopted += 1
        self._metrics.flow_unparked.inc(adopted)
        if adopted < len(held):  # taken by another process meanwhile: give the rest back
            state.releases.extend(held[adopted:])
            state.dirty = True
        elif state.parked_buckets:
            state.dirty = True  # more may fit: ask again

    def _alarm_at(self, state: FlowState, when_ms: float) -> None:
        """Call ``_alarm`` for the flow at ``when_ms`` (one pending alarm per flow: the
        earliest; the exchange it triggers sets the next)."""
        if state.alarm_ms is None or when_ms < state.alarm_ms:
            state.alarm_ms = when_ms
            self._alarms.add(when_ms, state.key)

    def _alarm(self, flow: str) -> None:
        """A park deadline or a rate window: park who must, and ask again."""
        state = self._states.get(flow)
        now = self._clock.wall_ms()
        if state is None or (state.alarm_ms is not None and state.alarm_ms > now):
            return  # a later alarm is pending: that one asks again
        state.alarm_ms = None
        due = []
        while state.queue and state.queue[0].park_by_ms <= now:  # in deadline order, ~
            waiter = state.queue.popleft()
            waiter.gone = True
            due.append(waiter)
        if due:
            # Not granted as far as this process knows; a reply lost on the way may have.
            state.releases.extend(w.permit for w in due)
            self._waiting -= len(due)
            self._metrics.flow_waiting.set(self._waiting)
            self._park_soon(due)
        self._kick(state)

    def _park_soon(self, waiters: list[Waiter]) -> None:
        """Park at the end of this event-loop iteration, all of it in one go: a burst turns
        thousands of waiters away at once."""
        if not self._to_park:
            asyncio.get_running_loop().call_soon(self._park_now)
        self._to_park.extend(waiters)

    def _park_now(self) -> None:
        waiters, self._to_park = self._to_park, []
        self._park(waiters)
