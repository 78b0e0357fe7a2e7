"""The service layer without HTTP (timewheel/operations): the settings' limits become
InvalidInput located in the request, the store's replies become results or domain errors, and
a schedule's task template is checked like a POST /tasks body. The HTTP answers these map to
are tests/test_api*.py's."""

from __future__ import annotations

import pytest

from timewheel.clock import FakeClock
from timewheel.delivery.netguard import NetworkPolicy
from timewheel.errors import InvalidInput, ScheduleNotFound, TaskConflict, TaskNotFound
from timewheel.metrics import Metrics
from timewheel.models import ScheduleCreate, TaskCreate, TaskReschedule, TaskStatus
from timewheel.operations.schedules import ScheduleOperations, schedule_store
from timewheel.operations.tasks import TaskLimits, TaskOperations
from timewheel.store import Store

URL = "http://127.0.0.1:9/cb"  # never called: nothing delivers here


def operations(store: Store, clock: FakeClock, *, allow_private: bool = True
               ) -> TaskOperations:
    return TaskOperations(store, clock, NetworkPolicy(allow_private=allow_private),
                          TaskLimits(max_horizon_seconds=3600, batch_deadline_seconds=30),
                          Metrics())


async def test_create_then_the_same_again_then_other_content(store: Store,
                                                             fake_clock: FakeClock) -> None:
    tasks = operations(store, fake_clock)
    body = TaskCreate(key="k", callback_url=URL, delay=60)
    first = await tasks.create(body)
    assert (first.created, first.record.status) == (True, TaskStatus.SCHEDULED)
    again = await tasks.create(body)
    assert (again.created, again.record) == (False, await tasks.get("k"))
    with pytest.raises(TaskConflict) as conflict:
        await tasks.create(TaskCreate(key="k", callback_url=URL, delay=61))
    assert conflict.value.record is None  # a POST's 409 shows no task


async def test_limits_of_the_settings_are_invalid_input_located_in_the_body(
        store: Store, fake_clock: FakeClock) -> None:
    tasks = operations(store, fake_clock, allow_private=False)
    cases = [(TaskCreate(callback_url=URL.replace("127.0.0.1", "example.com"), delay=3601),
              ("body", "delay")),
             (TaskCreate(callback_url=URL.replace("127.0.0.1", "example.com"), timeout=31),
              ("body", "timeout")),
             (TaskCreate(callback_url=URL), ("body", "callback_url"))]
    for body, loc in cases:
        with pytest.raises(InvalidInput) as refused:
            await tasks.create(body)
        assert refused.value.loc == loc
    # Control: within every limit, the same operations store the task.
    ok = await tasks.create(TaskCreate(callback_url=URL.replace("127.0.0.1", "example.com"),
                                       delay=3600, timeout=30))
    assert ok.created


async def test_changes_to_a_finished_or_missing_task_are_domain_errors(
        store: Store, fake_clock: FakeClock) -> None:
    tasks = operations(store, fake_clock)
    with pytest.raises(TaskNotFound):
        await tasks.cancel("nope")
    with pytest.raises(TaskNotFound):
        await tasks.reschedule("nope", TaskReschedule(delay=1))
    await tasks.create(TaskCreate(key="k", callback_url=URL, delay=60))
    with pytest.raises(TaskConflict) as not_failed:
        await tasks.replay("k")
    assert not_failed.value.record is not None
    assert not_failed.value.record.status is TaskStatus.SCHEDULED
    await tasks.cancel("k")
    with pytest.raises(TaskConflict) as finished:
        await tasks.cancel("k")
    assert finished.value.record is not None
    assert finished.value.record.status is TaskStatus.CANCELLED
    assert (await tasks.replay("k")).status is TaskStatus.SCHEDULED


async def test_a_bad_cursor_is_invalid_input_in_the_query(store: Store,
                                                          fake_clock: FakeClock) -> None:
    tasks = operations(store, fake_clock)
    with pytest.raises(InvalidInput) as refused:
        await tasks.page(TaskStatus.FAILED, key_prefix="", limit=10, cursor="not-a-cursor")
    assert (refused.value.loc, refused.value.value) == (("query", "cursor"), "not-a-cursor")


async def test_a_schedule_template_is_checked_like_a_task_and_located_under_task(
        store: Store, fake_clock: FakeClock) -> None:
    tasks = operations(store, fake_clock)
    schedules = ScheduleOperations(schedule_store(store, default_timeout=10.0), tasks,
                                   fake_clock)
    body = ScheduleCreate.model_validate({"every": 60, "task": {"callback_url": URL,
                                                                "timeout": 31}})
    with pytest.raises(InvalidInput) as refused:
        await schedules.put("s", body)
    assert refused.value.loc == ("body", "task", "timeout")
    with pytest.raises(ScheduleNotFound):
        await schedules.get("s")  # nothing was stored
    created, record = await schedules.put("s", ScheduleCreate.model_validate(
        {"every": 60, "task": {"callback_url": URL, "timeout": 30}}))
    assert created and record.id == "s"
    assert (await schedules.pause("s")).paused
    await schedules.delete("s")
    with pytest.raises(ScheduleNotFound):
        await schedules.resume("s")
