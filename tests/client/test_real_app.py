"""Both clients against the real app (real Redis, fake clock, no ticker) through its ASGI
transport: the models the client parses are the ones the API sends, and each error the API
raises arrives as its exception."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.client.conftest import Both
from tests.conftest import START_MS
from tests.test_api import fail_due
from timewheel.client import (
    AsyncClient,
    ConflictError,
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    UnauthorizedError,
)
from timewheel.clock import FakeClock
from timewheel.models import (
    FlowLimits,
    FlowView,
    ScheduleCreate,
    ScheduleTask,
    TaskCreate,
    TaskList,
    TaskStatus,
    TaskView,
)
from timewheel.scopes import ApiToken
from timewheel.settings import Settings
from timewheel.store import Store

URL = "http://127.0.0.1:9/hook"
NOW = "2027-01-15T08:00:00.000Z"  # START_MS


async def test_create_get_repeat_and_conflict(real: Both) -> None:
    created = await real.call("create_task", TaskCreate(key="order-1", callback_url=URL,
                                                        delay=60, body={"n": 1}))
    assert isinstance(created, TaskView)
    assert (created.key, created.status, created.execute_at) == (
        "order-1", TaskStatus.SCHEDULED, "2027-01-15T08:01:00.000Z")
    assert await real.call("get_task", "order-1") == created
    # The same request again is safe: the existing task, not an error.
    assert await real.call("create_task", {"key": "order-1", "callback_url": URL, "delay": 60,
                                           "body": {"n": 1}}) == created
    with pytest.raises(ConflictError) as raised:
        await real.call("create_task", {"key": "order-1", "callback_url": URL, "delay": 61})
    assert raised.value.status_code == 409
    assert raised.value.detail == "task 'order-1' exists with other content"


async def test_generated_key_and_put(real: Both) -> None:
    created = await real.call("create_task", {"callback_url": URL})
    moved = await real.call("put_task", created.key, {"callback_url": URL,
                                                      "execute_at": START_MS / 1000 + 5})
    assert moved.execute_at == "2027-01-15T08:00:05.000Z"
    assert (await real.call("get_task", created.key)).execute_at == moved.execute_at


async def test_cancel_then_cancel_again_conflicts_with_the_view(real: Both) -> None:
    await real.call("create_task", {"key": "c1", "callback_url": URL, "delay": 3600})
    assert await real.call("cancel_task", "c1") is None
    with pytest.raises(ConflictError) as raised:
        await real.call("cancel_task", "c1")
    assert raised.value.detail == "task 'c1' has already finished"
    assert raised.value.view is not None
    assert (raised.value.view.key, raised.value.view.status) == ("c1", TaskStatus.CANCELLED)


async def test_unknown_task_is_not_found(real: Both) -> None:
    for name in ("get_task", "cancel_task", "replay_task"):
        with pytest.raises(NotFoundError) as raised:
            await real.call(name, "nope")
        assert (raised.value.status_code, raised.value.detail) == (404, "no task with key 'nope'")


async def test_invalid_input_is_the_services_422(real: Both) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        await real.call("create_task", {"callback_url": "ftp://x", "delay": -1})
    assert raised.value.status_code == 422
    assert {tuple(e["loc"][:2]) for e in raised.value.detail} == {("body", "callback_url"),
                                                                 ("body", "delay")}


async def test_replay_and_list_failed(real: Both, store: Store, fake_clock: FakeClock) -> None:
    """Dead letters through list_tasks and iter_tasks (newest first), then a replay."""
    for n in range(3):
        await real.call("create_task", {"key": f"dead-{n}", "callback_url": URL,
                                        "execute_at": (START_MS + 1000 * n) / 1000})
    await real.call("create_task", {"key": "alive", "callback_url": URL, "delay": 3600})
    for n in range(3):
        assert await fail_due(store, START_MS + 1000 * n) == [f"dead-{n}"]

    page = await real.call("list_tasks", "failed", limit=2)
    assert isinstance(page, TaskList)
    assert [t.key for t in page.tasks] == ["dead-2", "dead-1"]
    assert page.next_cursor is not None
    rest = await real.call("list_tasks", "failed", limit=2, cursor=page.next_cursor)
    assert ([t.key for t in rest.tasks], rest.next_cursor) == (["dead-0"], None)
    every = await real.collect("iter_tasks", "failed", page_size=1)
    assert [t.key for t in every] == ["dead-2", "dead-1", "dead-0"]
    assert all(t.status == TaskStatus.FAILED and t.last_status_code == 400 for t in every)

    fake_clock.advance(7000)
    replayed = await real.call("replay_task", "dead-1")
    assert (replayed.status, replayed.attempts, replayed.next_attempt_at) == (
        TaskStatus.SCHEDULED, 0, "2027-01-15T08:00:07.000Z")
    assert [t.key for t in await real.collect("iter_tasks", "failed")] == ["dead-2", "dead-0"]
    with pytest.raises(ConflictError) as raised:
        await real.call("replay_task", "alive")
    assert raised.value.view is not None and raised.value.view.key == "alive"


async def test_list_with_a_bad_query_is_invalid(real: Both) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        await real.call("list_tasks", "failed", limit=0)
    assert raised.value.detail[0]["loc"] == ["query", "limit"]


async def test_token(app_transport: Callable[[Settings], Any], settings: Settings) -> None:
    """With tokens set, a client without one gets UnauthorizedError; with one it works."""
    settings = settings.model_copy(update={"api_tokens": [ApiToken("s3cret")]})
    async with app_transport(settings) as transport:
        async with AsyncClient("http://timewheel", token="", transport=transport) as anonymous:
            with pytest.raises(UnauthorizedError) as raised:
                await anonymous.get_task("k")
            assert raised.value.detail == "missing or invalid bearer token"
        async with AsyncClient("http://timewheel", token="s3cret", transport=transport) as ok:
            with pytest.raises(NotFoundError):
                await ok.get_task("k")
            assert (await ok.create_task({"key": "k", "callback_url": URL})).key == "k"


async def test_scope_too_small(app_transport: Callable[[Settings], Any],
                               settings: Settings) -> None:
    """A read token may look but not cancel: ForbiddenError naming the scope needed."""
    settings = settings.model_copy(update={"api_tokens": [ApiToken("read:r3ad"),
                                                          ApiToken("write:wr1te")]})
    async with app_transport(settings) as transport:
        async with AsyncClient("http://timewheel", token="wr1te", transport=transport) as writer:
            await writer.create_task({"key": "k", "callback_url": URL})
        async with AsyncClient("http://timewheel", token="r3ad", transport=transport) as reader:
            assert (await reader.get_task("k")).status == "scheduled"
            with pytest.raises(ForbiddenError) as raised:
                await reader.cancel_task("k")
            assert raised.value.detail == ("this token has scope read; DELETE /tasks/k needs "
                                           "write")
            assert (await reader.get_task("k")).status == "scheduled"


async def test_schedules(real: Both) -> None:
    """Set, get, list page by page, pause, resume, delete: the views the API sends."""
    nightly = ScheduleCreate(cron="0 3 * * *", timezone="Europe/Berlin",
                             task=ScheduleTask(callback_url=URL, headers={"X-Job": "n"}))
    created = await real.call("set_schedule", "nightly", nightly)
    assert (created.id, created.cron, created.every, created.timezone, created.paused) == (
        "nightly", "0 3 * * *", None, "Europe/Berlin", False)
    assert created.task.headers == {"X-Job": "n"}
    assert created.next_run_at == "2027-01-16T02:00:00.000Z"  # 03:00 in Berlin, winter
    assert await real.call("get_schedule", "nightly") == created
    await real.call("set_schedule", "a-tick", {"every": 60, "task": {"callback_url": URL}})
    await real.call("set_schedule", "z-tick", {"every": 3600, "task": {"callback_url": URL}})

    first = await real.call("list_schedules", limit=2)
    assert [s.id for s in first.schedules] == ["a-tick", "nightly"]
    assert [s.id for s in await real.collect("iter_schedules", page_size=1)] == [
        "a-tick", "nightly", "z-tick"]

    paused = await real.call("pause_schedule", "nightly")
    assert (paused.paused, paused.next_run_at) == (True, None)
    resumed = await real.call("resume_schedule", "nightly")
    assert (resumed.paused, resumed.next_run_at) == (False, "2027-01-16T02:00:00.000Z")
    assert await real.call("delete_schedule", "nightly") is None
    with pytest.raises(NotFoundError) as raised:
        await real.call("get_schedule", "nightly")
    assert raised.value.detail == "no schedule with id 'nightly'"


async def test_invalid_schedule_is_the_services_422(real: Both) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        await real.call("set_schedule", "bad", {"cron": "0 3 * *", "every": 5,
                                                "task": {"callback_url": URL}})
    assert [e["loc"][:2] for e in raised.value.detail] == [["body", "cron"]]


async def test_flows(real: Both) -> None:
    view = await real.call("set_flow", "api.example.com:443",
                           FlowLimits(parallelism=3, rate=0.5))
    assert view == FlowView(key="api.example.com:443", parallelism=3, rate=0.5, in_flight=0,
                            waiting=0)
    assert await real.call("get_flow", "api.example.com:443") == view
    assert (await real.call("list_flows")).flows == [view]
    assert await real.call("delete_flow", "api.example.com:443") is None
    default = await real.call("get_flow", "api.example.com:443")
    assert (default.rate, (await real.call("list_flows")).flows) == (None, [])
