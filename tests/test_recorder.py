"""Recording an outcome in the background (timewheel/engine/recorder.py ``record_soon``): the
first write is a future of the complete batch and a callback, no task; only a write that fails
gets a task, which tries again until the attempt's lease would have run out. Against a real
Redis, with its complete calls made to fail on purpose."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from tests.support.waiting import wait_until
from tests.test_store import claim_all, task
from timewheel.clock import FakeClock
from timewheel.engine.attempt import Attempt
from timewheel.engine.recorder import RETRY_FIRST_S, Recorder
from timewheel.errors import StoreUnavailable
from timewheel.metrics import Metrics
from timewheel.store import CompleteReply, Outcome, Store

NOW = 1_800_000_000_000


class FlakyStore:
    """The store, with its first ``fail`` complete calls failing as a Redis away does."""

    def __init__(self, store: Store, fail: int) -> None:
        self._store = store
        self.fail = fail
        self.calls = 0

    async def complete_many(self, outcomes: Sequence[tuple[int, Outcome]], *,
                            now_ms: int) -> list[CompleteReply]:
        self.calls += 1
        if self.calls <= self.fail:
            raise StoreUnavailable(f"complete: Redis away (call {self.calls})")
        return await self._store.complete_many(outcomes, now_ms=now_ms)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def started_attempt(store: Store, key: str = "a") -> Attempt:
    await store.schedule(task(key, NOW), replace=False, now_ms=NOW)
    [claimed] = await claim_all(store, NOW)
    await store.start_many([(claimed.bucket, claimed.key, claimed.token)])
    return Attempt.claimed(claimed, NOW, batch_deadline_ms=30_000, lease_margin_ms=5_000)


def delivered(attempt: Attempt, token: str | None = None) -> Outcome:
    return Outcome(attempt.task.key, token or attempt.task.token, "ok", 200, started_ms=NOW)


async def status_of(store: Store, key: str) -> str:
    record = await store.get(key)
    assert record is not None
    return record.status.value


async def test_an_outcome_written_at_the_first_try_takes_no_task(store: Store) -> None:
    attempt = await started_attempt(store)
    flaky = FlakyStore(store, fail=0)
    recorder = Recorder(flaky, FakeClock(NOW), Metrics())  # type: ignore[arg-type]
    assert await recorder.record_soon(attempt, delivered(attempt)) is True
    assert (flaky.calls, recorder.busy) == (1, 0)
    assert await status_of(store, "a") == "succeeded"


async def test_a_failed_first_write_is_tried_again_by_a_task_and_recorded_once(
        store: Store) -> None:
    attempt = await started_attempt(store)
    flaky = FlakyStore(store, fail=2)
    recorder = Recorder(flaky, FakeClock(NOW), Metrics())  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    began = loop.time()
    recorded = recorder.record_soon(attempt, delivered(attempt))
    assert await recorded is True
    # After a failed write the next waits RETRY_FIRST_S, then twice that.
    assert loop.time() - began >= 3 * RETRY_FIRST_S
    # The retries are not hand-backs: the attempt counts in the dispatcher's books already.
    assert (flaky.calls, recorder.busy) == (3, 0)
    assert await status_of(store, "a") == "succeeded"


async def test_an_outcome_not_written_before_its_lease_runs_out_is_not_recorded(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    attempt = await started_attempt(store)
    flaky = FlakyStore(store, fail=10**6)
    # The wheel's clock at the end of the attempt's lease: no time left for a retry.
    clock = FakeClock(attempt.send_by_ms + attempt.task.timeout_ms)
    recorder = Recorder(flaky, clock, Metrics())  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="timewheel.engine.recorder"):
        assert await recorder.record_soon(attempt, delivered(attempt)) is False
    assert flaky.calls == 1
    assert "outcome of a not stored, its lease will do: complete: Redis away (call 1)" in (
        caplog.text)
    assert await status_of(store, "a") == "delivering"


async def test_a_stale_outcome_counts_as_answered(store: Store,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    attempt = await started_attempt(store)
    recorder = Recorder(store, FakeClock(NOW), Metrics())
    with caplog.at_level(logging.INFO, logger="timewheel.engine.recorder"):
        assert await recorder.record_soon(attempt, delivered(attempt, "not-ours")) is True
    assert "outcome of a dropped: replaced or re-claimed meanwhile" in caplog.text
    assert await status_of(store, "a") == "delivering"


async def test_a_recording_given_up_at_shutdown_stops_its_retries(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its next try 5 s after the first: the cancel comes first however slowly this run goes
    # (a stall of 25 ms let the 50 ms retry come first); a retry the cancel missed tries at
    # 5 s and is still retrying when drain gives up at 10 s.
    monkeypatch.setattr("timewheel.engine.recorder.RETRY_FIRST_S", 5.0)
    attempt = await started_attempt(store)
    flaky = FlakyStore(store, fail=10**6)
    recorder = Recorder(flaky, FakeClock(NOW), Metrics())  # type: ignore[arg-type]
    recorded = recorder.record_soon(attempt, delivered(attempt))
    await wait_until(lambda: flaky.calls == 1, "the first write")
    await asyncio.sleep(RETRY_FIRST_S / 2)  # the retrying task waits for its next try
    recorded.cancel()
    assert await recorder.drain(10) == 0  # the retrying task ended with the cancel
    assert flaky.calls == 1  # no try after the cancel


def batch_futures(recorder: Recorder) -> list[asyncio.Future[Any]]:
    """The complete batch's futures that ``recorder`` hands out, kept for the test."""
    futures: list[asyncio.Future[Any]] = []
    batcher = recorder._completes
    submit = batcher.submit_nowait

    def keeping(bucket: int, item: Any) -> asyncio.Future[Any]:
        futures.append(submit(bucket, item))
        return futures[-1]

    batcher.submit_nowait = keeping  # type: ignore[method-assign]
    return futures


@pytest.mark.parametrize("when", ["before the batch", "while the batch fails"])
async def test_a_first_write_failing_after_the_recording_was_given_up_is_read(
        store: Store, when: str) -> None:
    """Given up before or while its batch fails (the batch may still carry it, as before):
    the batch's error is read, so asyncio logs no "Future exception was never retrieved"
    for it (that log comes only when the future is collected: the test reads the flag it
    comes from, Future._log_traceback)."""
    attempt = await started_attempt(store)
    flaky = FlakyStore(store, fail=10**6)
    recorder = Recorder(flaky, FakeClock(NOW), Metrics())  # type: ignore[arg-type]
    futures = batch_futures(recorder)
    recorded = recorder.record_soon(attempt, delivered(attempt))
    if when == "before the batch":
        recorded.cancel()
    else:
        real = flaky.complete_many

        async def failing_as_given_up(outcomes: Sequence[tuple[int, Outcome]], *,
                                      now_ms: int) -> list[CompleteReply]:
            recorded.cancel()
            return await real(outcomes, now_ms=now_ms)

        flaky.complete_many = failing_as_given_up  # type: ignore[method-assign]
    await wait_until(lambda: flaky.calls == 1, "the batch's write")
    await asyncio.sleep(0.01)
    [first] = futures
    assert first.done()
    assert not first._log_traceback  # type: ignore[attr-defined]


async def test_a_bug_while_retrying_is_logged_and_counts_as_not_recorded(
        store: Store, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    attempt = await started_attempt(store)
    flaky = FlakyStore(store, fail=1)
    recorder = Recorder(flaky, FakeClock(NOW), Metrics())  # type: ignore[arg-type]

    def broken(attempt: Attempt, result: int | None) -> bool:
        raise KeyError("a bug")

    monkeypatch.setattr(recorder, "_recorded", broken)
    with caplog.at_level(logging.ERROR, logger="timewheel.engine.recorder"):
        assert await recorder.record_soon(attempt, delivered(attempt)) is False
    assert "recording the outcome of a failed" in caplog.text and "a bug" in caplog.text
