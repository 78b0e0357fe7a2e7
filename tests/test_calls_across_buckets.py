"""One start call and one complete call for every bucket's claims on a single Redis
(lua/start.lua and lua/complete.lua with several prefixes): each claim gets its own answer
whatever the order of buckets in the call, and the recorder makes one call per batch there,
one per bucket on a cluster."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
import respx

from tests.support.waiting import wait_until
from tests.test_dispatcher import URL, Harness, router, wheel
from tests.test_store import claim_all, task
from timewheel.clock import FakeClock
from timewheel.engine.attempt import Attempt
from timewheel.engine.dispatcher import CHECK_LEAD_MS, WAKE_GRID_MS, on_grid
from timewheel.engine.recorder import Recorder
from timewheel.metrics import Metrics
from timewheel.store import CompleteReply, Outcome, Store
from timewheel.store.record import NOT_STARTED, ClaimedTask

NOW = 1_800_000_000_000
__all__ = ["router", "wheel"]  # fixtures of tests/test_dispatcher.py used here


async def claimed_in_buckets(store: Store, count: int) -> list[ClaimedTask]:
    """``count`` claimed tasks spread over at least three buckets, each with its own body."""
    for i in range(count):
        await store.schedule(dataclasses.replace(task(f"k{i}", NOW), body=f"body {i}".encode()),
                             replace=False, now_ms=NOW)
    claimed = await claim_all(store, NOW)
    assert len({c.bucket for c in claimed}) >= 3
    return claimed


async def test_one_call_starts_claims_of_many_buckets_each_with_its_own_answer(
        store: Store) -> None:
    """Claims interleaved over buckets (a, b, a, c, ...) in one call: each gets its own task's
    body back, in the order asked. A claim that is not the caller's any more (wrong token) is
    NOT_STARTED in its place without disturbing its neighbours."""
    claimed = await claimed_in_buckets(store, 12)
    claimed.sort(key=lambda c: (int(c.key[1:]) % 3, c.key))  # mixes the buckets
    claims = [(c.bucket, c.key, c.token) for c in claimed]
    stale = 5
    claims[stale] = (claims[stale][0], claims[stale][1], "not-the-token")
    started = await store.start_many(claims)
    for i, (claim, result) in enumerate(zip(claimed, started, strict=True)):
        if i == stale:
            assert result == NOT_STARTED
        else:
            assert (result.attempt, result.body) == (1, f"body {claim.key[1:]}".encode())
    # Idempotent, as a retried call must be: the same attempt numbers again.
    again = await store.start_many(claims)
    assert [s.attempt for s in again] == [s.attempt for s in started]


class CountingStore:
    """The real store, counting start calls and the buckets each carried."""

    def __init__(self, store: Store, *, span: bool) -> None:
        self._store = store
        self.starts_span_buckets = span
        self.calls: list[set[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def start_many(self, claims: Sequence[tuple[int, str, str]], **kwargs: Any) -> Any:
        self.calls.append({bucket for bucket, _, _ in claims})
        return await self._store.start_many(claims, **kwargs)

    async def complete_many(self, outcomes: Sequence[tuple[int, Outcome]],
                            **kwargs: Any) -> Any:
        self.calls.append({bucket for bucket, _ in outcomes})
        return await self._store.complete_many(outcomes, **kwargs)


@pytest.mark.parametrize("span", [True, False], ids=["single Redis", "cluster"])
async def test_starts_of_one_iteration_go_in_one_call_on_a_single_redis(
        store: Store, span: bool) -> None:
    """Attempts of several buckets starting in the same loop iteration: one call on a single
    Redis; one call per bucket where a call may not span buckets (a cluster). Both start
    every attempt."""
    claimed = await claimed_in_buckets(store, 12)
    counting = CountingStore(store, span=span)
    recorder = Recorder(counting, FakeClock(NOW), Metrics())  # type: ignore[arg-type]
    attempts = [Attempt.claimed(c, NOW, batch_deadline_ms=30_000, lease_margin_ms=5_000)
                for c in claimed]
    started = await asyncio.gather(*(recorder.start(a) for a in attempts))
    assert [s.attempt for s in started] == [1] * len(claimed)
    buckets = {c.bucket for c in claimed}
    if span:
        assert counting.calls == [buckets]
    else:
        assert sorted(len(call) for call in counting.calls) == [1] * len(buckets)
        assert set().union(*counting.calls) == buckets


async def test_attempts_due_within_one_grid_step_start_in_one_call(
        wheel: Harness, router: respx.MockRouter, monkeypatch: pytest.MonkeyPatch) -> None:
    """10 tasks due 1 ms apart over several buckets, the clock moving 1 ms at a time (each
    step run until the dispatcher is idle): the starts go in one call per WAKE_GRID_MS step
    (2), not one per task (10). Every task is sent once, none before its due time."""
    sent_at: dict[str, int] = {}

    def record(request: httpx.Request) -> httpx.Response:
        sent_at[request.headers["webhook-id"]] = wheel.clock.now_ms()
        return httpx.Response(200)

    router.post(URL).mock(side_effect=record)
    store = wheel.store
    real = store.start_many
    calls: list[int] = []

    async def counted(claims: Any, **kwargs: Any) -> Any:
        calls.append(len(claims))
        return await real(claims, **kwargs)

    monkeypatch.setattr(store, "start_many", counted)
    first_due = (wheel.clock.now_ms() // 1000 + 2) * 1000  # on a whole second: grid-aligned
    for i in range(10):  # 10: at most the harness's 10 workers hold attempts at once
        await wheel.add(f"g{i}", delay=None, execute_at=(first_due + i) / 1000)
    wheel.clock.set(first_due - 100)
    claimed = await wheel.claim(None)
    assert len(claimed) == 10 and len({t.bucket for t in claimed}) > 3
    wheel.dispatcher.submit(claimed, wheel.clock.now_ms())

    def started_by(now: int) -> int:
        return sum(1 for t in claimed if on_grid(t.due_ms - CHECK_LEAD_MS) <= now)

    wheel.clock.set(first_due - 40)
    for _ in range(60):
        wheel.clock.advance(1)
        now = wheel.clock.now_ms()
        await wait_until(lambda now=now: sum(calls) == started_by(now)
                         and len(sent_at) == sum(1 for t in claimed if t.due_ms <= now),
                         f"the dispatcher to catch up at {now}")
    await wheel.settle()
    assert WAKE_GRID_MS == 5
    assert calls == [5, 5]  # the first due on a whole second: 5 tasks per grid step
    assert {t.key: t.due_ms for t in claimed}.keys() == sent_at.keys()
    assert all(sent_at[t.key] >= t.due_ms for t in claimed)  # none early


def delivered(claim: ClaimedTask, token: str | None = None) -> Outcome:
    return Outcome(claim.key, token or claim.token, "ok", 200, started_ms=NOW)


async def test_one_call_records_outcomes_of_many_buckets_each_with_its_own_reply(
        store: Store) -> None:
    """Outcomes interleaved over buckets in one complete call: each is recorded on its own
    task; one whose claim is not the caller's (wrong token) is STALE in its place and leaves
    its task as it was."""
    claimed = await claimed_in_buckets(store, 12)
    claimed.sort(key=lambda c: (int(c.key[1:]) % 3, c.key))
    await store.start_many([(c.bucket, c.key, c.token) for c in claimed])
    stale = 7
    outcomes = [(c.bucket, delivered(c, "not-the-token" if i == stale else None))
                for i, c in enumerate(claimed)]
    replies = await store.complete_many(outcomes, now_ms=NOW + 10)
    assert replies == [CompleteReply.STALE if i == stale else CompleteReply.RECORDED
                       for i in range(len(claimed))]
    for i, c in enumerate(claimed):
        record = await store.get(c.key)
        assert record is not None
        assert record.status.value == ("delivering" if i == stale else "succeeded"), c.key


@pytest.mark.parametrize("span", [True, False], ids=["single Redis", "cluster"])
async def test_outcomes_answered_together_are_recorded_in_one_call_on_a_single_redis(
        store: Store, span: bool) -> None:
    """Outcomes of several buckets recorded within the linger: one call on a single Redis,
    one per bucket on a cluster; every outcome is recorded either way."""
    claimed = await claimed_in_buckets(store, 12)
    await store.start_many([(c.bucket, c.key, c.token) for c in claimed])
    counting = CountingStore(store, span=span)
    recorder = Recorder(counting, FakeClock(NOW), Metrics())  # type: ignore[arg-type]
    attempts = [Attempt.claimed(c, NOW, batch_deadline_ms=30_000, lease_margin_ms=5_000)
                for c in claimed]
    recorded = await asyncio.gather(*(recorder.record(a, delivered(a.task)) for a in attempts))
    assert recorded == [True] * len(claimed)
    buckets = {c.bucket for c in claimed}
    if span:
        assert counting.calls == [buckets]
    else:
        assert sorted(len(call) for call in counting.calls) == [1] * len(buckets)
