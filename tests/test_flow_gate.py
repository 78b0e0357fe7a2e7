"""Flow control in the dispatcher, on a real Redis with a fake clock and respx answering:
parallelism and rate hold, waiting is not an attempt, waiters park in Redis before their
lease could run out and come back when there is room, other flows are not held up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import respx

from tests.support.waiting import wait_until
from tests.test_dispatcher import DUE_MS, URL, Harness, flow_store, router
from tests.test_lateness import first_attempt_lateness
from timewheel.clock import FakeClock
from timewheel.delivery.netguard import NotWritten
from timewheel.delivery.senders import Answer, HttpxSender
from timewheel.engine import flow_gate
from timewheel.engine.attempt import Attempt, Lifecycle, Stage
from timewheel.engine.dispatcher import Dispatcher
from timewheel.engine.flow_gate import UNPARK_START_MS, FlowGate
from timewheel.engine.flow_state import FlowState, Lease, Release
from timewheel.engine.parking import Parking
from timewheel.engine.recorder import Recorder
from timewheel.engine.ticker import claim_tokens
from timewheel.errors import StoreUnavailable
from timewheel.metrics import Metrics
from timewheel.store import Store
from timewheel.store.flow_store import RATE_SLACK_MS, StoredLimits
from timewheel.store.record import ClaimedTask

FLOW = "127.0.0.1:9"  # the default flow of URL
__all__ = ["router"]  # the respx fixture, shared with test_dispatcher
OTHER = "http://127.0.0.1:9/hooks/other"


class Receiver:
    """A respx route that holds every request until ``open`` is set, counting concurrency."""

    def __init__(self, router: respx.MockRouter, url: str = URL) -> None:
        self.open = asyncio.Event()
        self._let_go = asyncio.Semaphore(0)  # answer() lets this many held requests go
        self.now = self.peak = 0
        self.attempts: list[tuple[str, str]] = []  # (webhook-id, timewheel-attempt)
        self.seen_at_once: list[int] = []  # requests open when each one arrived (itself too)
        self.route = router.post(url).mock(side_effect=self._answer)

    async def _answer(self, request: httpx.Request) -> httpx.Response:
        self.attempts.append((request.headers["webhook-id"],
                              request.headers["timewheel-attempt"]))
        self.now += 1
        self.peak = max(self.peak, self.now)
        self.seen_at_once.append(self.now)
        try:
            opened = asyncio.ensure_future(self.open.wait())
            one = asyncio.ensure_future(self._let_go.acquire())
            await asyncio.wait((opened, one), return_when=asyncio.FIRST_COMPLETED)
            for waiter in (opened, one):
                if not waiter.done():
                    waiter.cancel()
            if one.done() and not one.cancelled() and opened.done():
                self._let_go.release()  # not needed after all: leave it for the next
        finally:
            self.now -= 1
        return httpx.Response(200)

    def answer(self, count: int = 1) -> None:
        """Let ``count`` of the held requests (or the next ones) be answered."""
        for _ in range(count):
            self._let_go.release()


async def limit(store: Store, flow: str, *, parallelism: int | None = None,
                rate: float | None = None) -> None:
    await flow_store(store).set_limits(flow, StoredLimits(parallelism, rate))


async def due_now(wheel: Harness, keys: list[str], **fields: object) -> None:
    """Add the tasks (due at DUE_MS), claim them, hand them over, move the clock there."""
    for key in keys:
        await wheel.add(key, **fields)  # type: ignore[arg-type]
    tasks = await wheel.claim(None)
    assert sorted(t.key for t in tasks) == sorted(keys)
    wheel.dispatcher.submit(tasks, wheel.clock.now_ms())
    wheel.clock.set(DUE_MS)


async def statuses(wheel: Harness, keys: list[str]) -> list[tuple[str, int]]:
    return [((v := await wheel.view(k)).status.value, v.attempts) for k in keys]


@pytest.fixture
async def gated(store: Store, fake_clock: FakeClock, router: respx.MockRouter
                ) -> AsyncIterator[Harness]:
    harness = Harness(store, fake_clock)
    yield harness
    await harness.dispatcher.stop(0.1)
    await harness.sender.aclose()


async def test_parallelism_holds_and_waiting_is_not_an_attempt(
        gated: Harness, router: respx.MockRouter) -> None:
    receiver = Receiver(router)
    await limit(gated.store, FLOW, parallelism=2)
    keys = [f"k{i}" for i in range(5)]
    await due_now(gated, keys)

    await wait_until(lambda: _true(receiver.now == 2), "two attempts in flight")
    await wait_until(lambda: _still(gated), "the gate to have answered all five")
    assert _held(gated) == {Stage.SENT: 2, Stage.WAITING_FOR_FLOW: 3}  # no third started
    assert receiver.now == 2
    assert [s for s, _ in await statuses(gated, keys)].count("delivering") == 5
    receiver.open.set()
    await gated.settle()

    assert receiver.peak == 2
    assert sorted(receiver.attempts) == [(k, "1") for k in keys]
    assert await statuses(gated, keys) == [("succeeded", 1)] * 5
    assert await flow_store(gated.store).in_flight(FLOW, now_ms=gated.clock.now_ms()) == 0


async def test_waiter_parks_before_its_start_deadline_and_comes_back(
        gated: Harness, router: respx.MockRouter) -> None:
    """Still waiting near its start deadline, a task is parked: no lease, status shown as
    scheduled, counted as waiting; a permit given back takes it back, attempt 1."""
    receiver = Receiver(router)
    await limit(gated.store, FLOW, parallelism=1)
    keys = ["a", "b", "c"]
    await due_now(gated, keys)
    await wait_until(lambda: _true(receiver.now == 1), "one attempt in flight")

    gated.clock.set(DUE_MS + 4000)  # past the park deadline (start_by - 100 ms)
    await wait_until(lambda: _parked(gated, 2), "two tasks parked")
    waiting = [k for k in keys if k != receiver.attempts[0][0]]
    for key in waiting:
        assert (await gated.view(key)).status == "scheduled"
        assert key.encode() not in await gated.lease(key)
    assert gated.dispatcher.in_flight == 1  # the parked ones hold nothing here

    receiver.open.set()
    await wait_until(lambda: _true(len(receiver.attempts) == 3), "all three sent")
    await gated.settle()
    assert receiver.peak == 1
    assert sorted(receiver.attempts) == [(k, "1") for k in sorted(keys)]
    assert await statuses(gated, keys) == [("succeeded", 1)] * 3
    assert await gated.store.parked_count(FLOW) == 0


async def test_a_waiting_flow_does_not_hold_up_another(
        gated: Harness, router: respx.MockRouter) -> None:
    stuck = Receiver(router)
    healthy = router.post(OTHER).respond(200)
    await limit(gated.store, FLOW, parallelism=1)
    await due_now(gated, ["s1", "s2", "s3"])
    await wait_until(lambda: _true(stuck.now == 1), "the stuck flow's one attempt")

    await gated.add("h1", callback_url=OTHER, flow_key="healthy", delay=1.0)
    [task] = await gated.claim("h1")
    gated.dispatcher.submit([task], gated.clock.now_ms())
    gated.clock.set(task.due_ms)
    await wait_until(lambda: _true(healthy.call_count == 1), "the healthy flow's callback")
    assert (await gated.view("s2")).attempts + (await gated.view("s3")).attempts <= 1
    stuck.open.set()
    await gated.settle()


@pytest.mark.parametrize("late_ms", [20, 21])
async def test_a_rated_attempt_late_for_its_logged_start_asks_again(
        gated: Harness, router: respx.MockRouter, late_ms: int) -> None:
    """A rated flow logs each start for the moment it was granted; an attempt that could only
    be sent more than RATE_SLACK_MS (20 ms) after that (here its process stalled between its
    start call and its send) asks its flow again instead, so starts logged since cannot
    bunch up behind it. It is sent once, as attempt 1 (started again, counted once); the
    start logged for due goes (never sent then), the one for its new permit stays.
    Control (20 ms): sent on the permit it has, its start logged for due."""
    route = router.post(URL).respond(200)
    await limit(gated.store, FLOW, rate=10)
    await gated.add("r")
    [task] = await gated.claim("r")
    gated.dispatcher.submit([task], gated.clock.now_ms())
    gated.clock.set(task.due_ms - 5)  # granted (logged for due), then the start call

    async def started() -> bool:
        return (await gated.raw("r")).get("started") == "1"
    await wait_until(started, "the attempt to start")
    gated.clock.set(task.due_ms + late_ms)
    await wait_until(lambda: _true(route.call_count == 1), "the attempt sent")
    await gated.settle()
    assert route.calls.last.request.headers["timewheel-attempt"] == "1"
    assert await statuses(gated, ["r"]) == [("succeeded", 1)]
    assert await logged_starts(gated.store) == [task.due_ms + (late_ms if late_ms > 20 else 0)]


class Dialling:
    """The harness's sender behind connections that take ``dial_ms`` of the fake clock to
    come: for the first request only, or for every one (a receiver that closes each
    connection). ``ready`` is asked after the dial, where the default client asks it once its
    connection is there (HttpxSender asks it before any connection: here that is after the
    simulated dial). The wire client's own tests check that a connection dialled for a
    request not written serves the next (tests/test_wire_sender.py). While ``hold`` is clear,
    a dial does not end: ``dialling`` is set meanwhile."""

    def __init__(self, inner: HttpxSender, clock: FakeClock, dial_ms: int, *,
                 every: bool) -> None:
        self.inner, self.clock, self.dial_ms, self.every = inner, clock, dial_ms, every
        self.keep_body, self.result_body = inner.keep_body, inner.result_body
        self.dials = self.not_written = 0
        self.hold, self.dialling = asyncio.Event(), asyncio.Event()
        self.hold.set()

    async def send(self, method: str, url: str, headers: list[tuple[str, str]],
                   body: bytes | None, timeout: float, ready: Callable[[], bool] | None = None,
                   keep_body: int | None = None,
                   written: Callable[[], None] | None = None) -> Answer:
        if self.every or not self.dials:
            self.dials += 1
            self.dialling.set()
            await self.hold.wait()
            self.clock.advance(self.dial_ms)
        try:
            return await self.inner.send(method, url, headers, body, timeout, ready=ready,
                                         keep_body=keep_body, written=written)
        except NotWritten:
            self.not_written += 1
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def dialling(store: Store, clock: FakeClock, dial_ms: int, *, every: bool = False
                   ) -> AsyncIterator[tuple[Harness, Dialling]]:
    harness = Harness(store, clock)
    sender = Dialling(harness.sender, clock, dial_ms, every=every)
    harness.dispatcher = Dispatcher(
        store, flow_store(store), clock, sender, harness.metrics, signer=None,
        max_concurrency=10, batch_deadline_ms=30_000, tokens=claim_tokens())
    try:
        yield harness, sender
    finally:
        await harness.dispatcher.stop(0.1)
        await sender.aclose()


async def logged_starts(store: Store) -> list[int]:
    """The times of the starts the flow's rate log holds."""
    rows = await store.redis.zrange(store.keys.flow(FLOW) + "starts", 0, -1, withscores=True)
    return sorted(int(score) for _, score in rows)


@pytest.mark.parametrize("dial_ms", [15, 30])
async def test_a_rated_attempt_whose_connection_came_late_asks_again_unwritten(
        store: Store, fake_clock: FakeClock, router: respx.MockRouter, dial_ms: int) -> None:
    """Its connection came more than RATE_SLACK_MS (20 ms) after the start its rated flow
    logged (a dial): the request is not written, the attempt asks its flow again and is
    written on its next try, on the connection now pooled: once, as attempt 1, a start
    logged for when it asked again (the one logged for due stays: its request had gone to
    the sender, which for all the gate knows may have written it). Sent on a dialled
    connection, it would reach the receiver late, bunched with the next window's attempts.
    Control (15 ms): written on its first try, its start logged for due."""
    route = router.post(URL).respond(200)
    async with dialling(store, fake_clock, dial_ms) as (wheel, sender):
        await limit(store, FLOW, rate=10)
        await due_now(wheel, ["r"])
        await wait_until(lambda: _true(route.call_count == 1), "the attempt written")
        await wheel.settle()
        assert sender.not_written == (1 if dial_ms > 20 else 0)
        assert route.call_count == 1
        assert first_attempt_lateness(wheel)[0] == 1  # the try held back is not counted
        assert route.calls.last.request.headers["timewheel-attempt"] == "1"
        assert await statuses(wheel, ["r"]) == [("succeeded", 1)]
        assert await logged_starts(store) == [DUE_MS, DUE_MS + 30][:2 if dial_ms > 20 else 1]


async def test_an_attempt_is_held_back_at_the_write_once_then_written_however_late(
        store: Store, fake_clock: FakeClock, router: respx.MockRouter) -> None:
    """A receiver that closes every connection: each try dials (30 ms). Held back once, the
    attempt is written on its second try although its connection came late again, rather
    than asking its flow for ever."""
    route = router.post(URL).respond(200)
    async with dialling(store, fake_clock, 30, every=True) as (wheel, sender):
        await limit(store, FLOW, rate=10)
        await due_now(wheel, ["r"])
        await wait_until(lambda: _true(route.call_count == 1), "the attempt written")
        await wheel.settle()
        assert (sender.dials, sender.not_written, route.call_count) == (2, 1, 1)
        assert await statuses(wheel, ["r"]) == [("succeeded", 1)]
        assert await logged_starts(store) == [DUE_MS, DUE_MS + 30]  # asked again once


async def test_an_unrated_attempt_is_written_however_long_its_connection_takes(
        store: Store, fake_clock: FakeClock, router: respx.MockRouter) -> None:
    """Only a rate logs starts: a flow with a parallelism alone writes on a late connection
    (its lease still has room), even when the gate forgot the flow after its permit (a
    tick's poll drops the state of a flow that looks idle, and a started attempt does not
    count there). Whether it is rated is the attempt's own, as of its permit."""
    route = router.post(URL).respond(200)
    async with dialling(store, fake_clock, 30, every=True) as (wheel, sender):
        await limit(store, FLOW, parallelism=5)
        await wheel.add("p")
        [task] = await wheel.claim("p")
        wheel.dispatcher.submit([task], wheel.clock.now_ms())
        wheel.clock.set(task.due_ms - 5)  # permit, then the start call

        async def started() -> bool:
            return (await wheel.raw("p")).get("started") == "1"
        await wait_until(started, "the attempt to start")
        await wheel.dispatcher.poll_flows()
        assert FLOW not in wheel.dispatcher._gate._states
        wheel.clock.set(task.due_ms)
        await wait_until(lambda: _true(route.call_count == 1), "the attempt written")
        await wheel.settle()
        assert (sender.dials, sender.not_written) == (1, 0)
        assert await statuses(wheel, ["p"]) == [("succeeded", 1)]


async def test_an_attempt_held_back_while_stopping_is_handed_back(
        store: Store, fake_clock: FakeClock, router: respx.MockRouter) -> None:
    """Its connection comes late while the dispatcher stops: no worker would send it again,
    so it is handed back (claimable at once by any process), not put back in the drained
    gate."""
    route = router.post(URL).respond(200)
    async with dialling(store, fake_clock, 30) as (wheel, sender):
        await limit(store, FLOW, rate=10)
        sender.hold.clear()
        await due_now(wheel, ["r"])
        await wait_until(lambda: _true(sender.dialling.is_set()), "the dial")
        stopping = asyncio.create_task(wheel.dispatcher.stop(5.0))
        await asyncio.sleep(0.05)  # stop() has drained the gate; the sending worker is kept
        assert not stopping.done()
        sender.hold.set()
        await stopping
        assert (sender.not_written, route.call_count) == (1, 0)
        assert wheel.dispatcher.in_flight == 0
        assert await wheel.raw("r") == {"status": "scheduled", "attempts": "0",
                                        "due": str(DUE_MS)}


async def test_rate_spreads_starts_over_windows(gated: Harness,
                                                router: respx.MockRouter) -> None:
    """rate 2: two start at once, the next two when the window has moved on a second and the
    slack an attempt may start late by (lua/permits.lua)."""
    route = router.post(URL).respond(200)
    await limit(gated.store, FLOW, rate=2)
    keys = [f"r{i}" for i in range(5)]
    await due_now(gated, keys)
    await wait_until(lambda: _true(route.call_count == 2), "the first two")
    await asyncio.sleep(0.05)
    assert route.call_count == 2
    gated.clock.set(DUE_MS + 999 + RATE_SLACK_MS)
    await asyncio.sleep(0.05)
    assert route.call_count == 2
    gated.clock.set(DUE_MS + 1000 + RATE_SLACK_MS)
    await wait_until(lambda: _true(route.call_count == 4), "two more a second later")
    gated.clock.set(DUE_MS + 2 * (1000 + RATE_SLACK_MS))
    await wait_until(lambda: _true(route.call_count == 5), "the last")
    await gated.settle()
    assert await statuses(gated, keys) == [("succeeded", 1)] * 5


class PermitsCalls:
    """Every permits call of the harness's gate: the permits each gave back, each asked for."""

    def __init__(self, wheel: Harness) -> None:
        self.calls: list[tuple[int, int]] = []
        flows = wheel.dispatcher._gate._flows
        permits = flows.permits

        async def counted(flow: str, **kwargs: Any) -> Any:
            given_back = len(kwargs.get("release") or ()) + len(kwargs.get("unused") or ())
            self.calls.append((given_back, len(kwargs.get("want") or ())))
            return await permits(flow, **kwargs)

        flows.permits = counted  # type: ignore[method-assign]

    @property
    def releasing(self) -> list[int]:
        return [released for released, _ in self.calls if released]


async def test_permits_nobody_waits_for_go_back_together(
        gated: Harness, router: respx.MockRouter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers that come close together give their permits back in one permits call (not
    one each, nor one plus one for those given back while it was out), after the linger."""
    monkeypatch.setattr(flow_gate, "RELEASE_LINGER_S", 0.5)
    receiver = Receiver(router)
    await limit(gated.store, FLOW, parallelism=5)
    keys = [f"k{i}" for i in range(5)]
    await due_now(gated, keys)
    await wait_until(lambda: _true(receiver.now == 5), "all five in flight")
    calls = PermitsCalls(gated)
    receiver.open.set()
    await wait_until(lambda: _true(gated.dispatcher.returning_permits == 5),
                     "five permits given back here")
    assert calls.calls == []  # lingering: nothing sent yet
    assert await flow_store(gated.store).in_flight(FLOW, now_ms=gated.clock.now_ms()) == 5
    await gated.settle()
    assert calls.releasing == [5]
    assert await flow_store(gated.store).in_flight(FLOW, now_ms=gated.clock.now_ms()) == 0
    assert await statuses(gated, keys) == [("succeeded", 1)] * 5


async def test_a_permit_goes_back_at_once_when_its_flow_has_a_waiter(
        gated: Harness, router: respx.MockRouter, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rated flow's permit is never handed on here, so the waiter needs it back in Redis:
    it goes at once (with the waiter's ask), not after the linger. The clock stands still,
    so nothing else (a park deadline, a rate window) could let the waiter through."""
    monkeypatch.setattr(flow_gate, "RELEASE_LINGER_S", 60.0)
    receiver = Receiver(router)
    await limit(gated.store, FLOW, parallelism=1, rate=100)
    await due_now(gated, ["a", "b"])
    await wait_until(lambda: _true(receiver.now == 1), "one in flight, one waiting")
    receiver.open.set()
    await wait_until(lambda: _true(len(receiver.attempts) == 2), "the waiter sent")

    async def delivered() -> bool:
        return await statuses(gated, ["a", "b"]) == [("succeeded", 1)] * 2
    await wait_until(delivered, "both recorded")
    assert gated.dispatcher.returning_permits == 1  # the last one's: nobody waits for it


async def test_stop_sends_the_permits_still_lingering(
        gated: Harness, router: respx.MockRouter, monkeypatch: pytest.MonkeyPatch) -> None:
    """A permit given back with nobody waiting is in Redis after stop(), whatever the
    linger."""
    monkeypatch.setattr(flow_gate, "RELEASE_LINGER_S", 60.0)
    router.post(URL).respond(200)
    await limit(gated.store, FLOW, parallelism=5)
    await due_now(gated, ["a"])

    async def delivered() -> bool:
        return await statuses(gated, ["a"]) == [("succeeded", 1)]
    await wait_until(delivered, "the attempt answered and recorded")
    assert gated.dispatcher.returning_permits == 1
    assert await flow_store(gated.store).in_flight(FLOW, now_ms=gated.clock.now_ms()) == 1
    await gated.dispatcher.stop(0.1)
    assert await flow_store(gated.store).in_flight(FLOW, now_ms=gated.clock.now_ms()) == 0


async def test_cancelled_while_parked_is_never_sent(gated: Harness,
                                                    router: respx.MockRouter) -> None:
    receiver = Receiver(router)
    await limit(gated.store, FLOW, parallelism=1)
    await due_now(gated, ["a", "b"])
    await wait_until(lambda: _true(receiver.now == 1), "one in flight")
    gated.clock.set(DUE_MS + 4000)
    await wait_until(lambda: _parked(gated, 1), "the other parked")
    parked = "b" if receiver.attempts[0][0] == "a" else "a"
    assert await gated.store.cancel(parked, now_ms=gated.clock.now_ms()) == 1
    receiver.open.set()
    await gated.settle()
    await gated.dispatcher.poll_flows()
    await gated.settle()
    assert [key for key, _ in receiver.attempts] == [receiver.attempts[0][0]]
    assert (await gated.view(parked)).status == "cancelled"
    assert await gated.store.parked_count(FLOW) == 0


async def test_beyond_the_local_cap_tasks_park_at_once(
        store: Store, fake_clock: FakeClock, router: respx.MockRouter) -> None:
    """With room for one waiter per flow here, the others wait in Redis from the start (the
    one waiter is the one that then gets the permit)."""
    harness = Harness(store, fake_clock)
    harness.dispatcher = Dispatcher(
        store, flow_store(store), fake_clock, harness.sender, harness.metrics, signer=None,
        max_concurrency=10, batch_deadline_ms=30_000, tokens=claim_tokens(), flow_local_cap=1)
    receiver = Receiver(router)
    try:
        await limit(store, FLOW, parallelism=1)
        await due_now(harness, ["a", "b", "c", "d"])
        await wait_until(lambda: _parked(harness, 3), "three parked at once")
        await wait_until(lambda: _true(receiver.now == 1), "one sending")
        # The parked ones hold nothing here once their park replies are read (Redis may show
        # them parked a moment before; held here, they would stay counted until sent).
        await wait_until(lambda: _true(harness.dispatcher.in_flight == 1), "one held here")
        receiver.open.set()
        await wait_until(lambda: _true(len(receiver.attempts) == 4), "all four sent")
        assert receiver.peak == 1
    finally:
        await harness.dispatcher.stop(0.1)
        await harness.sender.aclose()


async def test_permits_taken_back_unused_leave_no_start_in_a_rated_flows_log(
        store: Store, fake_clock: FakeClock, router: respx.MockRouter) -> None:
    """Taking parked tasks back asks for permits without knowing how many are parked (the
    room left plus one); for a rated flow each one granted logs a start. Those given back
    unused (more than were parked) take their starts back: the log holds one start per task
    sent, so the window is not filled by starts that never happened."""
    route = router.post(URL).respond(200)
    harness = Harness(store, fake_clock)
    harness.dispatcher = Dispatcher(
        store, flow_store(store), fake_clock, harness.sender, harness.metrics, signer=None,
        max_concurrency=10, batch_deadline_ms=30_000, tokens=claim_tokens(), flow_local_cap=1)
    try:
        await limit(store, FLOW, rate=10)
        await due_now(harness, ["a", "b", "c"])  # one waits here, two park at once
        await wait_until(lambda: _true(route.call_count == 1), "the one waiting here")
        await harness.dispatcher.poll_flows()
        await wait_until(lambda: _parked(harness, 0), "the two taken back")
        # They start UNPARK_START_MS after their permits (the clock has not moved since).
        fake_clock.set(fake_clock.now_ms() + UNPARK_START_MS)
        await wait_until(lambda: _true(route.call_count == 3), "the two sent")
        await harness.settle()
        assert len(await logged_starts(store)) == 3
        assert await statuses(harness, ["a", "b", "c"]) == [("succeeded", 1)] * 3
    finally:
        await harness.dispatcher.stop(0.1)
        await harness.sender.aclose()


async def test_any_process_takes_back_tasks_another_parked(
        store: Store, fake_clock: FakeClock, router: respx.MockRouter) -> None:
    """Tasks parked by one process are sent by another once the flow has room (its tick)."""
    route = router.post(URL).respond(200)
    first, second = Harness(store, fake_clock), Harness(store, fake_clock)
    try:
        for key in ("a", "b"):
            await first.add(key)
        claimed = await first.claim(None)
        fake_clock.set(DUE_MS)
        for task in claimed:  # what the first process's gate does when refused
            assert await store.park(task.bucket, [(task.key, task.token)]) == [1]
        assert await store.parked_count(FLOW) == 2
        await second.dispatcher.poll_flows()
        # Whether the flow has a rate is not known yet to the second process: a task taken
        # back from Redis then starts UNPARK_START_MS after its permit, as for a rated flow.
        await asyncio.sleep(0.05)
        fake_clock.advance(UNPARK_START_MS)
        await wait_until(lambda: _true(route.call_count == 2), "both sent by the second")
        await second.settle()
        assert await statuses(second, ["a", "b"]) == [("succeeded", 1)] * 2
    finally:
        for harness in (first, second):
            await harness.dispatcher.stop(0.1)
            await harness.sender.aclose()


Bare = tuple[FlowGate, Lifecycle, asyncio.Queue[Attempt]]


@pytest.fixture
async def bare_gate(store: Store, fake_clock: FakeClock) -> AsyncIterator[Bare]:
    """A flow gate alone, for driving its internals directly: admitted attempts go to the
    queue yielded. Closed at the end: a permit given back arms a linger timer whose permits
    call, left to run after the test, would reopen the test's Redis client as its loop
    closes, and leave that connection open."""
    lifecycle, ready, metrics = Lifecycle(), asyncio.Queue[Attempt](), Metrics()
    gate = FlowGate(flow_store(store), store, Recorder(store, fake_clock, metrics), lifecycle,
                    ready, fake_clock, metrics, tokens=claim_tokens(), lease_margin_ms=5000,
                    batch_deadline_ms=30_000, local_cap=10, max_waiting=10)
    yield gate, lifecycle, ready
    await gate.close()


def waiting_attempt(lifecycle: Lifecycle, key: str) -> Attempt:
    """An attempt of FLOW waiting for a permit, having asked for permit ``p-<key>``."""
    task = ClaimedTask(key=key, bucket=0, token="t", due_ms=0, execute_at_ms=0, created_ms=0,
                       attempts=0, max_attempts=5, backoff_ms=1000, timeout_ms=10_000, url=URL,
                       method="POST", flow=FLOW)
    attempt = lifecycle.add(Attempt.claimed(task, 0, batch_deadline_ms=30_000,
                                            lease_margin_ms=5000))
    lifecycle.move(attempt, Stage.WAITING_FOR_FLOW)
    attempt.ask_for(f"p-{key}")
    return attempt


async def _true(value: bool) -> bool:
    return value


def _held(wheel: Harness) -> dict[Stage, int]:
    """How many attempts the dispatcher holds, per stage (none: left out)."""
    return {stage: n for stage, n in wheel.dispatcher._lifecycle.counts.items() if n}


def _still(wheel: Harness) -> bool:
    """Nothing under way that moves an attempt on by itself: no permits call or parking out,
    none on the timeline, admitted, started, or answered and unrecorded. From here only the
    clock, a tick or a receiver's answer changes what the dispatcher holds, so a check that
    something did not happen needs no wait."""
    gate, held = wheel.dispatcher._gate, _held(wheel)
    return (not (gate._to_park or gate._park_calls)
            and all(state.exchange is None and state.linger is None
                    for state in gate._states.values())
            and not held.keys() & {Stage.CLAIMED, Stage.ADMITTED, Stage.STARTED,
                                   Stage.ANSWERED})


async def _parked(wheel: Harness, count: int) -> bool:
    return await wheel.store.parked_count(FLOW) == count


async def test_stop_hands_back_waiters_and_gives_permits_back(
        gated: Harness, router: respx.MockRouter) -> None:
    """At shutdown the tasks waiting for their flow go back to their slice (claimable at once
    by any process); the attempt in flight is abandoned to its lease after the grace period;
    every permit this process held is given back."""
    receiver = Receiver(router)
    await limit(gated.store, FLOW, parallelism=1)
    await due_now(gated, ["a", "b", "c"])
    await wait_until(lambda: _true(receiver.now == 1), "one in flight")
    # /metrics as a scrape now reads it: one being sent, two waiting here for their flow.
    await wait_until(lambda: _true(gated.counter("timewheel_flow_waiting_local") == 2),
                     "the other two waiting for the flow")
    assert gated.counter("timewheel_callbacks_in_flight") == 1
    await gated.dispatcher.stop(0.2)
    assert gated.counter("timewheel_flow_waiting_local") == 0
    assert gated.counter("timewheel_callbacks_in_flight") == 0
    receiver.open.set()
    [sent] = [key for key, _ in receiver.attempts]
    for key in {"a", "b", "c"} - {sent}:
        assert (await gated.view(key)).status == "scheduled"
        assert await gated.lease(key) == []
    assert (await gated.view(sent)).status == "delivering"  # its lease re-sends it
    assert await flow_store(gated.store).in_flight(FLOW, now_ms=gated.clock.now_ms()) == 0


async def test_a_waiter_parked_while_its_permit_was_asked_for_gives_it_back(
        bare_gate: Bare) -> None:
    """The race between a park deadline and a permits reply: a waiter already parked when
    its permit arrives does not start, and its permit goes back (no one else uses it)."""
    gate, lifecycle, ready = bare_gate
    state = gate._flow(FLOW)  # the gate's own: closing it ends its linger
    waiters = [waiting_attempt(lifecycle, name) for name in "abc"]
    state.queue.extend(waiters)
    state.queue.popleft()  # what the park deadline did while the call was out
    waiters[0].drop_permit()
    gate._granted(state, waiters, [("p-a", 1), ("p-b", 1)], Lease(1e15))
    assert ready.get_nowait() is waiters[1] and ready.empty()
    assert (waiters[1].stage, waiters[1].permit) == (Stage.ADMITTED, "p-b")
    assert list(state.queue) == [waiters[2]]
    assert state.releases == [Release("p-a", sent=False)]


async def test_a_waiter_admitted_on_a_handed_on_permit_gives_its_own_back(
        bare_gate: Bare) -> None:
    """The race between a permit handed on in this process and a permits reply: the waiter
    runs on the permit handed on, and the permit granted for it meanwhile goes back."""
    gate, lifecycle, ready = bare_gate
    state = gate._flow(FLOW)  # the gate's own: closing it ends its linger
    [waiter] = [waiting_attempt(lifecycle, "a")]
    state.queue.append(waiter)
    state.queue.popleft()  # what give_back did while the call was out: handed on
    gate._admit(state, waiter, "handed", Lease(1e15), 0)
    gate._granted(state, [waiter], [("p-a", 1)], Lease(1e15))
    assert ready.get_nowait() is waiter and ready.empty()
    assert waiter.permit == "handed" and state.releases == [Release("p-a", sent=False)]


async def test_a_lowered_parallelism_holds_from_the_next_permit_on(
        gated: Harness, router: respx.MockRouter) -> None:
    """Permits handed from one attempt to the next within a process stop being handed on
    once the flow holds more than its lowered parallelism: the PUT is in force from the next
    permits call (a tick at the latest), not when the leases run out."""
    receiver = Receiver(router)
    await limit(gated.store, FLOW, parallelism=2)
    keys = [f"k{i}" for i in range(6)]
    await due_now(gated, keys)
    await wait_until(lambda: _true(receiver.now == 2), "two in flight")
    await limit(gated.store, FLOW, parallelism=1)
    await gated.dispatcher.poll_flows()  # the tick: the flow learns it is over its limit
    await wait_until(lambda: _still(gated), "the tick's permits call")
    assert gated.dispatcher._gate._states[FLOW].room < 0
    receiver.answer(1)  # one of the two finishes: its permit must not go to the next task
    await wait_until(lambda: _true(receiver.now == 1), "one answered")
    # Recorded, its permit was given back (before the record): handed on or not, by now.
    await wait_until(lambda: _still(gated) and len(gated.dispatcher._lifecycle) == 5,
                     "the answer recorded and its permit given back")
    assert _held(gated) == {Stage.SENT: 1, Stage.WAITING_FOR_FLOW: 4}
    assert receiver.now == 1 and len(receiver.attempts) == 2
    receiver.open.set()
    await wait_until(lambda: _true(len(receiver.attempts) == 6), "all six sent")
    await gated.settle()
    assert receiver.seen_at_once[:2] == [1, 2]


async def test_parking_one_attempt_found_cancelled_parks_the_rest(
        store: Store, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """park.lua answers per claim: one cancelled meanwhile (0) is skipped, an error hands its
    claim back, and neither stops the others of the batch from being parked."""
    lifecycle, metrics = Lifecycle(), Metrics()
    recorder = Recorder(store, fake_clock, metrics)
    parking = Parking(store, recorder, lifecycle, fake_clock, metrics, tokens=claim_tokens(),
                      batch_deadline_ms=30_000, lease_margin_ms=5000)
    attempts = [waiting_attempt(lifecycle, name) for name in "abc"]

    async def park(attempt: Attempt) -> bool:
        if attempt.task.key == "b":
            raise AttributeError("a client library's own error")
        return attempt.task.key != "a"

    handed: list[str] = []
    monkeypatch.setattr(recorder, "park", park)
    monkeypatch.setattr(recorder, "hand_back",
                        lambda items, why: handed.extend(a.task.key for a in items))
    assert await parking.park(attempts) == [attempts[2]]
    assert [a.stage for a in attempts] == [Stage.SKIPPED, Stage.HANDED_BACK, Stage.PARKED]
    assert handed == ["b"] and len(lifecycle) == 0


async def test_a_pause_stops_the_flow_from_the_next_tick(gated: Harness,
                                                         router: respx.MockRouter) -> None:
    """Paused while one task is in flight and two wait for its permit in this process: once
    the tick's permits call has told the gate (at most a tick), the answer hands the permit to
    no one, and the two park at once (long before their park deadline: the clock does not
    move), with no attempt. Resumed (control: the same tasks start after the next tick), they
    go, once each."""
    receiver = Receiver(router)
    await limit(gated.store, FLOW, parallelism=1)
    keys = ["k0", "k1", "k2"]
    await due_now(gated, keys)
    await wait_until(lambda: _true(receiver.now == 1), "one in flight")
    first = receiver.attempts[0][0]
    rest = [key for key in keys if key != first]
    gate = gated.dispatcher._gate

    await flow_store(gated.store).set_paused(FLOW, True)
    await gated.dispatcher.poll_flows()  # the tick: its permits call learns of the pause
    await wait_until(lambda: _true(gate._states[FLOW].paused), "the gate to know")
    receiver.answer()

    async def first_recorded() -> bool:  # its permit given back (before the record)
        return _still(gated) and (await gated.view(first)).status == "succeeded"
    await wait_until(first_recorded, "the first answered and recorded")
    assert _held(gated) == {}  # no other admitted, started or sent
    assert receiver.attempts == [(first, "1")]
    await wait_until(lambda: _parked(gated, 2), "the two parked")
    assert await statuses(gated, rest) == [("scheduled", 0)] * 2
    assert gate.waiting == 0  # nothing held here: both wait in Redis

    await flow_store(gated.store).set_paused(FLOW, False)
    receiver.open.set()
    await gated.dispatcher.poll_flows()  # the next tick takes them back from Redis

    async def sent_after_resume() -> bool:
        # A task taken back from Redis starts UNPARK_START_MS after its permit: move the clock.
        gated.clock.advance(UNPARK_START_MS)
        return len(receiver.attempts) == 3

    await wait_until(sent_after_resume, "both sent after the resume")
    await gated.settle()
    assert sorted(receiver.attempts) == [(k, "1") for k in keys]
    assert await statuses(gated, keys) == [("succeeded", 1)] * 3


class ReplyLost:
    """Wraps the gate's ``permits``: the next ``times`` calls run the script in Redis, then
    raise as a connection lost before the reply would (what the flow holds then, the gate
    never learns)."""

    def __init__(self, gate: FlowGate, times: int = 1) -> None:
        self.times = times
        permits = gate._flows.permits

        async def lost(flow: str, **kwargs: Any) -> Any:
            reply = await permits(flow, **kwargs)
            if self.times:
                self.times -= 1
                raise StoreUnavailable("permits: ConnectionError: connection lost (injected)")
            return reply

        gate._flows.permits = lost  # type: ignore[method-assign]


async def test_permits_granted_in_a_call_whose_reply_was_lost_go_back(
        bare_gate: Bare, store: Store, fake_clock: FakeClock) -> None:
    """A permits call that ran in Redis but whose reply was lost leaves its permits held
    there. A waiter that parks before the next call never asks for its id again: that call
    gives it back (as unused: no start of it stays in a rated flow's log)."""
    gate, lifecycle, _ = bare_gate
    await limit(store, FLOW, parallelism=5, rate=100)
    state = gate._flow(FLOW)
    state.room = 5
    waiters = [waiting_attempt(lifecycle, key) for key in "ab"]
    state.queue.extend(waiters)
    ReplyLost(gate)
    with pytest.raises(StoreUnavailable):
        await gate._exchange_once(state)
    flows, now = flow_store(store), fake_clock.now_ms()
    assert await flows.in_flight(FLOW, now_ms=now) == 2  # held in Redis, unknown here
    for waiter in waiters:  # their park deadline came meanwhile
        state.queue.remove(waiter)
        waiter.drop_permit()
    await gate._exchange_once(state)
    assert await flows.in_flight(FLOW, now_ms=now) == 0
    assert await logged_starts(store) == []


async def test_a_waiter_still_here_after_a_lost_reply_gets_its_permit(
        bare_gate: Bare, store: Store, fake_clock: FakeClock) -> None:
    """The same lost reply with the waiter still waiting: the next call gives its permit
    back and grants it again in one step; it is admitted, holding one permit."""
    gate, lifecycle, ready = bare_gate
    await limit(store, FLOW, parallelism=1)
    state = gate._flow(FLOW)
    state.room = 1
    waiter = waiting_attempt(lifecycle, "a")
    state.queue.append(waiter)
    ReplyLost(gate)
    with pytest.raises(StoreUnavailable):
        await gate._exchange_once(state)
    await gate._exchange_once(state)
    assert ready.get_nowait() is waiter and waiter.permit == "p-a"
    assert await flow_store(store).in_flight(FLOW, now_ms=fake_clock.now_ms()) == 1


async def test_permits_granted_for_parked_tasks_go_back_when_taking_them_back_fails(
        bare_gate: Bare, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Permits granted to take parked tasks back, then the take-back fails (Redis gone):
    no task was adopted, so the permits are given back with the next call."""
    gate, _, ready = bare_gate
    state = gate._flow(FLOW)

    async def fails(state: FlowState, count: int) -> list[Attempt]:
        raise StoreUnavailable("unpark: ConnectionError (injected)")

    monkeypatch.setattr(gate._parking, "take_back", fails)
    with pytest.raises(StoreUnavailable):
        await gate._unpark(state, ["p1", "p2"], 0, granted_ms=fake_clock.now_ms())
    assert state.releases == [Release("p1", sent=False), Release("p2", sent=False)]
    assert ready.empty()
