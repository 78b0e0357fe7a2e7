"""FlowGate: an attempt is sent only with a permit of its flow (docs/api.md, "Flow control").

An attempt that falls due asks its flow for a permit (lua/permits.lua: parallelism and rate
over every process of the wheel). Granted, it moves to ADMITTED and into the ready queue,
where a worker takes it; the worker gives the permit back after the answer. Refused, it waits
here (WAITING_FOR_FLOW) for a short while: at most ``local_cap`` attempts per flow, and never
past its park deadline, which comes before its claim's lease could run out. Then it is parked
in Redis, where waiting holds no lease, no worker, no connection and no claim budget. Parked
tasks are taken back by whichever process finds room in their flow: after giving back a
permit, when a rate window reopens, or at each tick. The gate decides when; the park and
unpark calls themselves are timewheel/engine/parking.py.

A paused flow (POST /flows/{key}/pause) is a flow whose permits call grants nothing: its due
attempts wait here and are parked like those of a full flow, nothing is handed on, and on
resume the parked ones come back earliest first, as when a full flow gets room again.

Each tick (``poll``) the process reports how many attempts wait here per flow
(timewheel/engine/waiting_report.py), so GET /flows counts them with the parked ones.

Redis calls are batched per flow: what one event-loop iteration gives back and asks for goes
to Redis as one permits call, and a permit that no attempt here needs goes back with the
flow's next call (RELEASE_LINGER_S at most). A permit of a flow without a rate is handed
straight to the next waiter of its flow here while its lease leaves room for that attempt,
so a saturated flow does not pay a round trip per attempt. A flow in trouble only makes its
own tasks wait.

Which attempts wait: those in a flow's ``queue``, in stage WAITING_FOR_FLOW, each with the
permit id it asked for in ``attempt.permit``. An attempt leaves the queue admitted (its
permit granted or handed on), parked, or drained at shutdown; a grant that arrives for an
attempt that has left (or now holds another permit) is given back.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterator

from timewheel.clock import Clock
from timewheel.engine.attempt import Attempt, Lifecycle, Stage
from timewheel.engine.flow_state import MAX_WANT, FlowState, Lease, Release
from timewheel.engine.parking import Parking
from timewheel.engine.recorder import Recorder
from timewheel.engine.timeline import Timeline
from timewheel.engine.waiting_report import WaitingReport
from timewheel.errors import StoreUnavailable
from timewheel.metrics import Metrics
from timewheel.store import Store
from timewheel.store.flow_store import FlowStore, new_permit_id

log = logging.getLogger(__name__)

UNPARK_BATCH = 256  # parked tasks taken back in one go
RETRY_MS = 200  # after a failed permits call
# A task taken back from Redis starts this long after its permit (the rate log counts it
# then): time for the unpark and start round trips, so it never starts before it is logged.
UNPARK_START_MS = 50
# A permit's lease covers its attempt (timeout + lease margin) and this much more, so that it
# can be handed to the next waiter of its flow here without asking Redis. A process that dies
# holds its permits that much longer.
PERMIT_REUSE_MS = 10_000
# A permit nobody here waits for goes back to Redis with the flow's next permits call, or
# alone after this long: longer than the 5 ms between grid points (the due attempts of one ask
# in one call), so while a flow has attempts due every grid point its permits all ride along,
# one permits call per grid point instead of one more per answered callback (bench/README.md,
# "Permits given back together"). Short, because attempts of the flow in other processes may
# be refused meanwhile, and then wait for their process's next call (a tick at most).
RELEASE_LINGER_S = 0.01


class FlowGate:
    def __init__(self, flows: FlowStore, store: Store, recorder: Recorder,
                 lifecycle: Lifecycle, ready: asyncio.Queue[Attempt], clock: Clock,
                 metrics: Metrics, *, tokens: Iterator[str], lease_margin_ms: int,
                 batch_deadline_ms: int, local_cap: int, max_waiting: int) -> None:
        self._flows = flows
        self._lifecycle = lifecycle
        self._ready = ready  # admitted attempts go here, for the dispatcher's workers
        self._clock = clock
        self._metrics = metrics
        self._lease_margin_ms = lease_margin_ms
        self._max_lease_ms = batch_deadline_ms + lease_margin_ms
        self._local_cap = local_cap
        self._max_waiting = max_waiting
        self._states: dict[str, FlowState] = {}
        self._report = WaitingReport(flows, clock)
        self._leases: dict[str, Lease] = {}  # the permits this process holds
        self._parking = Parking(store, recorder, lifecycle, clock, metrics, tokens=tokens,
                                batch_deadline_ms=batch_deadline_ms,
                                lease_margin_ms=lease_margin_ms)
        self._to_park: list[Attempt] = []
        self._park_calls: set[asyncio.Task[None]] = set()  # parking under way
        self._stopping = False  # drained: admit nothing more (no hand-on, no unpark)
        self._closed = False  # closed: no more permits calls
        # Park deadlines and rate windows reopening, on the wheel's clock.
        self._alarms: Timeline[str] = Timeline(clock, self._alarm)
        # Read when scraped; the counts alone (not the gate) are what the gauge keeps alive.
        counts = lifecycle.counts
        metrics.flow_waiting.set_function(lambda: counts[Stage.WAITING_FOR_FLOW])

    @property
    def waiting(self) -> int:
        """Attempts waiting in this process for a permit of their flow."""
        return self._lifecycle.counts[Stage.WAITING_FOR_FLOW]

    @property
    def returning(self) -> int:
        """Permits given back here that are not yet back in Redis."""
        return sum(len(state.releases) for state in self._states.values())

    def _flow(self, key: str) -> FlowState:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = FlowState(key)
        return state

    # -- what the dispatcher calls ----------------------------------------------------------

    def admit(self, attempt: Attempt) -> None:
        """A due attempt (WAITING_FOR_FLOW): admit it once its flow grants a permit."""
        state = self._flow(attempt.task.flow)
        if len(state.queue) >= self._local_cap or self.waiting > self._max_waiting:
            self._park_soon([attempt])  # enough of it waits here: wait in Redis, holding nothing
            return
        attempt.ask_for(new_permit_id())
        state.queue.append(attempt)
        self._kick(state)

    def give_back(self, attempt: Attempt) -> None:
        """The attempt is done with its permit (answered, or never sent): the next waiter of
        its flow here takes it over when that is safe, else it goes back to Redis."""
        permit = attempt.drop_permit()
        if permit is None:
            return
        state = self._flow(attempt.task.flow)
        lease = self._leases.pop(permit, None)
        if lease is not None and self._may_hand_on(state, lease):
            self._admit(state, state.queue.popleft(), permit, lease, self._clock.now_ms())
            return
        self._release(state, [permit], sent=attempt.sent)

    def _may_hand_on(self, state: FlowState, lease: Lease) -> bool:
        """Not for a rated or paused flow (every start of a rated flow must be logged in Redis;
        a pause is known from the flow's last permits call), not above a lowered
        parallelism, not past older parked tasks of the flow, and only if the lease outlasts
        the next attempt with its margin, as a fresh one would."""
        if (not state.queue or state.rated or state.paused or state.room < 0
                or self._stopping):
            return False
        head = state.queue[0]
        if state.parked_buckets and state.parked_due < head.task.due_ms:
            return False
        return (lease.expiry_ms - self._clock.now_ms()
                >= head.task.timeout_ms + self._lease_margin_ms)

    def _admit(self, state: FlowState, attempt: Attempt, permit: str, lease: Lease,
               start_ms: int) -> None:
        """The attempt (out of its queue now) holds ``permit``: to the workers. The permit
        it asked for, if a call under way grants it, is given back then (_granted)."""
        self._leases[permit] = lease
        self._lifecycle.admit(attempt, permit, max(start_ms, attempt.task.due_ms), state.retry,
                              rated=state.rated)
        self._ready.put_nowait(attempt)

    def _release(self, state: FlowState, permits: list[str], *, sent: bool) -> None:
        """Give permits back to Redis: at once when attempts of the flow wait for room (here
        or parked), else within RELEASE_LINGER_S, together with whatever else comes back or
        is asked for meanwhile. ``sent``: their attempts were (or may have been) sent."""
        state.releases.extend(Release(permit, sent) for permit in permits)
        if state.queue or state.parked_buckets or self._stopping:
            self._kick(state)
        elif state.linger is None:
            state.linger = asyncio.get_running_loop().call_later(
                RELEASE_LINGER_S, self._linger_over, state)

    def _linger_over(self, state: FlowState) -> None:
        state.linger = None
        if state.releases:  # not taken along by a permits call meanwhile
            self._kick(state)

    def parked(self, flow: str, bucket: int, due_ms: float = float("inf")) -> None:
        """A task of ``flow`` due at ``due_ms`` was parked in ``bucket``: take it back when
        there is room."""
        state = self._flow(flow)
        state.parked_due = min(state.parked_due, due_ms)
        if bucket not in state.parked_buckets:
            state.parked_buckets.add(bucket)
            self._kick(state)  # there may be room already (a permit came back meanwhile)

    async def poll(self, tick_ms: int = 1000) -> None:
        """Once a tick: permits given back by other processes, parked tasks anywhere; then
        report the attempts waiting here, per flow."""
        for flow, bucket, due in await self._parking.flows():
            self.parked(flow, bucket, due)
        for key, state in list(self._states.items()):
            if state.idle:
                del self._states[key]
            elif state.queue or state.parked_buckets:
                self._kick(state)
        await self._report.write({key: len(state.queue) for key, state in self._states.items()
                                  if state.queue}, tick_ms=tick_ms)

    def drain(self) -> list[Attempt]:
        """Shutdown: take every waiting attempt out (the caller hands their claims back); a
        permit granted to one of them meanwhile is given back."""
        self._stopping = True
        waiting = []
        for state in self._states.values():
            for attempt in state.queue:
                state.releases.append(Release(attempt.drop_permit() or "", sent=False))
                waiting.append(attempt)
            state.queue.clear()
        return waiting

    async def close(self) -> None:
        """Stop, after ``drain``: finish parking, give back the permits still to give back."""
        if self._park_calls:  # a claim not parked in time keeps its lease
            _, late = await asyncio.wait(set(self._park_calls), timeout=2.0)
            for parking in late:
                parking.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        self._closed = True  # from now on a permit given back waits for its lease
        await self._alarms.close()
        for state in self._states.values():
            if state.linger is not None:  # its releases are sent below
                state.linger.cancel()
                state.linger = None
        await self._report.clear()  # drained: nothing waits here any more
        running = [s.exchange for s in self._states.values() if s.exchange is not None]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for state in self._states.values():
            if state.releases:
                sent, unused = _split(state.releases)
                try:
                    await self._flows.permits(state.key, now_ms=self._clock.now_ms(),
                                              lease_ms=1, release=sent, unused=unused)
                except StoreUnavailable:
                    pass  # Redis (or its clock) unreachable: their leases give them back
        self._states.clear()

    # -- the per-flow exchange with Redis ---------------------------------------------------

    def _kick(self, state: FlowState) -> None:
        """Make a permits call for the flow soon: now, or after the one under way."""
        if self._closed:
            return  # a permit given back after close: its lease returns it
        if state.exchange is not None:
            state.again = True
            return
        state.exchange = asyncio.create_task(self._exchange(state))

    async def _exchange(self, state: FlowState) -> None:
        try:
            state.again = True
            while state.again:
                state.again = False
                await self._exchange_once(state)
        except StoreUnavailable as exc:
            log.warning("flow %s: permits unavailable, waiting: %s", state.key, exc)
            self._alarm_at(state, self._clock.wall_ms() + RETRY_MS)
        except Exception:  # one bad exchange must not stop the flow: retry soon
            log.exception("flow %s: permit exchange failed", state.key)
            self._alarm_at(state, self._clock.wall_ms() + RETRY_MS)
        finally:
            state.exchange = None

    async def _exchange_once(self, state: FlowState) -> None:
        """One permits call: give back what finished, then ask for the waiters here or for
        parked tasks of the flow (then taken back from Redis), whichever are older."""
        releases, state.releases = state.releases, []
        waiters, unparking, want, lease_ms = self._wanted(state, len(releases))
        if not releases and not want:
            return
        now = self._clock.now_ms()
        sent, unused = _split(releases)
        try:
            reply = await self._flows.permits(state.key, now_ms=now, lease_ms=lease_ms,
                                              release=sent, unused=unused, want=want)
        except BaseException:  # unavailable, or cancelled by close(), which sends them
            # Give back again what was given back, and the permits asked for as unused: a
            # reply lost after the script ran leaves them held in Redis, unknown here (a
            # waiter that parks meanwhile, or an unparking call's fresh ids, would never ask
            # for them again), till their leases ran out. Not held: the release is a no-op;
            # a waiter still here asks for its own again in the same call, after its release.
            state.releases[:0] = [*releases,
                                  *(Release(permit, sent=False) for permit, _ in want if permit)]
            raise
        state.rated, state.room = reply.rated, reply.room
        state.paused, state.retry = reply.paused, reply.retry
        if waiters:
            self._granted(state, waiters, want[:reply.granted], Lease(now + lease_ms))
        if state.paused and state.queue:
            # Paused: its waiters park now, not at their deadlines. From Redis a resume takes
            # them back earliest first over every process; held in two processes' memory they
            # would race for the flow's permits, out of due order.
            self._park_waiters(state, list(state.queue))
        elif unparking and reply.granted:
            await self._unpark(state, [permit for permit, _ in want[:reply.granted]],
                               want[0][1], granted_ms=now)
        if reply.room > 0 and (state.queue or (state.parked_buckets and not self._stopping)):
            state.again = True  # room left for more than was asked: go round again
        if reply.wait_ms > 0 and (state.queue or state.parked_buckets):
            self._alarm_at(state, self._clock.wall_ms() + reply.wait_ms)  # rate window
        if state.queue:
            # Waiters come in due order, so the head's deadline is (about) the earliest; an
            # alarm parks every waiter whose deadline has come.
            self._alarm_at(state, state.queue[0].park_by_ms)

    def _wanted(self, state: FlowState, releasing: int
                ) -> tuple[list[Attempt], bool, list[tuple[str, int]], int]:
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
        # Waiters are asked for a few ms before they are due and start at their due time:
        # the rate log must count them when they start, not when let through.
        want = [(w.permit or "", max(now, w.task.due_ms)) for w in waiters]
        return (waiters, False, want, self._lease_margin_ms + PERMIT_REUSE_MS
                + max(w.task.timeout_ms for w in waiters))

    def _granted(self, state: FlowState, waiters: list[Attempt],
                 granted: list[tuple[str, int]], lease: Lease) -> None:
        """Admit the waiters whose permits were granted (the first ones asked for)."""
        unneeded = []
        for attempt, (permit, start) in zip(waiters, granted, strict=False):
            if attempt.stage is not Stage.WAITING_FOR_FLOW or attempt.permit != permit:
                # Left the queue while the call was out (parked, or admitted on a permit
                # handed on): this one is not needed.
                unneeded.append(permit)
                continue
            if state.queue[0] is attempt:  # still waiting, so at the head (in due order)
                state.queue.popleft()
            else:
                state.queue.remove(attempt)
            self._admit(state, attempt, permit, lease, start)
        if unneeded:
            self._release(state, unneeded, sent=False)  # never used by any attempt

    async def _unpark(self, state: FlowState, held: list[str], start: int, *,
                      granted_ms: int) -> None:
        """Take back as many of the flow's earliest parked tasks, over all buckets, as there
        are permits in ``held`` (granted at ``granted_ms``); give back the permits left over."""
        try:
            adopted = await self._parking.take_back(state, len(held))
        except BaseException:  # none adopted: the permits go back with the next call
            state.releases.extend(Release(permit, sent=False) for permit in held)
            raise
        lease = Lease(granted_ms + self._max_lease_ms)
        for attempt, permit in zip(adopted, held, strict=False):
            self._admit(state, attempt, permit, lease, start)
        if len(adopted) < len(held):  # taken by another process meanwhile: give the rest back
            state.releases.extend(Release(permit, sent=False) for permit in held[len(adopted):])
            state.again = True
        elif state.parked_buckets:
            state.again = True  # more may fit: ask again

    # -- deadlines: waiting here turns into waiting in Redis ---------------------------------

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
        due = list(itertools.takewhile(lambda a: a.park_by_ms <= now, state.queue))
        if due:  # in deadline order, about
            self._park_waiters(state, due)
        self._kick(state)

    def _park_waiters(self, state: FlowState, waiters: list[Attempt]) -> None:
        """Take the first ``len(waiters)`` waiters out of the flow's queue, to be parked."""
        for attempt in waiters:
            state.queue.popleft()
            # Not granted as far as this process knows; a reply lost on the way may have.
            state.releases.append(Release(attempt.drop_permit() or "", sent=False))
        self._park_soon(waiters)

    def _park_soon(self, attempts: list[Attempt]) -> None:
        """Park at the end of this event-loop iteration, all of it in one go: a burst turns
        thousands of waiters away at once."""
        if not self._to_park:
            asyncio.get_running_loop().call_soon(self._park_now)
        self._to_park.extend(attempts)

    def _park_now(self) -> None:
        attempts, self._to_park = self._to_park, []
        parking = asyncio.create_task(self._park(attempts))
        self._park_calls.add(parking)
        parking.add_done_callback(self._park_calls.discard)

    async def _park(self, attempts: list[Attempt]) -> None:
        for attempt in await self._parking.park(attempts):
            self.parked(attempt.task.flow, attempt.task.bucket, attempt.task.due_ms)


def _split(releases: list[Release]) -> tuple[list[str], list[str]]:
    """The permits call's two lists: given back after a send, and never sent."""
    return [r.permit for r in releases if r.sent], [r.permit for r in releases if not r.sent]
