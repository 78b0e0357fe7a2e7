"""Lateness (timewheel_callback_lateness_seconds, the dashboard's p50/p99 card) is measured
from the earliest moment a task could have been sent: max(due time, created or replaced at).

A task created with an execute_at in the past is sent at once and is not "late" by the age of
its execute_at (a task created with an execute_at 39 hours ago once read as "> 300 s").
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import respx

from tests.conftest import START_MS
from tests.test_dispatcher import DUE_MS, URL, Harness
from timewheel.clock import FakeClock
from timewheel.store import Store

HOURS_39_MS = 39 * 3_600_000


@pytest.fixture
async def wheel(store: Store, fake_clock: FakeClock) -> AsyncIterator[Harness]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        router.post(URL).respond(200)
        harness = Harness(store, fake_clock)
        yield harness
        await harness.dispatcher.stop(0.1)
        await harness.sender.aclose()


def first_attempt_lateness(wheel: Harness) -> tuple[float, float]:
    """(count, sum in seconds) of the first-attempt lateness histogram."""
    name = "timewheel_callback_lateness_seconds"
    labels = {"attempt": "first"}
    return (wheel.counter(f"{name}_count", **labels), wheel.counter(f"{name}_sum", **labels))


async def test_a_task_created_with_a_past_execute_at_is_not_late(wheel: Harness) -> None:
    await wheel.add(delay=None, execute_at=(START_MS - HOURS_39_MS) / 1000)
    await wheel.fire()
    assert (await wheel.view()).status == "succeeded"
    # The FakeClock did not move: sent at the moment it was created, so 0 s late, not 39 h.
    assert first_attempt_lateness(wheel) == (1, 0.0)


async def test_a_task_sent_after_its_due_time_counts_as_late_from_it(wheel: Harness) -> None:
    """The control: a task due after its creation, sent 2.5 s after its due time, is 2.5 s
    late (the measure above is not always zero)."""
    await wheel.add()  # delay 1.0: due at DUE_MS, created at START_MS
    tasks = await wheel.claim()
    wheel.clock.set(DUE_MS + 2500)
    wheel.dispatcher.submit(tasks, START_MS)
    await wheel.settle()
    assert (await wheel.view()).status == "succeeded"
    assert first_attempt_lateness(wheel) == (1, 2.5)
