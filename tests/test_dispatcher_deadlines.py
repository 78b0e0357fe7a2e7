"""An attempt is never sent past its lease: a claim that cannot start in time, an attempt
whose process stalled between its start and its send, one whose tick's batch deadline has
passed, and one whose start call Redis did not answer are all handed back unsent, for any
process to claim at once (never sent late, never left to wait out a whole lease)."""

from __future__ import annotations

from typing import Any

import pytest
import respx

from tests.support.waiting import wait_until
from tests.test_dispatcher import URL, Harness, flow_store, router, wheel
from timewheel.clock import FakeClock
from timewheel.engine.dispatcher import Dispatcher
from timewheel.engine.ticker import claim_tokens
from timewheel.errors import StoreUnavailable
from timewheel.store import Store

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


async def test_attempt_past_its_batch_deadline_is_handed_back_unsent(
        store: Store, fake_clock: FakeClock, router: respx.MockRouter) -> None:
    """A task claimed at T with a batch deadline of 100 ms, due at T + 1 s: by its due time the
    batch is over, so it is not sent; it is handed back uncounted, claimable again at once."""
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
        raw = await h.raw()
        assert raw["status"] == "scheduled" and "claim" not in raw and raw["attempts"] == "0"
        assert await h.lease() == []
        [again] = await h.claim(token="other")
        assert again.key == "job-1" and again.attempts == 0
    finally:
        await h.dispatcher.stop(0.1)
        await h.sender.aclose()


async def started(wheel: Harness) -> None:
    """Move the clock to the claim check and wait until the attempt is counted in Redis."""
    async def counted() -> bool:
        return (await wheel.raw()).get("started") == "1"
    await wait_until(counted, "the attempt to start")


@pytest.mark.parametrize("stall_ms", [0, 1])
async def test_a_process_stalled_between_start_and_send_does_not_send(
        wheel: Harness, router: respx.MockRouter, stall_ms: int) -> None:
    """The process stops (SIGSTOP, a starved CPU) after lua/start.lua counted the attempt and
    before the request went out, until the attempt's lease has no room left for it: resumed,
    it hands the claim back unsent instead of sending a request that could arrive after
    another process re-claimed and delivered the task. Control (stall_ms=0): resumed exactly
    at the last moment its lease allows, it sends."""
    route = router.post(URL).respond(200)
    await wheel.add()
    [task] = await wheel.claim()
    wheel.dispatcher.submit([task], wheel.clock.now_ms())
    wheel.clock.set(task.due_ms - 5)  # the claim check (CHECK_LEAD_MS)
    await started(wheel)
    margin = wheel.store.lease_margin_ms
    wheel.clock.set(task.due_ms + max(margin // 2, margin - 1000) + stall_ms)
    await wheel.settle()
    raw = await wheel.raw()
    if stall_ms:
        assert not route.called
        assert raw["status"] == "scheduled" and raw["attempts"] == "0" and "claim" not in raw
        assert [t.key for t in await wheel.claim(token="other")] == ["job-1"]
    else:
        assert route.call_count == 1
        assert raw["status"] == "succeeded"


async def test_a_start_unanswered_in_a_redis_outage_is_handed_back_when_redis_answers(
        wheel: Harness, router: respx.MockRouter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis runs the start script but its reply is lost (a restart), and the hand-back fails
    too while it is away: the attempt is not sent, and once Redis answers the claim is handed
    back (uncounted), long before its lease would have run out (the clock never moves past
    the due time here). Control: the same task, the store answering, the same wait: sent."""
    route = router.post(URL).respond(200)
    store = wheel.store
    real_start, real_release = store.start_many, store.release
    releases_refused = []

    async def start_then_lose_reply(claims: Any, **kwargs: Any) -> Any:
        await real_start(claims, **kwargs)
        raise StoreUnavailable("start: ConnectionError: reply lost")

    async def release_once_refused(bucket: int, claims: Any) -> list[int]:
        if not releases_refused:
            releases_refused.append(claims)
            raise StoreUnavailable("release: ConnectionError: still away")
        return await real_release(bucket, claims)

    monkeypatch.setattr(store, "start_many", start_then_lose_reply)
    monkeypatch.setattr(store, "release", release_once_refused)
    await wheel.add()
    [task] = await wheel.claim()
    wheel.dispatcher.submit([task], wheel.clock.now_ms())
    wheel.clock.set(task.due_ms)
    await wheel.settle()
    assert releases_refused, "the first hand-back was refused (Redis away)"
    assert not route.called
    raw = await wheel.raw()
    assert raw["status"] == "scheduled" and raw["attempts"] == "0" and "claim" not in raw
    assert await wheel.lease() == []
    monkeypatch.setattr(store, "start_many", real_start)
    await wheel.fire()
    assert route.call_count == 1
    assert (await wheel.raw())["status"] == "succeeded"


async def test_a_start_failing_with_a_library_error_is_handed_back(
        wheel: Harness, router: respx.MockRouter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only StoreUnavailable: redis-py's cluster client raised AttributeError mid-failover
    (the cluster soak). The attempt is not sent, leaves the process's books (settle would
    time out otherwise) and goes back to the wheel. Control: the same task with the store
    answering is sent."""
    route = router.post(URL).respond(200)
    store = wheel.store
    real_start = store.start_many

    async def broken_start(claims: Any, **kwargs: Any) -> Any:
        raise AttributeError("'NoneType' object has no attribute 'writelines'")

    monkeypatch.setattr(store, "start_many", broken_start)
    await wheel.add()
    [task] = await wheel.claim()
    wheel.dispatcher.submit([task], wheel.clock.now_ms())
    wheel.clock.set(task.due_ms)
    await wheel.settle()
    assert not route.called
    assert (await wheel.raw())["status"] == "scheduled"
    monkeypatch.setattr(store, "start_many", real_start)
    await wheel.fire()
    assert route.call_count == 1
