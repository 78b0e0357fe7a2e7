"""How a shutdown stops the background loops (timewheel/loops.py): a step that ends in time is
waited for; one that a silent Redis holds up is cancelled, so the shutdown goes on. Each loop
is shown with a stand-in for its store whose calls never answer (a stopped or cut-off Redis):
before, its stop waited for the client's socket timeout, once or twice."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.conftest import START_MS
from tests.support.partition_proxy import forwarding
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until
from timewheel.clock import FakeClock
from timewheel.engine.materializer import Materializer
from timewheel.engine.publish_sweeper import PublishSweeper
from timewheel.jobs.runner import JobRunner
from timewheel.loops import STOP_WAIT_S, stop_loop
from timewheel.service import Wheel
from timewheel.settings import Settings

# Only a hang guard: a stop that waited on the silent Redis would never return.
GUARD_S = 10


async def never_answers(*args: Any, **kwargs: Any) -> Any:
    await asyncio.Event().wait()


def silent_store() -> SimpleNamespace:
    return SimpleNamespace(ready=True, keys=SimpleNamespace(buckets=2))


async def test_a_step_that_ends_in_time_is_waited_for() -> None:
    stopping, steps = asyncio.Event(), []

    async def loop() -> None:
        await stopping.wait()
        await asyncio.sleep(0.01)  # the step under way ends
        steps.append("finished")

    task = asyncio.create_task(loop())
    stopping.set()
    await stop_loop(task, wait_s=GUARD_S)
    assert (steps, task.cancelled()) == (["finished"], False)


async def test_a_step_held_up_past_the_wait_is_cancelled() -> None:
    task = asyncio.create_task(never_answers())
    await asyncio.wait_for(stop_loop(task, wait_s=0.05), GUARD_S)
    assert task.cancelled()


async def test_a_stop_that_is_cancelled_cancels_its_loop() -> None:
    loop_task = asyncio.create_task(never_answers())
    stopping = asyncio.create_task(stop_loop(loop_task, wait_s=GUARD_S))
    await asyncio.sleep(0.01)
    stopping.cancel()
    await asyncio.wait([stopping])
    await asyncio.wait_for(asyncio.wait([loop_task]), GUARD_S)
    assert loop_task.cancelled()


async def test_the_materializer_stops_while_its_pass_and_a_soon_pass_wait_on_redis() -> None:
    clock = FakeClock(START_MS)
    schedules = SimpleNamespace(next_soon=None, mark_pass=never_answers, due=never_answers)
    m = Materializer(silent_store(), schedules, clock, tick_ms=1000)  # type: ignore[arg-type]
    m.start()
    await asyncio.sleep(0.01)  # its pass waits on mark_pass
    m.downtime.passed_ms = clock.now_ms()  # as after an earlier pass: a schedule put now is told
    m.materialize_soon(0, clock.now_ms() + 10)
    [soon] = [t for t in asyncio.all_tasks() if t.get_name() == "timewheel-materialize-soon"]
    await asyncio.wait_for(m.stop(), GUARD_S)
    assert soon.cancelled()
    assert schedules.next_soon is None  # given back as it was


async def test_the_job_runner_stops_while_its_lease_call_waits_on_redis() -> None:
    jobs = SimpleNamespace(store=silent_store(), lease=never_answers)
    runner = JobRunner(jobs, FakeClock(START_MS))  # type: ignore[arg-type]
    runner.start()
    await asyncio.sleep(0.01)
    await asyncio.wait_for(runner.stop(), GUARD_S)


async def test_the_publish_sweeper_stops_while_its_sweep_waits_on_redis() -> None:
    publisher = SimpleNamespace(store=silent_store(), keys=SimpleNamespace(buckets=2),
                                complete_open=never_answers)
    sweeper = PublishSweeper(publisher, FakeClock(START_MS))  # type: ignore[arg-type]
    sweeper.start()
    await wait_until(lambda: sweeper._task is not None, "the sweeper's task")
    await asyncio.sleep(0.01)
    await asyncio.wait_for(sweeper.stop(), GUARD_S)


async def test_the_wheel_stops_its_ticker_while_a_pass_waits_on_a_silent_redis(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """The ticker is a loop too: cut off from Redis, its pass waits on one call after another
    (the clock's TIME, the flows' poll), the client's socket timeout each. Its stop is
    bounded like the others', so the dispatcher's stop begins within about a second."""
    with forwarding(redis_server.port) as proxy:
        settings = Settings(redis_url=proxy.url, allow_private_networks=True, data_dir=tmp_path,
                            key_prefix="tw-loops-silent", tick_seconds=0.2)
        wheel = await Wheel.open(settings)
        wheel.start_ticker()
        await wait_until(lambda: wheel.store.ready, "the wheel's store")
        await asyncio.sleep(0.5)  # a few passes while Redis answers
        await asyncio.to_thread(proxy.partition)
        await asyncio.sleep(0.5)  # the next pass began and waits on Redis (5 s socket timeout)
        began, dispatcher_stop = time.monotonic(), wheel.dispatcher.stop
        reached: list[float] = []

        async def stop_dispatcher(grace_seconds: float) -> None:
            reached.append(time.monotonic() - began)
            await dispatcher_stop(grace_seconds)

        wheel.dispatcher.stop = stop_dispatcher  # type: ignore[method-assign]
        await asyncio.wait_for(wheel.close(), GUARD_S)
        assert reached and reached[0] < STOP_WAIT_S + 1.0, reached
