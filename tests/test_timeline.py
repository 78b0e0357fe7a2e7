"""Timeline (timewheel/engine/timeline.py): items fire in time order once the clock reaches
them, and one item whose callback raises does not stop the line for the others."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from timewheel.clock import FakeClock
from timewheel.engine.timeline import Timeline


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(1000):  # bounded: at most ~10 s
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_items_fire_in_time_order_once_due(fake_clock: FakeClock) -> None:
    fired: list[str] = []
    line: Timeline[str] = Timeline(fake_clock, fired.append)
    now = fake_clock.now_ms()
    line.add(now + 20, "b")
    line.add(now + 10, "a")
    line.add(now + 30, "c")
    await asyncio.sleep(0.01)
    assert fired == []
    fake_clock.advance(20)
    await _until(lambda: fired == ["a", "b"], "a and b")
    fake_clock.advance(10)
    await _until(lambda: fired == ["a", "b", "c"], "c")
    await line.close()


async def test_a_failing_item_does_not_stop_the_others(fake_clock: FakeClock) -> None:
    fired: list[str] = []

    def fire(item: str) -> None:
        if item == "bad":
            raise RuntimeError("boom")
        fired.append(item)

    line: Timeline[str] = Timeline(fake_clock, fire)
    now = fake_clock.now_ms()
    line.add(now + 10, "bad")
    line.add(now + 10, "same tick")
    line.add(now + 20, "later")
    fake_clock.advance(20)
    await _until(lambda: fired == ["same tick", "later"], "the items after the bad one")
    await line.close()


async def test_an_earlier_item_wakes_a_line_asleep_for_a_later_one(fake_clock: FakeClock) -> None:
    """The line sleeps until its first item; one added for sooner fires at its own time, not
    when the sleep for the later one ends."""
    fired: list[str] = []
    line: Timeline[str] = Timeline(fake_clock, fired.append)
    now = fake_clock.now_ms()
    line.add(now + 100, "later")
    await asyncio.sleep(0.01)  # the runner is asleep until now + 100
    line.add(now + 10, "sooner")
    fake_clock.advance(10)
    await _until(lambda: fired == ["sooner"], "the sooner item")
    fake_clock.advance(90)
    await _until(lambda: fired == ["sooner", "later"], "the later item")
    await line.close()
