"""Flow control in the dispatcher, on a real Redis with a fake clock and respx answering:
parallelism and rate hold, waiting is not an attempt, waiters park in Redis before their
lease could run out and come back when there is room, other flows are not held up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import respx

from tests.test_dispatcher import DUE_MS, URL, Harness, flow_store, router, wait_until
from timewheel.clock import FakeClock
from timewheel.engine.dispatcher import Dispatcher
from timewheel.engine.flow_gate import UNPARK_START_MS, FlowGate
from timewheel.engine.flow_state import FlowState, Lease, Waiter
from timewheel.engine.ticker import claim_tokens
from timewheel.metrics import Metrics
from timewheel.store import Store
from timewheel.store.flow_store import StoredLimits

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
    await asyncio.sleep(0.05)  # room for a third to (wrongly) start
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


async def test_rate_spreads_starts_over_windows(gated: Harness,
                                                router: respx.MockRouter) -> None:
    """rate 2: two start at once, the next two when the window has moved on a second."""
    route = router.post(URL).respond(200)
    await limit(gated.store, FLOW, rate=2)
    keys = [f"r{i}" for i in range(5)]
    await due_now(gated, keys)
    await wait_until(lambda: _true(route.call_count == 2), "the first two")
    await asyncio.sleep(0.05)
    assert route.call_count == 2
    gated.clock.set(DUE_MS + 999)
    await asyncio.sleep(0.05)
    assert route.call_count == 2
    gated.clock.set(DUE_MS + 1000)
    await wait_until(lambda: _true(route.call_count == 4), "two more a second later")
    gated.clock.set(DUE_MS + 2000)
    await wait_until(lambda: _true(route.call_count == 5), "the last")
    await gated.settle()
    assert await statuses(gated, keys) == [("succeeded", 1)] * 5


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
        assert harness.dispatcher.in_flight == 1
        receiver.open.set()
        await wait_until(lambda: _true(len(receiver.attempts) == 4), "all four sent")
        assert receiver.peak == 1
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


def bare_gate(store: Store, clock: FakeClock,
              start: Callable[[object, str, int], None]) -> FlowGate:
    """A flow gate alone, for driving its internals directly: grants go to ``start``."""
    return FlowGate(flow_store(store), store, clock, Metrics(), start=start,
                    park=lambda waiters: None, adopt=lambda task, permit, start: None,
                    tokens=claim_tokens(), lease_margin_ms=5000, max_lease_ms=35_000,
                    local_cap=10, max_waiting=10)


async def _true(value: bool) -> bool:
    return value


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
    await gated.dispatcher.stop(0.2)
    receiver.open.set()
    [sent] = [key for key, _ in receiver.attempts]
    for key in {"a", "b", "c"} - {sent}:
        assert (await gated.view(key)).status == "scheduled"
        assert await gated.lease(key) == []
    assert (await gated.view(sent)).status == "delivering"  # its lease re-sends it
    assert await flow_store(gated.store).in_flight(FLOW, now_ms=gated.clock.now_ms()) == 0


async def test_a_waiter_parked_while_its_permit_was_asked_for_gives_it_back(
        store: Store, fake_clock: FakeClock) -> None:
    """The race between a park deadline and a permits reply: a waiter already parked when
    its permit arrives does not start, and its permit goes back (no one else uses it)."""
    started: list[tuple[object, str]] = []
    gate = bare_gate(store, fake_clock, lambda payload, permit, start: started.append(
        (payload, permit)))
    state = FlowState(FLOW)
    waiters = [Waiter(None, name, f"p-{name}", 0.0) for name in "abc"]  # type: ignore[arg-type]
    state.queue.extend(waiters)
    waiters[0].gone = True
    state.queue.popleft()  # what the park deadline did while the call was out
    gate._hand_over(state, waiters, [("p-a", 1), ("p-b", 1)], Lease(1e15, 0.0))
    assert started == [("b", "p-b")]
    assert list(state.queue) == [waiters[2]]
    assert state.releases == ["p-a"]


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
    await asyncio.sleep(0.05)
    receiver.answer(1)  # one of the two finishes: its permit must not go to the next task
    await wait_until(lambda: _true(receiver.now == 1), "one answered")
    await asyncio.sleep(0.1)  # room for a wrongly handed-on permit to start an attempt
    assert receiver.now == 1 and len(receiver.attempts) == 2
    receiver.open.set()
    await wait_until(lambda: _true(len(receiver.attempts) == 6), "all six sent")
    await gated.settle()
    assert receiver.seen_at_once[:2] == [1, 2]
