"""Spare permits (timewheel/engine/spare_permits.py), on a real Redis with a fake clock and
respx answering: a flow's next task reuses the permit its last one gave back, for at most
SPARE_MS after Redis granted it; rated flows, flows of low parallelism, parked tasks and
shutdown keep none."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
import respx

from tests.test_dispatcher import DUE_MS, URL, Harness, flow_store, router, wait_until
from tests.test_flow_gate import FLOW, OTHER, Receiver, _true, bare_gate, limit
from timewheel.clock import FakeClock
from timewheel.engine.dispatcher import Dispatcher
from timewheel.engine.flow_state import FlowState, Lease, Waiter
from timewheel.engine.spare_permits import SPARE_MS
from timewheel.engine.ticker import claim_tokens
from timewheel.store import Store
from timewheel.store.flow_store import FlowStore, PermitReply

__all__ = ["router"]  # the respx fixture, shared with test_dispatcher


class CountingFlows(FlowStore):
    """The flow store, noting each permits call as (permits given back, permits asked for)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store.redis, store.keys, store.scripts, default_parallelism=100)
        self.calls: list[tuple[int, int]] = []

    async def permits(self, flow: str, *, now_ms: int, lease_ms: int,
                      release: Sequence[str] = (), want: Sequence[tuple[str, int]] = ()
                      ) -> PermitReply:
        self.calls.append((len(release), len(want)))
        return await super().permits(flow, now_ms=now_ms, lease_ms=lease_ms, release=release,
                                     want=want)

    @property
    def asked(self) -> int:
        return sum(1 for _, wanted in self.calls if wanted)


@pytest.fixture
async def wheel(store: Store, fake_clock: FakeClock, router: respx.MockRouter
                ) -> AsyncIterator[tuple[Harness, CountingFlows]]:
    harness = Harness(store, fake_clock)
    flows = CountingFlows(store)
    harness.dispatcher = Dispatcher(
        store, flows, fake_clock, harness.sender, harness.metrics, signer=None,
        max_concurrency=10, batch_deadline_ms=30_000, tokens=claim_tokens())
    router.post(URL).respond(200)
    yield harness, flows
    await harness.dispatcher.stop(0.1)
    await harness.sender.aclose()


async def fire(harness: Harness, key: str, delay: float, **fields: object) -> None:
    """Add a task due ``delay`` s from now, claim it, move the clock to its due time and
    wait until its outcome is recorded."""
    await harness.add(key, delay=delay, **fields)
    tasks = await harness.claim(key)
    harness.dispatcher.submit(tasks, harness.clock.now_ms())
    harness.clock.set(tasks[0].due_ms)
    await harness.settle()


async def held(harness: Harness, count: int) -> bool:
    """Whether Redis counts ``count`` permits of the flow as held."""
    return await flow_store(harness.store).in_flight(FLOW, now_ms=harness.clock.now_ms()) == count


async def test_the_next_task_reuses_the_permit_and_it_goes_back_after_spare_ms(
        wheel: tuple[Harness, CountingFlows]) -> None:
    harness, flows = wheel
    await fire(harness, "a", 1.0)  # its permit is granted at DUE_MS
    assert flows.asked == 1
    assert await held(harness, 1)  # kept: still counted against the flow's parallelism
    await fire(harness, "b", 0.1)
    await fire(harness, "c", 0.1)
    assert flows.asked == 1  # b and c went out on a's permit, without a permits call
    assert [(await harness.view(k)).status for k in "abc"] == ["succeeded"] * 3

    harness.clock.set(DUE_MS + SPARE_MS)
    await wait_until(lambda: held(harness, 0), "the spare given back")
    assert flows.calls[-1] == (1, 0)


async def test_a_permit_older_than_spare_ms_is_not_reused(
        wheel: tuple[Harness, CountingFlows]) -> None:
    harness, flows = wheel
    await fire(harness, "a", 1.0)
    await fire(harness, "b", SPARE_MS / 1000 + 0.05)  # after a's permit stopped being fresh
    assert flows.asked == 2  # b asked Redis: the limits are read again


async def test_a_rated_flow_keeps_no_spare(wheel: tuple[Harness, CountingFlows]) -> None:
    harness, flows = wheel
    await limit(harness.store, FLOW, rate=1000)  # every start must be logged in Redis
    await fire(harness, "a", 1.0)
    await wait_until(lambda: held(harness, 0), "a's permit given back")
    await fire(harness, "b", 0.1)
    assert flows.asked == 2


async def test_a_flow_of_low_parallelism_keeps_no_spare(
        wheel: tuple[Harness, CountingFlows]) -> None:
    """With parallelism 2, one spare here would be half the flow for every other process."""
    harness, flows = wheel
    await limit(harness.store, FLOW, parallelism=2)
    await fire(harness, "a", 1.0)
    await wait_until(lambda: held(harness, 0), "a's permit given back")
    await fire(harness, "b", 0.1)
    assert flows.asked == 2


async def test_stop_gives_the_spares_back(wheel: tuple[Harness, CountingFlows]) -> None:
    harness, _ = wheel
    await fire(harness, "a", 1.0)
    assert await held(harness, 1)
    await harness.dispatcher.stop(0.1)
    assert await held(harness, 0)


async def test_a_rate_set_meanwhile_holds_once_the_spare_is_older_than_spare_ms(
        wheel: tuple[Harness, CountingFlows]) -> None:
    """A PUT adding a rate reaches a process's spare within SPARE_MS of its grant (the
    documented lag): a task after that asks Redis, learns the rate, keeps no spare, and the
    next one waits for the rate window."""
    harness, flows = wheel
    await fire(harness, "a", 1.0)
    await limit(harness.store, FLOW, rate=1)
    await fire(harness, "b", 0.1)  # within SPARE_MS of a's grant: on the spare, unlogged
    assert flows.asked == 1
    await fire(harness, "c", (SPARE_MS - 100) / 1000 + 0.05)  # past SPARE_MS: asks Redis
    assert flows.asked == 2
    await wait_until(lambda: held(harness, 0), "c's permit given back: a rated flow keeps none")
    c_start = harness.clock.now_ms()
    await harness.add("d", delay=0.1)
    [task] = await harness.claim("d")
    harness.dispatcher.submit([task], harness.clock.now_ms())
    harness.clock.set(task.due_ms)
    await asyncio.sleep(0.1)
    assert (await harness.view("d")).status != "succeeded"  # one start a second
    harness.clock.set(c_start + 1000)
    await harness.settle()
    assert (await harness.view("d")).status == "succeeded"


async def test_a_spare_too_short_for_the_next_task_goes_back_at_once(
        wheel: tuple[Harness, CountingFlows]) -> None:
    """A spare whose lease does not cover the next task's timeout is given back when that
    task asks Redis, not left holding a place of the flow for SPARE_MS."""
    harness, flows = wheel
    await fire(harness, "a", 1.0)  # timeout 10 s: its lease covers a 10 s attempt and more
    held_key = harness.store.keys.flow(FLOW) + "held"
    [spare] = await harness.store.redis.zrange(held_key, 0, -1)
    await fire(harness, "long", 0.1, timeout=29.0)
    assert flows.asked == 2
    assert spare not in await harness.store.redis.zrange(held_key, 0, -1)


async def test_stop_gives_spares_back_before_attempts_in_flight_end(
        wheel: tuple[Harness, CountingFlows], router: respx.MockRouter) -> None:
    """Shutdown waits up to its grace period for attempts in flight; spares of other flows
    go back at once, not after that wait."""
    harness, _ = wheel
    await fire(harness, "a", 1.0)
    slow = Receiver(router, OTHER)
    await harness.add("slow", callback_url=OTHER, flow_key="other", delay=0.1)
    [task] = await harness.claim("slow")
    harness.dispatcher.submit([task], harness.clock.now_ms())
    harness.clock.set(task.due_ms)
    await wait_until(lambda: _true(slow.now == 1), "the slow attempt in flight")
    stopping = asyncio.create_task(harness.dispatcher.stop(5.0))
    await wait_until(lambda: held(harness, 0), "the spare given back")
    assert slow.now == 1 and not stopping.done()
    slow.open.set()
    await stopping


async def test_a_parked_task_of_the_flow_gets_the_spare_back_first(
        wheel: tuple[Harness, CountingFlows]) -> None:
    """A task of the flow parked by any process goes before this process's next task: the
    spare goes back to Redis as soon as the tick sees the parked task (well before SPARE_MS),
    and the parked task is sent."""
    harness, _ = wheel
    await fire(harness, "a", 1.0)
    held_key = harness.store.keys.flow(FLOW) + "held"
    [spare] = await harness.store.redis.zrange(held_key, 0, -1)
    await harness.add("p", delay=0.1)
    [task] = await harness.claim("p")
    assert await harness.store.park(task.bucket, [(task.key, task.token)]) == [1]
    await harness.dispatcher.poll_flows()  # the clock stays at a's due time

    async def given_back() -> bool:
        return spare not in await harness.store.redis.zrange(held_key, 0, -1)
    await wait_until(given_back, "the spare given back")

    async def sent() -> bool:
        harness.clock.advance(10)  # an unparked task starts UNPARK_START_MS after its permit
        return (await harness.view("p")).status == "succeeded"
    await wait_until(sent, "the parked task sent")


async def test_only_a_permit_no_one_gives_back_becomes_a_spare(
        store: Store, fake_clock: FakeClock) -> None:
    """A reply granting permits to waiters gone meanwhile: the permit of one parked (already
    queued for giving back) goes back; the permit of one started on a permit handed on is
    fresh and unused, so it is kept. Keeping the first would let Redis count it free while
    this process still used it."""
    started: list[object] = []
    gate = bare_gate(store, fake_clock, lambda payload, permit, start: started.append(payload))
    state = FlowState(FLOW, rated=False, room=100)
    parked = Waiter(None, "parked", "p-parked", 0.0, gone=True)  # type: ignore[arg-type]
    handed_on = Waiter(None, "handed", "p-handed", 0.0,  # type: ignore[arg-type]
                       gone=True, handed_on=True)
    waiting = Waiter(None, "waiting", "p-waiting", 0.0)  # type: ignore[arg-type]
    state.queue.append(waiting)
    state.releases.append("p-parked")  # what the park deadline did
    now = fake_clock.now_ms()
    gate._hand_over(state, [parked, handed_on, waiting],
                    [("p-parked", now), ("p-handed", now), ("p-waiting", now)],
                    Lease(now + 60_000, now))
    assert started == ["waiting"]
    assert state.spare == ["p-handed"]
    assert "p-handed" not in state.releases and "p-parked" in state.releases
    await gate.close()
