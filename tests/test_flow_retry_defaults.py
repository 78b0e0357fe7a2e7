"""A flow's retry defaults (docs/api.md v3, "Flows: pause, retry defaults, and what waiting
counts"): tasks that set no ``max_attempts`` / ``retry_backoff`` get their flow's, a task's own
fields win, and ``max_backoff`` caps every retry delay of the flow (Retry-After included).
The dispatcher decides with the defaults its permits call read (timewheel/engine/executor.py)."""

from __future__ import annotations

import httpx
import respx

from tests.conftest import START_MS
from tests.test_dispatcher import DUE_MS, URL, Harness, jitter, router, wheel
from timewheel.store.flow_store import StoredLimits

__all__ = ["jitter", "router", "wheel"]  # fixtures of tests/test_dispatcher.py used here
FLOW = "127.0.0.1:9"  # URL's destination: the tasks' default flow


async def set_flow(wheel: Harness, **fields: int | bool | None) -> None:
    await wheel.dispatcher._gate._flows.set_limits(FLOW, StoredLimits(None, None, **fields))


async def test_flow_defaults_set_attempts_and_backoff(wheel: Harness, router: respx.MockRouter,
                                                      jitter: float) -> None:
    """max_attempts 2 and retry_backoff 30 s from the flow: one retry, 30 s (x jitter) after
    the first attempt, then failed. Control: without the flow's defaults the same task would
    retry after 1 s and get 5 attempts (test_dispatcher.py)."""
    route = router.post(URL).respond(503)
    await set_flow(wheel, max_attempts=2, backoff_ms=30_000)
    await wheel.add()
    await wheel.fire()
    raw = await wheel.raw()
    assert (raw["status"], raw["due"]) == ("retrying", str(DUE_MS + round(30_000 * jitter)))
    wheel.clock.set(int(raw["due"]) - 1000)
    await wheel.fire()
    assert route.call_count == 2
    assert ((await wheel.raw())["status"], await wheel.dead()) == ("failed", ["job-1"])


async def test_a_tasks_own_fields_win(wheel: Harness, router: respx.MockRouter,
                                      jitter: float) -> None:
    """The task sets max_attempts 3 and retry_backoff 1 s: the flow's 2 attempts and 30 s do
    not apply to it."""
    route = router.post(URL).respond(503)
    await set_flow(wheel, max_attempts=2, backoff_ms=30_000)
    await wheel.add(max_attempts=3, retry_backoff=1.0)
    await wheel.fire()
    raw = await wheel.raw()
    assert (raw["status"], raw["due"]) == ("retrying", str(DUE_MS + round(1000 * jitter)))
    for _ in range(2):
        wheel.clock.set(int((await wheel.raw())["due"]) - 1000)
        await wheel.fire()
    assert route.call_count == 3
    assert (await wheel.raw())["status"] == "failed"


async def test_own_backoff_flow_attempts(wheel: Harness, router: respx.MockRouter,
                                         jitter: float) -> None:
    """Each field on its own: the task's backoff with the flow's max_attempts."""
    router.post(URL).respond(503)
    await set_flow(wheel, max_attempts=1, backoff_ms=30_000)
    await wheel.add(retry_backoff=2.0)
    await wheel.fire()
    assert (await wheel.raw())["status"] == "failed"  # the flow's 1 attempt
    await set_flow(wheel, max_attempts=4, backoff_ms=30_000)
    task = await wheel.add("job-2", retry_backoff=2.0)
    await wheel.fire("job-2")
    assert (await wheel.raw("job-2"))["due"] == str(task.due_ms + round(2000 * jitter))


async def test_max_backoff_caps_the_delay_and_retry_after(wheel: Harness,
                                                          router: respx.MockRouter,
                                                          jitter: float) -> None:
    """max_backoff 1 day lets a Retry-After of 5 hours through (the service's cap is 1 hour);
    max_backoff 2 s holds a 30 s backoff to 2 s."""
    router.post(URL).respond(429, headers={"Retry-After": "18000"})
    await set_flow(wheel, max_backoff_ms=86_400_000)
    await wheel.add()
    await wheel.fire()
    assert (await wheel.raw())["due"] == str(DUE_MS + 18_000_000)

    await set_flow(wheel, max_backoff_ms=2000)
    task = await wheel.add("job-2", retry_backoff=30.0)
    await wheel.fire("job-2")
    assert (await wheel.raw("job-2"))["due"] == str(task.due_ms + 2000)


async def test_views_show_the_fields_in_force(client: httpx.AsyncClient) -> None:
    """GET /tasks/{key} and the batch answer show the flow's defaults for a task that set
    none, the task's own otherwise, the service's when neither did."""
    assert (await client.put(f"/flows/{FLOW}", json={"max_attempts": 20,
                                                     "retry_backoff": 60})).status_code == 200
    await client.post("/tasks", json={"key": "a", "callback_url": URL, "delay": 60})
    await client.post("/tasks", json={"key": "b", "callback_url": URL, "delay": 60,
                                      "max_attempts": 3, "retry_backoff": 2})
    await client.post("/tasks", json={"key": "c", "callback_url": "http://127.0.0.1:8/x",
                                      "delay": 60})
    shown = {key: ((view := (await client.get(f"/tasks/{key}")).json())["max_attempts"],
                   view["retry_backoff"]) for key in "abc"}
    assert shown == {"a": (20, 60.0), "b": (3, 2.0), "c": (5, 1.0)}
    batch = (await client.post("/tasks/batch", json={"tasks": [
        {"key": "d", "callback_url": URL, "delay": 60}]})).json()
    assert (batch["results"][0]["task"]["max_attempts"],
            batch["results"][0]["task"]["retry_backoff"]) == (20, 60.0)
    assert START_MS  # the app's clock starts there (tests/conftest.py)
