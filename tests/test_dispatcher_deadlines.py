"""Dispatcher deadlines: a claim that cannot start in time is handed back at once, and an
attempt whose tick's batch deadline has passed is abandoned to its lease (never sent late and
never recorded as a result it did not get)."""

from __future__ import annotations

import respx

from tests.test_dispatcher import URL, Harness, flow_store, router, wait_until, wheel
from timewheel.clock import FakeClock
from timewheel.engine.dispatcher import Dispatcher
from timewheel.engine.ticker import claim_tokens
from timewheel.store import Store, layout

__all__ = ["router", "wheel"]  # fixtures of test_dispatcher.py, shared


async def test_claim_that_misses_its_start_deadline_is_handed_back(
        wheel: Harness, router: respx.MockRouter) -> None:
    """The process stalls past the lease margin before the task could start: it is not sent
    (its lease may run out mid-attempt) but released, claimable again at once."""
    route = router.post(URL).respond(200)
    await wheel.add()
    [task] = await wheel.claim()
    wheel.dispatcher.submit([task], wheel.clock.now_ms())
    # Jump past due + lease margin (5 s in the store fixture) in one step: a stalled process.
    wheel.clock.set(task.due_ms + wheel.store.lease_margin_ms + 1)

    async def released() -> bool:
        return (await wheel.raw())["status"] == "scheduled"
    await wait_until(released, "the claim to be handed back")
    await wheel.settle()
    assert not route.called
    raw = await wheel.raw()
    assert "claim" not in raw and "started" not in raw and raw["attempts"] == "0"
    assert await wheel.lease() == []
    again = await wheel.claim(token="other")
    assert [t.key for t in again] == ["job-1"]


async def test_attempt_past_its_batch_deadline_is_abandoned_to_its_lease(
        store: Store, fake_clock: FakeClock, router: respx.MockRouter) -> None:
    """A task claimed at T with a batch deadline of 100 ms, due at T + 1 s: by its due time the
    batch is over, so it is not sent; its lease stays, so another process re-sends it."""
    route = router.post(URL).respond(200)
    h = Harness(store, fake_clock)
    h.dispatcher = Dispatcher(store, flow_store(store), fake_clock, h.sender, h.metrics,
                              signer=None, max_concurrency=10, batch_deadline_ms=100,
                              tokens=claim_tokens())
    try:
        await h.add()
        [task] = await h.claim()
        h.dispatcher.submit([task], fake_clock.now_ms())
        fake_clock.set(task.due_ms)
        await h.settle()
        assert not route.called
        assert h.counter("timewheel_callbacks_total", outcome="abandoned") == 1
        raw = await h.raw()
        assert raw["status"] == "delivering" and raw["claim"] == layout.digest(task.token).hex()
        assert await h.lease() == [b"job-1"]
        # After the lease, any process claims it again and the attempt counter shows it.
        fake_clock.set(task.due_ms + task.timeout_ms + store.lease_margin_ms)
        [again] = await h.claim(token="other")
        assert again.key == "job-1" and again.attempts == 1
    finally:
        await h.dispatcher.stop(0.1)
        await h.sender.aclose()
